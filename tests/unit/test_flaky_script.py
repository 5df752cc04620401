"""scripts/flaky.py: runs going on at the same time pick their nodes' ports from disjoint slices."""

from __future__ import annotations

import pytest

from scripts import flaky


def test_each_job_gets_its_own_slice_of_the_port_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_PORT_RANGE", "10000-32768")
    slices = [tuple(map(int, s.split("-"))) for s in flaky.port_slices(3)]
    assert slices[0][0] == 10000 and all(lo < hi for lo, hi in slices)
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:]))  # disjoint, in order
    assert slices[-1][1] <= 32768
