"""The in-process group harness: N real :class:`broker.node.node.Node` objects (3 by default)
in one event loop, on one :class:`client.testing.FakeClock`, linked by a
:class:`tests.harness.network.MemoryNetwork`, each with a ``MemoryEngine`` over a
``MemoryDisk`` of its own.

    async with Group(tmp_path, seed=7) as g:
        await g.start()                       # every member, until they have quorum and a catalogue active
        await g.declare("q", partitions=2)
        await g.kill("n2")                    # abandoned: tasks cancelled, links reset, nothing flushed
        g.net.cut("n1", "n3")                 # and heal(), drop(), set_delay() ...
        await g.run_for(3.0)                  # virtual seconds: timers fire, nothing sleeps
        await g.restart("n2")                 # a new Node over the same MemoryDisk

Everything a node does runs as that node's own (:class:`tests.harness.runtime.Life`), so a kill
ends exactly that node: its tasks are cancelled, its timers never fire, its store writer
drops what it had not written (what it had is on its ``MemoryDisk``, which a restart reopens),
its links are reset as the OS resets a killed process's sockets (or, ``silent``, go quiet as
a machine that lost power).  The peer links, the handshake with the group secret, replication,
elections, forwarding and the publish and delivery paths are the product's own code.

Clients are in-process (:mod:`tests.harness.clients`): producers call the node's
``Publisher.publish`` and consumers take deliveries from its ``Delivery`` as a client session
does, not over sockets.  The SDK over loopback would need a real socket per client and a
SCRAM login per connect, and its frames would travel through the kernel, outside the virtual
clock's control: a schedule could no longer replay exactly, and each seed would cost real
time.  The client's own failover logic is tested elsewhere (tests/integration).  Each node
still binds a real, unused loopback client port (its start needs one).

What the harness does not simulate: real sockets (buffers, partial writes, Nagle), TLS, the
writer thread's timing against the loop (commits happen on the loop's next turn), fsync and
torn writes (the ``MemoryDisk`` has what was committed, whole), processes (kill -9 of an OS
process, the CLI).  Those stay with tests/integration and the drills.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import broker.modes.replicated.reconcile
import broker.node.store
import broker.security.users
from broker.config import NodeConfig
from broker.messaging.publish import PublishRequest
from broker.node.node import Node
from client.protocol.frames import Declare, PublishMessage
from client.testing import FakeClock
from ha.membership import QuorumState
from storage.base import UserRecord
from storage.memory import MemoryDisk, MemoryEngine
from tests.harness.network import MemoryNetwork
from tests.harness.runtime import Driver, InlineExecutor, Life, LoopWriter, NodeClock, SeededRandom, owned_tasks
from tests.helpers import group_secret_file

log = logging.getLogger("tandem.harness")

NAMES = ("n1", "n2", "n3")
BASE_PEER_PORT = 7101
#: the settings every member gets unless a test says otherwise: failure detection in tenths of
#: a virtual second, no disk alarm (the MemoryDisk has no free space to measure)
SETTINGS: dict[str, Any] = {"keepalive_interval": 0.1, "non_response_timeout": 0.5, "disk_free_limit": 0}
START_TIMEOUT = 30.0  # virtual seconds


_make_user = broker.security.users.make_user


def _quick_user(name: str, password: str, role: str, *, iterations: int = 4096) -> UserRecord:
    """The first admin each node creates, with SCRAM's minimum of 4,096 PBKDF2 iterations
    (RFC 7677) rather than 100,000: no client logs in on the harness, and the derivation would
    cost 40 ms of each node's first start."""
    return _make_user(name, password, role, iterations=iterations)


class Member:
    """One member: its settings and disk (kept across lives), its node and life while it runs."""

    def __init__(self, name: str, config: NodeConfig) -> None:
        self.name, self.config = name, config
        self.disk = MemoryDisk()
        self.node: Node | None = None
        self.life: Life | None = None
        self.lives = 0

    @property
    def alive(self) -> bool:
        return self.node is not None

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as this node's own code (it must be alive)."""
        if self.life is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.life.run(fn, *args)

    @property
    def quorum(self) -> QuorumState | None:
        node = self.node
        if node is None or node.ha.peers is None:
            return None
        return node.ha.peers.membership.quorum_state

    def __repr__(self) -> str:
        return f"<member {self.name} {'alive' if self.alive else 'down'} lives={self.lives}>"


class Group:
    """A group of in-process nodes on one virtual clock and an in-memory network.

    ``seed`` seeds the network's delays (up to ``max_delay``) and the nodes' elections (their
    replication cores' random timeouts); a schedule draws its faults from a ``random.Random``
    of its own.  ``secret``: the group secret file (one made in ``tmp_path`` by default);
    ``settings``: NodeConfig fields for every member.

    Entered, it makes the running loop the harness's (:mod:`tests.harness.runtime`): its task
    factory tells whose each task is, its default executor runs at once, nodes open
    :class:`~tests.harness.runtime.LoopWriter` store writers and seeded election timers, and
    the first admin's credentials are cheap; on exit every live node is killed and all of that
    is undone."""

    def __init__(self, tmp_path: Path, *, names: tuple[str, ...] = NAMES, seed: int = 0, max_delay: float = 0.0,
                 secret: Path | None = None, **settings: Any) -> None:
        self.seed = seed
        self.clock = FakeClock()
        self.driver = Driver(self.clock)
        self.net = MemoryNetwork(self.clock, random.Random(f"net-{seed}"), max_delay=max_delay)
        secret = secret or group_secret_file(tmp_path)
        ports = {n: BASE_PEER_PORT + i for i, n in enumerate(names)}
        self.members: dict[str, Member] = {}
        for n in names:
            cfg = NodeConfig(name=n, data_dir=tmp_path / n, host="127.0.0.1", port=0, peer_port=ports[n],
                             peers=tuple(f"{o}=127.0.0.1:{ports[o]}" for o in names if o != n),
                             cluster_secret_file=secret, **{**SETTINGS, **settings})
            self.members[n] = Member(n, cfg)
        self._undo: list[Callable[[], None]] = []

    # -- the harness around the loop ----------------------------------------------------------------

    async def __aenter__(self) -> Group:
        loop = asyncio.get_running_loop()
        factory, executor = loop.get_task_factory(), getattr(loop, "_default_executor", None)
        loop.set_task_factory(owned_tasks)
        loop.set_default_executor(InlineExecutor(max_workers=1))
        patches: list[Any] = [
            mock.patch.object(broker.node.store, "GroupCommitWriter", LoopWriter),
            mock.patch.object(broker.modes.replicated.reconcile, "random", SeededRandom(self.seed)),
            mock.patch.object(broker.security.users, "make_user", _quick_user),
        ]
        for p in patches:
            p.start()

        def undo() -> None:
            for p in patches:
                p.stop()
            loop.set_task_factory(factory)
            loop._default_executor = executor  # type: ignore[attr-defined]  # (set_default_executor refuses None)

        self._undo.append(undo)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            for m in self.members.values():
                if m.alive:
                    await self.kill(m.name)
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo.clear()

    # -- time -----------------------------------------------------------------------------------------

    async def run_for(self, seconds: float) -> None:
        await self.driver.run_for(seconds)

    async def until(self, done: Callable[[], bool], timeout: float, *, what: str = "the condition",
                    fail: bool = True) -> bool:
        return await self.driver.until(done, timeout, what=what, fail=fail)

    # -- members --------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive]

    async def start(self, *names: str, wait: bool = True) -> None:
        """Start these members (all, by default) at once; ``wait``: until every live member
        has full node quorum and the catalogue has an active."""
        names = names or tuple(self.members)
        await self._start(*names)
        if wait:
            await self.until(self.formed, START_TIMEOUT, what="the group formed")

    async def restart(self, name: str) -> None:
        """Start a member that was killed or stopped again, from what its disk has."""
        await self._start(name)

    async def _start(self, *names: str) -> None:
        """(One driver moves time while the nodes start: two would each see the other's turns.)"""
        starting = {}
        for name in names:
            m = self.members[name]
            if m.alive:
                raise RuntimeError(f"{name} is running")
            m.lives += 1
            life = m.life = Life(name, m.lives)
            node = m.node = life.run(self._node, m, life)
            starting[name] = life.spawn(node.start(), name=f"harness-start-{name}")
        try:
            await self.until(lambda: all(t.done() for t in starting.values()), START_TIMEOUT,
                             what=f"{', '.join(names)} started")
            for t in starting.values():
                t.result()
        except BaseException:
            for name in names:
                if self.members[name].alive:
                    await self.kill(name)
            raise
        log.info("harness: %s started at %.3f", ", ".join(names), self.clock.monotonic())

    def _node(self, m: Member, life: Life) -> Node:
        """A new Node for ``m``'s next life: on the group's clock, over its own disk, on the network."""
        disk = m.disk
        return Node(m.config, clock=NodeClock(self.clock, life), engine=lambda _cfg: MemoryEngine(disk),
                    transport=self.net.endpoint(m.name))

    async def kill(self, name: str, *, silent: bool = False) -> None:
        """End ``name`` as a kill -9 would: its tasks cancelled, its timers silenced, its writes
        not yet committed lost, its links reset (``silent``: left to time out)."""
        m = self.members[name]
        life, node = m.life, m.node
        if life is None or node is None:
            raise RuntimeError(f"{name} is not running")
        life.dead = True
        m.node = None
        for w in life.writers:
            w.crash()
        self.net.crash(name, silent=silent)
        node._listeners.close()  # (the real client ports it bound: the OS closes a dead process's sockets)
        await self._end_tasks(life)
        log.info("harness: %s killed at %.3f", name, self.clock.monotonic())

    async def stop(self, name: str) -> None:
        """A clean stop (``Node.stop``), in virtual time."""
        m = self.members[name]
        life, node = m.life, m.node
        if life is None or node is None:
            raise RuntimeError(f"{name} is not running")
        task = life.spawn(node.stop(), name=f"harness-stop-{name}")
        await self.until(task.done, START_TIMEOUT, what=f"{name} stopped")
        task.result()
        life.dead = True
        m.node = None
        await self._end_tasks(life)

    async def _end_tasks(self, life: Life) -> None:
        for _ in range(20):
            left = [t for t in life.tasks if not t.done()]
            if not left:
                return
            for t in left:
                t.cancel()
            await self.driver.settle()
        left = [t for t in life.tasks if not t.done()]
        if left:
            raise AssertionError(f"{life}: tasks that outlive their cancellation: {[t.get_name() for t in left]}")

    # -- the group's state ----------------------------------------------------------------------------

    def formed(self) -> bool:
        """Every live member sees full node quorum, and one of them is the catalogue's active."""
        alive = self.alive()
        if not alive or any(m.quorum is not QuorumState.ACTIVE for m in alive):
            return False
        return self.catalogue_active() is not None

    def catalogue_active(self) -> Member | None:
        for m in self.alive():
            rep = m.node.ha.replication if m.node is not None else None
            if rep is not None and rep.serving((0, 0)):
                return m
        return None

    async def declare(self, queue: str, *, partitions: int = 1, timeout: float = 30.0, **fields: Any) -> None:
        """Declare ``queue`` at a live member, retried until it is known on every live member."""
        rid = 0

        async def attempt(m: Member) -> None:
            assert m.node is not None
            await m.node.catalogue.declare(Declare(rid=rid, queue=queue, partitions=partitions, **fields))

        deadline = self.clock.monotonic() + timeout
        while True:
            m = self.alive()[0]
            assert m.life is not None
            task = m.life.spawn(attempt(m), name="harness-declare")
            await self.until(task.done, timeout, what=f"declare {queue}")
            if task.exception() is None:
                break
            if self.clock.monotonic() > deadline:
                raise AssertionError(f"declare {queue} failed: {task.exception()!r}")
            await self.run_for(0.2)
        await self.until(lambda: all(m.node is not None and queue in m.node.catalogue.queues for m in self.alive()),
                         timeout, what=f"{queue} known on every live member")

    def publish(self, m: Member, queue: str, producer_id: str | None, messages: list[PublishMessage]) -> Any:
        """``Publisher.publish`` on member ``m``, as its own code: the Outcome (or raises)."""
        assert m.node is not None
        return m.run(m.node.publisher.publish, PublishRequest(queue, producer_id, messages))
