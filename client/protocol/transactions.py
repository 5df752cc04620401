"""Frames of transactions (protocol version 6): a transactional producer's epoch, and a
transaction's end.

A transaction's publishes are ``Publish`` frames and its acks ``Ack`` frames with ``tx`` set to
the transaction's id (client.protocol.messaging); they are *prepared*: stored and replicated by
each partition they touch, and invisible (its messages are not delivered, its acks settle nothing)
until ``TxEnd`` commits the transaction, or gone when it aborts.  docs/transactions.md has the
protocol; a transaction's id is ``<producer>/<epoch>/<number>`` (``TxInitOk``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op, Record


@dataclass(slots=True)
class TxPart(Record):
    """A partition a transaction wrote to (published into, or acked a delivery of); ``partition``
    None: some of the queue's partitions (the node mapped the messages)."""

    queue: str
    partition: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TxInit(Frame):
    """Start (or restart) the transactional producer ``transactional_id``: its epoch goes up by
    one, and a transaction of an earlier epoch can no longer commit (a zombie is fenced).
    Answered by ``TxInitOk``."""

    OP: ClassVar[Op] = Op.TX_INIT
    rid: int
    transactional_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TxInitOk(Frame):
    """``producer``: the producer's name in the group (the transactional id, scoped to the user
    that logged in), which its transactions' ids start with; ``epoch``: its epoch from now on;
    ``next_batch``: the first batch number it has not committed (0: none committed)."""

    OP: ClassVar[Op] = Op.TX_INIT_OK
    rid: int
    producer: str
    epoch: int
    next_batch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TxEnd(Frame):
    """Commit (``commit``) or abort transaction ``txid``, which wrote to ``parts``.  ``batch``: the
    transaction writes that batch of its producer (a Spark micro-batch): it commits only if the
    producer committed no batch as late, and is aborted otherwise (``TxEndOk.written``).
    Answered by ``TxEndOk`` once the outcome is decided (replicated) and the partitions have it."""

    OP: ClassVar[Op] = Op.TX_END
    rid: int
    txid: str
    commit: bool
    parts: list[TxPart] = field(default_factory=list)
    batch: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TxEndOk(Frame):
    """``committed``: the outcome; ``written``: the batch had been committed already by another
    transaction of the producer (this one was aborted, and nothing is missing)."""

    OP: ClassVar[Op] = Op.TX_END_OK
    rid: int
    committed: bool
    written: bool = False
