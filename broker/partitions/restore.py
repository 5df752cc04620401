"""Restore after a split brain: merge what HA-1014 discarded (:mod:`broker.partitions.quarantine` keeps
it in the queue ``tandem.quarantine``) back into the queues it came from.

The group as it is now is the source: each quarantined message is an instance its queue
lacks (Instance Added) and is published to it again; acknowledgements made on the side that
lost were not kept (State Conflict: the source's state wins, those messages are delivered
again).  Its id, the partition and offset the losing side stored it at, may name another
message in the source, which wrote its own there (Key Conflict: the source keeps the id), or
one it writes there later: so a restored message always gets the id of where it lands now,
its old one in :data:`RESTORED_ID` for consumers that saw it before the heal; the conflicts
are counted.  A message its producer sent again to the source (unconfirmed where it was
first stored, so resent after a failover, under the same producer id and seq) is the same
message: the source's partition is asked what it stores of that producer since the logs
parted (:func:`resent`), and a resend found there is not restored.  A message goes back
under the producer id ``restore.<writer>.<term>.<queue>.<partition>`` (the node that wrote
it, as active, and its term then) with its offset there as sequence number, so a restore cut
short and run again stores nothing twice, and the copies of one write that several nodes of
the losing side discarded are stored once.  Each is acknowledged in the quarantine once its
queue has it.

Two ways in, one procedure (this module's pieces): ``tandem restore``
(broker/tools/restore_cli.py) is a client of the group; :class:`~broker.partitions.restore_run.Restores`
runs it in the group itself for the admin API and the console (``POST /api/v1/restore``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.partitions.compensation import Conflict, Hook, Resolution, Version, resolve
from broker.messaging.forward import UNKNOWN_KIND, RestoreFwd
from broker.partitions.quarantine import HEADERS, QUEUE
from broker.messaging.streams import Produced
from broker.messaging.message import ID_HEADER
from client.errors import InvalidArgumentError, PartitionNotFoundError, UnknownOpError
from client.protocol.codec import MAX_INT
from client.protocol.frames import PublishMessage, StreamMessage

log = logging.getLogger("tandem.broker")

#: the id a restored message had on the side that lost ("<partition>-<offset>")
RESTORED_ID = "x-tandem-restored-id"

#: A restore counts what the quarantine holds when it begins (ready, delivered and not yet
#: settled, not yet committed) and is done once it has looked at that many messages; it waits
#: this many seconds for the next one at most, and is done then too (another consumer holds
#: the rest, or the count was not to be had).  What arrives after the count waits for the
#: next run.
WAIT = 2.0

#: seconds a run in the group goes on before it leaves the rest for the next (a forwarded
#: request is answered within 30 s)
BUDGET = 20.0

#: key conflicts a run logs one by one (the rest are counted)
LOGGED = 20

@dataclass(frozen=True, slots=True)
class Filter:
    """Which quarantined messages a restore takes (None: any)."""

    origin: str | None = None  # the node that discarded them
    queue: str | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        if self.partition is not None and self.partition < 0:
            raise InvalidArgumentError(f"partition {self.partition}: a partition number >= 0")

    @property
    def narrowed(self) -> bool:
        return self.origin is not None or self.queue is not None or self.partition is not None

    def wants(self, h: Mapping[str, str]) -> bool:
        return ((self.origin is None or h.get("x-quarantine-node") == self.origin)
                and (self.queue is None or h.get("x-quarantine-queue") == self.queue)
                and (self.partition is None or h.get("x-quarantine-partition") == str(self.partition)))

    def forward(self, hops: int) -> RestoreFwd:
        return RestoreFwd(hops, self.origin or "", self.queue or "",
                          "" if self.partition is None else str(self.partition))

    @classmethod
    def of(cls, req: RestoreFwd) -> Filter:
        if req.partition and not req.partition.isdigit():
            raise InvalidArgumentError(f"forwarded RESTORE: partition {req.partition!r} is not a number")
        return cls(req.origin or None, req.queue or None, int(req.partition) if req.partition else None)


def republished(h: Mapping[str, str], key: str | None, body: bytes) -> tuple[str, str, PublishMessage]:
    """(queue, producer id, message) that puts a quarantined message back: its own headers
    without the quarantine's and without its old id, which goes in :data:`RESTORED_ID`."""
    queue, partition, offset = h["x-quarantine-queue"], h["x-quarantine-partition"], int(h["x-quarantine-offset"])
    # who wrote it, in which term: each node that discarded the same write kept a copy, and
    # the copies go back under one producer id (the first stored, the others duplicates)
    written = h.get("x-quarantine-written") or f"{h['x-quarantine-node']}.{h['x-quarantine-term']}"
    headers = {k: v for k, v in h.items() if k not in HEADERS and k != ID_HEADER}
    headers[RESTORED_ID] = h["x-quarantine-id"]
    return queue, f"restore.{written}.{queue}.{partition}", PublishMessage(key, headers, body, offset)


def where(h: Mapping[str, str]) -> tuple[str, int]:
    """(queue, partition) the losing side stored a quarantined message at."""
    return h["x-quarantine-queue"], int(h["x-quarantine-partition"])


async def compensated(hook: Hook | None, h: Mapping[str, str], msg: PublishMessage,
                      read: Callable[[str, int, int], Awaitable[list[StreamMessage]]]) -> tuple[Resolution,
                                                                                             PublishMessage | None]:
    """A key conflict put to ``hook`` (:mod:`broker.partitions.compensation`): what it decided, and the
    message to publish instead of ``msg`` (None: none).  ``read`` reads the source's
    partition from an offset."""
    if hook is None:
        return resolve(None, _conflict(h, msg, None)), msg
    (queue, partition), offset = where(h), int(h["x-quarantine-offset"])
    found = [m for m in await read(queue, partition, offset) if m.offset == offset]
    kept = Version(found[0].key, found[0].headers, found[0].body) if found else None
    res = resolve(hook, _conflict(h, msg, kept))
    if res.outcome != "merged" or res.version is None:
        return res, msg if res.outcome == "kept" else None
    v = res.version
    headers = {k: x for k, x in v.headers.items() if k not in HEADERS and k != ID_HEADER}
    headers[RESTORED_ID] = msg.headers[RESTORED_ID]
    return res, PublishMessage(v.key, headers, v.body, msg.seq)


def _conflict(h: Mapping[str, str], msg: PublishMessage, kept: Version | None) -> Conflict:
    queue, partition = where(h)
    own = {k: x for k, x in msg.headers.items() if k != RESTORED_ID}
    return Conflict(queue, partition, int(h["x-quarantine-offset"]), h["x-quarantine-node"],
                    Version(msg.key, own, msg.body), kept)


def conflict_line(queue: str, msg: PublishMessage, res: Resolution) -> str:
    """The log line of a key conflict and what became of it."""
    what = {"kept": "restored with the id of where it landed",
            "merged": "the compensation hook merged it: restored in the version it returned",
            "dropped": "the compensation hook dropped it: not restored",
            "failed": f"the compensation hook failed ({res.why}): left in {QUEUE}"}[res.outcome]
    return f"restore: key conflict in {queue}: id {msg.headers[RESTORED_ID]} names another message there now; {what}"


async def taken(h: Mapping[str, str], ends: dict[tuple[str, int], int],
                end_of: Callable[[str, int], Awaitable[int]]) -> bool:
    """Whether the source holds another message where the losing side stored this one (a key
    conflict: its old id names that message now).  ``ends``: the source's end offset of each
    (queue, partition) asked so far (``end_of`` asks it)."""
    at = where(h)
    if at not in ends:
        try:
            ends[at] = await end_of(*at)
        except PartitionNotFoundError:
            ends[at] = 0  # (the queue was declared anew with fewer partitions: nothing there)
    return int(h["x-quarantine-offset"]) < ends[at]


#: what a restore found of each producer in the source's partitions: (queue, partition,
#: producer id, offset) -> Produced
Seen = dict[tuple[str, int, str, int], Produced]


async def resent(h: Mapping[str, str], seen: Seen,
                 produced: Callable[[str, int, str, int], Awaitable[Produced]]) -> bool | None:
    """Whether the source holds this quarantined message as its producer's resend: True (it
    stored the same producer id and sequence number after the logs parted), False (it may,
    unseen: the producer went on there past this one, and messages stored since the parting
    were settled and are no longer there to look at), None (it does not, or nothing says).

    A durable producer that got no confirmation sends a message again, after a failover to
    the other side too; that copy is the same message, not an instance the source lacks."""
    producer, seq = h.get("x-quarantine-producer", ""), h.get("x-quarantine-seq", "")
    if not producer or not seq.isdigit():
        return None
    queue, partition = where(h)
    since = h.get("x-quarantine-from", "0")
    at = (queue, partition, producer, int(since) if since.isdigit() else 0)
    if at not in seen:
        try:
            seen[at] = await produced(*at)
        except PartitionNotFoundError:  # (the queue was declared anew with fewer partitions)
            seen[at] = Produced(-1, True, frozenset())
        except (UnknownOpError, InvalidArgumentError) as exc:
            if not older_build(exc):
                raise
            # the partition's active (or the node tandem restore talks to) runs a build without
            # the look: nothing says the message is not there, as when settled ones are gone
            log.warning("restore: %s/%d cannot be asked what it holds of producer %s (%s): its messages are "
                        "restored and counted unsure", queue, partition, producer, exc)
            seen[at] = Produced(MAX_INT, False, frozenset())
    got, s = seen[at], int(seq)
    if s in got.seqs:
        return True
    return False if s <= got.last and not got.covered else None


def older_build(exc: Exception) -> bool:
    """Whether ``exc`` is a member's or node's answer to a request its build does not know: a
    client op (UnknownOpError) or a forwarded kind (broker.messaging.forward.decode_request)."""
    return isinstance(exc, UnknownOpError) or str(exc).startswith(UNKNOWN_KIND)


#: a :class:`Report`'s counters, by their names in its JSON
COUNTERS = ("restored", "already", "conflicts", "left", "dropped", "merged", "failed", "held", "resent",
            "unsure")


#: a :class:`Report`'s flags, in its JSON only when true
FLAGS = ("more", "moved")


@dataclass
class Report:
    """What a restore did, per queue."""

    restored: Counter[str] = field(default_factory=Counter)
    #: in their queue already (a restore cut short had published them)
    already: Counter[str] = field(default_factory=Counter)
    #: restored messages whose old id names another message of the queue now (key conflicts)
    conflicts: Counter[str] = field(default_factory=Counter)
    #: left in the quarantine: their queue is gone, or the filter did not take them
    left: Counter[str] = field(default_factory=Counter)
    #: key conflicts the compensation hook settled by dropping the quarantined message
    dropped: Counter[str] = field(default_factory=Counter)
    #: ... by a version of its own (restored, and counted in restored and conflicts too)
    merged: Counter[str] = field(default_factory=Counter)
    #: ... that it failed on (an error, or an answer it may not give): left in the quarantine
    failed: Counter[str] = field(default_factory=Counter)
    #: left in the quarantine behind one the hook failed on: the messages a partition lost go
    #: back in their order or not at all (a producer id's sequence numbers only go up, so one
    #: put back after a later one would count as a duplicate)
    held: Counter[str] = field(default_factory=Counter)
    #: not restored: their producer sent them again to the source after the split (it had no
    #: confirmation), and the source holds them (taken out of the quarantine)
    resent: Counter[str] = field(default_factory=Counter)
    #: restored, though the source may hold a resend of theirs it has delivered already: their
    #: producer went on there past them, and it no longer stores all it took since the split
    unsure: Counter[str] = field(default_factory=Counter)
    #: a run in the group stopped before the end (after BUDGET s, or ``moved``): the quarantine
    #: may hold more to restore
    more: bool = False
    #: ... because a partition of the quarantine moved to another member during the run: the
    #: deliveries it held are that member's now (one it had restored is still in the
    #: quarantine there, and the next run counts it in ``already``)
    moved: bool = False
    #: key conflicts logged one by one so far (the first LOGGED of a run)
    logged: int = field(default=0, compare=False)
    #: producer ids with a message the hook failed on in this run: the rest of theirs wait (held)
    blocked: set[str] = field(default_factory=set, compare=False)

    def holds(self, queue: str, pid: str) -> bool:
        """Whether a message of ``pid`` waits behind one the hook failed on (counted held)."""
        if pid in self.blocked:
            self.held[queue] += 1
            return True
        return False

    def resolved(self, queue: str, pid: str, msg: PublishMessage, res: Resolution, logger: logging.Logger) -> None:
        """Count and log a key conflict's outcome (the first LOGGED of a run one by one, a
        hook's failures always); after a failure the rest of ``pid``'s messages wait."""
        if res.outcome == "failed":
            logger.warning("%s", conflict_line(queue, msg, res))
            self.failed[queue] += 1
            self.blocked.add(pid)
            return
        if self.logged < LOGGED:
            self.logged += 1
            logger.info("%s", conflict_line(queue, msg, res))
        if res.outcome == "dropped":
            self.dropped[queue] += 1
        elif res.outcome == "merged":
            self.merged[queue] += 1

    def add(self, other: Report) -> None:
        for mine, theirs in zip(self.counters(), other.counters()):
            mine.update(theirs)
        self.more |= other.more
        self.moved |= other.moved

    def counters(self) -> tuple[Counter[str], ...]:
        return (self.restored, self.already, self.conflicts, self.left, self.dropped, self.merged, self.failed,
                self.held, self.resent, self.unsure)

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: dict(+c) for name, c in zip(COUNTERS, self.counters())}
        for flag in FLAGS:
            if getattr(self, flag):
                out[flag] = True
        return out

    @classmethod
    def from_json(cls, value: Any) -> Report:
        if not isinstance(value, dict):
            raise InvalidArgumentError("a restore report is a map")
        out = cls()
        for name, counter in zip(COUNTERS, out.counters()):
            part = value.get(name, {})
            if not isinstance(part, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0
                                                     for k, v in part.items()):
                raise InvalidArgumentError(f"a restore report's {name} maps queue names to counts")
            counter.update(part)
        for flag in FLAGS:
            on = value.get(flag, False)
            if type(on) is not bool:
                raise InvalidArgumentError(f"a restore report's {flag} is true or false")
            setattr(out, flag, on)
        return out

    def lines(self, narrowed: bool) -> list[str]:
        """What happened, a line per queue (``narrowed``: a filter chose the messages)."""
        out = []
        for q, n in sorted(self.restored.items()):
            if not n:
                continue
            already, conflicts = self.already[q], self.conflicts[q]
            out.append(f"{n} message(s) restored to {q}" + (f" ({already} were there already)" if already else "")
                       + (f"; {conflicts} of their ids name other messages there now (key conflict: the queue "
                          f"keeps them), so each restored message has the id of where it landed, its old one in "
                          f"{RESTORED_ID}" if conflicts else ""))
        for q, n in sorted(self.unsure.items()):
            if n:
                out.append(f"{n} of the message(s) restored to {q} may be there twice: their producer went on in "
                           f"{q} past them, and {q} no longer stores all it took since the split, so a resend of "
                           f"theirs it delivered already cannot be ruled out ({RESTORED_ID} marks the restored copy)")
        for q, n in sorted(self.resent.items()):
            if n:
                out.append(f"{n} message(s) of {q} not restored: their producer sent them again after the split, "
                           f"unconfirmed, and {q} holds them")
        for q, n in sorted(self.merged.items()):
            if n:
                out.append(f"{n} message(s) of {q} restored in the version the compensation hook made of both")
        for q, n in sorted(self.dropped.items()):
            if n:
                out.append(f"{n} message(s) of {q} dropped by the compensation hook (not restored: the queue's own "
                           f"message stands)")
        for q, n in sorted(self.failed.items()):
            if n:
                out.append(f"{n} message(s) of {q} left in {QUEUE}: the compensation hook failed on them (see the "
                           f"log)")
        for q, n in sorted(self.held.items()):
            if n:
                out.append(f"{n} message(s) of {q} left in {QUEUE} behind those: a partition's messages go back in "
                           f"their order; run it again once the hook is mended")
        for q, n in sorted(self.already.items()):
            if n and not self.restored[q]:
                out.append(f"{n} message(s) of {q} were there already (a restore cut short)")
        for q, n in sorted(self.left.items()):
            if n and not q:
                out.append(f"{n} message(s) without quarantine headers left in {QUEUE}")
            elif n:
                out.append(f"{n} message(s) of {q} left in {QUEUE}" + ("" if narrowed else " (their queue is gone)"))
        if self.moved:
            out.append(f"stopped early: a partition of {QUEUE} moved to another member during the run, and {QUEUE} "
                       f"may hold more; run it again (nothing is stored twice)")
        elif self.more:
            out.append(f"stopped after {BUDGET:.0f} s: {QUEUE} may hold more; run it again")
        if not out:
            out.append(f"nothing to restore: {QUEUE} holds no message that matches")
        return out

