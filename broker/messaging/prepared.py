"""What a transaction prepared in a partition: its messages, stored and replicated but never
delivered, and the deliveries it acked, held by it, until the transaction's outcome.

A transactional publish goes through the publish path as any other (offsets, producer
sequences, the partition's log) with one more op in its entry: the register
``~txp:<txid>:<first offset>`` holding how many messages it stored from there.  A transactional
ack writes ``~txa:<txid>:<offset>`` for each delivery it settles.  The registers
(broker.transactions.ids) are the durable record: a member that becomes the partition's active
loads them with the producer table, and :func:`index` tells its loader which offsets to hold
aside; :func:`divert` takes those messages out of whatever goes ready (a load, a read of the
cold region).  The transaction's outcome (broker.transactions.resolve) writes one entry: commit
settles the acked deliveries and drops the registers, and the messages become ready; abort
settles the prepared messages and drops the registers, and the acked deliveries are ready again.

Prepared messages count in the queue's depth (``Queue.pending_count``) until the outcome.
"""

from __future__ import annotations

from broker.messaging.message import Msg, Partition, PreparedTx

PREPARED, ACKED = "~txp:", "~txa:"
#: ``Partition.tx_offsets`` marks an acked delivery's transaction id with this (no id has it)
HELD = "!"


def prepared_register(txid: str, first: int) -> str:
    return f"{PREPARED}{txid}:{first}"


def acked_register(txid: str, offset: int) -> str:
    return f"{ACKED}{txid}:{offset}"


def _parse(name: str) -> tuple[str, str, int] | None:
    if name.startswith(PREPARED):
        kind, rest = "p", name[len(PREPARED):]
    elif name.startswith(ACKED):
        kind, rest = "a", name[len(ACKED):]
    else:
        return None
    txid, _, offset = rest.rpartition(":")
    if not txid or not offset.isdigit():
        return None
    return kind, txid, int(offset)


def index(part: Partition, now: float) -> int:
    """From the partition's registers (just loaded): the transactions in doubt here, and the
    offsets their messages and acked deliveries have, to hold aside as they are loaded.  How many
    transactions."""
    part.txs = {}
    part.tx_offsets = {}
    for name, value in part.registers.items():
        parsed = _parse(name)
        if parsed is None:
            continue
        kind, txid, offset = parsed
        part.txs.setdefault(txid, PreparedTx(now))
        if kind == "p":
            for o in range(offset, offset + value):
                part.tx_offsets[o] = txid
        else:
            part.tx_offsets[offset] = HELD + txid
    return len(part.txs)


def divert(part: Partition, msgs: list[Msg]) -> list[Msg]:
    """``msgs`` without those a transaction in doubt holds (now in its :class:`PreparedTx`)."""
    held = part.tx_offsets
    out: list[Msg] = []
    for m in msgs:
        who = held.pop(m.offset, None)
        if who is None:
            out.append(m)
        elif who[0] == HELD:
            tx = part.txs.get(who[1:])
            if tx is not None:
                tx.acked.append(m)
        else:
            tx = part.txs.get(who)
            if tx is not None:
                tx.msgs.append(m)
    return out


def held(part: Partition) -> int:
    """How many messages the transactions in doubt here prepared (loaded or not): counted as
    pending in the queue's depth."""
    return sum(v for k, v in part.registers.items() if k.startswith(PREPARED))


def held_acks(part: Partition) -> int:
    """How many deliveries the transactions in doubt here acked: counted as unacked until the
    outcome settles them or makes them ready again."""
    return sum(1 for k in part.registers if k.startswith(ACKED))


def registers_of(part: Partition, txid: str) -> list[str]:
    """The registers transaction ``txid`` wrote in the partition."""
    p, a = f"{PREPARED}{txid}:", f"{ACKED}{txid}:"
    return [name for name in part.registers if name.startswith(p) or name.startswith(a)]


def prepared_offsets(part: Partition, txid: str) -> list[int]:
    """Every offset of the messages ``txid`` prepared in the partition (loaded or not)."""
    out: list[int] = []
    for name in registers_of(part, txid):
        parsed = _parse(name)
        if parsed is not None and parsed[0] == "p":
            out.extend(range(parsed[2], parsed[2] + part.registers[name]))
    return out


def acked_offsets(part: Partition, txid: str) -> list[int]:
    out: list[int] = []
    for name in registers_of(part, txid):
        parsed = _parse(name)
        if parsed is not None and parsed[0] == "a":
            out.append(parsed[2])
    return out


def in_doubt(part: Partition) -> frozenset[int]:
    """The offsets of every message a transaction in doubt prepared in the partition: a read
    (browse) skips them."""
    out: set[int] = set()
    for name, value in part.registers.items():
        parsed = _parse(name)
        if parsed is not None and parsed[0] == "p":
            out.update(range(parsed[2], parsed[2] + value))
    return frozenset(out)
