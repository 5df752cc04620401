"""The links of a durable connection: one per node it uses, the *primary* among them,
and failover.

The primary link carries requests that are not about one partition (declare, status,
the partition map).  When it breaks, a keeper task dials the nodes it knows (the
group's members first, then the URL's hosts) with jittered exponential backoff on the
connection's clock, and says so in a :class:`~client.durable.events.ConnectionEvent`.
A primary whose node answers the partition map without quorum gives way to a node that
has it (:mod:`client.durable.routing`).
Producers and consumers ask for a link to a given node (a partition's active, a member)
with :meth:`DurableLinks.link_now` / :meth:`DurableLinks.link`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from client.clock import SYSTEM_CLOCK, Backoff, Clock
from client.connection import Connection, _params_dict
from client.durable import routing
from client.durable.events import ConnectionEvent
from client.durable.routing import MapAnswer
from client.errors import (
    ConnectionClosedError,
    InvalidArgumentError,
    NotActiveError,
    Retry,
    TandemError,
    TimeoutError_,
    UnavailableError,
)
from client.protocol.frames import PartitionMap
from client.url import ConnectParams

log = logging.getLogger("tandem.client")
T = TypeVar("T")

DEFAULT_SEND_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_BUFFER_MAX_BYTES = 64 * 1024 * 1024
#: how long a partition-map request waits for the other nodes when the primary's has no quorum
MAP_FANOUT_TIMEOUT = 0.5


class Stops(Protocol):
    """A producer of the connection: stopped (what is unconfirmed fails) when it closes."""

    async def _stop(self, exc: TandemError) -> None: ...


class Closes(Protocol):
    """A consumer of the connection: closed when it closes."""

    async def close(self) -> None: ...


class DurableLinks:
    """The links of a durable connection and its requests on the primary link;
    :class:`client.durable.connection.DurableConnection` adds the application's calls."""

    def __init__(self, params: ConnectParams, *, clock: Clock = SYSTEM_CLOCK,
                 send_timeout: float = DEFAULT_SEND_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 buffer_path: str | None = None, buffer_max_bytes: int = DEFAULT_BUFFER_MAX_BYTES) -> None:
        if send_timeout <= 0 or request_timeout <= 0:
            raise InvalidArgumentError("send_timeout and request_timeout must be > 0")
        if buffer_max_bytes <= 0:
            raise InvalidArgumentError("buffer_max_bytes must be > 0")
        self.params = params
        self.clock = clock
        self.send_timeout = send_timeout
        self.request_timeout = request_timeout
        self.buffer_path = buffer_path
        self.buffer_max_bytes = buffer_max_bytes
        self.links: dict[str, Connection] = {}  # node name -> open link
        self._opening: dict[str, asyncio.Task[Connection | None]] = {}
        self._link_retry: dict[str, float] = {}  # node -> earliest next dial
        self.addresses: dict[str, tuple[str, int]] = {}  # node name -> client host, port
        self._primary: Connection | None = None
        self._primary_up = asyncio.Event()
        self._primary_lost = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._maps: dict[str, tuple[int, PartitionMap]] = {}  # queue -> (map_epoch, map)
        self.map_epoch = 0  # bumped by every MapChanged: cached maps are stale
        self.changed = asyncio.Event()  # set (and replaced) on link and map changes
        self._listeners: list[Callable[[ConnectionEvent], None]] = []
        self.events: deque[ConnectionEvent] = deque(maxlen=1000)
        self._producers: set[Stops] = set()
        self._consumers: set[Closes] = set()
        self._closed = False
        self.closed_by_client = False
        self._rng = random.Random()
        self._last_primary: str | None = None  # the node of the latest primary link
        self._rotated_at = -1e9
        self._last_dial_error = ""  # why the last dial failed ("host:port: reason")
        #: address -> when a dial of it last failed (until it answers again)
        self._failed_at: dict[tuple[str, int], float] = {}
        #: where refusing nodes said the active is (NotActive's hint, e.g. a shared-mode
        #: passive naming the lock holder): tried first
        self._hints: list[tuple[str, int]] = []

    # -- events ----------------------------------------------------------------------------

    def on_event(self, callback: Callable[[ConnectionEvent], None]) -> None:
        """Call ``callback`` with every later :class:`ConnectionEvent` (in order, on the loop)."""
        self._listeners.append(callback)

    def _emit(self, ev: ConnectionEvent) -> None:
        self.events.append(ev)
        level = logging.WARNING if ev.kind in ("disconnected", "failed_over", "messages_lost") else logging.INFO
        log.log(level, "durable connection: %s %s %s", ev.kind, ev.node, ev.detail)
        for cb in list(self._listeners):
            try:
                cb(ev)
            except Exception:  # a listener's bug must not break the connection
                log.exception("connection event listener failed on %s", ev.kind)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> None:
        """Until a link or a partition map changes, or ``timeout`` seconds."""
        ev = self.changed
        try:
            async with self.clock.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            pass

    # -- links -----------------------------------------------------------------------------------

    async def _open(self) -> None:
        todo, tried = list(self.params.hosts), set()
        while todo:
            host, port = todo.pop(0)
            tried.add((host, port))
            link = await self._dial(host, port)
            if link is not None:
                self._set_primary(link)
                break
            todo[:0] = [h for h in self._hints if h not in tried and h not in todo]
        else:
            hosts = ", ".join(f"{h}:{p}" for h, p in self.params.hosts)
            if self.buffer_path is None:
                why = self._last_dial_error
                raise ConnectionClosedError(f"cannot connect to {hosts}: "
                                            f"{why.partition(': ')[2] if len(self.params.hosts) == 1 else why}")
            log.warning("durable connection: no node of %s is reachable; buffering sends to %s",
                        hosts, self.buffer_path)
        self._keeper = asyncio.create_task(self._keep_primary(), name="tandem-durable-primary")

    async def _open_link(self, host: str, port: int) -> Connection:
        """A new link to one node, its handshake done (the one place that opens sockets)."""
        params = ConnectParams(**{**_params_dict(self.params), "hosts": ((host, port),)})
        link = Connection(params, clock=self.clock)
        try:
            async with self.clock.timeout(self.params.connect_timeout):
                await link._open(follow_hint=False)  # the durable connection follows hints itself
        except BaseException:
            link._reset()
            raise
        return link

    async def _dial(self, host: str, port: int) -> Connection | None:
        """A link to ``host:port`` registered with this connection, or None if it does not answer."""
        try:
            link = await self._open_link(host, port)
        except TandemError as exc:
            if not exc.retriable:
                raise
            self._dial_failed(host, port, exc)
            self._note_hint(exc)  # after: the refusing node's own address is never its hint
            return None
        except (OSError, TimeoutError) as exc:
            self._dial_failed(host, port, exc)
            return None
        self._failed_at.pop((host, port), None)
        name = link.node or f"{host}:{port}"
        if self._closed:
            await link.close()
            return None
        old = self.links.get(name)
        if old is not None and not old.is_closed:
            await link.close()
            return old
        link.on_map_changed = self._on_map_changed
        link.on_closed = self._on_link_closed
        self.links[name] = link
        self.addresses.setdefault(name, (host, port))
        self._changed()
        return link

    def _note_hint(self, exc: TandemError) -> None:
        hint = exc.active_hint if isinstance(exc, NotActiveError) else None
        host, _, port = (hint or "").rpartition(":")
        if host and port.isdigit():
            addr = (host, int(port))
            if addr in self._hints:
                self._hints.remove(addr)
            self._hints.insert(0, addr)
            del self._hints[4:]

    def _dial_failed(self, host: str, port: int, exc: BaseException) -> None:
        # (a link's own error already names the address it dialled: "cannot connect to h:p: why")
        why = str(exc)
        self._last_dial_error = why.removeprefix("cannot connect to ") if why.startswith("cannot connect to ") \
            else f"{host}:{port}: {why}"
        if (host, port) in self._hints:  # a hint that does not answer is stale
            self._hints.remove((host, port))
        if (host, port) not in self._failed_at:  # said once, until it answers again
            log.info("durable connection: %s:%d does not answer: %s", host, port, exc)
        self._failed_at[(host, port)] = self.clock.monotonic()

    def _set_primary(self, link: Connection) -> None:
        before = self._last_primary
        self._primary = link
        self._last_primary = link.node or ""
        self._primary_lost.clear()
        self._primary_up.set()
        if before is None:
            self._emit(ConnectionEvent("connected", link.node or ""))
        elif before != link.node:
            self._emit(ConnectionEvent("failed_over", link.node or "", f"from {before}"))
        else:
            log.info("durable connection: reconnected to %s", link.node)

    def _on_link_closed(self, link: Connection, exc: TandemError) -> None:
        name = link.node or ""
        if self.links.get(name) is link:
            del self.links[name]
        if self._closed or link.closed_by_client:
            return
        self._emit(ConnectionEvent("disconnected", name, str(exc)))
        if link is self._primary:
            self._primary = None
            self._primary_up.clear()
            self._primary_lost.set()
        self.map_epoch += 1  # who is active may be what just changed
        self._changed()

    def _on_map_changed(self, node: str) -> None:
        self.map_epoch += 1
        self._changed()

    def _candidates(self) -> list[tuple[str, int]]:
        """Addresses to try for a new primary: known members first, then the URL's hosts."""
        seen: list[tuple[str, int]] = []
        for addr in list(self.addresses.values()) + list(self.params.hosts):
            if addr not in seen:
                seen.append(addr)
        self._rng.shuffle(seen)
        return self._hints + [a for a in seen if a not in self._hints]

    async def _keep_primary(self) -> None:
        backoff = Backoff(rng=self._rng)
        while not self._closed:
            if self._primary is not None and not self._primary.is_closed:
                await self._primary_lost.wait()
                continue
            for name, link in list(self.links.items()):  # a link that is up already will do
                if not link.is_closed:
                    self._set_primary(link)
                    backoff.reset()
                    break
            else:
                dialed = await self._redial(backoff)
                if dialed is not None:
                    self._set_primary(dialed)
                    backoff.reset()

    async def _redial(self, backoff: Backoff) -> Connection | None:
        """Dial every known address at once (where refusing nodes pointed first), again
        after each backoff interval for those that answered no, until one opens.  A dial
        that hangs (a node that accepts TCP but never answers: stopped, SIGSTOP) runs on
        meanwhile and never holds up one that answers."""
        inflight: dict[tuple[str, int], asyncio.Future[Connection | None]] = {}

        async def one(host: str, port: int) -> Connection | None:
            try:
                return await self._dial(host, port)
            except TandemError as exc:  # refused for good (bad credentials): say so, keep trying
                log.error("durable connection: %s:%d refused: %s", host, port, exc)
                return None

        try:
            while not self._closed:
                dialed_now: set[tuple[str, int]] = set()
                for addr in self._candidates():
                    if addr not in inflight:
                        inflight[addr] = asyncio.ensure_future(one(*addr))
                        dialed_now.add(addr)
                deadline = self.clock.monotonic() + backoff.next()
                while True:
                    for addr, task in list(inflight.items()):
                        if task.done():
                            del inflight[addr]
                            link = task.result()
                            if link is not None and not link.is_closed:
                                return link
                    for addr in self._hints:  # where a node that said no pointed: at once
                        if addr not in inflight and addr not in dialed_now:
                            inflight[addr] = asyncio.ensure_future(one(*addr))
                            dialed_now.add(addr)
                    remaining = deadline - self.clock.monotonic()
                    if remaining <= 0 or self._closed:
                        break
                    if not inflight:
                        await self.clock.sleep(remaining)
                        break
                    try:
                        async with self.clock.timeout(remaining):
                            await asyncio.wait(inflight.values(), return_when=asyncio.FIRST_COMPLETED)
                    except TimeoutError:
                        pass  # the interval is over: those that said no are dialed again
            return None
        finally:
            for task in inflight.values():  # let them finish: a link they open is kept
                task.add_done_callback(_consume)

    async def primary(self, deadline: float | None = None) -> Connection:
        """The primary link, waiting (until ``deadline``, monotonic) while it is being re-dialed."""
        while True:
            if self._closed:
                raise ConnectionClosedError("connection closed by the client")
            p = self._primary
            if p is not None and not p.is_closed:
                return p
            remaining = None if deadline is None else deadline - self.clock.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError_("no node of the group is reachable")
            try:
                async with self.clock.timeout(remaining):
                    await self._primary_up.wait()
            except TimeoutError:
                raise TimeoutError_("no node of the group is reachable") from None

    @property
    def connected(self) -> bool:
        return self._primary is not None and not self._primary.is_closed

    def link_now(self, node: str) -> Connection | None:
        """The open link to ``node``, or None (and a dial is started if its address is known)."""
        link = self.links.get(node)
        if link is not None and not link.is_closed:
            return link
        if node and node in self.addresses and node not in self._opening and not self._closed:
            if self.clock.monotonic() >= self._link_retry.get(node, 0.0):
                self._link_retry[node] = self.clock.monotonic() + 0.2 + self._rng.random() * 0.3
                host, port = self.addresses[node]
                task = asyncio.create_task(self._dial(host, port), name=f"tandem-durable-dial-{node}")
                self._opening[node] = task
                task.add_done_callback(functools.partial(self._dialed, node))
        return None

    def _dialed(self, node: str, task: asyncio.Task[Connection | None]) -> None:
        self._opening.pop(node, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("durable connection: dialing %s failed: %s", node, task.exception())
        self._changed()

    def failed_since(self, node: str, since: float) -> bool:
        """Whether a dial of ``node`` failed at or after ``since`` and none has answered since
        (it refused the connection, or did not answer in time)."""
        addr = self.addresses.get(node)
        return addr is not None and self._failed_at.get(addr, float("-inf")) >= since

    async def link(self, node: str, deadline: float) -> Connection:
        """A link to ``node``, dialing it if need be (until ``deadline``)."""
        while True:
            link = self.link_now(node)
            if link is not None:
                return link
            if node not in self.addresses:
                raise UnavailableError(f"no address known for node {node!r}")
            if self.clock.monotonic() >= deadline or self._closed:
                raise UnavailableError(f"node {node} is not reachable")
            await self.wait_changed(min(0.5, max(0.01, deadline - self.clock.monotonic())))

    # -- requests that are not about one partition ---------------------------------------------

    async def _call(self, fn: Callable[[Connection], Awaitable[T]], *, retry: bool = True,
                    timeout: float | None = None) -> T:
        """Run ``fn`` on the primary link; with ``retry``, again (on another node if need be)
        after a transient failure, until ``timeout`` (default ``request_timeout``)."""
        deadline = self.clock.monotonic() + (timeout or self.request_timeout)
        backoff = Backoff(rng=self._rng)
        while True:
            link = await self.primary(deadline)
            try:
                async with self.clock.timeout(max(0.05, deadline - self.clock.monotonic())):
                    return await fn(link)
            except TimeoutError:
                # no answer in time: the node may hang; another member may answer (a request
                # that is not retried is not sent again)
                if link is self._primary:
                    await self._rotate(link)
                if not retry or self.clock.monotonic() >= deadline or self._closed:
                    raise TimeoutError_(f"node {link.node} did not answer in time") from None
            except TandemError as exc:
                if not retry or not exc.should_retry or self.clock.monotonic() >= deadline or self._closed:
                    raise
                if exc.retry is Retry.OTHER_NODE and link is self._primary:
                    await self._rotate(link)  # a member without quorum or going away: ask another
                await self.clock.sleep(backoff.next())

    async def _rotate(self, current: Connection) -> None:
        """Make a link to another node the primary, if one answers (at most once a second)."""
        now = self.clock.monotonic()
        if now - self._rotated_at < 1.0:
            return
        self._rotated_at = now
        for name, link in list(self.links.items()):
            if link is not current and not link.is_closed:
                self._set_primary(link)
                return
        here = self.addresses.get(current.node or "")
        for host, port in self._candidates():
            if (host, port) == here:
                continue
            try:
                dialed = await self._dial(host, port)
            except TandemError:
                continue
            if dialed is not None and dialed is not current:
                self._set_primary(dialed)
                return

    @property
    def node(self) -> str | None:
        """The node the primary link is connected to (None while re-dialing)."""
        return self._primary.node if self._primary is not None else None

    async def partition_map(self, queue: str, *, timeout: float | None = None) -> PartitionMap:
        """The queue's partition map, fetched again after any MapChanged or link failure.

        When the primary's node answers without quorum, the other nodes are asked too
        (:mod:`client.durable.routing`): the map is what the nodes with quorum say, and the
        primary link moves to one of them."""
        epoch = self.map_epoch
        cached = self._maps.get(queue)
        if cached is not None and cached[0] == epoch:
            return cached[1]

        async def ask(c: Connection) -> MapAnswer:
            ok = await c.metadata(queue)
            return MapAnswer(c.node or "", ok.map, ok.quorum)

        first = await self._call(ask, timeout=timeout)
        self._learn_addresses(first.map)
        answers = [first]
        if routing.ask_others(first):
            answers += await self._ask_others(queue, first.node, answers)
            serving = routing.serving_node(answers, first.node)
            link = self.links.get(serving)
            if serving != first.node and link is not None and not link.is_closed and not self._closed:
                log.info("durable connection: %s has no quorum; requests go to %s", first.node, serving)
                self._set_primary(link)
        m = routing.merge(answers)
        self._learn_addresses(m)
        self._maps[queue] = (epoch, m)
        return m

    def _learn_addresses(self, m: PartitionMap) -> None:
        for name, addr in m.addresses.items():
            host, _, port = addr.rpartition(":")
            if host and port.isdigit():
                self.addresses[name] = (host, int(port))

    async def _ask_others(self, queue: str, exclude: str, answers: list[MapAnswer]) -> list[MapAnswer]:
        """The partition maps of the other nodes (known members, then URL hosts of unknown
        name) that answer within :data:`MAP_FANOUT_TIMEOUT`, until those with quorum name an
        active for every partition.  A link opened for it is kept."""
        known = set(self.addresses.values())
        targets: list[tuple[str, tuple[str, int]]] = [(n, a) for n, a in self.addresses.items() if n != exclude]
        targets += [("", a) for a in self.params.hosts if a not in known]

        async def one(name: str, addr: tuple[str, int]) -> MapAnswer | None:
            try:
                link = await self._map_link(name, addr)
                if link is None or link.node == exclude:
                    return None
                ok = await link.metadata(queue)
                return MapAnswer(link.node or "", ok.map, ok.quorum)
            except (TandemError, OSError) as exc:
                log.debug("durable connection: no partition map from %s: %s", name or addr, exc)
                return None

        tasks = [asyncio.ensure_future(one(n, a)) for n, a in targets]
        got: list[MapAnswer] = []
        deadline = self.clock.monotonic() + MAP_FANOUT_TIMEOUT
        pending = set(tasks)
        try:
            while pending and not routing.settled([*answers, *got]):
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    break
                try:
                    async with self.clock.timeout(remaining):
                        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                except TimeoutError:
                    break
                for t in tasks:  # in the order asked: the known members first
                    answer = t.result() if t in done else None
                    if answer is not None:
                        got.append(answer)
        finally:
            for t in pending:  # a hanging node: its answer (or link) comes later or never
                t.add_done_callback(_consume)
        return got

    async def _map_link(self, name: str, addr: tuple[str, int]) -> Connection | None:
        """An open link to node ``name`` (or, with no name, to ``addr``), dialing it if need be."""
        if name:
            link = self.link_now(name)  # starts a dial unless one runs or one failed just now
            if link is not None:
                return link
            opening = self._opening.get(name)
            return None if opening is None else await asyncio.shield(opening)
        return await self._dial(*addr)

    @property
    def is_closed(self) -> bool:
        return self._closed


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a dial that failed after another won is no news
