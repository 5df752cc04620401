from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.cluster import LocalCluster, port_range
from broker.tools.process import NodeProcess
from broker.config import NodeConfig
from broker.node.node import Node
from storage.memory import MemoryDisk, MemoryEngine
from tests.pg import pg_database, pg_url  # noqa: F401 (fixtures)

PASSWORD = "test-password"
FAST = ["--keepalive-interval", "0.1", "--non-response-timeout", "0.5"]  # failure detection for tests


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="run the long tier only (tests marked long: soaks, long drills, the pipeline demo; "
                          "make test-long, docs/testing.md); without it, every test but those")


#: where the suite's longest tests are (node processes, Spark, the fuzz run, the harness's seeds):
#: they are handed to the xdist workers first, so that the many short ones fill in at the end
#: instead of one long test running alone on one worker while the others are done
HEAVY = ("tests/spark/", "tests/fuzz/", "tests/integration/", "tests/harness/test_group_schedules.py",
         "tests/webconsole/test_browser.py", "tests/webconsole/test_api_schemathesis.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (docs/testing.md): ``make test`` runs what is not marked ``long``, ``make
    test-long`` (``--long``) what is; the other tier's tests are deselected, and counted so.
    Then the heavy tests go first (:data:`HEAVY`; otherwise in collection order)."""
    long = bool(config.getoption("--long"))
    keep, other = [], []
    for item in items:
        (keep if (item.get_closest_marker("long") is not None) == long else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
    keep.sort(key=lambda item: not item.nodeid.startswith(HEAVY))  # (a stable sort: the order within each part stays)
    items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker picks free ports from its own slice of the range (see free_ports).
    Node processes are forked from a server that imported the node's code once
    (broker/tools/forked.py): the same processes, started on a tenth of the CPU."""
    NodeProcess.forked = True
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit() and "TANDEM_PORT_RANGE" not in os.environ:
        low, high = port_range()
        span = (high - low) // int(count)
        start = low + int(worker[2:]) * span
        os.environ["TANDEM_PORT_RANGE"] = f"{start}-{start + span}"


@pytest.fixture(autouse=True)
def _admin_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_ADMIN_PASSWORD", PASSWORD)


@pytest.fixture
def blockbuster():
    """Fail the test on a blocking call made from the event loop."""
    from blockbuster import blockbuster_ctx

    with blockbuster_ctx(scanned_modules=["broker", "client", "storage", "ha", "webconsole"]) as bb:
        yield bb


@pytest_asyncio.fixture(params=["sqlite", "memory"])
async def node(request: pytest.FixtureRequest, tmp_path: Path, blockbuster) -> AsyncIterator[Node]:
    """A started node on a free port; every test using it runs against each storage engine."""
    if request.param == "memory":
        disk = MemoryDisk()
        n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0), engine=lambda _cfg: MemoryEngine(disk))
    else:
        n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        yield n
    finally:
        await n.stop()


def url_of(n: Node, password: str = PASSWORD, user: str = "admin") -> str:
    return f"tandem://{user}:{password}@127.0.0.1:{n.address[1]}"


@pytest.fixture
def url(node: Node) -> str:
    return url_of(node)


@pytest_asyncio.fixture
async def conn(url: str) -> AsyncIterator[client.DurableConnection]:
    """What applications use: a durable connection."""
    c = await client.connect(url)
    try:
        yield c
    finally:
        await c.close()


@pytest_asyncio.fixture
async def link(url: str) -> AsyncIterator[client.Connection]:
    """One plain link, for tests of the wire protocol and of the node's own rules."""
    c = await client.connect_link(url)
    try:
        yield c
    finally:
        await c.close()


@contextlib.asynccontextmanager
async def running_group(tmp_path: Path, *extra_args: str, tls: bool = False,
                        console: bool = False) -> AsyncIterator[LocalCluster]:
    """Three node processes in a replication group, quick to notice a dead member; stopped after.
    ``tls``: TLS on every link (LocalCluster's throwaway CA); ``console``: each node serves
    its console (off unless a test asks: a node without one starts on less CPU)."""
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password=PASSWORD, extra_args=[*FAST, *extra_args], tls=tls,
                      console=console)
    await cl.start()
    try:
        await cl.wait_ready()
        yield cl
    finally:
        await cl.stop()


@pytest_asyncio.fixture
async def trio(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three node processes in a replication group, quick to notice a dead member."""
    async with running_group(tmp_path) as cl:
        yield cl
