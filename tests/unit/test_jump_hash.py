"""The default data mapper, ``jump_hash``: stable, as even as chance allows, and minimal
movement when partitions are added."""

import math
import random
from collections import Counter

from client.mapper import DEFAULT_MAPPER, JumpHashMapper, jump, key_hash, make_mapper

_rng = random.Random(25)
KEYS = ["%016x" % _rng.getrandbits(64) for _ in range(20_000)]


def test_it_is_the_default_and_its_mapping_never_changes() -> None:
    """A queue's messages stay where they are across versions: these are pinned."""
    assert DEFAULT_MAPPER == "jump_hash"
    assert [make_mapper("jump_hash", n, 0).partition(k)
            for n, k in [(3, "k0"), (3, "k1"), (7, "order-42"), (64, "user:1001"), (1000, "x")]] == [0, 2, 2, 45, 89]
    assert key_hash("") == key_hash("") and key_hash("a") != key_hash("b")


def test_short_similar_keys_reach_every_partition() -> None:
    """k0..k63 (CRC-32's ring put none of them in one of 3 partitions)."""
    for n in range(2, 9):
        m = JumpHashMapper(n)
        assert {m.partition(f"k{i}") for i in range(64)} == set(range(n)), n
    counts = Counter(JumpHashMapper(3).partition(f"k{i}") for i in range(64))
    assert min(counts.values()) >= 15, counts


def test_keys_spread_as_evenly_as_a_uniform_random_choice() -> None:
    """20,000 keys over N partitions: the counts pass a chi-squared test of uniformity, and the
    fullest partition is within 4 standard deviations of the mean, for every N from 2 to 64.
    (A fixed max/mean bound such as 1.05 cannot hold past ~16 partitions for any key-hashing
    mapper: a uniform random assignment of 20,000 keys gives ~1.08 at 32 and ~1.13 at 64.)"""
    for n in range(2, 65):
        m = JumpHashMapper(n)
        counts = Counter(m.partition(k) for k in KEYS)
        mean = len(KEYS) / n
        chi2 = sum((counts[p] - mean) ** 2 / mean for p in range(n))
        df = n - 1
        assert chi2 < df + 5 * math.sqrt(2 * df), (n, chi2)
        assert max(counts.values()) <= mean + 4 * math.sqrt(mean), (n, max(counts.values()) / mean)
        if n <= 8:
            assert max(counts.values()) / mean <= 1.05, n


def test_adding_a_partition_moves_only_keys_into_it() -> None:
    before = [JumpHashMapper(1).partition(k) for k in KEYS]
    for n in range(1, 64):
        after = [JumpHashMapper(n + 1).partition(k) for k in KEYS]
        moved = [p for a, p in zip(before, after) if a != p]
        assert all(p == n for p in moved)  # only into the new partition
        assert len(moved) / len(KEYS) <= 1 / (n + 1) + 0.02, n
        before = after


def test_jump_stays_in_range() -> None:
    assert all(jump(h, 1) == 0 for h in (0, 1, 2**63, 2**64 - 1))
    assert all(0 <= jump(h, 10) < 10 for h in range(1000))


def test_keyless_and_anchored_messages_as_other_mappers() -> None:
    m = JumpHashMapper(4)
    assert sorted(m.partition(None) for _ in range(4)) == [0, 1, 2, 3]
    assert [m.partition(None, 100 + s) for s in range(4)] == [0, 1, 2, 3]
