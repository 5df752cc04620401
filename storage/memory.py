"""An in-memory engine: the reference the conformance suite holds SQLite to, and a
fast stand-in for tests of the broker that are not about the disk.

A :class:`MemoryDisk` outlives the engines opened on it, so "restart the node"
works in tests; nothing reaches a real disk (``capabilities.fsync`` is false).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from dataclasses import dataclass, field

from client.errors import StorageError
from storage.base import (
    Append,
    Capabilities,
    DropQueue,
    DropUser,
    GrantAcl,
    RevokeAcl,
    PutMeta,
    DropMeta,
    AclRecord,
    LogAppend,
    LogCompact,
    LogState,
    LogTruncate,
    MarkDelivered,
    PartitionState,
    PutApplied,
    PutHardState,
    DropProducers,
    PutProducer,
    PutQueue,
    PutUser,
    ResetPartition,
    QueueMeta,
    Recovered,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    Trim,
    UserRecord,
    WriteOp,
)
from storage.budget import message_cost
from storage.segments import repair_key

Key = tuple[int, int]


@dataclass
class _Part:
    next_offset: int = 0
    delivered_upto: int = 0
    messages: dict[int, StoredMessage] = field(default_factory=dict)  # unsettled, by offset
    counts: dict[int, int] = field(default_factory=dict)
    producers: dict[str, int] = field(default_factory=dict)


@dataclass
class MemoryDisk:
    """What the engine "persists"; share one between engine instances to reopen."""

    meta: dict[str, str] = field(default_factory=dict)
    queues: dict[int, QueueMeta] = field(default_factory=dict)
    parts: dict[Key, _Part] = field(default_factory=dict)
    users: dict[str, UserRecord] = field(default_factory=dict)
    acls: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (user, pattern) -> permissions
    logs: dict[Key, LogState] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: damage the replication log took at rest, found at the next open as the SQLite engine's
    #: segments find theirs (storage.segments), as damage that may have touched every partition:
    #: none of the log is read (set_aside_log clears it)
    log_damage: list[str] = field(default_factory=list)


class MemoryEngine:
    capabilities = Capabilities(shared=False, fsync=False)
    load_budget = 0  # Engine.load_budget

    def __init__(self, disk: MemoryDisk | None = None) -> None:
        self.disk = disk if disk is not None else MemoryDisk()
        self._open = False

    def open(self) -> Recovered:
        d = self.disk
        with d.lock:
            d.meta.setdefault("schema_version", "memory")
            rec = Recovered(meta=dict(d.meta), queues=sorted(d.queues.values(), key=lambda q: q.id),
                            users=sorted(d.users.values(), key=lambda u: u.name),
                            acls=[AclRecord(user=u, pattern=p, permissions=tuple(sorted(perms)))
                                  for (u, p), perms in sorted(d.acls.items()) if perms])
            for key in d.parts:
                rec.partitions[key] = self._state(key)
            rec.logs = copy.deepcopy(d.logs)
            if d.log_damage:
                rec.log_damage = list(d.log_damage)
                for key, st in rec.logs.items():
                    st.entries, st.damaged = [], True
                    if st.applied[0] > st.snapshot[0]:
                        st.snapshot = st.applied  # (the store is its own snapshot)
            for key, st in rec.logs.items():
                st.marked = rec.meta.get(repair_key(key)) == "1"
                if st.damaged:
                    d.meta[repair_key(key)] = "1"
        self._open = True
        return rec

    def set_aside_log(self) -> None:
        """The node goes on without the damaged log (SqliteEngine.set_aside_log)."""
        with self.disk.lock:
            self.disk.log_damage = []

    def _state(self, key: Key) -> PartitionState:
        p = self.disk.parts.get(key) or _Part()
        msgs = []
        for off in sorted(p.messages):
            m = copy.copy(p.messages[off])
            m.dc = p.counts.get(off, 0) + (1 if off < p.delivered_upto else 0)
            msgs.append(m)
        return PartitionState(next_offset=p.next_offset, delivered_upto=p.delivered_upto, messages=msgs,
                              producers=dict(p.producers))

    def load_partition(self, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
        with self.disk.lock:
            st = self._state((queue_id, partition))
            lg = self.disk.logs.get((queue_id, partition))
            if lg is not None:
                st.applied = lg.applied
            if budget:
                _cool(st, budget)
            return st

    def _log(self, op: LogAppend | LogTruncate | LogCompact | PutHardState | PutApplied) -> LogState:
        st = self.disk.logs.get((op.queue_id, op.partition))
        if st is None:
            st = self.disk.logs[(op.queue_id, op.partition)] = LogState()
        return st

    def close(self) -> None:
        self._open = False

    def _part(self, key: Key) -> _Part:
        p = self.disk.parts.get(key)
        if p is None:
            p = self.disk.parts[key] = _Part()
        return p

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        if not self._open:
            raise StorageError("store is closed")
        with self.disk.lock:
            staged = _staged(self.disk)
            try:
                for op in ops:
                    self._apply_one(op)
            except Exception as exc:
                for k, v in staged.items():  # all or nothing, like a transaction
                    setattr(self.disk, k, v)
                raise StorageError(f"write failed: {exc!r}", orig=exc) from exc

    def _apply_one(self, op: WriteOp) -> None:
        d = self.disk
        if isinstance(op, Append):
            p = self._part((op.queue_id, op.partition))
            for m in op.messages:
                if not isinstance(m.body, bytes):
                    raise TypeError("body must be bytes")
                p.messages[m.offset] = StoredMessage(m.offset, m.key, m.headers_blob, m.body, m.producer_id,
                                                     m.seq, m.ts)
            p.next_offset = max(p.next_offset, op.next_offset)
        elif isinstance(op, Settle):
            p = self._part((op.queue_id, op.partition))
            for off in op.offsets:
                p.messages.pop(off, None)
                p.counts.pop(off, None)
        elif isinstance(op, Trim):  # (each message is a chunk of its own here)
            p = self._part((op.queue_id, op.partition))
            for off in [o for o in p.messages if o < op.below]:
                del p.messages[off]
                p.counts.pop(off, None)
        elif isinstance(op, MarkDelivered):
            p = self._part((op.queue_id, op.partition))
            p.delivered_upto = max(p.delivered_upto, op.upto)
        elif isinstance(op, SetDeliveryCount):
            p = self._part((op.queue_id, op.partition))
            for off, dc in op.items:
                if off in p.messages:
                    p.counts[off] = dc
        elif isinstance(op, PutProducer):
            self._part((op.queue_id, op.partition)).producers[op.producer_id] = op.last_seq
        elif isinstance(op, DropProducers):
            prods = self._part((op.queue_id, op.partition)).producers
            for pid in op.producer_ids:
                prods.pop(pid, None)
        elif isinstance(op, PutQueue):
            if any(q.name == op.queue.name and q.id != op.queue.id for q in d.queues.values()):
                raise ValueError(f"queue name {op.queue.name!r} taken")
            d.queues[op.queue.id] = op.queue
            hwm = max(int(d.meta.get("queue_id_hwm", "0")), op.queue.id)
            d.meta["queue_id_hwm"] = str(hwm)
        elif isinstance(op, DropQueue):
            d.queues.pop(op.queue_id, None)
            for key in [k for k in d.parts if k[0] == op.queue_id]:
                del d.parts[key]
            for key in [k for k in d.logs if k[0] == op.queue_id]:
                del d.logs[key]
        elif isinstance(op, LogAppend):
            st = self._log(op)
            st.commit = max(st.commit, op.commit)
            for e in op.entries:
                if st.entries and e.index <= st.entries[-1].index:  # replaces (rare): keep it simple
                    st.entries = [x for x in st.entries if x.index != e.index]
                    st.entries.append(e)
                    st.entries.sort(key=lambda e: e.index)
                else:
                    st.entries.append(e)
        elif isinstance(op, LogTruncate):
            st = self._log(op)
            st.entries = [e for e in st.entries if e.index < op.from_index]
            st.commit = min(st.commit, op.from_index - 1)
        elif isinstance(op, LogCompact):
            st = self._log(op)
            st.entries = [e for e in st.entries if e.index > op.upto]
            st.snapshot = (op.upto, op.term, op.origin)
            st.snap_weak, st.snap_recency = op.weak, op.recency
        elif isinstance(op, PutHardState):
            st = self._log(op)
            st.term, st.voted_for, st.commit = op.term, op.voted_for, op.commit
        elif isinstance(op, PutApplied):
            self._log(op).applied = (op.index, op.term, op.origin)
        elif isinstance(op, ResetPartition):
            d.parts.pop((op.queue_id, op.partition), None)
        elif isinstance(op, PutUser):
            if not isinstance(op.user.salt, bytes):
                raise TypeError("salt must be bytes")
            d.users[op.user.name] = op.user
        elif isinstance(op, DropUser):
            d.users.pop(op.name, None)
            for k in [k for k in d.acls if k[0] == op.name]:
                del d.acls[k]
        elif isinstance(op, GrantAcl):
            d.acls.setdefault((op.acl.user, op.acl.pattern), set()).update(op.acl.permissions)
        elif isinstance(op, RevokeAcl):
            held = d.acls.get((op.acl.user, op.acl.pattern), set())
            held.difference_update(op.acl.permissions)
            if not held:
                d.acls.pop((op.acl.user, op.acl.pattern), None)
        elif isinstance(op, PutMeta):
            d.meta[op.key] = op.value
        elif isinstance(op, DropMeta):
            d.meta.pop(op.key, None)
        else:
            raise TypeError(f"unknown write op {type(op).__name__}")

    def read(self, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        with self.disk.lock:
            p = self.disk.parts.get((queue_id, partition))
            if p is None:
                return []
            offs = sorted(o for o in p.messages if o >= offset)[:limit]
            return [copy.copy(p.messages[o]) for o in offs]

    def chunks(self, queue_id: int, partition: int) -> list[tuple[int, int, int]]:
        with self.disk.lock:
            p = self.disk.parts.get((queue_id, partition))
            held = p.messages if p is not None else {}
            return [(o, 1, len(held[o].body) + len(held[o].headers_blob)) for o in sorted(held)]

    def stored_end(self, queue_id: int, partition: int) -> int:
        with self.disk.lock:
            p = self.disk.parts.get((queue_id, partition))
            return p.next_offset if p is not None else 0

    def set_meta(self, key: str, value: str) -> None:
        with self.disk.lock:
            self.disk.meta[key] = value


def _staged(d: MemoryDisk) -> dict[str, object]:
    """What a failed transaction puts back: each table copied down to what ops change in place
    (a partition's dicts, a log's entry list, a grant's permissions); the rows ops only ever
    replace whole (queue metadata, users, stored messages, log records) are shared."""
    return {
        "meta": dict(d.meta),
        "queues": dict(d.queues),
        "parts": {k: _Part(p.next_offset, p.delivered_upto, dict(p.messages), dict(p.counts), dict(p.producers))
                  for k, p in d.parts.items()},
        "users": dict(d.users),
        "acls": {k: set(v) for k, v in d.acls.items()},
        "logs": {k: dataclasses.replace(st, entries=list(st.entries)) for k, st in d.logs.items()},
    }


def _cool(st: PartitionState, budget: int) -> None:
    """Keep the head of ``st``'s messages that fits ``budget`` bytes (at least one); the rest
    becomes its cold region, as the SQLite engine's load leaves it."""
    held = 0
    for i, m in enumerate(st.messages):
        cost = message_cost(m)
        if held + cost > budget and i:
            rest = st.messages[i:]
            st.cold_start, st.cold_end, st.cold_count = m.offset, st.next_offset, len(rest)
            st.cold_bytes = sum(len(r.body) + len(r.headers_blob) for r in rest)
            del st.messages[i:]
            return
        held += cost
