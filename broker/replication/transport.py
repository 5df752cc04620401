"""Replication messages to and from peers, over the peer links' ``Replicate`` frames.

One ``Replicate`` frame per peer per turn of the event loop carries the messages of any
number of partitions (codec.py documents its bytes).  A snapshot leaves the core
without its data; it is read from the store here, as up to date as the log allows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

from broker.replication.codec import (
    CATALOGUE,
    Key,
    MalformedReplicationError,
    UnknownMessageKind,
    check_snapshot,
    decode_message,
    decode_replicate,
    encode_catalogue_snapshot,
    encode_message,
    encode_replicate,
    encode_snapshot,
)
from broker.replication.host import ReplicationHost
from broker.replication.partlog import PartLog
from client.protocol.frames import Replicate
from ha.messages import Envelope, InstallSnapshot, Message

log = logging.getLogger("tandem.ha")


class Transport:
    """``release_held(plog)`` submits the store writes a log holds back (a snapshot waits
    for them); ``spawn`` runs a coroutine as a task replication owns."""

    def __init__(self, host: ReplicationHost, logs: Mapping[Key, PartLog], *,
                 release_held: Callable[[PartLog], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._host = host
        self._logs = logs
        self._release_held = release_held
        self._spawn = spawn
        self._out: dict[str, list[list[Any]]] = {}  # peer -> Replicate items
        self._flush_scheduled = False
        self._unknown_kinds: set[tuple[str, str]] = set()  # (peer, repr of message kind) already logged

    def send(self, key: Key, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, InstallSnapshot) and msg.data is None:
            self._spawn(self._send_snapshot(key, env.dst, msg))
            return
        self._out.setdefault(env.dst, []).append([key[0], key[1], encode_message(msg)])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    async def _send_snapshot(self, key: Key, dst: str, m: InstallSnapshot) -> None:
        host = self._host
        if key == CATALOGUE:
            data = encode_catalogue_snapshot((q.meta for q in host.queues.values()), host.security_snapshot())
            pos = self._logs[key].applied
        else:
            plog = self._logs.get(key)
            if plog is not None:
                # a snapshot of the store as up to date as the log allows: what is held, and
                # what was released but not yet committed, first
                self._release_held(plog)
                await host.write([], sync=False)
            st = await asyncio.to_thread(host.engine.load_partition, *key)
            data = encode_snapshot(st)
            pos = st.applied
        log.info("partition %d/%d: sending a snapshot at index %d to %s", key[0], key[1], pos[0], dst)
        held = self._logs.get(key)
        r = held.replica if held is not None else None
        members = r.members_at(pos[0]) if r is not None and pos[0] >= r.snap_index else None
        full = InstallSnapshot(m.term, m.leader, pos[0], pos[1], pos[2], data, members)
        self._out.setdefault(dst, []).append([key[0], key[1], encode_message(full)])
        self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, {}
        peers = self._host.peers
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
                if isinstance(msg, InstallSnapshot) and msg.data is not None:
                    check_snapshot((qid, p), msg.data)  # (decoded twice: snapshots are rare)
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
