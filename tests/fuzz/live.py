"""The live phase: mutated frames against a real two-node group over real sockets.

Connections of five kinds, in turn, ``concurrency`` at a time:

* ``client-garbage``: a mutated client byte stream from the first byte (no valid handshake);
* ``client-login``: a real admin login (``Hello`` with the group's password), then mutated
  requests: what a client holding valid credentials can send;
* ``client-bad-login``: ``Hello`` with a wrong password, then mutated requests;
* ``peer-garbage``: mutated peer frames from the first byte on a peer port;
* ``peer-hello``: a ``PeerHello`` naming the other member, then mutated peer frames
  (``Replicate`` and ``Forward`` payloads mutated inside, too).  Where peer links are
  authenticated this stops at the handshake;
* ``amqp-garbage``: the AMQP protocol header (or not), then mutated AMQP frames on the AMQP
  port;
* ``amqp-login``: the header and a real AMQP login (PLAIN, the admin's password), then mutated
  AMQP frames: what a pika or kombu client holding valid credentials can send.

Mutations are structure-aware (a field of the msgpack map, or a value deep inside a nested
payload, replaced by a hostile value: huge, negative, NaN, the wrong type, empty, long) or
byte-level (flipped, inserted, dropped bytes inside the frame, its length prefix kept).

Afterwards: every node must still run, a real client must declare, publish and consume (a Tandem
client, and an AMQP one), and no node's log may hold a traceback, an ERROR or a CRITICAL line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import struct
import time
from pathlib import Path
from typing import Any

import msgpack

import client
from broker.tools.cluster import LocalCluster
from client.protocol import encode
from client.protocol.codec import FrameBuffer
from client.protocol.frames import AuthChallenge, AuthResponse, Hello, Op, PeerHello
from client.scram import MECHANISM, ScramClient
from tests.fuzz.corpus import AMQP_HEADER, amqp_frames, amqp_login, client_requests, peer_frames
from tests.helpers import read_frame

KINDS = ("client-garbage", "client-login", "client-bad-login", "peer-garbage", "peer-hello", "amqp-garbage",
         "amqp-login")

HOSTILE: list[Any] = [
    0, 1, -1, 255, 2**31, 2**32 + 1, 2**63 - 1, 2**64 - 1, -(2**63), 1e308, -1e308, float("nan"), float("inf"),
    -0.0, "", "x" * 300, "\x00", "\u00e9\u4e2d", "../../etc/passwd", "*", b"", b"\xff" * 64, b"\x00",
    None, True, False, [], [[]], [None] * 20, {}, {"a": 1}, {"": ""}, list(range(50)),
]

#: log lines that show an exception: a traceback (every ``log.exception`` has one), an exception
#: nobody handled, a node stopping.  Other ERROR lines are the node's reports of what the attack
#: did (an HA-1014 after an operator's quorum override, say): counted, shown, not failures.
LOG_PROBLEM = re.compile(r"Traceback \(most recent call last\)| CRITICAL |[Uu]nhandled|never retrieved|internal error")
LOG_ERROR = re.compile(r" ERROR ")


def _hostile(rng: random.Random) -> Any:
    return rng.choice(HOSTILE)


def _mutate_value(v: Any, rng: random.Random, depth: int = 0) -> Any:
    """``v`` with one value somewhere inside it replaced (a nested msgpack payload included)."""
    if depth < 6:
        if isinstance(v, list) and v and rng.random() < 0.8:
            v = list(v)
            i = rng.randrange(len(v))
            action = rng.random()
            if action < 0.7:
                v[i] = _mutate_value(v[i], rng, depth + 1)
            elif action < 0.85:
                del v[i]
            else:
                v.insert(i, _hostile(rng))
            return v
        if isinstance(v, dict) and v and rng.random() < 0.8:
            v = dict(v)
            k = rng.choice(list(v))
            v[k] = _mutate_value(v[k], rng, depth + 1)
            return v
        if isinstance(v, bytes) and v and rng.random() < 0.6:
            try:
                inner = msgpack.unpackb(v, raw=False)
            except Exception:  # not msgpack: a body, a chunk
                inner = None
            if isinstance(inner, (list, dict)):
                try:
                    return msgpack.packb(_mutate_value(inner, rng, depth + 1), use_bin_type=True)
                except (TypeError, ValueError, OverflowError):
                    pass
    return _hostile(rng)


def _frame_bytes(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _mutate_bytes(data: bytes, rng: random.Random, most: int) -> bytes:
    """``data`` with 1 to ``most`` bytes flipped, inserted or dropped."""
    b = bytearray(data)
    for _ in range(rng.randint(1, most)):
        op = rng.random()
        if op < 0.5 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op < 0.75:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif len(b) > 1:
            del b[rng.randrange(len(b))]
    return bytes(b)


def mutate_frame(frame_bytes: bytes, rng: random.Random) -> bytes:
    """One mutant of an encoded frame."""
    payload = frame_bytes[4:]
    r = rng.random()
    if r < 0.6:  # a field of the map
        body = msgpack.unpackb(payload, raw=False)
        action = rng.random()
        if action < 0.6:
            k = rng.choice(list(body))
            body[k] = _mutate_value(body[k], rng)
        elif action < 0.75:
            body.pop(rng.choice([k for k in body if k != "op"] or ["op"]), None)
        elif action < 0.9:
            body["op"] = rng.choice([int(rng.choice(list(Op))), rng.randrange(256), -1, "publish", None])
        else:
            body[rng.choice(["x", "rid", "op", "zz" * 40])] = _hostile(rng)
        try:
            return _frame_bytes(msgpack.packb(body, use_bin_type=True))
        except (TypeError, ValueError, OverflowError):
            return frame_bytes
    if r < 0.99:  # bytes inside the frame; the length prefix kept right
        return _frame_bytes(_mutate_bytes(payload, rng, 8))
    # the length prefix itself: a lie (the stream cannot recover; the node must close it)
    return struct.pack(">I", rng.choice([0, len(payload) + 7, 2**31, 2**32 - 1])) + payload


def mutate_amqp(frame_bytes: bytes, rng: random.Random) -> bytes:
    """One mutant of an AMQP frame (type, channel, size, payload, frame-end): bytes flipped,
    inserted or dropped in its payload, the size kept right mostly, else the header itself."""
    head, payload, end = frame_bytes[:7], _mutate_bytes(frame_bytes[7:-1], rng, 6), frame_bytes[-1:]
    r = rng.random()
    if r < 0.8:
        head = head[:3] + struct.pack(">I", len(payload))
    elif r < 0.9:  # the type, the channel or the size: anything
        b = bytearray(head)
        b[rng.randrange(7)] = rng.randrange(256)
        head = bytes(b)
    elif r < 0.95:
        end = bytes([rng.randrange(256)])
    return head + payload + end


async def login(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, password: str) -> Any:
    """The SCRAM-SHA-256 exchange as a client makes it (no password on the wire); a wrong
    password ends it with the node's Error.  The node's last answer (Welcome, or Error)."""
    sc = ScramClient("admin", password)
    writer.write(encode(Hello(min_version=1, max_version=1, client_name="fuzz", user="admin",
                              mechanism=MECHANISM, auth=sc.first, heartbeat=10.0)))
    buf = FrameBuffer(1 << 20)

    async def frame() -> Any:
        f = await read_frame(reader, buf)
        if f is None:
            raise ConnectionResetError("closed during the login")
        return f

    async with asyncio.timeout(10):
        challenge = await frame()
        if isinstance(challenge, AuthChallenge):
            sc.challenge(challenge.data)
            writer.write(encode(AuthResponse(data=sc.final(sc.salt_password()))))
            return await frame()  # Welcome, or Error for a wrong password
        return challenge


async def _drain(reader: asyncio.StreamReader) -> None:
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, OSError):
        pass


async def _attack(kind: str, ports: dict[str, int], password: str, member: str, frames: int,
                  rng: random.Random) -> int:
    """One connection of ``kind`` (to ``ports``: its member's client, peer and amqp ports); how
    many frames it sent."""
    port = ports[kind.split("-")[0]]
    amqp = kind.startswith("amqp")
    seeds = amqp_frames() if amqp else [encode(f) for f in (peer_frames() if kind.startswith("peer")
                                                            else client_requests())]
    mutate = mutate_amqp if amqp else mutate_frame
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0
    sent = 0
    if amqp and (kind == "amqp-login" or rng.random() < 0.8):
        writer.write(AMQP_HEADER + (b"".join(amqp_login(password)) if kind == "amqp-login" else b""))
        sent += 1
    if kind == "client-login" or kind == "client-bad-login":
        try:
            await login(reader, writer, password if kind == "client-login" else "wrong-password")
            sent += 2
        except (ConnectionError, OSError, TimeoutError):
            pass  # refused and closed (a wrong password): the mutated frames find the door shut
    drain = asyncio.create_task(_drain(reader))
    try:
        if kind == "peer-hello":
            writer.write(encode(PeerHello(min_version=1, max_version=1, node=member, store_stamp="fuzz-stamp",
                                          priority=0, votes=1)))
            sent += 1
        for _ in range(frames):
            if drain.done():  # the node closed the connection
                break
            seed = rng.choice(seeds)
            writer.write(mutate(seed, rng) if rng.random() < 0.9 else seed)
            sent += 1
            await writer.drain()
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        try:
            async with asyncio.timeout(5):
                await drain
                await writer.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            drain.cancel()
    return sent


async def _still_serving(cluster: LocalCluster) -> str | None:
    """None if a real client can declare, publish and consume; else what failed."""
    queue = f"after-fuzz-{random.randrange(10**6)}"
    try:
        async with asyncio.timeout(60):
            async with await client.connect(cluster.url) as conn:
                await conn.declare_queue(queue)
                producer = conn.producer(queue)
                bodies = [f"m{i}".encode() for i in range(10)]
                await producer.send_many(bodies)
                got: list[bytes] = []
                async with conn.group_consumer(queue, prefetch=16) as c:
                    while len(got) < len(bodies):
                        m = await c.next(30)
                        if m is None:
                            return f"consumed {len(got)} of {len(bodies)} messages in 30 s"
                        got.append(m.body)
                        await m.ack()
                if sorted(got) != sorted(bodies):
                    return f"consumed {got!r}, published {bodies!r}"
    except Exception as exc:  # whatever it is, it is the answer
        return f"a real client failed: {exc!r}"
    try:  # and an AMQP client, on each node's AMQP port
        import aio_pika

        async with asyncio.timeout(60):
            for name in cluster.nodes:
                url = f"amqp://admin:{cluster.password}@{cluster.hosts[name]}:{cluster.amqp_ports[name]}/"
                async with await aio_pika.connect(url) as amqp:
                    ch = await amqp.channel(publisher_confirms=True)
                    q = await ch.declare_queue(f"{queue}-amqp-{name}")
                    await ch.default_exchange.publish(aio_pika.Message(b"after"), routing_key=q.name)
                    back = await q.get(timeout=30)
                    await back.ack()
                    if back.body != b"after":
                        return f"an AMQP client on {name} got {back.body!r}"
    except Exception as exc:
        return f"an AMQP client failed: {exc!r}"
    return None


async def run_live(out: Path, *, connections: int = 400, frames_per_connection: int = 50, seed: int = 1,
                   concurrency: int = 20) -> dict[str, Any]:
    """Start a two-node group, attack it, check it; the figures and the problems found."""
    rng = random.Random(seed)
    # this process writes to connections the node closed, by design: asyncio's warnings about
    # that here are noise (the node's own log is what is checked)
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    out.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(out, console=False, nodes=2, base_port=0, password="fuzz-admin-password", amqp=True)
    started = time.monotonic()
    problems: list[str] = []
    frames = 0
    crashes = 0
    log_errors = 0
    error_lines: list[str] = []
    serving = False
    try:
        await cluster.start()
        await cluster.wait_ready()
        names = list(cluster.nodes)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> int:
            kind = KINDS[i % len(KINDS)]
            target = names[i % len(names)]
            other = names[(i + 1) % len(names)]
            node = cluster.nodes[target]
            assert node.address is not None
            async with sem:
                ports = {"client": node.address[1], "peer": cluster.peer_ports[target],
                         "amqp": cluster.amqp_ports[target]}
                return await _attack(kind, ports, cluster.password, other, frames_per_connection,
                                     random.Random(rng.random()))

        frames = sum(await asyncio.gather(*(one(i) for i in range(connections))))
        for name, p in cluster.nodes.items():
            if p.proc is None or p.proc.returncode is not None:
                crashes += 1
                problems.append(f"node {name} is not running (exit status {p.proc.returncode if p.proc else '?'})")
        if not crashes:
            await cluster.wait_ready()
            why = await _still_serving(cluster)
            serving = why is None
            if why is not None:
                problems.append(f"the group stopped serving: {why}")
    except Exception as exc:  # the group would not start or answer: report it as a problem
        problems.append(f"live phase failed: {exc!r}")
    finally:
        await cluster.stop()
    for name, p in cluster.nodes.items():
        bad = [line for line in p.log_text().splitlines() if LOG_PROBLEM.search(line)]
        log_errors += len(bad)
        problems += [f"{name} log: {line}" for line in bad[:20]]
        error_lines += [f"{name}: {line}" for line in p.log_text().splitlines()
                        if LOG_ERROR.search(line) and not LOG_PROBLEM.search(line)]
    return {"connections": connections, "frames": frames, "crashes": crashes, "log_errors": log_errors,
            "serving": serving, "problems": problems, "error_events": error_lines, "seconds": round(time.monotonic() - started, 1),
            "logs": [str(p.log_path) for p in cluster.nodes.values()]}
