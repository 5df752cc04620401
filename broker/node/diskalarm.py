"""The disk alarm: a node refuses new data while its disk is nearly full.

Every :data:`CHECK_INTERVAL` seconds (on the node's clock) the node reads the free space of
the file system its ``data_dir`` is on (``statvfs``, in a thread).  Below ``disk_free_limit``
the alarm is raised: a WARNING names the node, the free space and the limit, an event goes
into ``tandem status``, and the publishes and declares this node would store itself are
refused with UNAVAILABLE (retriable: a durable connection waits and sends again, to this node
or to whichever node is active then) until the free space is back above the limit (an INFO
line, another event).  What a client sends to a partition active on another member is that
member's business: only a node's own writes are refused.

The alarm keeps a write from meeting a full disk; it cannot promise it.  A log write that
fails with ENOSPC anyway (a fill faster than the check, a replica's writes, which the alarm
does not refuse) stops the node (docs/replication.md, "a full disk"), and a node that finds
its disk full (less than :data:`FULL_BELOW` free) or cannot open its store on it refuses to
start, in one line (:func:`start_error`); below the limit but not full, it starts with the
alarm raised.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.clock import Clock
from client.errors import TandemError, UnavailableError

log = logging.getLogger("tandem.broker")

#: seconds between two reads of the free space
CHECK_INTERVAL = 0.5
#: events kept for ``tandem status``
MAX_EVENTS = 50
#: a start that fails with less free space than this failed because the disk is full
FULL_BELOW = 1024 * 1024


def fmt_bytes(n: int) -> str:
    """``12.0 MiB``, ``512 KiB``, ``0 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def free_bytes(path: Path) -> int:
    """Free space, for this process, of the file system ``path`` is on (blocking: statvfs)."""
    return shutil.disk_usage(path).free


@dataclass(frozen=True, slots=True)
class DiskEvent:
    """An alarm raised or cleared, as ``tandem status`` lists events (``kind node: text``)."""

    at: float
    kind: str
    partition: str  # the node's name (status lists every event as "kind where: text")
    text: str


class DiskAlarm:
    """The free space of one node's data dir against its ``disk_free_limit``."""

    def __init__(self, node: str, path: Path, limit: int, *, clock: Clock, interval: float = CHECK_INTERVAL,
                 free: Callable[[Path], int] = free_bytes) -> None:
        self.node = node
        self.path = path
        self.limit = limit
        self.clock = clock
        self.interval = interval
        self._free = free
        #: bytes free at the last check (None before the first)
        self.free: int | None = None
        self.raised = False
        self.raised_count = 0  # times raised since start (metrics)
        self.refusals = 0  # requests refused while raised (metrics)
        self.events: deque[DiskEvent] = deque(maxlen=MAX_EVENTS)
        self._read_failed = False

    def describe(self) -> str:
        free = "unknown" if self.free is None else fmt_bytes(self.free)
        return f"disk free space {free} is below disk_free_limit {fmt_bytes(self.limit)}"

    def update(self, free: int) -> None:
        """One reading: raise or clear the alarm."""
        self.free = free
        below = free < self.limit
        if below == self.raised:
            return
        self.raised = below
        if below:
            self.raised_count += 1
            text = f"{self.describe()}: publishing refused until space is freed"
            log.warning("disk alarm raised: node %s: %s (data dir %s)", self.node, text, self.path)
        else:
            text = (f"cleared: disk free space {fmt_bytes(free)} is back above disk_free_limit "
                    f"{fmt_bytes(self.limit)}: publishing accepted again")
            log.info("disk alarm %s (node %s, data dir %s)", text, self.node, self.path)
        self.events.append(DiskEvent(self.clock.time(), "disk-alarm", self.node, text))

    async def check(self) -> None:
        """Read the free space now (in a thread) and update the alarm."""
        try:
            free = await asyncio.to_thread(self._free, self.path)
        except OSError as exc:  # the alarm keeps its state; the store's own writes will tell
            if not self._read_failed:
                log.warning("disk alarm: cannot read the free space of %s: %s", self.path, exc)
            self._read_failed = True
            return
        self._read_failed = False
        self.update(free)

    async def run(self) -> None:
        """Until cancelled: check every :attr:`interval` seconds."""
        while True:
            await self.clock.sleep(self.interval)  # the check's period, not a wait for a state
            await self.check()

    def refuse(self, what: str) -> None:
        """Raise UnavailableError while the alarm is raised: ``what`` (e.g. ``publishing``)
        would write to this node's disk."""
        if self.raised:
            self.refusals += 1
            raise UnavailableError(f"node {self.node}: {self.describe()}: {what} refused until space is freed")


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a write refused for want of space."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "disk is full" in str(e) or "No space left on device" in str(e):
            return True
        e = getattr(e, "orig", None) or e.__cause__ or e.__context__
    return False


def full_disk_error(node: str, path: Path, free: int | None, said: str = "") -> UnavailableError:
    """The one line a node that cannot start on a full disk says."""
    left = "unknown" if free is None else fmt_bytes(free)
    return UnavailableError(f"node {node} cannot start: its disk is full (No space left on device: {left} free "
                            f"in {path}); free some space and start it again" + (f" ({said})" if said else ""))


def start_error(node: str, path: Path, exc: BaseException) -> TandemError | None:
    """The one-line error of a start that failed because ``path``'s disk is full (the store
    cannot open, a first write fails), or None: then ``exc`` is the start's own error."""
    if isinstance(exc, UnavailableError) and "cannot start: its disk is full" in exc.message:
        return exc
    try:
        free: int | None = free_bytes(path)
    except OSError:
        free = None
    if not _disk_full(exc) and (free is None or free >= FULL_BELOW):
        return None
    return full_disk_error(node, path, free, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


__all__ = ["CHECK_INTERVAL", "FULL_BELOW", "DiskAlarm", "DiskEvent", "fmt_bytes", "free_bytes", "full_disk_error",
           "start_error"]
