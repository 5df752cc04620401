"""What a ready message costs a node in memory, for its memory budget (``max_memory``): the
store's loads and refills read no more than a partition's share of it."""

from __future__ import annotations

from storage.base import MessageRecord

#: bytes a ready message costs a node in memory beyond its body and headers (its object, an
#: estimate): the memory budget (``max_memory``) counts it, so tiny messages are bounded too
MSG_MEMORY = 200
#: the least a partition's share of ``max_memory`` may be
MIN_SHARE = 256 * 1024


def memory_share(limit: int, partitions: int) -> int:
    """Each partition's share of a node's ``max_memory`` (bytes; 0: no bound)."""
    if limit <= 0:
        return 0
    return max(MIN_SHARE, limit // max(1, partitions))


def message_cost(m: MessageRecord) -> int:
    """What a ready message counts against the memory budget."""
    return len(m.body) + len(m.headers_blob) + MSG_MEMORY
