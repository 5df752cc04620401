"""Requests forwarded over the peer links (location transparency): the ones this node sent,
waiting for their answers, and the answers it gives to the ones it is sent.

A request for a partition (or the queue catalogue) whose active is another member travels to
it as a ``Forward`` frame with a request id; the answer comes back as ``ForwardOk`` or as an
``Error`` with that id.  A request whose link is lost, or that gets no answer in
FORWARD_TIMEOUT, fails with UnavailableError (retriable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker.messaging.forward import ForwardRequest
from broker.peers.links import FORWARD_TIMEOUT, Link
from client.clock import Clock
from client.errors import ErrorCode, TandemError, UnavailableError, for_code
from client.protocol.frames import Error, Forward, ForwardOk

log = logging.getLogger("tandem.ha")


class Forwards:
    """The forwarded requests of one node's peer links.  ``handle``: how this node does a request
    it is forwarded (the link it came over, its kind, its payload) -> the reply's payload;
    ``lost``: told of each link that ended (what was bound to it ends too)."""

    def __init__(self, clock: Clock, handle: Callable[[Link, int, bytes], Awaitable[bytes]],
                 lost: Callable[[Link], None]) -> None:
        self.clock, self.handle, self.lost = clock, handle, lost
        self._next_rid = 1
        self._waiting: dict[int, tuple[Link, asyncio.Future[bytes]]] = {}  # rid -> (its link, its answer)

    async def ask(self, link: Link, request: ForwardRequest) -> bytes:
        """Ask the member at the other end of ``link`` to do ``request``; its reply, or the error
        it raised."""
        kind = request.KIND.name
        rid = self._next_rid
        self._next_rid += 1
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (link, fut)
        try:
            link.send(Forward(rid=rid, kind=int(request.KIND), payload=request.pack()))
            async with self.clock.timeout(FORWARD_TIMEOUT):
                return await fut
        except TimeoutError:
            raise UnavailableError(f"node {link.name} did not answer a forwarded {kind} in {FORWARD_TIMEOUT:.0f} s") \
                from None
        finally:
            self._waiting.pop(rid, None)

    def answered(self, frame: ForwardOk | Error) -> None:
        """The answer to request ``frame.rid`` (an Error: the error the member raised)."""
        entry = self._waiting.get(frame.rid)
        if entry is None or entry[1].done():
            return
        if isinstance(frame, ForwardOk):
            entry[1].set_result(frame.payload)
        else:
            entry[1].set_exception(for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                            next_seq=frame.next_seq))

    async def answer(self, link: Link, f: Forward) -> None:
        """Do the request ``f`` the member at the other end of ``link`` forwarded, and answer it."""
        try:
            out = await self.handle(link, f.kind, f.payload)
            link.send(ForwardOk(rid=f.rid, payload=out))
        except TandemError as exc:
            link.send(Error(rid=f.rid, code=int(exc.code), message=exc.message,
                            active_hint=getattr(exc, "active_hint", None),
                            next_seq=getattr(exc, "next_seq", None)))
        except Exception as exc:  # a bug must not kill the link: answer, and log it
            log.exception("forwarded %s from %s failed", f.kind, link.name)
            link.send(Error(rid=f.rid, code=int(ErrorCode.INTERNAL_ERROR), message=repr(exc)))

    def link_lost(self, link: Link) -> None:
        """``link`` ended: the requests sent over it fail."""
        for _rid, (via, fut) in list(self._waiting.items()):
            if via is link and not fut.done():
                fut.set_exception(UnavailableError(f"link to node {link.name} lost during a forwarded request"))
        self.lost(link)

    def stop(self, me: str) -> None:
        """Node ``me`` is stopping: every request still waiting fails."""
        for _link, fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(UnavailableError(f"node {me} is shutting down"))
