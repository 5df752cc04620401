"""broker.arbiters.lockrecord: the lease record beside the LockFile, two nodes on one temp path in one
process (real files, real flocks).  A holder that stopped renewing is simulated by ageing
the record's mtime (the gateway's clock says how old it is)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import filelock
import pytest

from broker.arbiters.lockrecord import Flock, LockFile, LockFileError

LEASE = 1.0


def pair(tmp_path: Path) -> tuple[LockFile, LockFile]:
    path = tmp_path / "gw" / "tandem.lock"
    return (LockFile(path, "a", lease=LEASE, flock_timeout=0.2), LockFile(path, "b", lease=LEASE, flock_timeout=0.2))


def age(lf: LockFile, seconds: float) -> None:
    """The record was last written ``seconds`` ago (its holder stopped renewing then)."""
    t = time.time() - seconds
    os.utime(lf.record_path, (t, t))


def test_the_first_taker_gets_epoch_1_and_a_fresh_record_is_not_taken(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    assert a.read().holder is None
    t = a.try_take(None)
    assert t.taken and (t.record.holder, t.record.epoch) == ("a", 1)
    assert not b.try_take(None).taken
    rec = b.read()
    assert (rec.holder, rec.epoch) == ("a", 1) and rec.age is not None and rec.age < LEASE
    # seen unchanged for a lease on b's clock, but young on the gateway's clock: not taken
    assert not b.try_take(rec.key).taken


def test_renewals_change_the_record_and_keep_it_young(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.try_take(None)
    first = b.read()
    r = a.renew(1, alone=True)
    assert (r.renewal, r.alone) == (1, True)
    assert b.read().key != first.key
    age(a, 5)
    assert not b.try_take(first.key).taken  # a renewed after b looked: b's observation is stale


def test_a_record_unchanged_and_old_is_taken_with_the_next_epoch_and_the_old_holder_loses_it(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.try_take(None)
    key = b.read().key
    age(a, LEASE + 0.5)
    t = b.try_take(key)
    assert t.taken and (t.record.holder, t.record.epoch) == ("b", 2) and t.previous.holder == "a"
    with pytest.raises(LockFileError, match="names b with epoch 2"):
        a.renew(1, alone=False)
    assert not a.release(1)  # not its lock any more: the record stays b's
    assert b.read().holder == "b"


def test_a_released_lock_is_taken_at_once(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.try_take(None)
    assert a.release(1)
    t = b.try_take(None)
    assert t.taken and t.record.epoch == 2


def test_a_record_naming_this_node_is_taken_again_with_a_new_epoch(tmp_path: Path) -> None:
    a, _b = pair(tmp_path)
    a.try_take(None)
    t = a.try_take(None)  # a restarted (or lost it on its own clock): nobody else holds it
    assert t.taken and t.record.epoch == 2


def test_a_foreign_or_torn_record_is_an_error_never_a_lock(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.try_take(None)
    a.record_path.write_text('{"holder": "a"')
    with pytest.raises(LockFileError, match="not a Tandem lock record"):
        b.try_take(None)
    with pytest.raises(LockFileError):
        a.renew(1, alone=False)


def test_a_bit_flipped_at_rest_in_the_record_is_an_error_never_a_lease(tmp_path: Path) -> None:
    """An epoch gone back by a flipped bit would let the next taker reuse an epoch the fencing
    already saw: the record's checksum makes it an error (a record without one, an older
    build's, is read as it is)."""
    a, b = pair(tmp_path)
    for _ in range(5):
        a.try_take(None)  # (a takes its own record again: epoch 5)
    raw = a.record_path.read_bytes()
    assert b'"epoch": 5' in raw and b'"crc": ' in raw
    a.record_path.write_bytes(raw.replace(b'"epoch": 5', b'"epoch": 1'))  # (bit 2 of 5 flipped)
    with pytest.raises(LockFileError, match="fails its checksum: damaged at rest"):
        b.try_take(None)
    with pytest.raises(LockFileError, match="fails its checksum"):
        a.renew(5, alone=False)
    a.record_path.write_text('{"v": 1, "holder": "a", "epoch": 5, "renewal": 0, "alone": false}')
    assert (b.read().holder, b.read().epoch) == ("a", 5)


def test_a_held_flock_times_out_as_an_error(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    other = filelock.FileLock(str(a.path), thread_local=False, preserve_lock_file=True)
    a.path.parent.mkdir(parents=True)
    with other:
        with pytest.raises(LockFileError, match="held by another process"):
            b.try_take(None)


def test_an_unreachable_path_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    lf = LockFile(blocker / "tandem.lock", "a", lease=LEASE, flock_timeout=0.2)
    with pytest.raises(LockFileError):
        lf.try_take(None)


def test_a_record_whose_holder_confirmed_alone_is_never_taken_by_the_other(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.try_take(None)
    rec = a.renew(1, alone=True)
    age(a, 10 * LEASE)
    t = b.try_take(rec.key)  # unchanged and old: still not b's, b may lack what a confirmed
    assert not t.taken and t.record.holder == "a"
    assert not a.release(1)  # a clean stop keeps it a's
    assert not b.try_take(None).taken
    again = a.try_take(None)  # a, back, takes it again
    assert again.taken and again.record.epoch == 2 and not again.record.alone


def test_a_gateway_directory_that_goes_away_is_unreachable_not_made_again(tmp_path: Path) -> None:
    """The lock file's directory is made at the first use only: a share that is unmounted later
    must not be replaced by a local directory, where the node would take a lock the other
    node never sees."""
    a, _b = pair(tmp_path)
    assert a.try_take(None).taken
    for f in (tmp_path / "gw").iterdir():
        f.unlink()
    (tmp_path / "gw").rmdir()  # (the share is gone)
    with pytest.raises(LockFileError, match="not reachable|No such file"):
        a.renew(1, alone=False)
    assert not (tmp_path / "gw").exists()


def test_the_flock_never_makes_the_directory_of_a_share_that_went_away(tmp_path: Path) -> None:
    """Between an operation's first write and its flock the share can go: the flock then fails,
    and no local directory takes the share's place (py-filelock makes one: this node would
    find no record there and take a lock the other node never sees)."""
    a, _b = pair(tmp_path)
    assert a.try_take(None).taken
    for f in (tmp_path / "gw").iterdir():
        f.unlink()
    (tmp_path / "gw").rmdir()  # (the share is gone, after the operation wrote its temporary record)
    with pytest.raises(LockFileError, match="cannot lock .*No such file"):
        with a._locked("renew"):
            pass
    assert not (tmp_path / "gw").exists()
    flock = Flock(tmp_path / "gw" / "tandem.lock", 0.2)
    with pytest.raises(FileNotFoundError):
        flock.acquire()
    assert not (tmp_path / "gw").exists()
