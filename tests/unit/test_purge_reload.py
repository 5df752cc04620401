"""A purge of a partition whose commit fails puts the messages back, unless the partition was
loaded anew meanwhile (this node lost it and got it back): the loaded messages are the
store's, each once (broker.messaging.catalogue ``purge_partition``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.messaging.catalogue import Catalogue
from broker.messaging.message import EMPTY_HEADERS, Msg
from broker.messaging.queues import Queue
from client.errors import NotActiveError
from storage.base import PartitionState, QueueMeta, StoredMessage


class _Commit:
    def __init__(self) -> None:
        self.callback: Any = None

    def propose(self, ops: list[Any], callback: Any, *, durable: bool = False) -> None:
        self.callback = callback

    def serving(self, key: Any) -> bool:
        return True


def _setup() -> tuple[Catalogue, _Commit, Queue]:
    commit = _Commit()
    node = SimpleNamespace(config=SimpleNamespace(max_memory=0), commit=commit)
    cat = Catalogue(node)  # type: ignore[arg-type]
    q = Queue(QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    q.add_ready(q.partitions[0], [Msg(0, i, None, {}, EMPTY_HEADERS, b"x", None, None, 0.0) for i in range(5)])
    return cat, commit, q


@pytest.mark.asyncio
@pytest.mark.parametrize("reloaded", [False, True])
async def test_a_failed_purge_puts_back_only_into_the_memory_it_took_from(reloaded: bool) -> None:
    cat, commit, q = _setup()
    purge = asyncio.ensure_future(cat.purge_partition(q, 0))
    while commit.callback is None:
        await asyncio.sleep(0)
    assert q.ready_count == 0
    if reloaded:  # (lost and won back: loaded from the store, which still has all five)
        q.clear_partition(0)
        q.load_partition(0, PartitionState(next_offset=5, messages=[
            StoredMessage(i, None, EMPTY_HEADERS, b"x", None, None, 0.0) for i in range(5)]))
    commit.callback(NotActiveError("partition 1/0 is not active here", active_hint=None))
    with pytest.raises(NotActiveError):
        await purge
    assert [m.offset for m in q.partitions[0].ready] == [0, 1, 2, 3, 4] and q.ready_count == 5
