"""Running locust as a child process (``python -m locust -f LOCUSTFILE --headless ...``) for
``tandem load`` and the soak: locust monkey-patches whatever imports it, and the process
that runs it here runs asyncio (the spawned nodes)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from broker.tools.process import CODE_ROOT
from client.errors import InvalidArgumentError


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


def parse_duration(text: str, what: str = "--run-time") -> float:
    """Seconds of ``90``, ``90s``, ``5m``, ``1h30m``."""
    m = _DURATION.match(text.strip())
    if not text.strip() or m is None:
        raise InvalidArgumentError(f"{what} {text!r}: a duration such as 90s, 5m or 1h30m")
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    seconds = float(h * 3600 + mi * 60 + s)
    if seconds <= 0:
        raise InvalidArgumentError(f"{what} {text!r}: must be more than 0 s")
    return seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class LocustRun:
    locustfile: Path
    users: int
    spawn_rate: float | None
    run_time: float
    processes: int
    out: Path
    options: list[str]
    extra: list[str]

    def command(self) -> list[str]:
        # absolute paths: locust runs in ``out`` (its own files land there)
        out = self.out.resolve()
        cmd = [sys.executable, "-P", "-m", "locust", "-f", str(self.locustfile.resolve()), "--headless",
               "--users", str(self.users), "--spawn-rate", str(self.spawn_rate or self.users),
               "--run-time", f"{self.run_time:.0f}s", "--stop-timeout", "5",
               "--csv", str(out / "locust"), "--html", str(out / "report.html"), "--only-summary",
               "--exit-code-on-error", "1"]
        if self.processes > 1:
            cmd += ["--processes", str(self.processes)]
        return cmd + self.options + self.extra

    def env(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The URL in the environment (LOCUST_HOST), not on the command line where ``ps`` shows
        its password; this process's code first on the path (the locustfile imports client)."""
        path = os.environ.get("PYTHONPATH")
        return {**os.environ, "LOCUST_HOST": url, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": CODE_ROOT + (os.pathsep + path if path else ""), **(extra or {})}


async def run_locust(run: LocustRun, url: str, env: dict[str, str] | None = None) -> int:
    """Run locust to the end (its output in ``out/locust.log``); its exit status."""
    run.out.mkdir(parents=True, exist_ok=True)
    with open(run.out / "locust.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(*run.command(), stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                    env=run.env(url, env), cwd=str(run.out))
        try:
            # its own --run-time ends it; the margin covers start-up, the stop and the reports
            async with asyncio.timeout(run.run_time + 120):
                return await proc.wait()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
