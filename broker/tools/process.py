"""Run a Tandem node as a child process: for ``tandem bench --spawn``, drills and tests.

``NodeProcess.start()`` launches ``python -m broker.cli broker start`` with a
given data dir and waits (with a deadline, reading the node's own output,
never sleeping blind) until it prints its client URL.  ``kill()`` is
``kill -9``; ``stop()`` is SIGTERM and a wait for the clean shutdown.

The node runs the code of the process that starts it (:func:`node_command`):
``python -m`` alone would put the working directory first on ``sys.path``, and
a ``broker`` package there (another checkout, say) would be what runs.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from broker.tools.builds import OtherBuild
from broker.tools.forked import ForkedProcess, can_fork, start_forked
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError

_URL_LINE = re.compile(r"client URL\s*:\s*(tandems?)://[^@]*@([^:\s]+):(\d+)")


class NodeStartError(TandemError):
    pass


#: the directory this process imports ``broker`` from
CODE_ROOT = str(Path(__file__).resolve().parents[2])


def node_command() -> tuple[list[str], dict[str, str]]:
    """``python -m broker.cli`` as a child of this process runs it, and its environment:
    the same code as this process (``-P``: not the working directory's first), with
    CODE_ROOT first on its ``PYTHONPATH``."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": CODE_ROOT + (os.pathsep + path if path else "")}
    return [sys.executable, "-P", "-m", "broker.cli"], env


class NodeProcess:
    #: start the node in a process forked from a server that imported its code once
    #: (:mod:`broker.tools.forked`: the tests do) rather than in a fresh interpreter; a node
    #: with a :attr:`wrap` or :attr:`env` of its own, or an environment a fork would not honour
    #: (:func:`~broker.tools.forked.can_fork`), always gets a fresh interpreter
    forked = False

    def __init__(self, data_dir: Path, *, name: str = "node1", port: int = 0, sync: str = "SYNC",
                 password: str = "bench-password", host: str = "127.0.0.1", log_path: Path | None = None,
                 extra_args: list[str] | None = None, ca: Path | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        #: a command the node runs under (``ip netns exec NS``, say: the drill's faults); it must
        #: exec the node, so that :attr:`pid` is the node's own
        self.wrap: list[str] = []
        #: variables added to the node's environment (a fault's: libfaketime's, say)
        self.env: dict[str, str] = {}
        #: another build of Tandem to run the node on (broker.tools.builds: the rolling-upgrade
        #: drill), in a fresh interpreter; None: this process's code
        self.build: OtherBuild | None = None
        #: the CA a TLS node's certificate is signed by (the ``ca`` of :attr:`url`)
        self.ca = ca
        self.tls = False  # whether the node said tandems:// (set when it starts)
        self.data_dir = Path(data_dir)
        self.name = name
        self.port = port
        self.sync = sync
        self.host = host
        self.password = password
        self.log_path = log_path or self.data_dir.parent / f"{name}.log"
        self.extra_args = extra_args or []
        self.proc: asyncio.subprocess.Process | ForkedProcess | None = None
        self.paused = False  # SIGSTOPped by pause(): it accepts connections and answers none
        self.address: tuple[str, int] | None = None
        self._output: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        if self.address is None:
            raise NodeStartError(f"node {self.name} is not running")
        if self.tls:
            query = f"/?ca={self.ca}" if self.ca is not None else ""
            return f"tandems://admin:{self.password}@{self.address[0]}:{self.address[1]}{query}"
        return f"tandem://admin:{self.password}@{self.address[0]}:{self.address[1]}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise NodeStartError(f"node {self.name} is not running")
        return self.proc.pid

    async def start(self, timeout: float = 60.0) -> NodeProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = node_command() if self.build is None else (self.build.command(), self.build.env())
        env.update({"TANDEM_ADMIN_PASSWORD": self.password, "PYTHONUNBUFFERED": "1", **self.env})
        port = self.port if self.address is None else self.address[1]  # a restart keeps its port
        argv = ["broker", "start", "--name", self.name, "--data-dir", str(self.data_dir), "--host", self.host,
                "--port", str(port), "--sync", self.sync, *self.extra_args]
        if self.forked and not self.wrap and not self.env and self.build is None and can_fork(env):
            self.proc = await start_forked(argv, env)
        else:
            self.proc = await asyncio.create_subprocess_exec(
                *self.wrap, *command, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
        found: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
        self._output = asyncio.create_task(self._pump(found))
        try:
            async with self.clock.timeout(timeout):
                self.address = await asyncio.shield(found)
        except (TimeoutError, NodeStartError) as exc:
            await self.kill()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise NodeStartError(f"node {self.name} did not start: {exc or 'timeout'}\n{tail}") from None
        finally:
            found.cancel()  # (a start given up on: the pump sets no exception nobody would retrieve)
        return self

    async def _pump(self, found: asyncio.Future[tuple[str, int]]) -> None:
        if self.proc is None or self.proc.stdout is None:
            raise NodeStartError(f"node {self.name} has no output to read")
        with open(self.log_path, "ab") as log:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                log.write(line)
                log.flush()
                if not found.done():
                    m = _URL_LINE.search(line.decode(errors="replace"))
                    if m:
                        self.tls = m.group(1) == "tandems"
                        found.set_result((m.group(2), int(m.group(3))))
        if not found.done():
            found.set_exception(NodeStartError(f"exited with status {await self.proc.wait()}"))

    async def wait(self) -> int:
        """Until the process exits and its output is in the log; its exit status (a negative
        one: the signal that killed it)."""
        if self.proc is None:
            raise NodeStartError(f"node {self.name} is not running")
        code = await self.proc.wait()
        await self._finish_output()
        return code

    async def kill(self) -> None:
        """kill -9: no flush, no goodbye (a paused node too: it is gone, not frozen)."""
        await self._signal(signal.SIGKILL)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process freezes, its sockets stay open (a hung node)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait for a clean exit (kill -9 after ``timeout``)."""
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGCONT)  # a paused node could not act on SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with self.clock.timeout(timeout):
                await self.proc.wait()
        except TimeoutError:
            await self.kill()
        await self._finish_output()
        return self.proc.returncode

    async def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
            await self.proc.wait()
        await self._finish_output()

    async def _finish_output(self) -> None:
        if self._output is not None:
            await self._output
            self._output = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
