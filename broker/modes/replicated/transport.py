"""Replication messages to and from peers, over the peer links' ``Replicate`` frames.

One ``Replicate`` frame per peer per turn of the event loop carries the messages of any
number of partitions (broker.peers.codec documents its bytes).  A snapshot leaves the core
without its data; it is read from the store here, as up to date as the log allows.

A partition's snapshot is streamed: its messages go in parts (``SnapshotChunk``) of at
most ``objects_locked_per_transaction`` messages and CHUNK_BYTES, each read from the
store in a transaction of its own and sent once the link has taken the one before, then
the state without messages (the streamed form) ends it as the core's ``InstallSnapshot``.
So however large the partition, the active never holds it in memory nor stops for it.
The parts are read while the partition goes on: a message settled after the snapshot's
position is missing from a later part, and the entries after that position, which the
replica applies next, settle it again (a no-op), as ZooKeeper's fuzzy snapshots do;
messages appended after it are left out (offsets from the snapshot's next offset on).

The replica writes each part as it arrives.  At the first it starts the partition over
empty (store and core, as after HA-1014; a mark in the store says a stream is under way,
so a restart midway starts over too) and neither votes nor stands until it is caught up;
a part out of order, or from another active or term, drops the stream, and the active's
next snapshot starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from broker.peers.codec import (
    CATALOGUE,
    Key,
    MalformedReplicationError,
    UnknownMessageKind,
    check_snapshot,
    chunk_ops,
    decode_message,
    decode_replicate,
    encode_catalogue_snapshot,
    encode_chunk,
    encode_message,
    encode_replicate,
    encode_snapshot,
    encode_streamed,
    streamed_parts,
)
from broker.config import NodeConfig
from broker.modes.replicated.host import PeerGroup, PeerLink, Queues, StoreWriter
from broker.modes.replicated.partlog import PartLog
from client.clock import Clock
from client.protocol.frames import Replicate
from ha.messages import Envelope, InstallSnapshot, Message, SnapshotAck, SnapshotChunk
from ha.replica import Role
from storage.base import Engine, PartitionState

log = logging.getLogger("tandem.ha")

CHUNK_BYTES = 4 * 1024 * 1024  # message bodies (about) in one part of a streamed snapshot
#: after a stream, the active waits for the replica's answer (it keeps the entries after the
#: snapshot, and sends it no other) until the replica has it, or for at most this many
#: non-response timeouts plus the time to write the parts at WRITE_RATE (a replica gone meanwhile)
PIN_TIMEOUTS = 10
WRITE_RATE = 16 * 1024 * 1024  # bytes a second a replica is assumed to write parts at, at least
AHEAD = 4  # parts the active sends beyond the last one the replica has written


@dataclass(slots=True)
class _Incoming:
    """A stream a replica is taking: from whom, in which term, as of which index, the next part."""

    src: str
    term: int
    index: int
    next: int


class Transport:
    """``release_held(plog)`` submits the store writes a log holds back (a snapshot waits
    for them); ``spawn`` runs a coroutine as a task replication owns."""

    def __init__(self, config: NodeConfig, clock: Clock, logs: Mapping[Key, PartLog], *, engine: Engine,
                 writer: StoreWriter, peers: PeerGroup | None, queues: Queues,
                 group_state: Callable[[], dict[str, Any]],
                 release_held: Callable[[PartLog], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 restart: Callable[[PartLog, str], PartLog]) -> None:
        self._config = config
        self._clock = clock
        self._engine = engine
        self._writer = writer
        self._peers = peers
        self._queues = queues
        self._group_state = group_state  # the group's state for the catalogue's snapshot
        self._logs = logs
        self._release_held = release_held
        self._spawn = spawn
        self._restart = restart  # start a partition over empty (returns its new log)
        self._streaming: set[tuple[Key, str]] = set()  # (partition, replica) snapshots being sent
        self._incoming: dict[Key, _Incoming] = {}  # snapshots being received
        self._skipped: dict[Key, tuple[str, int, int]] = {}  # streams a replica had no need of
        #: (partition, replica) -> (index of the snapshot streamed to it, when it started or ended,
        #: bytes sent): the entries after it are what the replica needs next, kept from compaction
        self._pins: dict[tuple[Key, str], tuple[int, float, int]] = {}
        #: (partition, replica) -> the link a stream to it was on when it stopped before its end
        #: (None: no link): once another link is up, no answer to that stream can come
        self._cut: dict[tuple[Key, str], PeerLink | None] = {}
        #: (partition, replica) -> (snapshot index, the last part it has written), and the event
        #: a stream waits on for the next
        self._acks: dict[tuple[Key, str], tuple[int, int]] = {}
        self._acked: dict[tuple[Key, str], asyncio.Event] = {}
        self._out: dict[str, list[list[Any]]] = {}  # peer -> Replicate items
        self._flush_scheduled = False
        self._unknown_kinds: set[tuple[str, str]] = set()  # (peer, repr of message kind) already logged

    def send(self, key: Key, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, InstallSnapshot) and msg.data is None:
            self._spawn(self._send_snapshot(key, env.dst, msg))
            return
        self._put(env.dst, key, msg)
        self._schedule_flush()

    async def _send_snapshot(self, key: Key, dst: str, m: InstallSnapshot) -> None:
        if key != CATALOGUE:
            # The core asks again while one is on its way, and before the replica's answer to
            # the last one is back (it answers once it has written every part): not again
            # while that answer may still come (_answer_due).
            plog = self._logs.get(key)
            progress = plog.replica.progress() if plog is not None else {}
            if (key, dst) not in self._streaming and not self._answer_due(key, dst, progress):
                self._streaming.add((key, dst))
                try:
                    await self._stream_snapshot(key, dst, m)
                finally:
                    self._streaming.discard((key, dst))
            return
        data = encode_catalogue_snapshot((q.meta for q in self._queues.queues.values()), self._group_state())
        pos = self._logs[key].applied
        log.info("catalogue: sending a snapshot at index %d to %s", pos[0], dst)
        members = self._members_at(key, pos[0])
        self._put(dst, key, InstallSnapshot(m.term, m.leader, pos[0], pos[1], pos[2], data, members, m.weak))
        self.flush()

    def _put(self, dst: str, key: Key, msg: Message | SnapshotChunk | SnapshotAck) -> None:
        """Queue ``msg`` of ``key`` for ``dst``'s next Replicate frame."""
        self._out.setdefault(dst, []).append([key[0], key[1], encode_message(msg)])

    async def _committed(self) -> None:
        """Until everything submitted to the store writer so far is committed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def committed(err: BaseException | None) -> None:
            if not done.done():
                done.set_exception(err) if err else done.set_result(None)

        self._writer.submit([], sync=False, callback=committed)
        await done

    async def _written(self, key: Key, dst: str, index: int, seq: int) -> bool:
        """Until ``dst`` has written part ``seq`` of the snapshot as of ``index`` (True), or has
        not for PIN_TIMEOUTS non-response timeouts (False)."""
        if seq < 0:
            return True
        try:
            async with self._clock.timeout(PIN_TIMEOUTS * self._config.non_response_timeout):
                while self._acks.get((key, dst), (-1, -1)) < (index, seq):
                    ev = self._acked.setdefault((key, dst), asyncio.Event())
                    ev.clear()
                    await ev.wait()
        except TimeoutError:
            return False
        return True

    def _ack(self, key: Key, m: SnapshotAck) -> None:
        """A replica wrote part ``m.seq``: the stream to it may go on."""
        pair = (key, m.replica)
        if (m.index, m.seq) > self._acks.get(pair, (-1, -1)):
            self._acks[pair] = (m.index, m.seq)
        ev = self._acked.get(pair)
        if ev is not None:
            ev.set()

    def streamed_at(self, key: Key, progress: Mapping[str, int]) -> int | None:
        """The lowest index of a snapshot streamed (or being streamed) to a replica of
        ``key`` whose answer may still come (``progress``: the replicas' match indexes): the
        entries after it are kept from compaction."""
        out = None
        for pin, (index, _at, _sent) in list(self._pins.items()):
            if pin[0] == key and self._answer_due(key, pin[1], progress) and (out is None or index < out):
                out = index
        return out

    def _answer_due(self, key: Key, dst: str, progress: Mapping[str, int]) -> bool:
        """A snapshot streamed to ``dst`` is on its way or written there: its answer may still
        come.  Not once ``dst`` has its index, nor PIN_TIMEOUTS non-response timeouts after
        its last part plus a second per WRITE_RATE bytes of parts (the replica answers once
        it has written them all), nor once a stream that stopped before its end has lost the
        link it was on (the replica never got the end)."""
        pair = (key, dst)
        pin = self._pins.get(pair)
        if pin is None:
            return False
        if pair in self._cut and pair not in self._streaming and self._link(dst) is not self._cut[pair]:
            del self._pins[pair], self._cut[pair]
            return False
        index, at, sent = pin
        wait = PIN_TIMEOUTS * self._config.non_response_timeout + sent / WRITE_RATE
        if progress.get(dst, 0) >= index or (pair not in self._streaming and self._clock.monotonic() - at > wait):
            del self._pins[pair]
            self._cut.pop(pair, None)
            return False
        return True

    def _link(self, dst: str) -> PeerLink | None:
        return self._peers.links.get(dst) if self._peers is not None else None

    def _members_at(self, key: Key, index: int) -> Any:
        held = self._logs.get(key)
        r = held.replica if held is not None else None
        return r.members_at(index) if r is not None and index >= r.snap_index else None

    async def _stream_snapshot(self, key: Key, dst: str, m: InstallSnapshot) -> None:
        """Stream partition ``key``'s snapshot to ``dst``, part by part (see the module).  A
        stream that stops before its end is remembered with its link (:meth:`_answer_due`)."""
        self._cut.pop((key, dst), None)
        ended = False
        try:
            ended = await self._stream(key, dst, m)
        finally:
            if not ended and (key, dst) in self._pins:
                self._cut[(key, dst)] = self._link(dst)

    async def _stream(self, key: Key, dst: str, m: InstallSnapshot) -> bool:
        """The stream itself: True once its end is sent."""
        plog = self._logs.get(key)
        if plog is not None:
            # a snapshot of the store as up to date as the log allows: what is held, and
            # what was released but not yet committed, first
            self._release_held(plog)
            await self._committed()
        head = await asyncio.to_thread(self._engine.load_partition, key[0], key[1], 1)
        pos, end = head.applied, head.next_offset
        per_part = self._config.objects_locked_per_transaction
        self._pins[(key, dst)] = (pos[0], self._clock.monotonic(), 0)
        self._acks.pop((key, dst), None)
        log.info("partition %d/%d: streaming a snapshot at index %d to %s (parts of up to %d messages)", key[0],
                 key[1], pos[0], dst, per_part)
        offset, parts, sent, limit = 0, 0, 0, per_part

        def still_sending() -> bool:
            now = self._logs.get(key)
            return now is not None and now.replica.role is Role.LEADER and now.replica.term == m.term

        while offset < end:
            msgs = await asyncio.to_thread(self._engine.read, key[0], key[1], offset, limit)
            msgs = [x for x in msgs if x.offset < end]
            if not msgs:
                break
            size, n = 0, 0
            for x in msgs:  # a part of at most CHUNK_BYTES (and one message at least)
                size += len(x.body) + len(x.headers_blob)
                n += 1
                if size >= CHUNK_BYTES:
                    break
            part = msgs[:n]
            limit = min(per_part, n + 1) if n < len(msgs) else per_part  # (about a part's worth next)
            offset = part[-1].offset + 1
            link = self._link(dst)
            if link is None or not still_sending():
                log.info("partition %d/%d: snapshot to %s stopped after %d part(s) (the link or the role went)",
                         key[0], key[1], dst, parts)
                return False
            self._put(dst, key, SnapshotChunk(m.term, m.leader, pos[0], parts, encode_chunk(part), m.weak))
            self.flush()
            parts += 1
            sent += len(part)
            self._pins[(key, dst)] = (pos[0], self._clock.monotonic(), self._pins[(key, dst)][2] + size)
            try:
                await link.drain()  # the next part once the link has taken this one
            except ConnectionError as exc:
                log.info("partition %d/%d: snapshot to %s stopped after %d part(s): the link went (%s)", key[0],
                         key[1], dst, parts, exc)
                return False
            if not await self._written(key, dst, pos[0], parts - 1 - AHEAD):
                log.info("partition %d/%d: snapshot to %s stopped after %d part(s): the replica has not written "
                         "them", key[0], key[1], dst, parts)
                return False
        if not still_sending():
            return False
        # (no message at all: the whole form, which starts the replica's partition over)
        data = encode_streamed(head, parts) if parts else encode_snapshot(
            PartitionState(next_offset=head.next_offset, delivered_upto=head.delivered_upto, producers=head.producers))
        members = self._members_at(key, pos[0])
        self._put(dst, key, InstallSnapshot(m.term, m.leader, pos[0], pos[1], pos[2], data, members, m.weak))
        self.flush()
        log.info("partition %d/%d: snapshot at index %d streamed to %s: %d message(s) in %d part(s)", key[0], key[1],
                 pos[0], dst, sent, parts)
        return True

    def _part(self, plog: PartLog, src: str, m: SnapshotChunk) -> InstallSnapshot | None:
        """Part ``m.seq`` of a snapshot streamed here: written as it arrives (see the module).
        A weak stream this replica refuses is not written: what its core is to be told instead
        (InstallSnapshot.weak)."""
        key, r = plog.key, plog.replica
        inc = self._incoming.get(key)
        if m.seq == 0:
            if m.term < r.term or (m.term == r.term and r.leader not in (None, m.leader)):
                return None  # (a deposed active's)
            if m.weak and r.refuses_weak_snapshot():
                # A weak active's state over what a majority wrote: not started over for it;
                # the core refuses it and deposes that active (the stream's end is dropped)
                self._incoming.pop(key, None)
                self._skipped[key] = (src, m.term, m.index)
                return InstallSnapshot(m.term, m.leader, m.index, weak=True)
            if r.commit >= m.index:
                # it has all of it committed (it took the last one, whose answer crossed this)
                self._incoming.pop(key, None)
                self._skipped[key] = (src, m.term, m.index)
                return None
            plog = self._restart(plog, f"taking a snapshot streamed from {m.leader}")
            self._incoming[key] = _Incoming(src, m.term, m.index, 1)
        elif inc is None or (inc.src, inc.term, inc.index, inc.next) != (src, m.term, m.index, m.seq):
            if self._skipped.get(key) == (src, m.term, m.index):
                return None
            if inc is not None:
                del self._incoming[key]
                log.warning("partition %s: snapshot part %d from %s out of order: the stream is dropped (the "
                            "active starts another)", plog.name, m.seq, src)
            return None
        else:
            inc.next += 1
        try:
            ops = chunk_ops(key, m.data)
        except MalformedReplicationError as exc:
            self._incoming.pop(key, None)
            log.warning("bad snapshot part from %s for %s dropped, and its stream: %s", src, plog.name, exc.message)
            return None
        ack = SnapshotAck(m.term, self._config.name, m.index, m.seq)

        def written(err: BaseException | None) -> None:
            if err is None:  # (a failed write stops the node)
                self._put(src, key, ack)
                self._schedule_flush()

        self._writer.submit(ops, sync=False, callback=written)
        return None

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _stream_ends(self, plog: PartLog, src: str, m: InstallSnapshot) -> bool:
        """Whether the core may take snapshot ``m``: whole, or ending the stream it takes."""
        parts = streamed_parts(m.data)
        if not parts:
            return True
        inc = self._incoming.pop(plog.key, None)
        if inc is not None and (inc.src, inc.term, inc.index, inc.next) == (src, m.term, m.index, parts):
            return True
        if self._skipped.pop(plog.key, None) == (src, m.term, m.index):
            return False
        log.warning("partition %s: the end of a snapshot stream from %s without its %d part(s): dropped (the "
                    "active starts another)", plog.name, src, parts)
        return False

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, {}
        peers = self._peers
        if peers is None:
            return
        epoch = peers.epoch
        for dst, items in out.items():
            link = peers.links.get(dst)
            if link is not None:
                link.send(Replicate(payload=encode_replicate(items), epoch=epoch))

    def receive(self, src: str, payload: bytes) -> Iterator[tuple[PartLog, Message]]:
        """The messages of a Replicate frame from peer ``src``, each with its log (looked up
        as the caller gets to it).  Messages of partitions unknown here are skipped (a queue
        whose catalogue entry is on its way), as are those that do not decode (and a payload
        that does not, whole)."""
        try:
            items = decode_replicate(payload)
        except MalformedReplicationError as exc:
            log.warning("bad replication frame from %s dropped: %s", src, exc.message)
            return
        for qid, p, raw in items:
            plog = self._logs.get((qid, p))
            if plog is None:
                continue
            try:
                msg = decode_message(raw)
                if isinstance(msg, SnapshotChunk):
                    if (qid, p) != CATALOGUE:  # (the catalogue's snapshot goes whole)
                        refused = self._part(plog, src, msg)
                        if refused is not None:  # (a weak stream refused: its core deposes the sender)
                            yield plog, refused
                    continue
                if isinstance(msg, SnapshotAck):
                    if msg.replica == src:
                        self._ack((qid, p), msg)
                    continue
                if isinstance(msg, InstallSnapshot) and msg.data is not None:
                    check_snapshot((qid, p), msg.data)  # (decoded twice: snapshots are rare)
                    if (qid, p) != CATALOGUE and not self._stream_ends(plog, src, msg):
                        continue
            except UnknownMessageKind as exc:
                # a newer build's: said once per peer and kind
                if (src, repr(exc.kind)) not in self._unknown_kinds:  # (repr: a kind may be a list)
                    self._unknown_kinds.add((src, repr(exc.kind)))
                    log.warning("%s sends replication messages of kind %r, which this build does not know "
                                "(a newer build's?): dropped, and not logged again", src, exc.kind)
                continue
            except MalformedReplicationError as exc:
                log.warning("bad replication message from %s for %d/%d dropped: %s", src, qid, p, exc.message)
                continue
            yield plog, msg
