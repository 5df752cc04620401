"""Client authentication (SCRAM-SHA-256) and the limits against abuse, against real node
processes: every SDK logs in, no password crosses the wire, a fake node is found out, and
each limit is refused with its code and counted in the metrics."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

import client
import client.blocking
from broker.tools.cluster import free_ports
from broker.tools.process import NodeProcess
from client import scram
from client.errors import (
    AuthError,
    ErrorCode,
    LoginThrottledError,
    PrefetchTooLargeError,
    RemoteProtocolError,
    TandemError,
    TooManyConnectionsError,
)
from client.protocol import FrameBuffer, decode_payload, encode
from client.protocol.frames import AuthChallenge, AuthResponse, Hello, Welcome
from tests.conftest import PASSWORD
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


@pytest_asyncio.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[object]:
    """Start node processes with the given flags (and a console); all stopped after the test."""
    procs: list[NodeProcess] = []

    async def start(*args: str) -> tuple[NodeProcess, str]:
        port = free_ports(1)[0]
        proc = NodeProcess(tmp_path / f"n{len(procs)}", password=PASSWORD,
                           extra_args=["--http-port", str(port), *args])
        procs.append(proc)
        await proc.start()
        return proc, f"http://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for p in procs:
            await p.stop()


def url_for(proc: NodeProcess, user: str = "admin", password: str = PASSWORD, port: int | None = None) -> str:
    assert proc.address is not None
    return f"tandem://{user}:{password}@127.0.0.1:{port or proc.address[1]}"


def basic(user: str = "admin", password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def metric(http: str, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{http}/metrics", headers=basic()) as r:
        assert r.status == 200
        text = await r.text()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        m = re.match(rf"{name}(?:_total)?\{{([^}}]*)\}} (\S+)$", line)
        if m and all(part in m.group(1) for part in want.split(",")):
            return float(m.group(2))
    raise AssertionError(f"no {name}{{{want}}} in the metrics")


async def test_every_sdk_logs_in_with_scram(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, http = await make_node()
    link = await client.connect_link(url_for(proc))
    await link.declare_queue("q")
    await link.close()
    durable = await client.connect(url_for(proc))
    assert [q.name for q in await durable.list_queues()] == ["q"]
    await durable.close()

    def blocking() -> list[str]:
        with client.blocking.connect(url_for(proc)) as b:
            return [q.name for q in b.list_queues()]

    assert await asyncio.to_thread(blocking) == ["q"]
    assert await metric(http, "tandem_auth_failures", node="node1") == 0


async def test_wrong_passwords_and_unknown_users_are_refused(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, http = await make_node()
    for url in (url_for(proc, password="wrong-password"), url_for(proc, user="nobody")):
        with pytest.raises(AuthError) as info:
            await client.connect_link(url)
        assert info.value.code is ErrorCode.AUTHENTICATION_FAILED
        assert "wrong user name or password" in info.value.message
    with pytest.raises(AuthError, match="authentication failed for user 'admin'"):
        await client.connect(url_for(proc, password="wrong-password"))
    with pytest.raises(AuthError, match="authentication failed for user 'admin'"):
        await asyncio.to_thread(client.blocking.connect, url_for(proc, password="wrong-password"))
    assert await metric(http, "tandem_auth_failures", node="node1") == 4


class Recorder:
    """A TCP relay in front of a node that keeps every byte each way."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.to_node = bytearray()
        self.to_client = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Recorder:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nr, nw = await asyncio.open_connection(*self.target)
        for src, dst, buf in ((r, nw, self.to_node), (nr, w, self.to_client)):
            task = asyncio.create_task(self._pipe(src, dst, buf))
            self._tasks.add(task)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, buf: bytearray) -> None:
        try:
            while data := await src.read(65536):
                buf += data
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()


async def test_the_password_never_crosses_the_wire(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, _http = await make_node()
    assert proc.address is not None
    secret = PASSWORD.encode()
    async with Recorder(proc.address) as rec:
        link = await client.connect_link(url_for(proc, port=rec.port))
        await link.list_queues()
        await link.close()
        durable = await client.connect(url_for(proc, port=rec.port))
        await durable.list_queues()
        await durable.close()

        def blocking() -> None:
            with client.blocking.connect(url_for(proc, port=rec.port)) as b:
                b.list_queues()

        await asyncio.to_thread(blocking)
        with pytest.raises(AuthError):
            await client.connect_link(url_for(proc, password="another-secret", port=rec.port))
    sent = bytes(rec.to_node)
    assert sent.count(scram.MECHANISM.encode()) >= 4  # every handshake went through the relay, with SCRAM
    assert b"n,,n=admin,r=" in sent
    for pw in (secret, b"another-secret", base64.b64encode(secret)):
        assert pw not in sent and pw not in rec.to_client


class FakeNode:
    """A server that speaks the protocol but does not hold the user's credentials.
    ``skip``: answer Hello with Welcome at once (no challenge at all)."""

    def __init__(self, *, skip: bool = False) -> None:
        self.skip = skip
        self.port = 0
        self.proofs: list[str] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeNode:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _accept(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        buf = FrameBuffer()

        async def frame() -> object:
            while (payload := buf.next_payload()) is None:
                data = await r.read(65536)
                if not data:
                    raise ConnectionError("client gone")
                buf.feed(data)
            return decode_payload(payload)

        welcome = dict(version=1, node="fake", heartbeat=10.0, max_frame_size=1 << 20, max_message_size=1 << 16)
        try:
            hello = await frame()
            assert isinstance(hello, Hello)
            if self.skip:
                w.write(encode(Welcome(**welcome)))  # type: ignore[arg-type]
            else:
                fake = scram.ScramServer(hello.auth, scram.make_credentials("a-guess-at-it", iterations=4096))
                w.write(encode(AuthChallenge(data=fake.server_first)))
                response = await frame()
                assert isinstance(response, AuthResponse)
                self.proofs.append(response.data)
                forged = "v=" + base64.b64encode(b"\x01" * 32).decode()
                w.write(encode(Welcome(**welcome, auth=forged)))  # type: ignore[arg-type]
            await r.read()  # until the client hangs up
        except ConnectionError:
            pass
        finally:
            w.close()


@pytest.mark.parametrize("skip", [False, True], ids=["forged-signature", "no-challenge"])
async def test_a_fake_node_cannot_complete_the_handshake(skip: bool) -> None:
    async with FakeNode(skip=skip) as fake:
        url = f"tandem://admin:{PASSWORD}@127.0.0.1:{fake.port}/?connect_timeout=5"
        want: type[TandemError] = RemoteProtocolError if skip else AuthError
        match = "Welcome cannot be received" if skip else "could not prove it holds this user's credentials"
        with pytest.raises(want, match=match):
            await client.connect_link(url)
        with pytest.raises(want, match=match):
            await client.connect(url)
        with pytest.raises(want, match=match):
            await asyncio.to_thread(client.blocking.connect, url)
        assert len(fake.proofs) == (0 if skip else 3)


async def test_limits_are_refused_with_their_codes_and_counted(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, http = await make_node("--max-connections-per-user", "2", "--max-prefetch", "100")
    first = await client.connect_link(url_for(proc))
    second = await client.connect_link(url_for(proc))
    with pytest.raises(TooManyConnectionsError, match="max_connections_per_user = 2") as info:
        await client.connect_link(url_for(proc))
    assert info.value.code is ErrorCode.TOO_MANY_CONNECTIONS
    await second.close()

    async def third_connects() -> bool:
        try:
            link = await client.connect_link(url_for(proc))
        except TooManyConnectionsError:
            return False
        await link.close()
        return True

    await wait_until(third_connects, timeout=10, what="the freed connection slot")
    await first.declare_queue("q")
    async with first.consumer("q", prefetch=100):
        pass
    with pytest.raises(PrefetchTooLargeError, match=r"prefetch 101 .*max_prefetch = 100") as pinfo:
        async with first.consumer("q", prefetch=101):
            pass
    assert pinfo.value.code is ErrorCode.PREFETCH_TOO_LARGE
    await first.close()
    assert await metric(http, "tandem_limit_refusals", limit="max_connections_per_user") >= 1
    assert await metric(http, "tandem_limit_refusals", limit="max_prefetch") == 1


async def test_failed_logins_from_an_address_back_off_and_a_success_resets(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, http = await make_node("--max-failed-logins", "2")
    for _ in range(2):
        with pytest.raises(AuthError, match="wrong user name or password"):
            await client.connect_link(url_for(proc, password="wrong-password"))
    with pytest.raises(LoginThrottledError, match=r"too many failed logins from 127.0.0.1: try again in") as info:
        await client.connect_link(url_for(proc))  # even the right password waits its turn
    assert info.value.code is ErrorCode.LOGIN_THROTTLED
    with pytest.raises(LoginThrottledError):
        await asyncio.to_thread(client.blocking.connect, url_for(proc))
    async def logs_in() -> bool:
        try:
            link = await client.connect_link(url_for(proc))
        except LoginThrottledError:
            return False
        await link.close()
        return True

    await wait_until(logs_in, timeout=10, what="the backoff (1 s) to pass")
    # (the console shares the throttle: a scrape from 127.0.0.1 would have waited as well)
    assert await metric(http, "tandem_logins_throttled", node="node1") >= 2
    assert await metric(http, "tandem_auth_failures", node="node1") == 2
    # the success cleared the address: one more failure is below the limit again
    with pytest.raises(AuthError, match="wrong user name or password"):
        await client.connect_link(url_for(proc, password="wrong-password"))
    link = await client.connect_link(url_for(proc))
    await link.close()


async def test_console_logins_check_the_scram_credentials(make_node) -> None:  # type: ignore[no-untyped-def]
    proc, http = await make_node()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{http}/login", json={"user": "admin", "password": PASSWORD}) as r:
            assert r.status == 200 and (await r.json())["role"] == "admin"
        async with s.post(f"{http}/login", json={"user": "admin", "password": "wrong-password"}) as r:
            assert r.status == 401
        async with s.post(f"{http}/api/v1/users", headers=basic(),
                          json={"name": "carol", "password": "carol-password", "role": "monitor"}) as r:
            assert r.status == 201
    async with await client.connect_link(url_for(proc, user="carol", password="carol-password")) as carol:
        assert await carol.list_queues() == []
    async with aiohttp.ClientSession() as s, \
            s.post(f"{http}/login", json={"user": "carol", "password": "carol-password"}) as r:
        assert r.status == 200 and (await r.json())["role"] == "monitor"


async def test_users_in_the_scrypt_format_log_in_to_the_console_until_their_password_is_set_again(
        tmp_path: Path) -> None:
    """A store from a build that kept scrypt hashes: such a user is refused on the client port
    with a message saying how to get back in, may still log in to the console, and logs in
    with SCRAM once an admin has set the password again."""
    import hashlib

    from broker.cli import console_view
    from broker.config import NodeConfig
    from broker.node.node import Node
    from storage.base import PutUser, UserRecord
    from webconsole.app import serve_console

    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0))
    await node.start()
    console = await serve_console(console_view(node), "127.0.0.1", 0)
    try:
        salt = b"legacy-salt-0001"
        legacy = UserRecord(name="old", salt=salt, role="monitor", params="scrypt:n=16384,r=8,p=1",
                            hash=hashlib.scrypt(b"old-password", salt=salt, n=2**14, r=8, p=1, dklen=32,
                                                maxmem=64 * 1024 * 1024))
        await node.store.write([PutUser(legacy)], sync=True)
        node.services.users.put(legacy)
        url = f"tandem://old:old-password@127.0.0.1:{node.address[1]}"
        with pytest.raises(AuthError, match=r"scrypt format.*POST /api/v1/users/old/password") as info:
            await client.connect_link(url)
        assert info.value.code is ErrorCode.AUTHENTICATION_FAILED
        assert console.address is not None
        http = f"http://127.0.0.1:{console.address[1]}"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{http}/login", json={"user": "old", "password": "old-password"}) as r:
                assert r.status == 200
            async with s.post(f"{http}/api/v1/users/old/password", headers=basic(),
                              json={"password": "new-password"}) as r:
                assert r.status == 200
        async with await client.connect_link(f"tandem://old:new-password@127.0.0.1:{node.address[1]}") as link:
            assert await link.list_queues() == []
    finally:
        await console.stop()
        await node.stop()
