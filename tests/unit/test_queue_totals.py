"""tandem queues: the members' figures of a queue add up to the whole queue."""

from __future__ import annotations

from broker.tools.totals import member_url, merge
from client.protocol.frames import QueueInfo
from client.url import parse_url


def info(name: str, ready: int, unacked: int, consumers: int, published: int, acked: int) -> QueueInfo:
    return QueueInfo(name, 4, "consistent_hash", 1024, 0, None, 0, ready, unacked, consumers, published,
                     published - unacked - ready, acked)


def test_figures_are_summed_and_consumers_are_the_largest_members() -> None:
    node1 = [info("orders", 3, 1, 1, 5, 1), info("jobs", 0, 0, 0, 0, 0)]
    node2 = [info("orders", 2, 0, 1, 2, 0)]
    node3 = [info("orders", 2, 0, 1, 2, 0), info("late", 1, 0, 0, 1, 0)]
    (orders, jobs, late) = merge([node1, node2, node3])
    assert (orders.name, orders.ready, orders.unacked, orders.published, orders.acked) == ("orders", 7, 1, 9, 1)
    assert orders.consumers == 1  # a group consumer subscribes on every member: one consumer
    assert orders.delivered == node1[0].delivered + 2 * node2[0].delivered
    assert (jobs.name, jobs.ready) == ("jobs", 0)
    assert (late.name, late.ready) == ("late", 1)  # a queue one member lists first still shows


def test_member_url_keeps_the_credentials() -> None:
    params = parse_url("tandem://ad%40min:p%3Aw@127.0.0.1:7780,127.0.0.1:7790")
    url = member_url(params, "127.0.0.1:7800")
    again = parse_url(url)
    assert (again.user, again.password, again.hosts) == ("ad@min", "p:w", (("127.0.0.1", 7800),))
