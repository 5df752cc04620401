"""Where peer links come from: the :class:`PeerTransport` the peer manager listens on and dials
through, and :data:`TCP`, the one every node process uses.

A transport hands the peer links a connection as an asyncio ``StreamReader`` / ``StreamWriter``
pair and nothing more: the handshake, authentication, framing and keep-alives above it are the
links' own, whatever carries the bytes.  :class:`TcpTransport` carries them over TCP, with TLS
when the peer links use it (``peer_tls``, docs/security.md): the listener reports a failed TLS
handshake as ``refused`` (the peer port counts it as an intruder), and a dial gives up after
:func:`broker.peers.links.connect_timeout`.  A test passes a transport of its own to the
:class:`~broker.node.node.Node` (``transport=``) to run a group's links in memory
(``tests/harness/``, docs/testing.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from broker.config import NodeConfig
from broker.peers.links import HANDSHAKE_TIMEOUT, LinkTasks, connect
from broker.security.tls import TlsServer, peer_server_context
from client.clock import Clock

#: serves one accepted connection until its link ends
Accept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]
#: told of a connection refused before it reached ``Accept`` ("host:port", why): a failed TLS handshake
Refused = Callable[[str, str], None]


class Listener(Protocol):
    """A peer port being listened on."""

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) where it listens (the port chosen, when 0 was asked for)."""

    def close(self) -> None:
        """Accept no more connections (those accepted are the links' to end)."""

    async def wait_closed(self) -> None: ...


class PeerTransport(Protocol):
    async def listen(self, config: NodeConfig, clock: Clock, accept: Accept, *, refused: Refused,
                     tasks: LinkTasks) -> Listener:
        """Listen on ``config``'s host and peer port; each connection is served by ``accept`` in a
        task of ``tasks``."""

    async def connect(self, config: NodeConfig, clock: Clock, host: str, port: int
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the peer port at ``host:port``; OSError or TimeoutError when none is made."""


class _TcpListener:
    def __init__(self, server: asyncio.Server | TlsServer) -> None:
        self._server = server
        sock = server.sockets[0].getsockname()
        self.address: tuple[str, int] = (sock[0], sock[1])

    def close(self) -> None:
        self._server.close()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


class TcpTransport:
    """Peer links over TCP, with TLS when the settings ask for it."""

    async def listen(self, config: NodeConfig, clock: Clock, accept: Accept, *, refused: Refused,
                     tasks: LinkTasks) -> Listener:
        ctx = peer_server_context(config)
        if ctx is None:
            def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                tasks.spawn(accept(reader, writer), name="tandem-peer-accepted")

            return _TcpListener(await asyncio.start_server(accepted, config.host, config.peer_port))
        # mutual TLS: a failed TLS handshake is an intruder too; the connections run in tasks of ``tasks``
        server = TlsServer(accept, refused, ctx, handshake_timeout=HANDSHAKE_TIMEOUT, tasks=tasks.running, clock=clock)
        return _TcpListener(await server.start(config.host, config.peer_port or 0))

    async def connect(self, config: NodeConfig, clock: Clock, host: str, port: int
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await connect(config, clock, host, port)


#: the transport of every node process
TCP: PeerTransport = TcpTransport()
