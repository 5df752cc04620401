"""Run a witness (``tandem witness start``) as a child process, beside a local pair's nodes.

A witness is the data-less third vote of a two-node replicated group: it listens on its peer
port only (no clients, no console).  :class:`WitnessProcess` starts it and waits (with a
deadline) until that port accepts connections; it has the rest of
:class:`~broker.tools.process.NodeProcess`'s interface (``wait``, ``kill``, ``pause``,
``stop``, ``pid``, ``log_path``), so ``tandem cluster up`` supervises it like a node.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.tools.process import NodeProcess, NodeStartError, node_command
from client.clock import SYSTEM_CLOCK, Clock


class WitnessProcess(NodeProcess):
    def __init__(self, data_dir: Path, *, name: str, peer_port: int, peers: dict[str, tuple[str, int]],
                 host: str = "127.0.0.1", log_path: Path | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(data_dir, name=name, port=peer_port, host=host, log_path=log_path, clock=clock)
        self.peer_port = peer_port
        self.peers = dict(peers)  # data node -> its peer address

    @property
    def spec(self) -> str:
        """NAME=HOST:PORT, as the data nodes' ``--witness`` names it."""
        return f"{self.name}={self.host}:{self.peer_port}"

    @property
    def url(self) -> str:
        raise NodeStartError(f"witness {self.name} serves no clients")

    async def start(self, timeout: float = 60.0) -> WitnessProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = node_command()
        env["PYTHONUNBUFFERED"] = "1"
        peers = ",".join(f"{n}={h}:{p}" for n, (h, p) in self.peers.items())
        self.proc = await asyncio.create_subprocess_exec(
            *command, "witness", "start", "--name", self.name, "--peer-port", str(self.peer_port),
            "--peers", peers, "--data-dir", str(self.data_dir),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )
        # it prints no client URL: _pump only copies its output, and fails this when it exits
        never: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
        never.add_done_callback(lambda f: f.cancelled() or f.exception())  # its exit is wait()'s news
        self._output = asyncio.create_task(self._pump(never))  # its output into the log
        try:
            async with self.clock.timeout(timeout):
                while not await self._listening():
                    if self.proc.returncode is not None or never.done():
                        raise NodeStartError(f"exited with status {await self.proc.wait()}")
                    await self.clock.sleep(0.05)  # polling a starting process's port, bounded by the deadline
        except (TimeoutError, NodeStartError) as exc:
            await self.kill()
            if not never.done():
                never.cancel()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise NodeStartError(f"witness {self.name} did not start: {exc or 'timeout'}\n{tail}") from None
        self.address = (self.host, self.peer_port)
        return self

    async def _listening(self) -> bool:
        try:
            _r, w = await asyncio.open_connection(self.host, self.peer_port)
        except OSError:
            return False
        w.close()
        try:
            await w.wait_closed()
        except OSError:
            pass  # the witness closed first: it is listening all the same
        return True
