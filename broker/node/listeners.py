"""A node's client ports: Tandem's own (``port``) and, with ``amqp_port``, the AMQP 0-9-1 front
door (:mod:`broker.amqp`).  Both are bound before the node starts serving (peers learn the
client address in their handshake) and serve once everything is set up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from broker.amqp.session import AmqpSession
from broker.config import NodeConfig
from broker.security import tls
from broker.sessions.session import Session

#: what a connection on a client port is handed to: the node's handler, with its session's kind
OnClient = Callable[[type[Session], asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Listeners:
    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.amqp_address: tuple[str, int] | None = None

    async def bind(self, cfg: NodeConfig, on_client: OnClient) -> tuple[str, int]:
        """Bind the client ports; the address of Tandem's."""
        ssl = tls.client_server_context(cfg)

        def handler(kind: type[Session]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
            return lambda reader, writer: on_client(kind, reader, writer)

        server = await asyncio.start_server(handler(Session), cfg.host, cfg.port, limit=1 << 20, ssl=ssl,
                                            start_serving=False)
        self.servers.append(server)
        if cfg.amqp_port is not None:
            amqp = await asyncio.start_server(handler(AmqpSession), cfg.host, cfg.amqp_port, limit=1 << 20,
                                              ssl=ssl, start_serving=False)
            self.servers.append(amqp)
            sock = amqp.sockets[0].getsockname()
            self.amqp_address = (sock[0], sock[1])
        sock = server.sockets[0].getsockname()
        return sock[0], sock[1]

    async def serve(self) -> None:
        for server in self.servers:
            await server.start_serving()

    def close(self) -> None:
        for server in self.servers:
            server.close()

    async def wait_closed(self) -> None:
        for server in self.servers:
            await server.wait_closed()
