"""Loaded by the nodes that ``scripts/confirm_tail.py`` starts (it puts this folder on their
``PYTHONPATH`` and sets ``TANDEM_TAIL_PROBE`` to a folder).  In a node it records:

* every writer commit: start, seconds, the writer thread's CPU seconds, ops, synced, and how
  many of its submissions were lazy (held store writes: broker/modes/replicated/apply.py, HOLD_APPLY);
* the event loop's lag: a thread asks the loop to run a callback every 2 ms and notes when
  that took over 2 ms.

and writes them to ``$TANDEM_TAIL_PROBE/<pid>.json`` when the node exits.  A diagnostic, never
loaded otherwise: without the variable, or in any process but a node, it does nothing.

Times are the project's clock (``client.clock.SYSTEM_CLOCK``, the machine's monotonic clock, one
for every process), CPU seconds the thread's own (``time.thread_time``).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

if os.environ.get("TANDEM_TAIL_PROBE") and "broker" in sys.argv and "start" in sys.argv:
    _out = os.environ["TANDEM_TAIL_PROBE"]
    _commits: list[tuple[float, float, float, int, bool, int]] = []
    _lags: list[tuple[float, float]] = []

    def _dump() -> None:
        with open(os.path.join(_out, f"{os.getpid()}.json"), "w") as f:
            json.dump({"argv": sys.argv, "commits": _commits, "lags": _lags}, f)

    atexit.register(_dump)

    import asyncio.runners

    import storage.writer
    from client.clock import SYSTEM_CLOCK as _clock

    _commit = storage.writer.GroupCommitWriter._commit

    def _timed_commit(self, batch):  # type: ignore[no-untyped-def]
        t0, c0 = _clock.monotonic(), time.thread_time()
        result = _commit(self, batch)
        _commits.append((t0, _clock.monotonic() - t0, time.thread_time() - c0, sum(len(i.ops) for i in batch),
                         any(i.sync for i in batch), sum(1 for i in batch if i.lazy)))
        return result

    storage.writer.GroupCommitWriter._commit = _timed_commit  # type: ignore[method-assign]

    _lazy_init = asyncio.runners.Runner._lazy_init

    def _init_and_watch(self):  # type: ignore[no-untyped-def]
        _lazy_init(self)
        loop = self._loop

        def watch() -> None:
            while True:
                t0 = _clock.monotonic()
                ran = threading.Event()
                loop.call_soon_threadsafe(ran.set)
                if not ran.wait(5):
                    return  # the loop is gone
                lag = _clock.monotonic() - t0
                if lag > 0.002:
                    _lags.append((t0, lag))
                _clock.sleep_blocking(0.002)  # a probe's own pace, not a wait for a state

        threading.Thread(target=watch, name="tail-probe", daemon=True).start()

    asyncio.runners.Runner._lazy_init = _init_and_watch  # type: ignore[method-assign]
