"""The blocking client under gevent, in a process of its own (tests/client/test_gevent.py runs it).

``python gevent_worker.py '<json config>'``: monkey-patches first (before anything imports
socket, ssl or threading), then imports :mod:`client.blocking` and runs one scenario with
many greenlets in this one process.  It prints JSON lines on stdout: progress events
(``{"event": "kill"}``: the test should kill -9 the node now and answer ``killed`` on stdin)
and, last, ``{"result": {...}}`` for the test to check.

Scenarios (``config["mode"]``):

``load``: ``consumers`` greenlets, each with its own connection (``consumer_urls``, taken in
turn), block in a consumer iteration while ``producers`` greenlets (each its own connection
to ``producer_url``) publish ``messages`` each; with ``kill_after`` the worker asks for the
kill once that many sends are confirmed and the producers keep sending until each has had
``after_kill`` sends confirmed after it.  It ends when every confirmed message was consumed
(or after ``deadline`` seconds) and reports what was confirmed and what was consumed.

``cooperative``: one greenlet ticks (``gevent.sleep``) while another waits in the client:
re-dialling a dead port with backoff, a handshake with a node that accepts and never answers,
a consumer's socket timeout on an empty queue; ticks are counted in each.  Also a round trip
through ``localhost`` (gevent's resolver) and what the process imported.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gevent.fileobject  # noqa: E402
import gevent.server  # noqa: E402
import gevent.socket  # noqa: E402

from client import blocking  # noqa: E402
from client.errors import ConnectionClosedError, StaleDeliveryError, TandemError  # noqa: E402


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Ticker:
    """A greenlet that counts its turns: it stops counting if another greenlet holds the hub."""

    def __init__(self, interval: float = 0.005) -> None:
        self.ticks = 0
        self.interval = interval
        self.g = gevent.spawn(self._run)

    def _run(self) -> None:
        while True:
            gevent.sleep(self.interval)
            self.ticks += 1

    def during(self, fn: Callable[[], Any]) -> tuple[int, float, Any]:
        """(ticks, seconds, fn's result or its exception's class name) while ``fn`` runs in a
        greenlet of its own."""
        def run() -> Any:
            try:
                return fn()
            except Exception as exc:  # the outcome the test checks
                return type(exc).__name__

        before, t0 = self.ticks, time.monotonic()
        g = gevent.spawn(run)
        g.join()
        return self.ticks - before, time.monotonic() - t0, g.value


def load(cfg: dict[str, Any]) -> dict[str, Any]:
    queue = cfg.get("queue", "g")
    n_prod, n_cons, per = cfg["producers"], cfg["consumers"], cfg["messages"]
    kill_after, after_kill = cfg.get("kill_after"), cfg.get("after_kill", 5)
    with blocking.connect(cfg["producer_url"], client_name="gevent-setup") as admin:
        admin.declare_queue(queue, partitions=cfg.get("partitions", 6))
    confirmed: list[str] = []
    consumed: list[tuple[str, bool]] = []
    seen: set[str] = set()
    errors: list[str] = []
    stale = [0]
    ack_lost = [0]
    nodes_before: dict[str, str] = {}
    producers_done = gevent.event.Event()
    all_consumed = gevent.event.Event()
    kill_asked = gevent.event.Event()
    killed = gevent.event.Event()
    consumers_ready = [0]
    every_consumer_waiting = gevent.event.Event()
    conns: dict[str, blocking.BlockingConnection] = {}
    ticker = Ticker()

    def check_done() -> None:
        if producers_done.is_set() and seen.issuperset(confirmed):
            all_consumed.set()

    def consumer(i: int) -> None:
        url = cfg["consumer_urls"][i % len(cfg["consumer_urls"])]
        conn = blocking.connect(url, client_name=f"gevent-c{i}", send_timeout=cfg.get("send_timeout", 60))
        conns[f"c{i}"] = conn
        nodes_before[f"c{i}"] = conn.node
        c = conn.consumer(queue, prefetch=cfg.get("prefetch", 16))
        consumers_ready[0] += 1
        if consumers_ready[0] == n_cons:
            every_consumer_waiting.set()
        for m in c:  # blocks (cooperatively) until a delivery, re-dials on a lost node
            body = m.body.decode()
            consumed.append((body, m.redelivered))
            seen.add(body)
            try:
                m.ack()
            except StaleDeliveryError:
                stale[0] += 1  # came on a link that failed since: it comes again
            except ConnectionClosedError:
                ack_lost[0] += 1  # the link died under the ack: it comes again, marked redelivered
            check_done()

    def producer(i: int) -> None:
        conn = blocking.connect(cfg["producer_url"], client_name=f"gevent-p{i}",
                                send_timeout=cfg.get("send_timeout", 60))
        conns[f"p{i}"] = conn
        nodes_before[f"p{i}"] = conn.node
        p = conn.producer(queue)
        n = sent_after = 0
        while n < per or (kill_after is not None and sent_after < after_kill):
            body = f"p{i}-{n}"
            try:
                p.send(body, key=f"k{n}")
            except TandemError as exc:
                errors.append(f"{body}: {type(exc).__name__}: {exc}")
                return
            confirmed.append(body)
            n += 1
            if killed.is_set():
                sent_after += 1
            if kill_after is not None and len(confirmed) >= kill_after and not kill_asked.is_set():
                kill_asked.set()
                emit({"event": "kill", "confirmed": len(confirmed), "nodes": sorted(set(nodes_before.values()))})
            if n > 50 * per:
                errors.append(f"producer {i}: never told the node was killed")
                return

    def stdin_reader() -> None:
        f = gevent.fileobject.FileObjectPosix(sys.stdin.fileno(), "rb", close=False)
        for line in f:
            if line.strip() == b"killed":
                killed.set()

    reader = gevent.spawn(stdin_reader)
    cons = [gevent.spawn(consumer, i) for i in range(n_cons)]
    if not every_consumer_waiting.wait(timeout=60):
        errors.append("the consumers did not all subscribe")
    idle_ticks = ticker.ticks
    gevent.sleep(cfg.get("idle_window", 0.5))  # every consumer blocked in its iteration: the ticker runs on
    idle_ticks = ticker.ticks - idle_ticks
    prods = [gevent.spawn(producer, i) for i in range(n_prod)]
    gevent.joinall(prods, timeout=cfg.get("deadline", 120))
    for g in prods:
        if not g.ready():
            errors.append("a producer did not finish before the deadline")
        elif not g.successful():
            errors.append(f"producer: {type(g.exception).__name__}: {g.exception}")
    producers_done.set()
    check_done()
    all_consumed.wait(timeout=cfg.get("deadline", 120))
    for g in cons:
        if g.ready() and not g.successful():
            errors.append(f"consumer: {type(g.exception).__name__}: {g.exception}")
    gevent.killall([*cons, reader], timeout=5)
    sockets = sorted({f"{type(conn._sock).__module__}.{type(conn._sock).__name__}" for conn in conns.values()})
    nodes_after = {g: conn.node for g, conn in conns.items()}
    for conn in conns.values():
        conn.close()
    ticker.g.kill()
    return {"confirmed": confirmed, "consumed": consumed, "errors": errors, "stale": stale[0],
            "ack_lost": ack_lost[0], "nodes_before": nodes_before, "nodes_after": nodes_after,
            "ticks": ticker.ticks, "idle_ticks": idle_ticks,
            "sockets": sockets}


def cooperative(cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ticker = Ticker()
    if cfg.get("redial", True):
        redial_and_silent(cfg, ticker, out)
    url = cfg["url"]
    if cfg.get("dns", True):  # localhost through gevent's resolver
        url = url.replace("127.0.0.1", "localhost")
    with blocking.connect(url, timeout=cfg.get("read_timeout", 1.0)) as conn:
        out["socket_class"] = f"{type(conn._sock).__module__}.{type(conn._sock).__name__}"
        conn.declare_queue("coop")
        c = conn.consumer("coop", prefetch=4)
        # a consumer's socket timeout on an empty queue: the hub runs the ticker meanwhile
        out["read_timeout"] = ticker.during(c.next)
        # and the link works after it (the node serves the queue, or in a group another one)
        out["after_timeout"] = [q.name for q in conn.list_queues()]
        if cfg.get("round_trip", True):  # a publish on another connection reaches the consumer
            with blocking.connect(url) as other:
                other.producer("coop").send(b"after the timeout")
            m = c.next()
            m.ack()
            out["round_trip"] = m.body.decode()
    ticker.g.kill()
    out["patched"] = {name: monkey.is_module_patched(name) for name in ("socket", "ssl", "time", "select",
                                                                        "threading", "selectors")}
    return out


def redial_and_silent(cfg: dict[str, Any], ticker: Ticker, out: dict[str, Any]) -> None:
    # re-dial against a dead port: the backoff sleeps must let the ticker run
    dead = gevent.socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()  # nobody listens there now: every dial is refused at once
    with tempfile.TemporaryDirectory() as tmp:
        conn = blocking.connect(f"tandem://admin:pw@127.0.0.1:{dead_port}", buffer_path=f"{tmp}/b.db",
                                send_timeout=cfg.get("redial_seconds", 2.0))
        out["redial"] = ticker.during(lambda: conn.declare_queue("never"))
        conn.close()

    # a node that accepts and never answers: the handshake gives up after connect_timeout
    held: list[Any] = []

    def hold(sock: Any, _address: Any) -> None:  # accept, then say nothing
        held.append(sock)
        gevent.sleep(3600)

    silent = gevent.server.StreamServer(("127.0.0.1", 0), hold)
    silent.start()
    out["silent"] = ticker.during(lambda: blocking.connect(
        f"tandem://admin:pw@127.0.0.1:{silent.server_port}/?connect_timeout={cfg.get('connect_timeout', 1.0)}"))
    silent.stop(timeout=0)
    for s in held:
        s.close()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    mode = cfg["mode"]
    result = load(cfg) if mode == "load" else cooperative(cfg)
    emit({"result": result})


if __name__ == "__main__":
    main()
