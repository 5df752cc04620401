"""`tandem bench --transactions`: its flags are checked before anything starts, and each phase
deals whole transactions to the producers."""

from __future__ import annotations

import pytest

from broker.cli import build_parser
from broker.tools.bench.transactions import CHUNK_MESSAGES, _chunks, _share, parse_sizes
from client.errors import InvalidArgumentError


def test_sizes_are_distinct_positive_whole_numbers_in_the_order_given() -> None:
    assert parse_sizes("100, 1,10") == [100, 1, 10]
    for bad, says in (("1,x", "whole numbers"), ("", "whole numbers"), ("0", ">= 1"), ("-3", ">= 1"),
                      ("5,5", "twice")):
        with pytest.raises(InvalidArgumentError, match=says):
            parse_sizes(bad)


def test_each_producer_gets_whole_transactions_in_turn() -> None:
    shares = _share(25, 10, 3)  # two whole transactions of 10: the last 5 messages are left out
    assert shares == [[range(0, 10)], [range(10, 20)], []]
    assert sum(len(r) for s in _share(20_000, 100, 4) for r in s) == 20_000


def test_a_large_transaction_goes_in_publishes_that_fit_a_frame() -> None:
    assert _chunks(range(100), 1024) == [range(100)]
    assert [len(c) for c in _chunks(range(600), 1024)] == [CHUNK_MESSAGES, CHUNK_MESSAGES, 600 - 2 * CHUNK_MESSAGES]
    assert all(len(c) * 1024 * 1024 <= 4 * 1024 * 1024 for c in _chunks(range(10), 1024 * 1024))


@pytest.mark.parametrize(("argv", "says"), [
    ([], "needs --spawn"),
    (["--spawn", "--tx-producers", "0"], "--tx-producers"),
    (["--spawn", "--tx-messages", "399"], "too few"),
    (["--spawn", "--tx-sizes", "1,,10"], "--tx-sizes"),
    (["--spawn", "--nodes", "10"], "1 to 9"),
    (["--spawn", "--peer", "nats"], "--peer"),
    (["--spawn", "--sync", "FAST"], "durability policy"),
    (["--spawn", "--size", "4"], "--size"),
])
def test_bad_flags_are_refused_with_what_is_wrong(argv: list[str], says: str) -> None:
    args = build_parser().parse_args(["bench", "--transactions", *argv])
    if not args.spawn:
        args.url = "tandem://admin:pw@127.0.0.1:1"  # (else the bench asks for one of --url or --spawn)
    with pytest.raises(InvalidArgumentError, match=says):
        args.func(args)
