"""The LockFile on the gateway: a lease with an epoch, kept in files both nodes reach.

A plain ``flock`` is not a lease: a holder stopped by SIGSTOP (or a machine that hangs) keeps
its flock for ever, and one killed by ``kill -9`` loses it at once, whatever it had told
its peer.  So the flock (on ``PATH``: :class:`Flock`, which never makes a directory) only
guards short critical sections, and the lease lives in a *record* beside it, ``PATH.epoch``::

    {"v": 1, "holder": "node1", "epoch": 7, "renewal": 1234, "alone": false, "crc": 517187380}

``holder`` null: released (a clean stop), free to take at once.  ``epoch`` grows by one at
every acquisition; ``renewal`` by one at every renewal; ``alone``: the holder confirms
writes without its peer (STANDALONE): what it confirmed may be missing on the other node,
so the other never takes such a record over, and the holder keeps it at a clean stop;
only the holder serves again (an operator who accepts losing those writes removes the
record).  ``crc``: the CRC-32 of the other fields (:func:`_crc`), so a bit flipped at rest
(an epoch gone back, another holder) is an error, never a lease; a record without it (an
older build's) is read unchecked, and an older build reading this one ignores it.  The record is written whole to a temporary file, fsynced,
renamed over the old one and the directory fsynced: a reader sees the old record or the
new one, never a torn one.

Rules (every step under the flock, each a fresh read of the record):

* **renew** (the holder, every ``lease / 4``): the record still names this node and its
  epoch: rewrite it with ``renewal + 1``.  Anything else (another holder or epoch, a
  missing record, an error of the file system: the gateway gone, an NFS hiccup) is a
  lost lock.  The holder's lease runs from the moment it *started* the renewal, on its
  own clock, and it stops serving when that runs out, whether or not the renewal ever
  came back (a hung NFS call).
* **take** (a waiting node): the record is free (missing, released, or naming this
  node, which knows it serves nothing); or its holder stopped renewing: the same
  (holder, epoch, renewal) was seen unchanged for longer than ``lease`` on the taker's
  clock (``stale``, decided by the caller) *and* the record is older than ``lease`` on the
  gateway's clock: its mtime against the mtime of a probe file (``PATH.probe-NODE``) the
  taker writes just before (on NFS both are set by the server).  Then it writes
  ``epoch + 1`` naming itself.

Why that is safe: the holder's deadline is (start of its last renewal) + ``lease``; that
renewal's write, and so the first time a taker can have seen it, come after that start,
so a taker that saw it unchanged for ``lease`` acts after the holder's deadline (clock
rates aside), and one more renewal written meanwhile is seen by the taker's fresh read
under the flock.  The gateway-clock test guards against a taker whose own clock jumped.

What it cannot do: a holder stopped *inside* a critical section (a few milliseconds
every ``lease / 4`` on a local disk) keeps the flock, and nobody can take over until it
runs again or dies; the lease still stops it from confirming anything.

All calls block (file I/O, the flock): the driver runs them on a thread of its own.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path


RECORD_VERSION = 1


def _crc(holder: str | None, epoch: int, renewal: int, alone: bool) -> int:
    """The CRC-32 a record carries of its fields."""
    return zlib.crc32(json.dumps([holder, epoch, renewal, alone]).encode())


class LockFileError(Exception):
    """The lock file could not be read or written (the gateway gone, permissions, a torn
    or foreign record); ``orig`` is the file system's error."""

    def __init__(self, message: str, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig


@dataclass(frozen=True, slots=True)
class Record:
    """The record as last read.  ``age``: seconds since it was written, on the gateway's
    clock (None when there is no record)."""

    holder: str | None = None
    epoch: int = 0
    renewal: int = 0
    alone: bool = False
    age: float | None = None

    @property
    def key(self) -> tuple[str | None, int, int]:
        """What changes at every write: a holder that renews changes it."""
        return (self.holder, self.epoch, self.renewal)


@dataclass(frozen=True, slots=True)
class Taken:
    """The outcome of :meth:`LockFile.try_take`: ``taken`` and the record as it now is."""

    taken: bool
    record: Record
    previous: Record


class LockFile:
    """One node's access to the lock at ``path``.  ``flock_timeout``: how long a critical
    section may wait for the flock (the other node's section takes milliseconds)."""

    def __init__(self, path: str | Path, node: str, *, lease: float, flock_timeout: float) -> None:
        self.path = Path(path)
        self.node = node
        self.lease = lease
        self.record_path = self.path.with_name(self.path.name + ".epoch")
        self._probe_path = self.path.with_name(f"{self.path.name}.probe-{node}")
        self._tmp_path = self.path.with_name(f"{self.path.name}.epoch.tmp-{node}")
        self._renewed = (0, 0)  # (epoch, last renewal number) this node wrote
        self._dir_made = False  # (see _make_dir)
        self._mtime = 0.0  # of the record at the last read (the gateway's clock)
        # a real flock, kept on one pathname (no soft marker that kill -9 would leave behind)
        self._flock = Flock(self.path, flock_timeout)

    # -- the operations ----------------------------------------------------------------------

    def read(self) -> Record:
        """The record as it is (under the flock), with its age on the gateway's clock."""
        with self._locked("read"):
            return self._read(with_age=True)

    def renew(self, epoch: int, *, alone: bool) -> Record:
        """Renew this node's lease under ``epoch``; the record written.  LockFileError if the
        record no longer names this node and epoch (the lock is lost) or on any error.

        Only the holder writes renewals of its epoch, so it numbers them itself and the new
        record is written and fsynced *before* the flock is taken: under the flock there is
        a read and a rename, no fsync (a holder stopped there blocks every takeover)."""
        if self._renewed[0] != epoch:
            self._renewed = (epoch, self.read_unlocked().renewal)
        new = Record(self.node, epoch, self._renewed[1] + 1, alone)
        self._prepare(new)
        with self._locked("renew"):
            rec = self._read(with_age=False)
            if rec.holder != self.node or rec.epoch != epoch:
                raise LockFileError(f"the lock record names {rec.holder or 'nobody'} with epoch {rec.epoch}, "
                                    f"not {self.node} with epoch {epoch}")
            self._commit()
        self._renewed = (epoch, new.renewal)
        self._sync_dir()
        return new

    def read_unlocked(self) -> Record:
        """The record as it is now, without the flock (a hint: a rename makes every read
        see a whole record)."""
        return self._read(with_age=False)

    def try_take(self, stale: tuple[str | None, int, int] | None) -> Taken:
        """Take the lock if it is free, or if its record still is ``stale`` (the key the
        caller has seen unchanged for over ``lease``) and is older than ``lease`` on the
        gateway's clock.  The record written names this node with the next epoch."""
        # what would be written, written and fsynced before the flock (see renew); and the
        # gateway's "now" read before it too: an earlier now makes the age smaller (safe)
        hint = self.read_unlocked()
        new = Record(self.node, hint.epoch + 1, 0, False)
        self._prepare(new)
        now = self._probe_now()
        with self._locked("take"):
            rec = self._read(with_age=False)
            rec = Record(rec.holder, rec.epoch, rec.renewal, rec.alone, now - self._mtime)
            if rec.alone and rec.holder not in (None, self.node):
                # the holder confirmed writes this node may not have (its peer was gone): only
                # it may serve again, or an operator who accepts the loss (remove the record)
                return Taken(False, rec, rec)
            free = rec.holder is None or rec.holder == self.node
            expired = (stale is not None and rec.key == stale and rec.age is not None and rec.age > self.lease)
            if not (free or expired) or rec.epoch != hint.epoch:  # (changed meanwhile: the next round)
                return Taken(False, rec, rec)
            self._commit()
        self._renewed = (new.epoch, 0)
        self._sync_dir()
        return Taken(True, new, rec)

    def release(self, epoch: int) -> bool:
        """A clean stop: mark the record released if it still names this node and ``epoch``
        (the peer may take it at once).  False if it did not."""
        self._prepare(Record(None, epoch, self._renewed[1] + 1 if self._renewed[0] == epoch else 1 << 30, False))
        with self._locked("release"):
            rec = self._read(with_age=False)
            if rec.holder != self.node or rec.epoch != epoch or rec.alone:
                return False  # not ours; or confirmed alone: the record keeps it ours (see try_take)
            self._commit()
        self._sync_dir()
        return True

    # -- files ---------------------------------------------------------------------------------

    def _make_dir(self) -> None:
        """The lock file's directory, made once (a first start).  Never again: a gateway share
        that goes away (unmounted) must be "not reachable", not a local directory made in its
        place, where this node would take a lock no other node sees."""
        if not self._dir_made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._dir_made = True

    def _locked(self, what: str) -> _Release:
        try:
            self._make_dir()
        except OSError as exc:
            raise LockFileError(f"{what}: the lock file's directory {self.path.parent} is not reachable: {exc}",
                                exc) from exc
        try:
            self._flock.acquire()
        except FlockTimeout as exc:
            raise LockFileError(f"{what}: the flock on {self.path} is held by another process", exc) from exc
        except OSError as exc:
            raise LockFileError(f"{what}: cannot lock {self.path}: {exc}", exc) from exc
        return _Release(self._flock)

    def _read(self, *, with_age: bool) -> Record:
        try:
            fd = os.open(self.record_path, os.O_RDONLY)
        except FileNotFoundError:
            return Record()
        except OSError as exc:
            raise LockFileError(f"cannot open {self.record_path}: {exc}", exc) from exc
        try:
            st = os.fstat(fd)  # on the open file: NFS revalidates its attributes on open
            raw = b""
            while chunk := os.read(fd, 4096):
                raw += chunk
        except OSError as exc:
            raise LockFileError(f"cannot read {self.record_path}: {exc}", exc) from exc
        finally:
            os.close(fd)
        try:
            d = json.loads(raw)
            if d.get("v") != RECORD_VERSION:
                raise ValueError(f"version {d.get('v')!r}")
            holder, epoch, renewal, alone = d["holder"], d["epoch"], d["renewal"], d["alone"]
            if not (holder is None or isinstance(holder, str)) or type(epoch) is not int \
                    or type(renewal) is not int or type(alone) is not bool:
                raise ValueError("mistyped field")
            if "crc" in d and d["crc"] != _crc(holder, epoch, renewal, alone):
                raise ValueError("it fails its checksum: damaged at rest")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LockFileError(f"{self.record_path} is not a Tandem lock record ({exc}): remove it only "
                                "once both nodes are stopped") from exc
        self._mtime = st.st_mtime_ns / 1e9
        age = self._probe_now() - self._mtime if with_age else None
        return Record(holder, epoch, renewal, alone, age)

    def _probe_now(self) -> float:
        """The gateway's time now: the mtime of a file written now (set by the NFS server)."""
        try:
            fd = os.open(self._probe_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, self.node.encode())
                os.fsync(fd)
                return os.fstat(fd).st_mtime_ns / 1e9
            finally:
                os.close(fd)
        except OSError as exc:
            raise LockFileError(f"cannot write {self._probe_path}: {exc}", exc) from exc

    def _prepare(self, rec: Record) -> None:
        """Write ``rec`` to this node's temporary file and fsync it (no flock needed: the file
        is this node's own)."""
        data = json.dumps({"v": RECORD_VERSION, "holder": rec.holder, "epoch": rec.epoch, "renewal": rec.renewal,
                           "alone": rec.alone, "crc": _crc(rec.holder, rec.epoch, rec.renewal, rec.alone)}).encode()
        try:
            self._make_dir()
            fd = os.open(self._tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise LockFileError(f"cannot write {self._tmp_path}: {exc}", exc) from exc

    def _commit(self) -> None:
        """Under the flock: the prepared record becomes the record (an atomic rename)."""
        try:
            os.replace(self._tmp_path, self.record_path)
        except OSError as exc:
            raise LockFileError(f"cannot write {self.record_path}: {exc}", exc) from exc

    def _sync_dir(self) -> None:
        """After the flock: the rename made durable (an fsync of the directory)."""
        try:
            dfd = os.open(self.record_path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise LockFileError(f"cannot sync {self.record_path.parent}: {exc}", exc) from exc


class FlockTimeout(Exception):
    """The flock stayed held by another process past the timeout."""


class Flock:
    """An exclusive ``flock`` on one pathname, taken within ``timeout`` seconds.  It opens the
    file with ``O_CREAT`` and makes no directory: a gateway share that went away (unmounted)
    fails the open, where a lock library that makes the file's directory first (py-filelock
    does) would put a local directory in its place, and this node would take a lock no other
    node sees."""

    #: seconds between two tries of a flock held by another process
    POLL = 0.005

    def __init__(self, path: Path, timeout: float) -> None:
        self.lock_file, self.timeout = str(path), timeout
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)  # (FileNotFoundError: no directory)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise FlockTimeout(self.lock_file) from None
                time.sleep(self.POLL)  # (a critical section of the other node: milliseconds)
            except OSError:
                os.close(fd)
                raise

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


class _Release:
    """``with`` around an acquired flock: released on exit, a release error reported."""

    def __init__(self, flock: Flock) -> None:
        self._flock = flock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        try:
            self._flock.release()
        except OSError as err:
            raise LockFileError(f"cannot unlock {self._flock.lock_file}: {err}", err) from err
