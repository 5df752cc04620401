"""`tandem bench` end to end: spawned node, both peers, exactly-once check, JSON report."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.peers]


async def test_bench_spawn_with_peers_reports_json() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--amqp", "--peer", "rabbitmq", "--peer", "nats",
        "--peer", "null-amqp", "--messages", "3000", "--latency-messages", "300", "--latency-rate", "1000", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out)
    systems = [r["system"] for r in report["runs"]]
    assert systems == ["tandem", "tandem-amqp", "rabbitmq", "nats", "null-amqp"]  # (the spawned node through AMQP too)
    for r in report["runs"]:
        assert r["error"] is None, r
        assert (r["lost"], r["duplicated"], r["unexpected"]) == (0, 0, 0), r
        assert r["confirmed"] == r["consumed"] == 3000
        assert r["publish_per_s"] > 0 and r["consume_per_s"] > 0
        assert 0 < r["confirm_ms"]["p50"] <= r["confirm_ms"]["p99"]
    assert set(report["ratios"]) == {"tandem-amqp", "rabbitmq", "nats", "null-amqp", "tandem-amqp / rabbitmq",
                                     "null-amqp / rabbitmq"}
    assert report["ratios"]["tandem-amqp / rabbitmq"]["publish_per_s"] > 0
    assert report["ratios"]["null-amqp / rabbitmq"]["publish_per_s"] > 0
    assert report["ratios"]["nats"]["publish_per_s"] > 0
    # CPU per message: the client's for every system, the node's where the bench started it
    tandem, *peers = report["runs"]
    assert tandem["cpu_us_per_msg"]["client"] > 0 and tandem["cpu_us_per_msg"]["servers"] > 0
    assert all(r["cpu_us_per_msg"]["client"] > 0 for r in peers)
    # the servers' CPU per message, per phase: the spawned node's, and the peers' local servers'
    assert tandem["server_cpu_us_per_msg"]["throughput"] > 0
    assert set(tandem["server_cpu_us_per_msg"]) == {"throughput", "latency"}
    assert tandem["server_cpu"]["reason"] is None and "1 spawned tandem node" in tandem["server_cpu"]["processes"]
    for r, server in zip(peers, ("1 spawned tandem node", "beam.smp", "nats-server", "null-amqp pid")):
        assert r["server_cpu_us_per_msg"]["throughput"] > 0, r["server_cpu"]
        assert server in r["server_cpu"]["processes"]


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    """Relay one connection to 127.0.0.1:``port`` (a proxy in front of the peer)."""
    up_r, up_w = await asyncio.open_connection("127.0.0.1", port)

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))


async def test_bench_peer_behind_a_proxy_has_no_server_cpu_figure() -> None:
    """The process listening on the peer's URL is not a nats-server (a proxy, here this test):
    no server figure, and the reason says what listens there."""
    server = await asyncio.start_server(lambda r, w: _forward(r, w, 4222), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.cli", "bench", "--spawn", "--peer", "nats",
            "--nats-url", f"nats://127.0.0.1:{port}",
            "--messages", "500", "--latency-rate", "0", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        server.close()
    assert proc.returncode == 0, err.decode()[-3000:]
    tandem, nats_run = json.loads(out)["runs"]
    assert tandem["server_cpu_us_per_msg"]["throughput"] >= 0  # (500 messages: maybe under a clock tick)
    assert nats_run["error"] is None, nats_run
    assert nats_run["server_cpu_us_per_msg"] is None
    assert "not nats-server" in nats_run["server_cpu"]["reason"], nats_run["server_cpu"]


async def test_bench_needs_a_target() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _out, err = await proc.communicate()
    assert proc.returncode == 2 and b"--url" in err and b"Traceback" not in err


async def test_bench_of_a_spawned_group_measures_the_default_queue() -> None:
    """The issue's command without the peers: a 3-node group, its default queue (one
    partition: an active and two replicas), every message checked."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3",
        "--messages", "2000", "--latency-messages", "200", "--latency-rate", "500", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out)
    assert report["workload"]["partitions"] == 1
    (run,) = report["runs"]
    assert run["durability"].startswith("3-node group")
    assert run["error"] is None, run
    assert (run["lost"], run["duplicated"], run["unexpected"]) == (0, 0, 0), run
    assert run["confirmed"] == run["consumed"] == 2000
    assert run["cpu_us_per_msg"]["servers"] > 0
    assert run["server_cpu_us_per_msg"]["throughput"] > 0
    assert "3 spawned tandem node(s)" in run["server_cpu"]["processes"]


async def test_bench_of_delayed_messages_reports_their_cost_and_lateness() -> None:
    """`tandem bench --delayed`: a group of three (finalized by the bench), messages scheduled far
    ahead, then messages due in 1-5 s, none early."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3", "--delayed", "1000", "--due", "100",
        "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    r = json.loads(out)
    assert r["error"] is None and r["confirmed"] == 1000 and r["publish_per_s"] > 0, r
    assert set(r["peak_rss"]) == {"node1", "node2", "node3"} and r["bytes_per_message"] > 0
    assert (r["due_received"], r["early"]) == (100, 0) and 0 <= r["late_ms"]["p50"] <= r["late_ms"]["max"], r


async def test_bench_of_transactions_reports_each_size_against_plain_publishes() -> None:
    """`tandem bench --transactions`: a group of three (finalized by the bench), for each of 1, 10
    and 50 messages per transaction plain confirmed publishes, plain batches and transactions by
    4 producers; every phase's queue holds exactly what it confirmed or committed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3", "--transactions", "--tx-sizes",
        "1,10,50", "--tx-messages", "200", "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    r = json.loads(out)
    assert r["error"] is None and r["counted"] and r["nodes"] == 3 and r["producers"] == 4, r
    assert r["baseline_confirmed"] == r["baseline_ready"] == 3 * 200 and len(r["baseline_rounds"]) == 3, r
    assert r["baseline_per_s"] > 0 and all(rate > 0 for rate in r["baseline_rounds"]), r
    assert [s["per_tx"] for s in r["sizes"]] == [1, 10, 50]
    for s in r["sizes"]:
        assert s["transactions"] == 200 // s["per_tx"] and s["messages"] == s["ready"] == s["batches_ready"] == 200
        assert s["tx_per_s"] > 0 and s["msg_per_s"] > 0 and s["batches_per_s"] > 0, s
        assert 0 < s["commit_ms"]["p50"] <= s["commit_ms"]["p99"] and s["ratio_to_baseline"] > 0, s


async def test_bench_with_consumers_on_one_node_drains_every_partition_through_its_relays() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3", "--partitions", "3", "--messages",
        "3000", "--latency-rate", "0", "--relayed", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    (r,) = json.loads(out)["runs"]
    assert "consumers on one node (relayed)" in r["mode"], r
    assert r["error"] is None and (r["lost"], r["duplicated"], r["unexpected"]) == (0, 0, 0), r
    assert r["confirmed"] == r["consumed"] == 3000


async def test_bench_of_exchanges_counts_every_copy() -> None:
    """`tandem bench --fanout`: a fanout exchange bound to 1 and 5 queues and a topic exchange with
    50 patterns, on a spawned group and on the local RabbitMQ; every queue holds every message
    routed to it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3", "--fanout", "1,5",
        "--topic-bindings", "50", "--messages", "300", "--peer", "rabbitmq", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    runs = json.loads(out)["runs"]
    assert [(r["system"], r["kind"], r["queues"], r["bindings"], r["stored"], r["error"]) for r in runs] == [
        (system, *run) for system in ("tandem", "rabbitmq")
        for run in (("fanout", 1, 1, 300, None), ("fanout", 5, 5, 1500, None), ("topic", 10, 50, 300, None))]
    assert all(r["messages_per_s"] > 0 and r["copies_per_s"] >= r["messages_per_s"] for r in runs)


async def test_bench_of_exchanges_through_a_plain_producer_counts_its_confirms() -> None:
    """`tandem bench --fanout --plain-producer`: one plain link's pipelined exchange producer; every
    publish confirmed here (one node, a fan-out of 3), and every confirmed copy stored."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--fanout", "3", "--messages", "600",
        "--plain-producer", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    (run,) = json.loads(out)["runs"]
    assert (run["queues"], run["confirmed"], run["stored"], run["error"]) == (3, 600, 1800, None)


async def test_bench_of_a_stream_replay_reads_every_message_twice() -> None:
    """`tandem bench --stream-replay`: 4 MB to a 2-partition stream of a spawned group, read from
    first to end twice, every message once each time; and the same through a RabbitMQ stream."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "3", "--partitions", "2",
        "--stream-replay", "4000000", "--size", "4000", "--peer", "rabbitmq", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:] + out.decode()[-3000:]
    runs = json.loads(out)
    assert [(r["system"], r["confirmed"], r["passed"], r["error"]) for r in runs] == [
        ("tandem", 1000, True, None), ("rabbitmq", 1000, True, None)]
    for r in runs:
        assert [(p["messages"], p["missing"], p["duplicated"], p["unexpected"]) for p in r["passes"]] == \
            [(1000, 0, 0, 0)] * 2 and all(p["mb_per_s"] > 0 for p in r["passes"])
