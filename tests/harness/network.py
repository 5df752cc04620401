"""An in-memory network for peer links: named endpoints, connections made of asyncio
``StreamReader`` / ``StreamWriter`` pairs, and the faults a test controls.

Each node gets an endpoint (:meth:`MemoryNetwork.endpoint`), a
:class:`broker.peers.transport.PeerTransport` that listens and dials here instead of on TCP.
A connection carries bytes in two *pipes*, one per direction; a pipe is a TCP stream: bytes
arrive whole and in order, or not at all.  So what the faults do is what a network does to TCP:

* **cut** ``a -> b`` (one way) or both ways: a pipe from ``a`` to ``b`` holds what is written
  to it, as TCP retransmits into a black hole; :meth:`MemoryNetwork.heal` lets it through,
  in order, unless an end gave up on the connection first.  A dial across a cut (either way:
  TCP's handshake needs both) hangs until the dialer's timeout.
* **drop**: the connections between two endpoints are reset at once, both ends see
  ``ConnectionResetError`` (a middlebox's RST).
* **delay** and **reorder**: every write waits a delay drawn from the network's seeded
  ``random.Random`` (up to ``max_delay``, per pipe if set).  Within one pipe the order is kept
  (TCP); writes on different connections, and the two directions of one, overtake each other.
* **crash** an endpoint (its node killed): its listener goes, and its connections are reset
  towards the other ends (a killed process's sockets are closed by the OS), or, ``silent``,
  go quiet (a machine that lost power: the other ends learn it by their keep-alive timeouts).

Time is the group's :class:`client.testing.FakeClock`: a delay is a timer on it, so nothing
moves until the test advances the clock, and a seed replays exactly.  There is no TLS here
(``Link.certificate`` sees a plaintext link) and no socket buffer limits: a write never blocks.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
from collections import deque
from typing import Any

from broker.config import NodeConfig
from broker.peers.links import LinkTasks, connect_timeout
from broker.peers.transport import Accept, Listener, Refused
from client.clock import Clock
from client.testing import FakeClock

Address = tuple[str, int]

_EOF = object()  # in a pipe: the writer closed (a FIN)
_RST = object()  # in a pipe: the writer aborted (an RST)


class _Pipe:
    """One direction of a connection: from endpoint ``src`` to ``dst``'s transport ``to``."""

    def __init__(self, src: str, dst: str) -> None:
        self.src, self.dst = src, dst
        self.to: MemoryTransport | None = None
        self.held: list[object] = []  # written while the pipe is cut
        self.flight: deque[object] = deque()  # on its way, in order
        self.last_at = 0.0  # when the last chunk on its way arrives (order is kept)
        self.gone = False  # the connection is over for this direction: nothing more arrives


class Connection:
    """Two pipes and the transports at their ends."""

    def __init__(self, dialer: str, acceptor: str) -> None:
        self.ends = (dialer, acceptor)
        self.out, self.back = _Pipe(dialer, acceptor), _Pipe(acceptor, dialer)
        self.dialer_side: MemoryTransport | None = None
        self.acceptor_side: MemoryTransport | None = None


class MemoryTransport(asyncio.Transport):
    """One end of a connection, as asyncio's streams see a socket transport."""

    def __init__(self, net: MemoryNetwork, conn: Connection, pipe: _Pipe, protocol: asyncio.Protocol,
                 extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self._net, self._conn, self._pipe, self._protocol = net, conn, pipe, protocol
        self._closing = False
        self._lost = False
        self._paused = False
        self._inbox: deque[object] = deque()  # arrived while reading is paused

    # -- writing ----------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._net._send(self._pipe, bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self._closing:
            self._net._send(self._pipe, _EOF)

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    # -- closing ----------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """A FIN after what was written; this end is done."""
        if self._closing:
            return
        self._closing = True
        self._net._send(self._pipe, _EOF)
        self._lose(None)

    def abort(self) -> None:
        """An RST: what is on its way towards the other end may be lost; this end is done."""
        if self._closing and self._lost:
            return
        self._closing = True
        self._net._send(self._pipe, _RST)
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        """This end ends: its protocol is told once, on the next turn of the loop."""
        if self._lost:
            return
        self._lost = self._closing = True
        self._net.loop.call_soon(self._protocol.connection_lost, exc)

    # -- reading ----------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            while self._inbox and not self._paused and not self._lost:
                self._take(self._inbox.popleft())

    def is_reading(self) -> bool:
        return not self._paused

    def _arrive(self, chunk: object) -> None:
        if self._lost:
            return
        if self._paused:
            self._inbox.append(chunk)
        else:
            self._take(chunk)

    def _take(self, chunk: object) -> None:
        if chunk is _EOF:
            self._protocol.eof_received()
        elif chunk is _RST:
            self._lose(ConnectionResetError("connection reset by peer"))
        else:
            self._protocol.data_received(chunk)  # type: ignore[arg-type]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]


class _Listening:
    def __init__(self, name: str, address: Address, accept: Accept, tasks: LinkTasks,
                 context: contextvars.Context) -> None:
        self.name, self.address, self.accept, self.tasks, self.context = name, address, accept, tasks, context
        self.closed = asyncio.Event()


class _MemoryListener:
    """What :meth:`Endpoint.listen` returns (a :class:`broker.peers.transport.Listener`)."""

    def __init__(self, net: MemoryNetwork, listening: _Listening) -> None:
        self._net, self._listening = net, listening
        self.address = listening.address

    def close(self) -> None:
        self._net._unlisten(self._listening)

    async def wait_closed(self) -> None:
        await self._listening.closed.wait()


class Endpoint:
    """A node's place on the network: the :class:`~broker.peers.transport.PeerTransport` it is given."""

    def __init__(self, net: MemoryNetwork, name: str) -> None:
        self.net, self.name = net, name

    async def listen(self, config: NodeConfig, clock: Clock, accept: Accept, *, refused: Refused,
                     tasks: LinkTasks) -> Listener:
        """Listen at the node's host and peer port (port 0: one is chosen); each connection is
        served by ``accept`` in a task of ``tasks`` made in the listener's context, so that it
        belongs to the node that listens, whoever dialled."""
        port = config.peer_port or next(self.net._ports)
        listening = _Listening(self.name, (config.host, port), accept, tasks, contextvars.copy_context())
        self.net._listen(listening)
        return _MemoryListener(self.net, listening)

    async def connect(self, config: NodeConfig, clock: Clock, host: str, port: int
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host:port``: refused at once where nothing listens (the node is
        dead or stopped), hanging until the dial's timeout across a cut."""
        async with clock.timeout(connect_timeout(config.keepalive_interval)):
            return await self.net._connect(self.name, config.host, (host, port))


class MemoryNetwork:
    """Endpoints, their connections and the faults between them; ``rng`` draws every delay."""

    def __init__(self, clock: FakeClock, rng: random.Random, *, max_delay: float = 0.0) -> None:
        self.clock, self.rng = clock, rng
        self.max_delay = max_delay
        self.delays: dict[tuple[str, str], float] = {}  # (src, dst) -> its own max delay
        self.cuts: set[tuple[str, str]] = set()  # (src, dst): nothing gets from src to dst
        self.connections: list[Connection] = []
        self._listeners: dict[Address, _Listening] = {}
        self._ports = itertools.count(40000)
        self.sent = 0  # chunks written (a test's sanity check that links carried traffic)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(self, name)

    # -- faults -----------------------------------------------------------------------------------

    def cut(self, a: str, b: str, *, both: bool = True) -> None:
        """Nothing gets from ``a`` to ``b`` (and, ``both``, from ``b`` to ``a``) until healed."""
        self.cuts.add((a, b))
        if both:
            self.cuts.add((b, a))

    def isolate(self, name: str, others: list[str]) -> None:
        """Cut ``name`` off from every one of ``others``, both ways."""
        for o in others:
            self.cut(name, o)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Heal the cut between ``a`` and ``b`` (both ways), or every cut: what was held flows."""
        if a is None:
            self.cuts.clear()
        else:
            self.cuts.discard((a, b or ""))
            self.cuts.discard((b or "", a))
        self._prune()
        for conn in self.connections:
            for pipe in (conn.out, conn.back):
                if pipe.held and (pipe.src, pipe.dst) not in self.cuts:
                    held, pipe.held = pipe.held, []
                    for chunk in held:
                        self._schedule(pipe, chunk)

    def drop(self, a: str, b: str) -> int:
        """Reset every connection between ``a`` and ``b`` now (both ends see a reset); how many."""
        n = 0
        for conn in list(self.connections):
            if set(conn.ends) == {a, b}:
                n += 1
                self._reset(conn)
        return n

    def set_delay(self, a: str, b: str, max_delay: float) -> None:
        """Writes from ``a`` to ``b`` wait up to ``max_delay`` (drawn per write)."""
        self.delays[(a, b)] = max_delay

    def crash(self, name: str, *, silent: bool = False) -> None:
        """``name``'s node is gone: its listener closes and its connections end; the other ends
        see a reset (``silent``: nothing at all)."""
        for addr, listening in list(self._listeners.items()):
            if listening.name == name:
                self._unlisten(listening)
        for conn in list(self.connections):
            if name not in conn.ends:
                continue
            mine, theirs = (conn.dialer_side, conn.out) if conn.ends[0] == name else (conn.acceptor_side, conn.back)
            if mine is not None:
                mine._lost = mine._closing = True  # (the process is gone: nobody is told on its side)
            theirs.held.clear()
            if not silent:
                self._send(theirs, _RST)  # (held, like the rest, while the way is cut)

    # -- the machinery ----------------------------------------------------------------------------

    def _listen(self, listening: _Listening) -> None:
        if listening.address in self._listeners:
            raise OSError(98, f"address in use: {listening.address}")
        self._listeners[listening.address] = listening

    def _unlisten(self, listening: _Listening) -> None:
        if self._listeners.get(listening.address) is listening:
            del self._listeners[listening.address]
        listening.closed.set()

    async def _connect(self, src: str, src_host: str, addr: Address
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        listening = self._listeners.get(addr)
        dst = listening.name if listening is not None else None
        if dst is not None and ((src, dst) in self.cuts or (dst, src) in self.cuts):
            await self.loop.create_future()  # (never done: the dial's timeout ends it)
        if listening is None:
            raise ConnectionRefusedError(111, f"connection refused: nothing listens at {addr[0]}:{addr[1]}")
        self._prune()
        conn = Connection(src, listening.name)
        port = next(self._ports)
        dialer_r, dialer_w = self._end(conn, conn.out, conn.back, {"peername": addr, "sockname": (src_host, port)})
        accept_r, accept_w = self._end(conn, conn.back, conn.out, {"peername": (src_host, port), "sockname": addr})
        conn.dialer_side = dialer_w.transport  # type: ignore[assignment]
        conn.acceptor_side = accept_w.transport  # type: ignore[assignment]
        self.connections.append(conn)
        listening.context.run(listening.tasks.spawn, listening.accept(accept_r, accept_w),
                              name="tandem-peer-accepted")
        return dialer_r, dialer_w

    def _end(self, conn: Connection, out: _Pipe, into: _Pipe, extra: dict[str, Any]
             ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = self.loop
        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = MemoryTransport(self, conn, out, protocol, {**extra, "socket": None})
        into.to = transport
        protocol.connection_made(transport)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def _send(self, pipe: _Pipe, chunk: object) -> None:
        if pipe.gone:
            return
        self.sent += 1
        if (pipe.src, pipe.dst) in self.cuts:
            pipe.held.append(chunk)
        else:
            self._schedule(pipe, chunk)

    def _schedule(self, pipe: _Pipe, chunk: object) -> None:
        now = self.clock.monotonic()
        top = self.delays.get((pipe.src, pipe.dst), self.max_delay)
        at = max(now + (self.rng.uniform(0.0, top) if top > 0 else 0.0), pipe.last_at)
        pipe.last_at = at
        pipe.flight.append(chunk)
        if at <= now:
            self.loop.call_soon(self._deliver, pipe)
        else:
            self.clock.call_later(at - now, lambda: self._deliver(pipe))

    def _deliver(self, pipe: _Pipe) -> None:
        """The oldest chunk on its way arrives (one call per chunk, in the order they were sent)."""
        if not pipe.flight:
            return
        chunk = pipe.flight.popleft()
        if pipe.gone or pipe.to is None:
            return
        if chunk is _RST:
            pipe.gone = True
        pipe.to._arrive(chunk)

    def _reset(self, conn: Connection) -> None:
        for side in (conn.dialer_side, conn.acceptor_side):
            if side is not None:
                side._lose(ConnectionResetError("connection reset"))
        self._forget(conn)

    def _forget(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)

    def _prune(self) -> None:
        """Forget the connections both ends are done with, with nothing held between them."""
        self.connections = [c for c in self.connections if not (
            c.dialer_side is not None and c.dialer_side._lost and c.acceptor_side is not None
            and c.acceptor_side._lost and not c.out.held and not c.back.held)]

    def live(self, a: str, b: str) -> int:
        """Connections between ``a`` and ``b`` with both ends still open."""
        return sum(1 for c in self.connections if set(c.ends) == {a, b} and c.dialer_side is not None
                   and c.acceptor_side is not None and not c.dialer_side.is_closing()
                   and not c.acceptor_side.is_closing())

