"""Mount, command and unmount a powerfs (:mod:`broker.tools.powerfs`) from Python.

:class:`PowerFS` runs ``python -m broker.tools.powerfs BACKING MOUNT`` as a child process,
waits (with a deadline) until the mount answers, sends it commands over its control socket
and unmounts it: ``fusermount3 -u``, lazily if the mount is busy or its process died, so
that no mount outlives the object, whichever way the caller leaves.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

from broker.tools.process import node_command
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import UnavailableError


class PowerFSError(UnavailableError):
    pass


def mounted(path: str | Path) -> bool:
    """Whether something is mounted at ``path`` (a dead FUSE mount counts)."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4].replace("\\040", " ") == real for line in f)


def unmount(path: str | Path) -> None:
    """Unmount ``path`` if mounted: ``fusermount3 -u``, lazily (``-z``) if it is busy or dead."""
    for cmd in (["fusermount3", "-u"], ["fusermount3", "-u", "-z"], ["umount", "-l"]):
        if not mounted(path):
            return
        try:
            subprocess.run([*cmd, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue  # the next, lazier way


def fuse_missing() -> str | None:
    """Why powerfs cannot run here (no /dev/fuse, not root, no fusermount3, no mfusepy), or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if os.geteuid() != 0:
        return "not root (powerfs mounts and kills node processes)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy/libfuse3 not available: {exc}"
    if subprocess.run(["sh", "-c", "command -v fusermount3"], stdout=subprocess.DEVNULL,
                      check=False).returncode != 0:
        return "fusermount3 is not installed (Debian: apt-get install fuse3)"
    return None


class PowerFS:
    """One powerfs mount of ``backing`` at ``mount``; ``async with`` mounts and unmounts it."""

    def __init__(self, backing: str | Path, mount: str | Path, *, strict: bool = False,
                 log_path: str | Path | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.backing = Path(backing)
        self.mount_point = Path(mount)
        self.strict = strict
        self.clock = clock
        self.log_path = Path(log_path) if log_path else self.backing.with_name(self.backing.name + ".powerfs.log")
        self.control = f"tandem-powerfs-{os.getpid()}-{secrets.token_hex(6)}"
        self.proc: asyncio.subprocess.Process | None = None
        self._ours = False  # whether a mount at mount_point may be this object's (never unmount another's)

    async def __aenter__(self) -> PowerFS:
        await self.mount()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unmount()

    async def mount(self, timeout: float = 20.0) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount_point.mkdir(parents=True, exist_ok=True)
        if mounted(self.mount_point):
            raise PowerFSError(f"powerfs: something is already mounted at {self.mount_point}")
        self._ours = True
        command, env = node_command()
        command = [*command[:-1], "broker.tools.powerfs"]  # python -P -m broker.tools.powerfs
        args = [str(self.backing), str(self.mount_point), "--control", self.control,
                *(["--strict"] if self.strict else [])]
        with open(self.log_path, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(*command, *args, stdout=out, stderr=out, env=env)
        deadline = self.clock.monotonic() + timeout
        try:
            while True:
                if self.proc.returncode is not None:
                    raise PowerFSError(f"powerfs exited with status {self.proc.returncode} before it mounted "
                                       f"{self.mount_point}: {self._tail()}")
                if mounted(self.mount_point):
                    try:
                        await asyncio.to_thread(self.command, "ping", 2.0)
                        return
                    except PowerFSError:
                        pass  # not answering yet
                if self.clock.monotonic() > deadline:
                    raise PowerFSError(f"powerfs did not mount {self.mount_point} within {timeout:.0f} s: "
                                       f"{self._tail()}")
                await self.clock.sleep(0.05)  # polling a child process for a state, bounded by the deadline
        except BaseException:
            await self.unmount()
            raise

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-500:].strip() or "(no output)"
        except OSError:
            return "(no output)"

    def command(self, line: str, timeout: float = 30.0) -> dict[str, Any]:
        """Send one control request; its answer (PowerFSError when refused or unanswered)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect("\0" + self.control)
                s.sendall(line.encode() + b"\n")
                reply = s.makefile("r").readline()
        except OSError as exc:
            raise PowerFSError(f"powerfs at {self.mount_point} did not answer {line!r}: {exc}") from exc
        try:
            out: dict[str, Any] = json.loads(reply)
        except ValueError:
            raise PowerFSError(f"powerfs at {self.mount_point}: no answer to {line!r}") from None
        if not out.get("ok"):
            raise PowerFSError(f"powerfs at {self.mount_point}: {out.get('error', 'refused')}")
        return out

    def rollback(self) -> dict[str, Any]:
        """Every file (strict: every directory too) back to its last fsync."""
        return self.command("rollback")

    def fail_io(self, mode: str) -> None:
        """``write``, ``fsync``, ``all`` (writes and fsyncs) or ``read`` fail with EIO from now on;
        ``off`` ends that."""
        self.command(f"fail-io {mode}")

    def rollback_torn(self, seed: int) -> dict[str, Any]:
        """A power loss that tears the last writes (``rollback-torn``): what it undid and kept."""
        return self.command(f"rollback-torn {seed}")

    def rollback_reordered(self, seed: int) -> dict[str, Any]:
        """A power loss after reordered writes (``rollback-reordered``): what it undid and kept."""
        return self.command(f"rollback-reordered {seed}")

    def lie_fsync(self, on: bool) -> None:
        """From now on every fsync answers success and syncs nothing (``on``), or syncs again."""
        self.command(f"lie-fsync {'on' if on else 'off'}")

    def lose_write(self, suffix: str) -> None:
        """The next write to a file whose name ends with ``suffix`` is acknowledged and never
        made (``lose-write``; ``off``: none after all); ``stats()["lost"]`` says where it was."""
        self.command(f"lose-write {suffix}")

    def misdirect_write(self, suffix: str, seed: int) -> None:
        """The next write to a file whose name ends with ``suffix`` lands 1-64 sectors (drawn from
        ``seed``) before where it was meant to, which keeps its old bytes (``misdirect-write``)."""
        self.command(f"misdirect-write {suffix} {seed}")

    def bad_sector(self, suffix: str, seed: int) -> dict[str, Any]:
        """One sector of a file whose name ends with ``suffix`` (drawn from ``seed``) fails every
        read that covers it with EIO until a write covers it whole (``bad-sector``): which file
        and offset."""
        return self.command(f"bad-sector {suffix} {seed}")

    def stats(self) -> dict[str, Any]:
        return self.command("stats")

    async def unmount(self, timeout: float = 3.0) -> None:
        """Unmount (lazily if busy) and wait for the process; kill -9 it after ``timeout`` (after
        a lazy unmount it would serve the files still open until they close). Idempotent;
        leaves no mount behind."""
        if not self._ours:
            return
        await asyncio.to_thread(unmount, self.mount_point)
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            try:
                async with self.clock.timeout(timeout):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.to_thread(unmount, self.mount_point)  # a mount its killed process left
        self._ours = False
