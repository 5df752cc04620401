"""The witness of a local pair as ``tandem cluster up`` supervises it.

:class:`~broker.tools.witness_process.WitnessProcess` starts ``tandem witness start`` and
waits for it to say it is up; :class:`SupervisedWitness` adds what the supervisor and the
drills use of a node process: its ``pid``, ``wait()`` for its exit, and ``paused``.
"""

from __future__ import annotations

from pathlib import Path

from broker.tools.process import NodeStartError
from broker.tools.witness_process import WitnessProcess
from client.clock import SYSTEM_CLOCK, Clock


class SupervisedWitness(WitnessProcess):
    def __init__(self, data_dir: Path, *, name: str, peer_port: int, peers: dict[str, tuple[str, int]],
                 host: str = "127.0.0.1", extra_args: list[str] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(data_dir, name=name, peer_port=peer_port,
                         peers=[f"{n}={h}:{p}" for n, (h, p) in peers.items()], host=host, extra_args=extra_args,
                         clock=clock)
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
