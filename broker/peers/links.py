"""A peer link's connection (its socket, protocol state and frames), the connect that opens
one, the owner of the link tasks, and the timeouts and limits of the peer links.

A :class:`Link` is one TCP connection (TLS on it when peer links use TLS) with the
sans-IO :class:`client.protocol.ProtocolConnection` that frames it.  Every task the peer links
run (an accepted link, a dialer, the answer to a forwarded request) belongs to a
:class:`LinkTasks`, which :meth:`broker.peers.peers.PeerManager.stop` ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from broker.config import NodeConfig
from broker.logsafe import escape
from broker.security.tls import peer_dial_tls
from client.clock import Clock
from client.errors import ErrorCode, TandemError, UnsupportedProtocolError
from client.protocol import NEED_DATA, ConnectionEnded, ProtocolConnection
from client.protocol.frames import Close, Error, Frame, expect

log = logging.getLogger("tandem.ha")

HANDSHAKE_TIMEOUT = 5.0
#: seconds a link to a removed member stays open (tandem group remove): long enough for the
#: catalogue's active to tell it that it is no longer a member (broker.modes.replicated.reconcile)
FAREWELL_LINGER = 12.0
REDIAL_MAX = 2.0  # the longest wait between dials of a peer not known to be Down (never seen yet, refusing)
#: dials in a row that nothing answers before a member is also dialled where it said it is
MOVED_AFTER = 2
PEER_MAX_FRAME = 512 * 1024 * 1024  # snapshots of large partitions travel in one frame (once admitted)
FORWARD_TIMEOUT = 30.0


def connect_timeout(keepalive_interval: float) -> float:
    """How long a dial waits for the TCP connection (the TLS handshake has HANDSHAKE_TIMEOUT
    of its own): two keep-alive intervals, at least half a second."""
    return min(HANDSHAKE_TIMEOUT, max(0.5, 2 * keepalive_interval))


def host_port(host: str, port: int) -> str:
    """"host:port", an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def connect(config: NodeConfig, clock: Clock, host: str, port: int
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to a peer's port, TLS on it if peer links use TLS; the TCP connect gives up
    after connect_timeout, the TLS handshake after HANDSHAKE_TIMEOUT."""
    tls = peer_dial_tls(config, host)
    async with clock.timeout(connect_timeout(config.keepalive_interval)):
        reader, writer = await asyncio.open_connection(host, port)
    if tls:
        try:
            async with clock.timeout(HANDSHAKE_TIMEOUT):
                await writer.start_tls(tls["ssl"], server_hostname=tls["server_hostname"])
        except BaseException:
            writer.transport.abort()
            raise
    return reader, writer


class Link:
    """One peer link: ``name`` the member at the other end ("" until its handshake names it)."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 proto: ProtocolConnection) -> None:
        self.name, self.reader, self.writer, self.proto = name, reader, writer, proto

    def send(self, frame: Frame) -> None:
        if not self.writer.is_closing():
            self.writer.write(self.proto.send(frame))

    async def next_frame(self) -> Frame:
        """The next frame from the other end; ConnectionResetError once the link has ended, a
        TandemError for bytes that are no frame or a frame out of turn."""
        while True:
            event = self.proto.next_event()
            if event is NEED_DATA:
                data = await self.reader.read(65536)
                self.proto.receive_data(data)
                continue
            if isinstance(event, ConnectionEnded):
                raise ConnectionResetError("peer link closed")
            return expect(event, Frame)

    def certificate(self) -> tuple[bool, dict[str, Any] | None]:
        """(whether the link is TLS, the other end's certificate as ``getpeercert()`` gives it)."""
        ssl_object = self.writer.get_extra_info("ssl_object")
        if ssl_object is None:
            return False, None
        return True, ssl_object.getpeercert() or None

    def close(self) -> None:
        self.writer.close()

    async def drain(self) -> None:
        """Until what is queued to send is down to the transport's low-water mark
        (ConnectionError once the link is gone)."""
        await self.writer.drain()

    def abort(self) -> None:
        """Close at once, dropping what is still queued (a dead link would never take it)."""
        self.writer.transport.abort()

    def refuse(self, why: str) -> None:
        """Refuse the node at the other end as it is configured (not an intruder): logged, and
        it is told ``why`` before the link closes."""
        log.warning("peer link %s refused: %s", escape(self.name), escape(why))
        try:
            self.send(Error(rid=0, code=int(UnsupportedProtocolError.code), message=why))
            self.send(Close(code=int(UnsupportedProtocolError.code), reason=why))
        except TandemError:
            pass  # the protocol already forbids more output on this link; closing it is all that is left
        self.close()

    def fail_authentication(self) -> None:
        """Close a link that failed authentication; the other end learns only that it failed."""
        for frame in (Error(rid=0, code=int(ErrorCode.PROTOCOL_ERROR), message="peer authentication failed"),
                      Close(code=int(ErrorCode.PROTOCOL_ERROR), reason="peer authentication failed")):
            try:
                self.send(frame)
            except TandemError:
                pass  # the protocol forbids this frame on this side now (a dialer sends no Error)
        self.close()


class LinkTasks:
    """The tasks of the peer links: each kept until it ends (one that fails is logged, with its
    name), all cancelled and awaited by :meth:`close`."""

    def __init__(self) -> None:
        #: the tasks running now (a TLS listener adds the connections it accepts: broker.security.tls)
        self.running: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.running.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("task %s failed: %r", task.get_name(), exc, exc_info=exc)

    async def close(self) -> None:
        """Cancel every task (but the caller's own) and wait until each has ended."""
        me = asyncio.current_task()
        while tasks := [t for t in self.running if t is not me and not t.done()]:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # (a failed one is logged as it ends)
