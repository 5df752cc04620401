"""The disk alarm (broker/node/diskalarm.py) and its setting, on a fake clock and a fake free-space
reading."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import pytest

from broker.config import ConfigError, NodeConfig, build_config, parse_size
from broker.node.diskalarm import DiskAlarm, fmt_bytes, start_error
from client.errors import Retry, StorageError, UnavailableError
from client.testing import FakeClock

MiB = 1 << 20


@pytest.mark.parametrize(("text", "size"), [("64M", 64 * MiB), ("64MiB", 64 * MiB), ("64mb", 64 * MiB),
                                            ("512K", 512 * 1024), ("1G", 1 << 30), ("1048576", MiB), ("0", 0)])
def test_disk_free_limit_takes_bytes_with_a_suffix(text: str, size: int) -> None:
    assert parse_size(text) == size
    assert build_config({"disk_free_limit": text}).disk_free_limit == size


def test_disk_free_limit_defaults_to_64_mib_and_refuses_nonsense() -> None:
    assert NodeConfig().disk_free_limit == 64 * MiB
    assert build_config({"disk_free_limit": 1000}).disk_free_limit == 1000
    for bad in ("lots", "64X", "-1", "1.5G"):
        with pytest.raises(ConfigError, match="disk_free_limit"):
            build_config({"disk_free_limit": bad})
    with pytest.raises(ConfigError, match="disk_free_limit"):
        build_config({"disk_free_limit": -5})


def test_fmt_bytes() -> None:
    assert [fmt_bytes(n) for n in (0, 1023, 2048, 12 * MiB, 3 << 30)] == ["0 B", "1023 B", "2.0 KiB", "12.0 MiB",
                                                                           "3.0 GiB"]


def _alarm(clock: FakeClock, free: list[int]) -> DiskAlarm:
    return DiskAlarm("node1", Path("/data/node1"), 64 * MiB, clock=clock, interval=0.5, free=lambda _p: free[0])


def test_the_alarm_refuses_while_raised_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    alarm = _alarm(FakeClock(), [0])
    caplog.set_level(logging.INFO, "tandem.broker")
    alarm.refuse("publishing")  # nothing read yet: not raised
    alarm.update(100 * MiB)
    alarm.refuse("publishing")
    alarm.update(12 * MiB)
    alarm.update(11 * MiB)  # still below: no second line, no second event
    with pytest.raises(UnavailableError) as err:
        alarm.refuse("publishing")
    assert err.value.message == ("node node1: disk free space 11.0 MiB is below disk_free_limit 64.0 MiB: "
                                 "publishing refused until space is freed")
    assert err.value.retriable and err.value.retry is Retry.OTHER_NODE  # a durable client sends it again
    alarm.update(80 * MiB)
    alarm.refuse("declaring queues")
    assert (alarm.raised_count, alarm.refusals) == (1, 1)
    assert [(e.kind, e.partition) for e in alarm.events] == [("disk-alarm", "node1")] * 2
    assert alarm.events[0].text == ("disk free space 12.0 MiB is below disk_free_limit 64.0 MiB: publishing "
                                    "refused until space is freed")
    assert alarm.events[1].text.startswith("cleared: disk free space 80.0 MiB is back above disk_free_limit")
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [("WARNING", "disk alarm raised"), ("INFO", "disk alarm cleared")]


@pytest.mark.asyncio
async def test_the_alarm_checks_on_the_node_clock() -> None:
    clock = FakeClock(autojump=True)
    free = [100 * MiB]
    alarm = _alarm(clock, free)
    task = asyncio.create_task(alarm.run())
    try:
        free[0] = MiB
        while not alarm.raised:
            await clock.sleep(0.1)
        assert 0.5 <= clock.monotonic() <= 1.0
        free[0] = 65 * MiB
        while alarm.raised:
            await clock.sleep(0.1)
        assert alarm.free == 65 * MiB
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_start_that_failed_on_a_full_disk_is_one_line(tmp_path: Path) -> None:
    full = StorageError("cannot open store x: OperationalError: database or disk is full\n(Background ...)")
    err = start_error("node1", tmp_path, full)
    assert err is not None and "\n" not in err.message
    assert err.message.startswith("node node1 cannot start: its disk is full (No space left on device: ")
    assert err.message.endswith("(cannot open store x: OperationalError: database or disk is full)")
    wrapped = StorageError("write failed", orig=OSError(errno.ENOSPC, "No space left on device"))
    assert start_error("node1", tmp_path, wrapped) is not None
    assert start_error("node1", tmp_path, StorageError("store x has schema version 9")) is None  # (room enough)
