"""The soak's producers: TandemUsers that write a ledger line before and after each batch
(:mod:`broker.tools.soak_report`) into ``$TANDEM_SOAK_LEDGER/ledger-<pid>.txt``.

Loaded by locust only (``tandem load --profile soak`` runs it).
"""

from __future__ import annotations

import os
from typing import IO, Any

from locust import task

from client.clock import SYSTEM_CLOCK
from client.locust import TandemUser

_files: dict[int, IO[str]] = {}


def _ledger() -> IO[str]:
    """This process's ledger (locust --processes forks: one file each), line-buffered: a
    line is in the file once its write returns."""
    pid = os.getpid()
    f = _files.get(pid)
    if f is None:
        f = open(os.path.join(os.environ["TANDEM_SOAK_LEDGER"], f"ledger-{pid}.txt"), "a", buffering=1)
        _files[pid] = f
    return f


class SoakProducer(TandemUser):
    queue = "soak"
    batch_size = 10

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.tag = self.producer_tag.hex()

    def sending(self, first: int, count: int) -> None:
        _ledger().write(f"s {self.tag} {first} {count}\n")

    def confirmed(self, first: int, count: int, latency: float) -> None:
        _ledger().write(f"c {self.tag} {first} {count} {SYSTEM_CLOCK.time():.6f} {latency:.6f}\n")

    def failed(self, first: int, count: int, exc: BaseException) -> None:
        _ledger().write(f"f {self.tag} {first} {count} {SYSTEM_CLOCK.time():.6f} {type(exc).__name__}\n")

    @task
    def send(self) -> None:
        self.publish()
