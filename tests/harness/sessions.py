"""A client session on a harness member, without a socket: the node's own
:class:`broker.sessions.session.Session`, logged in as the member's first admin, fed request
frames one at a time; its answers are read from the bytes it writes.

    s = ClientSession(g, g["n3"])
    reply = await s.ask(Metadata(rid=1, queue="q"))   # MetadataOk, or the Error it sent

What it skips: the Hello and SCRAM exchange (the session starts logged in) and the socket.
What it runs: the session's handling of each request (``Session._handle``), with its own
look-ups, forwarding and the catch-up with the catalogue's active before "does not exist"."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, TypeVar

from broker.sessions.session import Session
from client.errors import ErrorCode
from client.protocol import Frame, FrameBuffer, decode_payload
from client.protocol.frames import Ack, Deliver, Error, Subscribe, SubscribeOk
from client.protocol.connection import State
from tests.harness.group import Group, Member

ASK_TIMEOUT = 30.0  # virtual seconds
F = TypeVar("F", bound=Frame)


class _Writer:
    """What a session writes to its client, kept (an ``asyncio.StreamWriter`` in its place)."""

    def __init__(self) -> None:
        self.buf = FrameBuffer()
        self.closed = False
        self.transport = self  # (its write buffer: always empty, the bytes are taken at once)

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.buf.feed(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    async def drain(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def frames(self) -> list[Frame]:
        out = []
        while (payload := self.buf.next_payload()) is not None:
            out.append(decode_payload(payload))
        return out


class ClientSession:
    """A session on ``m``'s current life, logged in as its admin."""

    def __init__(self, g: Group, m: Member, user: str = "admin") -> None:
        assert m.node is not None and m.life is not None, f"{m.name} is not running"
        self.g, self.m, self.life = g, m, m.life
        self.writer = _Writer()
        node = m.node
        self.session = m.run(Session, node._session_parts, asyncio.StreamReader(), self.writer)
        record = node._session_parts.node.users.get(user)
        assert record is not None, f"{m.name} has no user {user}"
        self.session.user = record
        self.session.proto.state = State.OPEN
        self._held: list[Frame] = []

    def pushed(self, kind: type[F]) -> list[F]:
        """The frames of ``kind`` the session sent unasked (deliveries, cancels) since the last look."""
        self._held += self.writer.frames()
        out = [f for f in self._held if isinstance(f, kind)]
        self._held = [f for f in self._held if not isinstance(f, kind)]
        return out

    async def ask(self, request: Frame) -> Frame:
        """The session's answer to ``request`` (a frame with its rid: the reply or an Error)."""
        rid = getattr(request, "rid")
        task = self.life.spawn(self.session._handle(request), name=f"harness-ask-{type(request).__name__}")
        await self.g.until(task.done, ASK_TIMEOUT, what=f"{self.m.name} to answer {type(request).__name__}")
        task.result()
        return await self.answer(rid)

    async def answer(self, rid: int) -> Frame:
        """The answer with ``rid``, once sent (a publish answers once its commit is confirmed)."""

        def answered() -> bool:
            self._held += self.writer.frames()
            return any(getattr(f, "rid", None) == rid for f in self._held)

        await self.g.until(answered, ASK_TIMEOUT, what=f"{self.m.name}'s answer to request {rid}")
        return next(self._held.pop(i) for i, f in enumerate(self._held) if getattr(f, "rid", None) == rid)


class Reader:
    """A client consuming ``queue`` through one session on ``m``: it acks what it gets (unless
    told to hold it), counts every body it was given and notes when it first got it."""

    def __init__(self, g: Group, m: Member, queue: str, *, prefetch: int = 40, local: bool = False) -> None:
        self.g, self.s, self.queue, self.prefetch, self.local = g, ClientSession(g, m), queue, prefetch, local
        self.rid = 100
        self.got: Counter[bytes] = Counter()
        self.when: dict[bytes, float] = {}  # a body's first delivery, by the group's clock (time())
        self.partitions: set[int] = set()
        self.unknown_tags = 0
        self.consumer = 0
        self.hold = False
        self.held: list[int] = []

    def next_rid(self) -> int:
        self.rid += 1
        return self.rid

    async def subscribe(self) -> None:
        reply = await self.s.ask(Subscribe(rid=self.next_rid(), queue=self.queue, prefetch=self.prefetch,
                                           local=self.local))
        assert isinstance(reply, SubscribeOk), reply
        self.consumer = reply.consumer

    async def step(self) -> None:
        """Take what was delivered; ack it in one frame."""
        tags = []
        for f in self.s.pushed(Deliver):
            assert f.consumer == self.consumer
            for d in f.messages:
                self.got[d.body] += 1
                self.when.setdefault(d.body, self.g.clock.time())
                self.partitions.add(d.partition)
                tags.append(d.tag)
        if self.hold:
            self.held += tags
            return
        if tags:
            reply = await self.s.ask(Ack(rid=self.next_rid(), tags=tags))
            if isinstance(reply, Error):
                assert reply.code == ErrorCode.UNKNOWN_DELIVERY_TAG, reply
                self.unknown_tags += 1

    async def until(self, done: int, timeout: float = 60.0) -> None:
        """Step until ``done`` distinct bodies were given (virtual seconds)."""
        deadline = self.g.clock.monotonic() + timeout
        while len(self.got) < done:
            assert self.g.clock.monotonic() < deadline, f"{len(self.got)} of {done} delivered"
            await self.g.run_for(0.05)
            await self.step()
