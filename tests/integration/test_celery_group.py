"""Celery on a 3-node group through the AMQP front door, with real node processes and a real
Celery worker process: 1,000 tasks published with confirms (kombu's ``confirm_publish``) and
executed with late acks, while the node the worker and the publisher are connected to is killed
(kill -9) and started again.  Every task is executed at least once and its result is recorded
(Celery's file result backend); the executions beyond one (a task whose ack the kill lost, run
again) are counted.  Before the run, the worker answers a ``celery.pidbox`` broadcast (``ping``),
runs a task given a countdown, and one that retries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker.tools.cluster import LocalCluster
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

PASSWORD = "test-password"
TASKS = 1000

APP = '''
import os
from pathlib import Path

from celery import Celery

HERE = Path(__file__).parent
app = Celery("tandem_tasks", broker=os.environ["BROKER_URLS"], backend=f"file://{HERE / 'results'}")
app.conf.update(
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    broker_heartbeat=4,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=8,
)


@app.task
def record(i):
    with open(HERE / "executed.log", "a") as f:
        f.write(f"{i}\\n")
    return i * 2


@app.task(bind=True, max_retries=5, default_retry_delay=0.2)
def shaky(self, n):
    if self.request.retries < 2:
        raise self.retry()
    return n + self.request.retries
'''


def _load(tmp: Path) -> Any:
    """The tasks module, imported in this process (the publisher's side)."""
    sys.path.insert(0, str(tmp))
    try:
        import tandem_tasks  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp))
    return tandem_tasks


def _publish(mod: Any, ids: range) -> int:
    """Send ``record(i)`` for each i, each with its own task id; a send whose outcome a fault left
    unknown is sent again with the same id (at least once).  How many were sent again."""
    again = 0
    for i in ids:
        deadline = time.monotonic() + 60
        while True:
            try:
                mod.record.apply_async((i,), task_id=f"task-{i}", retry=False)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                again += 1
                time.sleep(0.2)  # (pacing the resends of a client, not a wait for a state)
    return again


async def test_a_celery_worker_runs_1000_tasks_through_a_kill_9_of_its_node(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path / "group", console=False, nodes=3, base_port=0, password=PASSWORD, extra_args=FAST,
                      amqp=True)
    await cl.start()
    worker: subprocess.Popen[bytes] | None = None
    app_dir = tmp_path / "app"
    (app_dir / "results").mkdir(parents=True)
    (app_dir / "tandem_tasks.py").write_text(APP)
    # node1 first: the worker and the publisher are on it until it is killed, then fail over
    urls = ";".join(f"amqp://admin:{PASSWORD}@{cl.hosts[n]}:{cl.amqp_ports[n]}//" for n in ("node1", "node2", "node3"))
    os.environ["BROKER_URLS"] = urls
    try:
        await cl.finalize()
        log = open(tmp_path / "worker.log", "wb")
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tandem_tasks", "worker", "--pool", "threads", "-c", "4",
             "-l", "info", "--without-mingle", "--without-gossip", "-n", "w1@%h"],
            cwd=app_dir, env={**os.environ, "PYTHONPATH": str(app_dir)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        mod = _load(app_dir)
        app = mod.app

        def pinged() -> bool:
            return bool(app.control.ping(timeout=1.0))

        await wait_until(lambda: asyncio.to_thread(pinged), timeout=60, what="the worker answering a broadcast ping")
        started = time.monotonic()
        later = mod.record.apply_async((-1,), countdown=1)
        assert await asyncio.to_thread(later.get, timeout=30) == -2
        assert time.monotonic() - started >= 1.0  # (not run before its countdown)
        assert await asyncio.to_thread(mod.shaky.delay(40).get, timeout=30) == 42

        executed = app_dir / "executed.log"

        def done() -> Counter[int]:
            return Counter(int(x) for x in executed.read_text().split()) if executed.exists() else Counter()

        sending = asyncio.ensure_future(asyncio.to_thread(_publish, mod, range(TASKS)))
        await wait_until(lambda: len(done()) >= TASKS // 3, timeout=120, what=f"{TASKS // 3} tasks executed")
        await cl.nodes["node1"].kill()
        await cl.nodes["node1"].start()
        resent = await sending
        results = app_dir / "results"

        def recorded() -> int:
            return sum(1 for i in range(TASKS) if (results / f"celery-task-meta-task-{i}").exists())

        await wait_until(lambda: recorded() == TASKS, timeout=180,
                         what=f"a result for each of the {TASKS} tasks (worker log: {tmp_path / 'worker.log'})")
        for i in (0, TASKS // 2, TASKS - 1):
            assert await asyncio.to_thread(app.AsyncResult(f"task-{i}").get, timeout=10) == i * 2
        runs = done()
        missing = [i for i in range(TASKS) if runs[i] == 0]
        assert not missing, missing[:10]
        again = sum(n - 1 for i, n in runs.items() if i >= 0 and n > 1)
        print(f"celery: {TASKS} tasks, each executed, {again} executed again, {resent} sends repeated")
    finally:
        os.environ.pop("BROKER_URLS", None)
        sys.modules.pop("tandem_tasks", None)
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        await cl.stop()
