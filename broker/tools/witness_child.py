"""Run a witness (``tandem witness start``) as a child process, beside a local pair's nodes.

A witness is the data-less third vote of a two-node replicated group: it listens on its peer
port only (no clients, no console).  :class:`SupervisedWitness` starts it and waits (with a
deadline) until it prints that it is up; it has the rest of
:class:`~broker.tools.process.NodeProcess`'s interface (``wait``, ``kill``, ``pause``,
``stop``, ``pid``, ``log_path``), so ``tandem cluster up`` supervises it like a node.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.tools.process import NodeProcess, NodeStartError, node_command
from client.clock import SYSTEM_CLOCK, Clock


class SupervisedWitness(NodeProcess):
    """``tandem witness start`` as a child process."""

    def __init__(self, data_dir: Path, *, name: str, peer_port: int, peers: dict[str, tuple[str, int]],
                 host: str = "127.0.0.1", log_path: Path | None = None, extra_args: list[str] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(data_dir, name=name, port=peer_port, host=host, log_path=log_path, extra_args=extra_args,
                         clock=clock)
        self.peer_port = peer_port
        self.peers = dict(peers)  # data node -> its peer address

    @property
    def spec(self) -> str:
        """NAME=HOST:PORT, as the data nodes' ``--witness`` names it."""
        return f"{self.name}={self.host}:{self.peer_port}"

    @property
    def url(self) -> str:
        raise NodeStartError(f"witness {self.name} serves no clients")

    async def start(self, timeout: float = 60.0) -> SupervisedWitness:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command, env = node_command()
        env["PYTHONUNBUFFERED"] = "1"
        peers = ",".join(f"{n}={h}:{p}" for n, (h, p) in self.peers.items())
        self.proc = await asyncio.create_subprocess_exec(
            *command, "witness", "start", "--name", self.name, "--peer-port", str(self.peer_port),
            "--peers", peers, "--host", self.host, "--data-dir", str(self.data_dir), *self.extra_args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )
        up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._output = asyncio.create_task(self._pump_witness(up))
        try:
            async with self.clock.timeout(timeout):
                await asyncio.shield(up)
        except (TimeoutError, NodeStartError) as exc:
            await self.kill()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise NodeStartError(f"witness {self.name} did not start: {exc or 'timeout'}\n{tail}") from None
        self.address = (self.host, self.peer_port)
        return self

    async def _pump_witness(self, up: asyncio.Future[None]) -> None:
        """Its output into the log; ``up`` once it says it is up."""
        if self.proc is None or self.proc.stdout is None:
            raise NodeStartError(f"witness {self.name} has no output to read")
        with open(self.log_path, "ab") as log:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                log.write(line)
                log.flush()
                if not up.done() and b" is up" in line:
                    up.set_result(None)
        if not up.done():
            up.set_exception(NodeStartError(f"exited with status {await self.proc.wait()}"))
