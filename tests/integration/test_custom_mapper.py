"""Custom data mappers by entry point (``tandem.mappers``): a real installed-looking package
(a ``.dist-info`` with ``entry_points.txt`` on the path) seen by a real node process and by
this test's client; bad plug-ins give clear errors; a node without the plug-in still loads
the queue and refuses only its keyed publishes."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import client
from broker.tools.process import CODE_ROOT, NodeProcess
from client import blocking
from client.errors import InvalidArgumentError
from client.mapper import custom_mappers, make_mapper

PLUGIN = textwrap.dedent("""
    class ByFirstLetter:
        '''Keys by their first letter: a -> 0, b -> 1, ...'''
        def __init__(self, partitions, ring_size):
            self.partitions = partitions
        def partition(self, key):
            return (ord(key[0]) - ord("a")) % self.partitions

    class OutOfRange:
        def __init__(self, partitions, ring_size):
            self.partitions = partitions
        def partition(self, key):
            return self.partitions  # one past the last

    class Raises:
        def __init__(self, partitions, ring_size):
            pass
        def partition(self, key):
            raise KeyError(key)

    def cannot_build(partitions, ring_size):
        raise RuntimeError("no licence for this mapper")
""")

ENTRY_POINTS = textwrap.dedent("""
    [tandem.mappers]
    by_letter = tandem_test_mappers:ByFirstLetter
    out_of_range = tandem_test_mappers:OutOfRange
    raises = tandem_test_mappers:Raises
    cannot_build = tandem_test_mappers:cannot_build
    jump_hash = tandem_test_mappers:OutOfRange
""")


def make_plugin(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tandem_test_mappers.py").write_text(PLUGIN)
    info = root / "tandem_test_mappers-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-test-mappers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = make_plugin(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(root))  # this test's client sees it as the node does
    custom_mappers.cache_clear()
    yield root
    custom_mappers.cache_clear()


def test_the_plugin_is_found_and_cannot_shadow_a_built_in(plugin: Path) -> None:
    found = custom_mappers()
    assert {"by_letter", "out_of_range", "raises", "cannot_build"} <= set(found)
    assert "jump_hash" not in found  # the built-in one wins
    assert type(make_mapper("jump_hash", 4, 64)).__name__ == "JumpHashMapper"
    m = make_mapper("by_letter", 4, 64)
    assert [m.partition(k) for k in ("a", "b", "c", "d", "e")] == [0, 1, 2, 3, 0]
    assert sorted(m.partition(None) for _ in range(4)) == [0, 1, 2, 3]  # keyless: spread
    with pytest.raises(InvalidArgumentError, match=r"'out_of_range' put key 'k' in partition 4 \(the queue has 0..3\)"):
        make_mapper("out_of_range", 4, 64).partition("k")
    with pytest.raises(InvalidArgumentError, match=r"'raises' failed on key 'k': KeyError"):
        make_mapper("raises", 4, 64).partition("k")
    with pytest.raises(InvalidArgumentError, match="could not be loaded: RuntimeError.*no licence"):
        make_mapper("cannot_build", 4, 64)
    with pytest.raises(InvalidArgumentError, match="unknown data mapper 'nope'.*by_letter"):
        make_mapper("nope", 4, 64)


@pytest.mark.asyncio
@pytest.mark.integration
async def test_a_node_with_the_plugin_places_keys_by_it_and_one_without_still_loads(
        plugin: Path, tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "n1", name="n1", log_path=tmp_path / "n1.log")
    node.env["PYTHONPATH"] = f"{CODE_ROOT}:{plugin}"
    await node.start()
    try:
        conn = await client.connect(node.url)
        try:
            info = await conn.declare_queue("letters", partitions=3, mapper="by_letter")
            assert info.mapper == "by_letter"
            with pytest.raises(InvalidArgumentError, match="could not be loaded"):
                await conn.declare_queue("nolicence", partitions=3, mapper="cannot_build")
            with pytest.raises(InvalidArgumentError, match="mapper 'nope': choose jump_hash.*by_letter"):
                await conn.declare_queue("nope", partitions=3, mapper="nope")
            # the durable producer maps with the plug-in itself; the node agrees
            await conn.producer("letters").send_many([(k.encode(), k) for k in ("apple", "banana", "cherry", "date")])
            async with conn.consumer("letters", prefetch=10) as c:
                got = {}
                for _ in range(4):
                    m = await c.next(30)
                    assert m is not None
                    got[m.body] = m.partition
                    m.ack()
            assert got == {b"apple": 0, b"banana": 1, b"cherry": 2, b"date": 0}
            await conn.declare_queue("bad-range", partitions=3, mapper="out_of_range")
        finally:
            await conn.close()

        # a client that maps nothing itself: the node's own check answers
        def node_maps() -> str:
            with blocking.connect(node.url) as b:
                assert b.producer("letters").send(b"egg", key="egg") >= 0  # confirmed
                try:
                    b.producer("bad-range").send(b"x", key="k")
                except InvalidArgumentError as exc:
                    return exc.message
                return "accepted"
        answer = await asyncio.to_thread(node_maps)
        assert "'out_of_range' put key 'k' in partition 3 (the queue has 0..2)" in answer, answer

        # the same node started without the plug-in: it comes up, keeps the queue, and refuses
        # only keyed publishes to it
        await node.stop()
        node.env["PYTHONPATH"] = CODE_ROOT
        await node.start()
        assert "queue letters: unknown data mapper 'by_letter'" in node.log_text()

        def without_plugin() -> tuple[str, int]:
            with blocking.connect(node.url) as b:
                (q,) = [q for q in b.list_queues() if q.name == "letters"]
                try:
                    b.producer("letters").send(b"fig", key="fig")
                    refused = "accepted"
                except InvalidArgumentError as exc:
                    refused = exc.message
                b.producer("letters").send(b"keyless")
                return refused, q.ready
        refused, ready = await asyncio.to_thread(without_plugin)
        assert "queue 'letters': unknown data mapper 'by_letter'" in refused
        assert ready == 1  # egg, kept across the restart
    finally:
        await node.stop()
