"""A transaction's names: its id, its coordinator partition, and the registers that hold its state.

A transaction's id is ``<producer>/<epoch>/<number>``: the producer that runs it (its
transactional id, scoped to its user: :func:`producer_name`), the producer's epoch when it began
(client.protocol.transactions.TxInit) and its number in that epoch.  The producer's state and the transactions' decisions are registers in the producer table
of one partition of :data:`COORDINATOR_QUEUE` (the producer's *coordinator partition*, by a hash of
its transactional id); what a transaction prepared in a partition it wrote to is registers of
that partition.  A register is a producer-table entry whose id starts ``~``
(broker.messaging.message): written through the partition's log by ``PUT_PRODUCER``, dropped by
``DROP_PRODUCERS``, stored by every replica, carried in snapshots and loaded by a new active.
"""

from __future__ import annotations

import hashlib
import re
import zlib

from broker.messaging.catalogue import COORDINATOR_QUEUE
from client.errors import InvalidArgumentError

COORDINATOR_PARTITIONS = 8
TRANSACTIONAL_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
#: a producer's name in the group: its transactional id and a digest of its user's name
PRODUCER = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}~[0-9a-f]{16}$")

# registers of a coordinator partition
EPOCH = "~txe:"  # + transactional id -> its epoch
BATCH = "~txb:"  # + transactional id -> the last batch it committed
DECISION = "~txd:"  # + transaction id -> outcome + 4 * the second it was decided

COMMIT, ABORT = 1, 2


def check_transactional_id(tid: str) -> None:
    if not TRANSACTIONAL_ID.match(tid):
        raise InvalidArgumentError(f"transactional id {tid!r}: 1-128 characters from A-Z a-z 0-9 _ . : -")


def producer_name(tid: str, user: str) -> str:
    """The producer ``user`` runs as ``tid``: two users' transactional ids never meet."""
    check_transactional_id(tid)
    return f"{tid}~{hashlib.blake2b(user.encode(), digest_size=8).hexdigest()}"


def owned_by(producer: str, user: str) -> bool:
    return producer.endswith("~" + hashlib.blake2b(user.encode(), digest_size=8).hexdigest())


def parse_txid(txid: str) -> tuple[str, int, int]:
    """(producer, epoch, number) of a transaction id; InvalidArgumentError if it is not one."""
    tid, _, rest = txid.partition("/")
    epoch, _, number = rest.partition("/")
    if not (PRODUCER.match(tid) and epoch.isascii() and epoch.isdigit() and number.isascii()
            and number.isdigit() and len(epoch) <= 18 and len(number) <= 18):
        raise InvalidArgumentError(f"transaction id {txid!r}: expected <producer>/<epoch>/<number> (TxInitOk.producer)")
    return tid, int(epoch), int(number)


def coordinator_partition(tid: str) -> int:
    return zlib.crc32(tid.encode()) % COORDINATOR_PARTITIONS


def decision_value(outcome: int, now: float) -> int:
    return outcome + 4 * int(now)


def decision_outcome(value: int) -> int:
    return value & 3


def decision_time(value: int) -> int:
    return value >> 2
