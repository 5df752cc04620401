"""A fault-injecting TCP proxy, for tests and failover drills.

``FaultProxy(target)`` listens on a port of its own and forwards every
connection to ``target``.  ``cut()`` drops every connection through it and
refuses new ones (accepts and closes at once, like a link that is gone);
``heal()`` lets traffic through again.  Put one in front of a node's peer port
(configure the other members to reach it through the proxy) and cutting it
isolates that node from the group.  ``delay`` (seconds, default 0) holds every
chunk that long before passing it on, in order: a slow link, which makes a
member lag behind the others without losing it.

``stall_disk(pids, seconds)`` makes the disk of running processes stop for a
while: the next fsync / fdatasync of each of their threads waits ``seconds``
before it runs, and what those threads write meanwhile waits behind it, as on a
virtual disk that stops (docs/replication.md).  It uses strace's syscall fault
injection: Linux, with strace installed and the right to trace the processes
(root; or one's own processes where Yama's ptrace_scope is 0, since strace is
not their parent).
"""

from __future__ import annotations

import asyncio
import logging
import shutil

from client.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("tandem.faults")


class FaultProxy:
    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.target = target
        self.clock = clock
        self.host, self.port = host, port
        self.cut_off = False
        self.delay = 0.0
        self.held = 0  # bytes a delay is holding right now, all links
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`heal`."""
        self.cut_off = True
        self.held = 0  # dropped
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()
        log.info("proxy %s -> %s:%d cut", self.address, *self.target)

    def heal(self) -> None:
        self.cut_off = False
        log.info("proxy %s -> %s:%d healed", self.address, *self.target)

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if self.cut_off:
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._conns.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            t = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        late: asyncio.Queue[tuple[float, bytes] | None] | None = None  # once delayed, always queued
        try:
            while True:
                data = await src.read(65536)
                if not data or self.cut_off:
                    break
                if self.delay > 0 or late is not None:
                    if late is None:
                        late = asyncio.Queue()
                        t = asyncio.get_running_loop().create_task(self._late(late, dst))
                        self._tasks.add(t)
                        t.add_done_callback(self._tasks.discard)
                    # in order, even if ``delay`` changes meanwhile
                    late.put_nowait((self.clock.monotonic() + self.delay, data))
                    self.held += len(data)
                    continue
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass  # either side went away: the link is over
        finally:
            self._conns.discard(dst)
            if late is not None and not self.cut_off:
                late.put_nowait(None)  # what is on its way arrives first, then the link closes
            else:
                dst.transport.abort()

    async def _late(self, late: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter) -> None:
        """Pass on the chunks of a delayed pipe, each at its time, in order."""
        try:
            while (item := await late.get()) is not None:
                due, data = item
                wait = due - self.clock.monotonic()
                if wait > 0:
                    await self.clock.sleep(wait)  # the injected delay itself
                if self.cut_off:
                    break
                dst.write(data)
                self.held -= len(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass  # the far side went away: the link is over
        finally:
            dst.transport.abort()


async def stall_disk(pids: list[int], seconds: float, *, clock: Clock = SYSTEM_CLOCK) -> None:
    """The next fsync and the next fdatasync of every thread of ``pids`` wait ``seconds``
    (what they write meanwhile waits behind them); returns once the stall is over and the
    processes are let go.  RuntimeError if strace is missing or cannot trace one of them."""
    if not pids:
        raise ValueError("stall_disk: no process to stall")
    strace = shutil.which("strace")
    if strace is None:
        raise RuntimeError("stall_disk needs strace (Debian: apt-get install strace)")
    delay = f"inject=fsync,fdatasync:delay_enter={int(seconds * 1e6)}:when=1"
    # (under timeout(1): should this process die without letting go, strace still does)
    args = ["timeout", f"{seconds + 10:.0f}", strace, "-f", "-e", "trace=fsync,fdatasync", "-e", delay,
            "-o", "/dev/null"]
    for pid in pids:
        args += ["-p", str(pid)]
    proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    if proc.stderr is None:
        raise RuntimeError("stall_disk: no pipe from strace")  # (asked for above: never)
    try:
        attached = 0
        async with asyncio.timeout(10):
            while attached < len(pids):  # "strace: Process N attached ..." for each
                line = await proc.stderr.readline()
                if not line or b"attach:" in line:  # "strace: attach: ptrace(PTRACE_SEIZE, N): ..."
                    raise RuntimeError(f"strace cannot stall {pids}: {line.decode(errors='replace').strip()}")
                attached += b"attached" in line
        log.warning("disk of pid(s) %s stalls for %.1f s (injected)", pids, seconds)
        await clock.sleep(seconds)  # the injected stall itself
    finally:
        if proc.returncode is None:
            proc.terminate()  # strace lets the processes go as it exits (timeout passes the signal on)
        await proc.wait()
