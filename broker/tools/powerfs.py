"""powerfs: a FUSE pass-through file system that can lose what was never fsynced.

``python -m broker.tools.powerfs BACKING MOUNT [--strict] [--control NAME]`` mounts
``BACKING`` at ``MOUNT`` (root or fuse3's ``fusermount3``; the process runs until unmounted).
Every write goes through to the backing file at once, and powerfs remembers, per file (by
the backing inode), how to undo it: the file's size at its last ``fsync``/``fdatasync`` and
the old bytes of every range overwritten since (the first time only; bytes past the synced
size need no copy).  An fsync of a file forgets its undo journal, so it costs little.

On command, ``rollback`` puts every file back as it was at its last fsync (a power loss:
truncate to the synced size, write the saved bytes back).  With ``--strict`` it also puts
every directory back as it was at its last fsync of that directory: names created, renamed
in or out, or unlinked since go back (an unlinked file is kept aside, in
``BACKING.powerfs-trash``, until then).  Without it a directory entry is durable at once
(ext4's ``data=ordered`` gives about that).  The node whose disk this is must be dead
(kill -9) when it rolls back: a process that kept files open would go on writing.

The error mode (``fail-io write|fsync|all``) fails every write and/or fsync with EIO until
``fail-io off``: a failing disk.  The lying mode (``lie-fsync on``) answers every fsync (and
``O_SYNC`` write) with success and syncs nothing, until ``lie-fsync off``: a rollback then
takes the files back to their last fsync before the lying began (a disk whose cache lies).
A lost write (``lose-write SUFFIX``): the next write to a file whose name ends with ``SUFFIX``
answers success and leaves the bytes it covers as they were (zeros past the file's end: the
file's size says it was written, as a file system's metadata would), once; later writes land.
``lose-write off`` disarms one not made yet.
A misdirected write (``misdirect-write SUFFIX SEED``): the same, and its bytes land instead
some sectors earlier in the file (a number drawn from ``SEED``), over what was there.
A latent sector error (``bad-sector SUFFIX SEED``): one sector of a file whose name ends with
``SUFFIX`` (the file and the sector drawn from ``SEED``) fails every read that covers it with EIO,
until a write covers it whole (a disk remaps a sector on write). ``fail-io read`` fails every
read.

The backing files are never fsynced themselves: powerfs's own journal is the model of the
disk.  Writes through a shared ``mmap`` (SQLite's ``-shm``) reach powerfs when the kernel
writes the pages back; SQLite rebuilds that file on open, so what it holds does not matter.

Control: one request line on the abstract Unix socket ``NAME`` (``--control``), one JSON line
back: ``ping``, ``rollback``, ``rollback-torn SEED`` (a power loss that tears the last writes:
each file keeps a prefix, cut at a sector boundary drawn from the seed, of what was written past
its synced size), ``rollback-reordered SEED`` (a power loss after writes the disk made in an
order of its own: each sector written since the file's last fsync kept or lost on its own, drawn
from the seed; :mod:`broker.tools.powerundo` has the model), ``fail-io MODE``, ``lie-fsync on|off``, ``lose-write SUFFIX``,
``misdirect-write SUFFIX SEED``, ``bad-sector SUFFIX SEED``, ``stats`` (syncs seen, fsyncs lied
about, bytes rolled back, the writes lost or misdirected: file, offset, length, and where a
misdirected one landed; reads failed; the bad sectors).
:class:`PowerFS` mounts, commands and unmounts it from Python, with deadlines, and always
leaves no mount behind.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import random
import shutil
import socket
import threading
from typing import Any

from broker.tools.powerundo import SECTOR, Undo

log = logging.getLogger("tandem.powerfs")

#: the fail-io modes and what each fails
FAIL_MODES = {"off": frozenset(), "write": frozenset({"write"}), "fsync": frozenset({"fsync"}),
              "all": frozenset({"write", "fsync"}), "read": frozenset({"read"})}


def _fs_classes() -> Any:
    """The FUSE operations class (mfusepy is imported only where powerfs runs)."""
    from mfusepy import FuseOSError, Operations

    class PowerOps(Operations):
        use_ns = True

        def __init__(self, backing: str, strict: bool) -> None:
            self.root = os.path.realpath(backing)
            self.trash = self.root + ".powerfs-trash"
            os.makedirs(self.trash, exist_ok=True)
            self.strict = strict
            self.mu = threading.RLock()
            self.undo: dict[int, Undo] = {}  # backing inode -> its journal
            self.dirs: dict[int, dict[str, int]] = {}  # strict: dir inode -> its entries at its last fsync
            self.handles: dict[int, tuple[int, int, bool]] = {}  # fh -> (fd, inode, O_SYNC)
            self.stale: set[int] = set()  # handles opened before the last rollback: no more writes
            self.next_fh = 1
            self.fail: frozenset[str] = frozenset()
            self.lie = False  # fsyncs answer success and sync nothing (lie-fsync on)
            self.lose: str | None = None  # the next write to a file named *lose is lost (lose-write)
            self.misdirect: random.Random | None = None  # ... and lands elsewhere (misdirect-write)
            self.lost: list[dict[str, Any]] = []  # the writes lost: path, offset, bytes
            self.bad: dict[int, dict[str, Any]] = {}  # backing inode -> its unreadable sector (bad-sector)
            self.trashed = 0
            self.stats = {"syncs": 0, "dir_syncs": 0, "writes": 0, "rollbacks": 0, "bytes_rolled_back": 0,
                          "entries_rolled_back": 0, "failed_ios": 0, "lied_syncs": 0, "lost_writes": 0,
                          "failed_reads": 0}

        # -- paths and journals -----------------------------------------------------------

        def _p(self, path: str) -> str:
            return self.root + path

        def _journal(self, fd: int, ino: int) -> Undo:
            u = self.undo.get(ino)
            if u is None:
                u = self.undo[ino] = Undo(os.fstat(fd).st_size)
            return u

        def _touch_dir(self, path: str) -> None:
            """Strict: remember the entries of the directory of ``path`` before it changes."""
            if not self.strict:
                return
            d = os.path.dirname(self._p(path)) or self.root
            ino = os.stat(d).st_ino
            if ino not in self.dirs:
                with os.scandir(d) as it:
                    self.dirs[ino] = {e.name: e.inode() for e in it}

        def _to_trash(self, real: str) -> None:
            self.trashed += 1
            os.rename(real, os.path.join(self.trash, str(self.trashed)))

        def _fail(self, what: str) -> None:
            if what in self.fail:
                self.stats["failed_ios"] += 1
                raise FuseOSError(errno.EIO)

        # -- files ------------------------------------------------------------------------

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._p(path))
            out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")}
            out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return out

        def _handle(self, fd: int, flags: int) -> int:
            with self.mu:
                fh = self.next_fh
                self.next_fh += 1
                self.handles[fh] = (fd, os.fstat(fd).st_ino, bool(flags & (os.O_SYNC | os.O_DSYNC)))
                return fh

        def open(self, path: str, flags: int) -> int:
            real = self._p(path)
            with self.mu:
                if flags & os.O_TRUNC and flags & (os.O_WRONLY | os.O_RDWR):
                    self._fail("write")
                    fd = os.open(real, os.O_RDONLY)
                    try:
                        self._journal(fd, os.fstat(fd).st_ino).keep(fd, 0, os.fstat(fd).st_size)
                    finally:
                        os.close(fd)
                fd = os.open(real, flags & ~os.O_APPEND)
                return self._handle(fd, flags)

        def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
            real = self._p(path)
            with self.mu:
                self._touch_dir(path)
                existed = os.path.exists(real)
                fd = os.open(real, (flags | os.O_CREAT) & ~os.O_APPEND, mode)
                ino = os.fstat(fd).st_ino
                if not existed:
                    self.undo[ino] = Undo(0)  # nothing of it is on disk yet
                return self._handle(fd, flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            got = self.handles.get(fh)
            if got is None:
                raise FuseOSError(errno.EBADF)
            bad = self.bad.get(got[1])
            if "read" in self.fail or (bad is not None and offset < bad["offset"] + SECTOR
                                       and bad["offset"] < offset + size):
                with self.mu:
                    self.stats["failed_reads"] += 1
                raise FuseOSError(errno.EIO)
            return os.pread(got[0], size, offset)

        def _bad_sector(self, suffix: str, seed: int) -> dict[str, Any]:
            """Make one sector of a file named ``*suffix`` unreadable (drawn from ``seed``)."""
            rng = random.Random(seed)
            files = sorted(os.path.join(d, f)[len(self.root):] for d, _dirs, names in os.walk(self.root)
                           for f in names if f.endswith(suffix) and os.path.getsize(os.path.join(d, f)) > 0)
            if not files:
                return {"ok": False, "error": f"no file ending with {suffix!r} holds a byte"}
            path = rng.choice(files)
            st = os.stat(self._p(path))
            sector = {"path": path, "offset": SECTOR * rng.randrange((st.st_size + SECTOR - 1) // SECTOR)}
            with self.mu:
                self.bad[st.st_ino] = sector
            return {"ok": True, **sector}

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.mu:
                got = self.handles.get(fh)
                if got is None or fh in self.stale:
                    raise FuseOSError(errno.EBADF)  # a handle from before a rollback
                fd, ino, sync = got
                self._fail("write")
                self.stats["writes"] += 1
                bad = self.bad.get(ino)
                if bad is not None and offset <= bad["offset"] and bad["offset"] + SECTOR <= offset + len(data):
                    del self.bad[ino]  # (written whole: remapped)
                if self.lose is not None and path.endswith(self.lose):
                    return self._lose(path, fd, ino, data, offset)
                if sync and self.lie:
                    self.stats["lied_syncs"] += 1
                elif sync:
                    n = os.pwrite(fd, data, offset)
                    self.undo.pop(ino, None)
                    return n
                self._journal(fd, ino).keep(fd, offset, offset + len(data))
                return os.pwrite(fd, data, offset)

        def _lose(self, path: str, fd: int, ino: int, data: bytes, offset: int) -> int:
            """A write the disk acknowledged and never made (lose-write): the range keeps its
            old bytes, zeros past the end (the file's size grows as it would).  Misdirected
            (misdirect-write), its bytes land 1-64 sectors earlier (never before byte 0)."""
            self.lose = None
            self.stats["lost_writes"] += 1
            lost: dict[str, Any] = {"path": path, "offset": offset, "bytes": len(data)}
            end = offset + len(data)
            journal = self._journal(fd, ino)
            journal.keep(fd, offset, end)
            if os.fstat(fd).st_size < end:
                os.ftruncate(fd, end)
            rng, self.misdirect = self.misdirect, None
            if rng is not None and offset >= SECTOR:
                to = offset - SECTOR * rng.randint(1, min(64, offset // SECTOR))
                rw = os.open(self._p(path), os.O_RDWR)  # (the caller's may append only, or not read)
                try:
                    journal.keep(rw, to, to + len(data))
                    os.pwrite(rw, data, to)
                finally:
                    os.close(rw)
                lost["to"] = to
            self.lost.append(lost)
            return len(data)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self.mu:
                self._fail("write")
                fd = os.open(self._p(path), os.O_RDWR)
                try:
                    st = os.fstat(fd)
                    self._journal(fd, st.st_ino).keep(fd, length, st.st_size)
                    os.ftruncate(fd, length)
                finally:
                    os.close(fd)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            with self.mu:
                self._fail("fsync")
                got = self.handles.get(fh)
                if got is None or fh in self.stale:
                    raise FuseOSError(errno.EBADF)
                if self.lie:
                    self.stats["lied_syncs"] += 1
                    return 0
                self.undo.pop(got[1], None)
                self.stats["syncs"] += 1
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with self.mu:
                got = self.handles.pop(fh, None)
                self.stale.discard(fh)
            if got is not None:
                os.close(got[0])
            return 0

        # -- directories ------------------------------------------------------------------

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._p(path))]

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            with self.mu:
                self._fail("fsync")
                if self.lie:
                    self.stats["lied_syncs"] += 1
                    return 0
                self.dirs.pop(os.stat(self._p(path)).st_ino, None)
                self.stats["dir_syncs"] += 1
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            with self.mu:
                self._touch_dir(path)
                os.mkdir(self._p(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            with self.mu:
                self._touch_dir(path)
                if self.strict:
                    if os.listdir(self._p(path)):
                        raise FuseOSError(errno.ENOTEMPTY)
                    self._to_trash(self._p(path))
                else:
                    os.rmdir(self._p(path))
            return 0

        def unlink(self, path: str) -> int:
            with self.mu:
                self._touch_dir(path)
                if self.strict:
                    self._to_trash(self._p(path))
                else:
                    os.unlink(self._p(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            with self.mu:
                self._touch_dir(old)
                self._touch_dir(new)
                if self.strict and os.path.lexists(self._p(new)):
                    self._to_trash(self._p(new))
                os.rename(self._p(old), self._p(new))
            return 0

        def symlink(self, target: str, source: str) -> int:
            with self.mu:
                self._touch_dir(target)
                os.symlink(source, self._p(target))
            return 0

        def readlink(self, path: str) -> str:
            return os.readlink(self._p(path))

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._p(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._p(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(self._p(path))
            else:
                os.utime(self._p(path), ns=times)
            return 0

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._p(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._p(path))
            return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                 "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

        # -- the power loss ---------------------------------------------------------------

        def _index(self) -> dict[int, str]:
            """backing inode -> where it is now (in the tree or in the trash)."""
            out: dict[int, str] = {}
            for top in (self.root, self.trash):
                for d, names, files in os.walk(top):
                    for n in (*names, *files):
                        p = os.path.join(d, n)
                        out[os.lstat(p).st_ino] = p
            out[os.stat(self.root).st_ino] = self.root
            return out

        def rollback(self, torn: int | None = None, *, reorder: bool = False) -> dict[str, int]:
            """Every file back to its last fsync; with ``torn`` (a seed) each keeps a prefix of
            what was written past its synced size (a torn write), or with ``reorder`` any of the
            sectors written since (powerundo.Undo.restore)."""
            rng = None if torn is None else random.Random(torn)
            with self.mu:
                self.stale = set(self.handles)  # (their descriptors close when released)
                entries = self._rollback_dirs() if self.strict else 0
                index = self._index()
                changed = files = kept = 0
                for ino, u in sorted(self.undo.items()):
                    p = index.get(ino)
                    if p is not None and not p.startswith(self.trash + os.sep) and os.path.isfile(p):
                        undone, keep = u.restore(p, rng, reorder=reorder)
                        changed += undone
                        kept += keep
                        files += 1
                self.undo.clear()
                shutil.rmtree(self.trash, ignore_errors=True)
                os.makedirs(self.trash, exist_ok=True)
                self.stats["rollbacks"] += 1
                self.stats["bytes_rolled_back"] += changed
                self.stats["entries_rolled_back"] += entries
                return {"files": files, "bytes": changed, "entries": entries, "kept": kept}

        def _rollback_dirs(self) -> int:
            """Every directory changed since its last fsync back to its entries then."""
            moved = 0
            for ino, entries in self.dirs.items():  # out: every name that was not there
                d = self._index().get(ino)
                if d is None:
                    continue
                with os.scandir(d) as it:
                    now = {e.name: e.inode() for e in it}
                for name, n_ino in now.items():
                    if entries.get(name) != n_ino:
                        self._to_trash(os.path.join(d, name))
                        moved += 1
            for ino, entries in self.dirs.items():  # in: every name that was there
                index = self._index()
                d = index.get(ino)
                if d is None:
                    continue
                for name, n_ino in entries.items():
                    dst = os.path.join(d, name)
                    src = index.get(n_ino)
                    if src is not None and src != dst and not os.path.lexists(dst):
                        os.rename(src, dst)
                        index = self._index()
                        moved += 1
            self.dirs.clear()
            return moved

        def command(self, line: str) -> dict[str, Any]:
            word, _, arg = line.strip().partition(" ")
            if word == "ping":
                return {"ok": True}
            if word == "rollback":
                return {"ok": True, **self.rollback()}
            if word == "rollback-torn" and arg.isdigit():
                return {"ok": True, **self.rollback(int(arg))}
            if word == "rollback-reordered" and arg.isdigit():
                return {"ok": True, **self.rollback(int(arg), reorder=True)}
            if word == "fail-io" and arg in FAIL_MODES:
                with self.mu:
                    self.fail = FAIL_MODES[arg]
                return {"ok": True, "fail": sorted(self.fail)}
            if word == "lie-fsync" and arg in ("on", "off"):
                with self.mu:
                    self.lie = arg == "on"
                return {"ok": True, "lie": self.lie}
            if word == "lose-write" and arg:
                with self.mu:
                    self.lose, self.misdirect = (None if arg == "off" else arg), None
                return {"ok": True, "lose": self.lose}
            suffix, _, seed = arg.partition(" ")
            if word == "misdirect-write" and suffix and seed.isdigit():
                with self.mu:
                    self.lose, self.misdirect = suffix, random.Random(int(seed))
                return {"ok": True, "misdirect": suffix}
            if word == "bad-sector" and suffix and seed.isdigit():
                return self._bad_sector(suffix, int(seed))
            if word == "stats":
                with self.mu:
                    return {"ok": True, **self.stats, "journaled_files": len(self.undo),
                            "journaled_bytes": sum(len(b) for u in self.undo.values() for _s, b in u.saved),
                            "dirty_dirs": len(self.dirs), "fail": sorted(self.fail), "lie": self.lie,
                            "lost": list(self.lost), "bad_sectors": list(self.bad.values())}
            return {"ok": False, "error": f"unknown command {line.strip()!r} (ping, rollback, "
                                          f"rollback-torn SEED, rollback-reordered SEED, fail-io {'|'.join(FAIL_MODES)}, "
                                          f"lie-fsync on|off, lose-write SUFFIX, "
                                          f"misdirect-write SUFFIX SEED, bad-sector SUFFIX SEED, stats)"}

    return PowerOps


def _serve_control(ops: Any, name: str) -> socket.socket:
    """Answer control requests on the abstract Unix socket ``name`` (a thread of its own)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    line = conn.makefile("r").readline()
                    reply = ops.command(line)
                except Exception as exc:  # a failed command is answered, never kills the mount
                    log.exception("powerfs command failed")
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                try:
                    conn.sendall((json.dumps(reply) + "\n").encode())
                except OSError:
                    continue

    threading.Thread(target=loop, name="powerfs-control", daemon=True).start()
    return srv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m broker.tools.powerfs",
                                 description="A FUSE pass-through file system that can roll every file back "
                                             "to its last fsync (a power loss) and fail writes with EIO.")
    ap.add_argument("backing", help="the directory that holds the files")
    ap.add_argument("mount", help="where to mount it")
    ap.add_argument("--strict", action="store_true",
                    help="also forget directory entries made or removed since their directory's last fsync")
    ap.add_argument("--control", default=None,
                    help="abstract Unix socket name for commands (default powerfs-<pid>)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.backing) or not os.path.isdir(args.mount):
        print(f"powerfs: {args.backing} and {args.mount} must both be directories", flush=True)
        return 2
    try:
        from mfusepy import FUSE
    except (ImportError, OSError) as exc:  # the module, or libfuse3 itself, missing
        print(f"powerfs: FUSE is not available: {exc}", flush=True)
        return 2
    ops = _fs_classes()(args.backing, args.strict)
    srv = _serve_control(ops, args.control or f"powerfs-{os.getpid()}")
    try:
        FUSE(ops, args.mount, foreground=True, fsname="powerfs", entry_timeout=0, attr_timeout=0,
             negative_timeout=0)
    except RuntimeError as exc:
        print(f"powerfs: mount failed: {exc}", flush=True)
        return 1
    finally:
        srv.close()
    return 0


from broker.tools.powerfs_mount import PowerFS, PowerFSError, mounted, unmount  # noqa: E402  (re-exported)

__all__ = ["FAIL_MODES", "SECTOR", "PowerFS", "PowerFSError", "Undo", "main", "mounted", "unmount"]

if __name__ == "__main__":
    raise SystemExit(main())
