"""The attacker's view with no credentials, on every member of a real three-process group:
every request frame sent before the login is refused and the connection closed; the peer port
serves no forwarded request of any kind to a link that has not proved the group secret; every
console route but ``/healthz``, the login and the static files answers 401 (a page: a redirect
to the login); a wrong password or an unknown user gets the same refusal.  At the end the
group is as it was.

Each test opens its own connections and reuses the module's group (tests/security/conftest.py).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

import client
from broker.messaging.forward import ForwardKind
from client.errors import AuthError, ErrorCode
from client.protocol.codec import FrameBuffer, decode_payload, encode
from client.protocol.connection import MAX_VERSION, MIN_VERSION
from client.protocol.frames import (AuthChallenge, AuthResponse, Close, Error, Forward, ForwardOk, Frame, Heartbeat,
                                    Hello, PeerChallenge, PeerHello, PeerWelcome, Replicate)
from client.clock import SYSTEM_CLOCK
from client.scram import MECHANISM, ScramClient
from tests.conftest import PASSWORD
from tests.fuzz.corpus import hello, sample_frame
from tests.helpers import read_frame
from tests.security.conftest import MALLORY, PARTITIONS, PAYMENTS, PER_PARTITION, SecurityGroup, basic
from tests.security.surface import PUBLIC, console_routes, example_path, forward_example, request_frames

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.xdist_group("security-unauthenticated")]

MEMBERS = ["node1", "node2", "node3"]
#: seconds a node has to answer and close
ANSWER = 10.0

#: what a client could send first instead of Hello: every request, the handshake's second
#: frame, a keep-alive, and the peer frames that carry requests and replication
BEFORE_HELLO: list[type[Frame]] = [*request_frames(), AuthResponse, Heartbeat, Forward, Replicate]


@dataclass
class Answer:
    """What a node sent back on one connection, until it closed it."""

    frames: list[Frame] = field(default_factory=list)
    closed: bool = False

    @property
    def errors(self) -> list[Error]:
        return [f for f in self.frames if isinstance(f, Error)]


async def exchange(address: tuple[str, int], frames: list[Frame], *, answers_first: int = 0) -> Answer:
    """Connect, send ``frames`` (after reading ``answers_first`` frames from the node for the
    first of them), then read until the node closes the connection."""
    got = Answer()
    reader, writer = await asyncio.open_connection(*address)
    buf = FrameBuffer(64 * 1024 * 1024)

    async def frame() -> Frame | None:
        f = await read_frame(reader, buf)
        got.closed = f is None
        return f

    try:
        async with SYSTEM_CLOCK.timeout(ANSWER):
            writer.write(encode(frames[0]))
            for _ in range(answers_first):
                f = await frame()
                if f is not None:
                    got.frames.append(f)
            for f in frames[1:]:
                writer.write(encode(f))
            while not got.closed:
                f = await frame()
                if f is not None:
                    got.frames.append(f)
    except ConnectionError:
        got.closed = True  # reset by the node
    finally:
        writer.close()
    return got


# -- the client port ----------------------------------------------------------------------------------


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("cls", BEFORE_HELLO, ids=lambda c: c.__name__)
async def test_a_frame_before_hello_is_refused_and_the_connection_closed(target: SecurityGroup, cls: type[Frame],
                                                                        member: str) -> None:
    got = await exchange(target.client_port(member), [sample_frame(cls)])
    assert got.closed, got.frames
    assert [e.code for e in got.errors] == [ErrorCode.PROTOCOL_ERROR], got.frames
    assert cls.__name__ in got.errors[0].message
    assert all(isinstance(f, (Error, Close)) for f in got.frames), got.frames


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("cls", request_frames(), ids=lambda c: c.__name__)
async def test_a_request_inside_the_handshake_is_refused_and_the_connection_closed(
        target: SecurityGroup, cls: type[Frame], member: str) -> None:
    """Hello names admin, the node challenges, and a request comes instead of the proof."""
    got = await exchange(target.client_port(member), [hello(), sample_frame(cls)], answers_first=1)
    assert isinstance(got.frames[0], AuthChallenge), got.frames
    assert got.closed, got.frames
    assert [e.code for e in got.errors] == [ErrorCode.PROTOCOL_ERROR], got.frames
    assert all(isinstance(f, (AuthChallenge, Error, Close)) for f in got.frames[1:]), got.frames


@pytest.mark.parametrize("member", MEMBERS)
async def test_a_wrong_proof_is_refused_and_the_connection_closed(target: SecurityGroup, member: str) -> None:
    sc = ScramClient("admin", "not-the-password")
    first = Hello(min_version=MIN_VERSION, max_version=MAX_VERSION, client_name="attacker", user="admin",
                  mechanism=MECHANISM, auth=sc.first)
    reader, writer = await asyncio.open_connection(*target.client_port(member))
    buf = FrameBuffer()
    try:
        async with SYSTEM_CLOCK.timeout(ANSWER):
            writer.write(encode(first))
            frames: list[Frame] = []
            while True:
                payload = buf.next_payload()
                if payload is not None:
                    f = decode_payload(payload)
                    frames.append(f)
                    if isinstance(f, AuthChallenge):
                        sc.challenge(f.data)
                        writer.write(encode(AuthResponse(data=sc.final(await asyncio.to_thread(sc.salt_password)))))
                    continue
                data = await reader.read(65536)
                if not data:
                    break
                buf.feed(data)
    finally:
        writer.close()
    errors = [f for f in frames if isinstance(f, Error)]
    assert [e.code for e in errors] == [ErrorCode.AUTHENTICATION_FAILED], frames
    assert not any(type(f).__name__ == "Welcome" for f in frames), frames
    # (a successful login clears the address's failed-login count for the tests that follow)
    async with await target.login(member):
        pass


@pytest.mark.parametrize("member", MEMBERS)
async def test_wrong_passwords_and_unknown_users_are_refused_on_every_member(target: SecurityGroup,
                                                                            member: str) -> None:
    """The same refusal for a wrong password and a name nobody has, on the client port and
    the console (fewer than max_failed_logins failures: the throttle is tested elsewhere)."""
    for user, password in ((MALLORY, "wrong-password"), ("nobody", "whatever-password")):
        with pytest.raises(AuthError) as err:
            await client.connect_link(target.url(member, user, password))
        assert err.value.code is ErrorCode.AUTHENTICATION_FAILED
        assert f"authentication failed for user '{user}': wrong user name or password" in err.value.message
    base = target.console(member)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/api/v1/overview", headers=basic("admin", "wrong-password")) as r:
            assert r.status == 401 and (await r.json())["error"] == "unauthenticated"
        async with s.post(f"{base}/login", json={"user": "admin", "password": "wrong-password"}) as r:
            assert r.status == 401 and "tandem_session" not in r.cookies
    async with await target.login(member):  # (clears the address's count)
        pass


# -- the peer port --------------------------------------------------------------------------------------


def _peer_hello(name: str) -> PeerHello:
    return PeerHello(min_version=MIN_VERSION, max_version=MAX_VERSION, node=name,
                     store_stamp="forged-" + secrets.token_hex(4), priority=3, votes=1,
                     client_address="127.0.0.1:1", nonce=secrets.token_bytes(32))


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("kind", list(ForwardKind), ids=lambda k: k.name)
async def test_no_forwarded_kind_is_served_without_the_group_secret(target: SecurityGroup, kind: ForwardKind,
                                                                    member: str) -> None:
    """A forwarded request carries no user: the member it entered checked the user's
    permission.  So only a proven member may send one; a link that claims a member's name and
    sends the request instead of the proof, or sends it first, gets no answer but a refusal."""
    req = forward_example(kind, PAYMENTS)
    forward = Forward(rid=1, kind=int(kind), payload=req.pack())
    other = next(m for m in MEMBERS if m != member)
    address = (target.client_port(member)[0], target.peer_port(member))
    for attempt in (await exchange(address, [_peer_hello(other), forward], answers_first=1),
                    await exchange(address, [forward])):
        assert attempt.closed, attempt.frames
        assert not any(isinstance(f, (ForwardOk, PeerWelcome)) for f in attempt.frames), attempt.frames
        assert all(isinstance(f, (PeerChallenge, Error, Close)) for f in attempt.frames), attempt.frames


# -- the console ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("route", console_routes(), ids=lambda r: f"{r[0]} {r[1]}")
async def test_console_routes_need_a_login(target: SecurityGroup, route: tuple[str, str], member: str) -> None:
    """No credentials, and a session cookie nobody was given: 401 (a browser asking for a
    page is sent to the login).  Only /healthz, the login and the static files answer."""
    method, path = route
    url = target.console(member) + example_path(path)
    for cookies in ({}, {"tandem_session": secrets.token_urlsafe(32)}):
        async with aiohttp.ClientSession(cookies=cookies) as s:
            async with s.request(method, url, json={}, allow_redirects=False) as r:
                body: Any = await r.json() if r.content_type == "application/json" else await r.text()
                if route in PUBLIC:
                    want = 400 if method == "POST" else 200  # /login without a user name
                    assert r.status == want, (route, r.status, body)
                elif method == "GET" and not path.startswith("/api/") and path != "/metrics":
                    assert r.status == 302 and r.headers["Location"] == "/login", (route, r.status)
                else:
                    assert r.status == 401 and body["error"] == "unauthenticated", (route, r.status, body)


async def test_after_every_attempt_the_group_is_as_it_was(target: SecurityGroup) -> None:
    """Runs last: nothing an unauthenticated attacker sent changed the group."""
    state = await target.state()
    assert state == target.baseline
    assert state.depth == PARTITIONS * PER_PARTITION
    assert [u for u, _role in state.users] == ["admin", MALLORY, "watch"]
    async with await client.connect_link(target.url("node1", "admin", PASSWORD)) as conn:
        assert {q.name for q in await conn.list_queues()} == {PAYMENTS}
