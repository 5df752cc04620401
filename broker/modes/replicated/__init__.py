"""Replicated mode: the I/O that feeds each partition's :class:`ha.replica.Replica`.

Every partition of every queue has a replication log on each node that holds it, and
the group has one more log, the *catalogue* (key ``(0, 0)``), whose entries declare and
delete queues.  What changes a partition (a publish batch, settlements, delivery counts
and marks, producer sequences) is a list of store write ops; on the active those ops
become one log entry per partition per turn of the event loop, the entry is shipped to
the replicas, and once the core says it is committed (a quorum of voters, the active
included, has it on disk) the ops are applied to the local store on every node and the
client is confirmed.  Replicas apply committed ops to their store and nothing else.

Modules, from the bottom up:

* ``codec``: the wire format (message kinds, log op codes, snapshots), byte by byte;
* ``host``: what replication needs from the node (narrow Protocols: the store, the queues,
  the group's state, the node's events);
* ``compaction``: how much applied log is kept; ``partlog``: one partition's log;
  ``segments``: compacting past the log files' oldest segment;
* ``commit``: staging and proposing ops; ``apply``: committed entries to store writes,
  held back for a moment; ``serving``: who serves each partition, waits for an active;
  ``transport``: ``Replicate`` frames to and from peers;
* ``events``: what happened (role changes, hand-overs, HA-1014), logged, kept and counted;
  ``reconcile``: which logs this node holds and their members (placement, moves, a
  change of the group's members);
* ``group``: :class:`Replication`, the coordinator: ticks, Readies, the loop.

Peer frames: ``Replicate`` carries the messages of any number of partitions to one
peer, one frame per peer per turn of the loop; ``Forward``/``ForwardOk`` carry client
requests to the node that is active for them (location transparency,
docs/replication.md).
"""

from broker.modes.replicated.apply import HOLD_APPLY, one_applied_position
from broker.peers.codec import (
    CATALOGUE,
    Key,
    MalformedReplicationError,
    MessageKind,
    OpCode,
    UnknownMessageKind,
    decode_message,
    decode_ops,
    encode_message,
    encode_ops,
    encode_snapshot,
    snapshot_ops,
)
from broker.modes.replicated.commit import LAZY_PROPOSE_OPS, STAGE_BYTES, waits_for_commit
from broker.modes.replicated.compaction import COMPACT_BYTES, COMPACT_EVERY, compact_upto
from broker.modes.replicated.events import HaEvent
from broker.modes.replicated.group import Replication
from broker.modes.replicated.partlog import PartLog

__all__ = [
    "CATALOGUE",
    "COMPACT_BYTES",
    "COMPACT_EVERY",
    "HOLD_APPLY",
    "LAZY_PROPOSE_OPS",
    "STAGE_BYTES",
    "HaEvent",
    "Key",
    "MalformedReplicationError",
    "MessageKind",
    "OpCode",
    "PartLog",
    "Replication",
    "UnknownMessageKind",
    "compact_upto",
    "decode_message",
    "decode_ops",
    "encode_message",
    "encode_ops",
    "encode_snapshot",
    "one_applied_position",
    "snapshot_ops",
    "waits_for_commit",
]
