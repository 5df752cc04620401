"""The Spark tests' shared parts: one local SparkSession for all of them (they run on one xdist
worker: group "spark"), and a node process per module."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from broker.tools.process import NodeProcess

PASSWORD = "spark-password"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run this interpreter (it has the client)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from client.spark import register

    # local[2,2]: two cores, and a failed task tried once more (as on a cluster), which the
    # sink's exactly-once tests need
    s = (SparkSession.builder.master("local[2,2]").appName("tandem-tests")
         .config("spark.sql.shuffle.partitions", "1").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "1g")
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
         .config("spark.sql.session.timeZone", "UTC")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    proc = NodeProcess(tmp_path_factory.mktemp("spark-node") / "node1", password=PASSWORD)
    loop.run_until_complete(proc.start())
    try:
        yield proc.url
    finally:
        loop.run_until_complete(proc.stop())
        loop.close()
