"""The client port spoken by hand (client.protocol): a Hello with any user name, the
AuthChallenge it gets, a proof that fails."""

from __future__ import annotations

import asyncio

from client import scram
from client.clock import SYSTEM_CLOCK
from client.protocol import MAX_VERSION, MIN_VERSION, Frame, FrameBuffer, encode
from client.protocol.frames import AuthChallenge, AuthResponse, Error, Hello
from tests.helpers import read_frame


class RawLogin:
    """One connection to a node's client port, logging in as ``user`` step by step."""

    def __init__(self, host: str, port: int, user: str, password: str = "not-the-password", *,
                 client_name: str = "probe") -> None:
        self.host, self.port, self.user, self.client_name = host, port, user, client_name
        self.scram = scram.ScramClient(user, password)
        self._buf = FrameBuffer()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawLogin:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    async def _frame(self) -> Frame:
        assert self._reader is not None
        async with SYSTEM_CLOCK.timeout(30):
            frame = await read_frame(self._reader, self._buf)
        if frame is None:
            raise ConnectionError("the node closed the connection")
        return frame

    def _send(self, frame: Frame) -> None:
        assert self._writer is not None
        self._writer.write(encode(frame))

    async def challenge(self) -> tuple[bytes, int]:
        """Hello; the salt and iteration count of the node's AuthChallenge."""
        self._send(Hello(min_version=MIN_VERSION, max_version=MAX_VERSION, client_name=self.client_name,
                         user=self.user, mechanism=scram.MECHANISM, auth=self.scram.first))
        frame = await self._frame()
        assert isinstance(frame, AuthChallenge), f"expected AuthChallenge, got {frame!r}"
        return self.scram.challenge(frame.data)

    async def fail(self) -> Error:
        """After :meth:`challenge`: the proof of the (wrong) password; the node's refusal."""
        salted = await asyncio.to_thread(self.scram.salt_password)
        self._send(AuthResponse(data=self.scram.final(salted)))
        frame = await self._frame()
        assert isinstance(frame, Error), f"expected Error, got {frame!r}"
        return frame


async def challenge(host: str, port: int, user: str) -> tuple[bytes, int]:
    """The salt and iteration count a node challenges ``user`` with (no login follows)."""
    async with RawLogin(host, port, user) as login:
        return await login.challenge()
