from __future__ import annotations

from broker.messaging.message import Msg, Partition


def test_requeue_restores_offset_order() -> None:
    p = Partition(0)

    def msg(o: int) -> Msg:
        return Msg(0, o, None, {}, b"\x80", b"", None, None, 0.0)

    p.ready.extend(msg(o) for o in (10, 11, 12))
    p.requeue([msg(3), msg(1)])  # all before
    p.requeue([msg(20)])  # after
    p.requeue([msg(11.5), msg(2)])  # type: ignore[arg-type]  # interleaved
    assert [m.offset for m in p.ready] == [1, 2, 3, 10, 11, 11.5, 12, 20]
