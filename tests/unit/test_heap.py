"""broker/node/heap.py on this (glibc) machine: the arena limit is taken, and a trim hands free
pages inside the heap back to the system (checked in a child process of its own)."""

import platform
import subprocess
import sys
import textwrap

import pytest

from broker.node import heap

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

CHILD = textwrap.dedent("""
    import gc
    from broker.node import heap

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    blocks = [bytearray(100_000) for _ in range(2_000)]  # ~200 MB of heap (under the mmap threshold)
    pin = bytearray(100_000)  # the heap's top stays in use: only a trim can return what is below
    del blocks
    gc.collect()
    before = rss_mib()
    assert heap.trim()
    after = rss_mib()
    print(round(before), round(after))
""")


def test_arenas_limited() -> None:
    assert heap.limit_arenas() is True


def test_trim_returns_freed_pages_below_the_heaps_top() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(int, out.stdout.split())
    assert before > 150, out.stdout  # freed but still counted
    assert after < before - 150, out.stdout  # handed back
