"""Run a two-node group's witness as a child process (tests, drills, ``tandem cluster up``):
``tandem witness start`` with a deadline on its "is up" line, ``kill()`` (kill -9), ``stop()``
(SIGTERM), and what the supervisor and the drills use of a node process: ``pid``, ``wait()``
and ``paused``."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from broker.tools.process import NodeStartError, node_command
from client.clock import SYSTEM_CLOCK, Clock


class WitnessProcess:
    def __init__(self, data_dir: Path, *, name: str, peer_port: int, peers: list[str], host: str = "127.0.0.1",
                 extra_args: list[str] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.data_dir = Path(data_dir)
        self.name, self.peer_port, self.peers, self.host = name, peer_port, peers, host
        self.extra_args = extra_args or []
        self.clock = clock
        self.log_path = self.data_dir.parent / f"{name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self._output: asyncio.Task[None] | None = None
        self.paused = False  # (a witness is never paused by the tools; the drills skip paused nodes)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise NodeStartError(f"witness {self.name} is not running")
        return self.proc.pid

    async def wait(self) -> int:
        """Until the process exits and its output is in the log; its exit status (a negative
        one: the signal that killed it)."""
        if self.proc is None:
            raise NodeStartError(f"witness {self.name} is not running")
        code = await self.proc.wait()
        await self._finish_output()
        return code

    @property
    def spec(self) -> str:
        """``NAME=HOST:PORT``, as the data nodes' ``--witness`` takes it."""
        return f"{self.name}={self.host}:{self.peer_port}"

    async def start(self, timeout: float = 60.0) -> WitnessProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = node_command()
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = await asyncio.create_subprocess_exec(
            *command, "witness", "start", "--name", self.name, "--peer-port", str(self.peer_port),
            "--peers", ",".join(self.peers), "--host", self.host, "--data-dir", str(self.data_dir),
            *self.extra_args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
        up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._output = asyncio.create_task(self._pump(up))
        try:
            async with self.clock.timeout(timeout):
                await asyncio.shield(up)
        except (TimeoutError, NodeStartError) as exc:
            await self.kill()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise NodeStartError(f"witness {self.name} did not start: {exc or 'timeout'}\n{tail}") from None
        return self

    async def _pump(self, up: asyncio.Future[None]) -> None:
        if self.proc is None or self.proc.stdout is None:
            raise NodeStartError(f"witness {self.name} has no output to read")
        with open(self.log_path, "ab") as log:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                log.write(line)
                log.flush()
                if not up.done() and b"is up" in line:
                    up.set_result(None)
        if not up.done():
            up.set_exception(NodeStartError(f"exited with status {await self.proc.wait()}"))

    async def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        await self._finish_output()

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait for the clean exit (kill -9 after ``timeout``)."""
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with self.clock.timeout(timeout):
                await self.proc.wait()
        except TimeoutError:
            await self.kill()
        await self._finish_output()
        return self.proc.returncode

    async def _finish_output(self) -> None:
        if self._output is not None:
            await self._output
            self._output = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
