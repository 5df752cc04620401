"""The replication wire format: messages between replicas, log entry payloads, snapshots.

Everything is msgpack (``use_bin_type=True``; decoded with ``raw=False``).  Arrays
are positional; a field marked *bin* is a msgpack bin, *str* a msgpack str, *nil|x*
may be nil.  Nodes of different builds talk to each other, so no field moves and no
code changes meaning; a new message kind or op code is added at the end, and a
receiver drops a kind it does not know (:class:`UnknownMessageKind`).  Every decoder
checks what it reads against the layouts (an array of at least the listed items, each of
the listed type; *int* items fit a signed 64-bit integer, and are never negative in a
message, or in an op where they name a position) and refuses anything else with
:class:`MalformedReplicationError`, whoever sent the bytes.

Each module documents its layouts byte by byte beside the code:

* ``messages``   the ``Replicate`` frame and the replication messages (:class:`MessageKind`)
* ``ops``        log entry payloads: the write ops (:class:`OpCode`)
* ``snapshots``  partition and catalogue snapshots, and the chunks of a streamed one
* ``records``    the records ops and snapshots carry: queues, users, grants, placements,
                 the group's members, updates, messages
* ``base``       the partition key, the error, the checks every decoder runs

The names below are the package's interface: import them from ``broker.peers.codec``.
"""

from broker.peers.codec.base import CATALOGUE, Key, MalformedReplicationError
from broker.peers.codec.messages import (
    MessageKind,
    UnknownMessageKind,
    decode_message,
    decode_replicate,
    encode_message,
    encode_replicate,
)
from broker.peers.codec.ops import OpCode, decode_ops, encode_ops
from broker.peers.codec.records import group_out, placement_out, updating_out
from broker.peers.codec.snapshots import (
    check_snapshot,
    chunk_ops,
    decode_catalogue_snapshot,
    encode_catalogue_snapshot,
    encode_chunk,
    encode_snapshot,
    encode_streamed,
    snapshot_ops,
    streamed_parts,
)

__all__ = [
    "CATALOGUE",
    "Key",
    "MalformedReplicationError",
    "MessageKind",
    "OpCode",
    "UnknownMessageKind",
    "check_snapshot",
    "chunk_ops",
    "decode_catalogue_snapshot",
    "decode_message",
    "decode_ops",
    "decode_replicate",
    "encode_catalogue_snapshot",
    "encode_chunk",
    "encode_message",
    "encode_ops",
    "encode_replicate",
    "encode_snapshot",
    "encode_streamed",
    "group_out",
    "placement_out",
    "snapshot_ops",
    "streamed_parts",
    "updating_out",
]
