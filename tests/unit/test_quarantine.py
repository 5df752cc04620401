"""broker.partitions.quarantine's spool: what HA-1014 discards is written, fsynced, with where it came
from, before anything else happens to it (its publishing runs in tests/integration/test_restore.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from broker.partitions.quarantine import HEADERS, Quarantine
from broker.messaging.message import encode_headers
from storage.base import Append, Settle, StoredMessage


class _Host:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.name = "node3"
        self.spawned: list[Any] = []

    def queue_name(self, queue_id: int) -> str | None:
        return {4: "orders", 9: "tandem.quarantine"}.get(queue_id)

    def spawn(self, coro: Any) -> None:
        self.spawned.append(coro)
        coro.close()


def test_discarded_messages_are_spooled_with_their_origin_and_acks_are_not(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    q = Quarantine(host)  # type: ignore[arg-type]
    m1 = StoredMessage(7, "k1", encode_headers({"a": "b"}), b"one", "p1", 3, 1.0)
    m2 = StoredMessage(8, None, encode_headers({}), b"two", None, None, 1.0)
    entries = [[Append(4, 2, [m1], 8)], [Settle(4, 2, [5])], [Append(4, 2, [m2], 9)]]
    assert q.keep((4, 2), 6, 11, entries, 1, [("node4", 5), ("node4", 5), ("node2", 6)]) == 2
    (path,) = (tmp_path / "quarantine").glob("*.msgpack")
    assert path.name == "4.2.6.11.msgpack"
    (k1, h1, b1), (k2, h2, b2) = msgpack.unpackb(path.read_bytes(), raw=False)
    assert (k1, b1, k2, b2) == ("k1", b"one", None, b"two")
    assert h1["a"] == "b" and set(HEADERS) <= set(h1)
    assert [h1[k] for k in HEADERS[:9]] == ["orders", "2", "7", "2-7", "p1", "3", "node3", "6", "true"]
    assert (h2["x-quarantine-seq"], h2["x-quarantine-producer"], h2["x-quarantine-confirmed"]) == ("", "", "false")
    assert h1["x-quarantine-from"] == h2["x-quarantine-from"] == "7"  # (where the logs parted: the first offset)
    assert (h1["x-quarantine-written"], h2["x-quarantine-written"]) == ("node4.5", "node2.6")  # (who wrote each)
    assert len(host.spawned) == 1  # (publishing starts)
    assert not list((tmp_path / "quarantine").glob("*.tmp"))


def test_entries_without_messages_spool_nothing(tmp_path: Path) -> None:
    q = Quarantine(_Host(tmp_path))  # type: ignore[arg-type]
    assert q.keep((4, 0), 6, 1, [[Settle(4, 0, [1])], []], 2) == 0
    assert not (tmp_path / "quarantine").exists()


def test_the_quarantines_own_unconfirmed_writes_are_not_kept_again(tmp_path: Path) -> None:
    """The quarantine's writes come from spool files published again until confirmed: a
    discarded one this node never confirmed is still spooled (kept again, it would be there
    twice); a confirmed one's file is gone, so it is kept."""
    host = _Host(tmp_path)
    q = Quarantine(host)  # type: ignore[arg-type]
    confirmed = StoredMessage(3, "k1", encode_headers({}), b"confirmed", "quarantine.node3.x", 0, 1.0)
    spooled = StoredMessage(4, "k2", encode_headers({}), b"spooled", "quarantine.node3.y", 0, 1.0)
    assert q.keep((9, 0), 7, 9, [[Append(9, 0, [confirmed], 4)], [Append(9, 0, [spooled], 5)]], 1) == 1
    (path,) = (tmp_path / "quarantine").glob("*.msgpack")
    assert [b for _k, _h, b in msgpack.unpackb(path.read_bytes(), raw=False)] == [b"confirmed"]
    assert q.keep((9, 0), 7, 11, [[Append(9, 0, [spooled], 5)]], 0) == 0
