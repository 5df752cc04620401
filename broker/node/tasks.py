"""The owner of the tasks a node spawns (STYLE rule 14: every task has an owner).

Work a node starts off the request path (a remap's sweep, a forced move, a cold refill, a
publish relayed to another member's active, the security seed) runs as a task of a
:class:`TaskOwner`.  The owner keeps each task until it ends, logs the exception of one that
failed (with the task's name: never swallowed), and :meth:`TaskOwner.close` ends them all:
cancelled, then awaited for at most a bound.  After ``close`` nothing more is spawned.

Why not an :class:`asyncio.TaskGroup`: a TaskGroup owns its tasks for the span of an
``async with`` block and cancels every sibling when one fails.  A node's life is two calls
(``start`` and ``stop``) with no block around them, and one failed refill or sweep must not
cancel the node's other work (each such task reports its own failure, here, and the rest go
on).  So the owner is a set with done-callbacks, ended by the node's ``stop`` at the point
of its sequence where the spawned work may go: after the sessions closed (their last acks
commit), before the peer links and the store close.  :func:`to_the_end` runs that stop: a step
of it that fails is logged and the node stops all the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from client.errors import TandemError

log = logging.getLogger("tandem.broker")

#: how long ``close`` waits for cancelled tasks to end: the most a stop gets slower by
CLOSE_BOUND = 2.0


class TaskOwner:
    """Tasks spawned by ``owner`` (a name for the log), ended together by :meth:`close`."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any] | None:
        """Run ``coro`` as a task of this owner; None (and ``coro`` closed, unrun) once closed."""
        name = name or f"{self.owner}:{getattr(coro, '__qualname__', 'task')}"
        if self.closed:
            coro.close()
            log.warning("%s is stopping: task %s refused", self.owner, name)
            return None
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # (read: asyncio then says nothing at garbage collection)
        if exc is not None:
            log.error("task %s failed: %r", task.get_name(), exc, exc_info=exc)

    async def cancel_all(self, bound: float = CLOSE_BOUND) -> None:
        """Cancel every task (but the caller's own) and wait for them, ``bound`` seconds at
        most; the ones still running then are named in the log (cancelled, not awaited)."""
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for t in tasks:
            t.cancel()
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=bound)
        if pending:
            log.warning("%s: %d task(s) still running %.1f s after being cancelled: %s", self.owner,
                        len(pending), bound, ", ".join(sorted(t.get_name() for t in pending)))

    async def close(self, bound: float = CLOSE_BOUND) -> None:
        """Refuse new tasks, then :meth:`cancel_all`.  Calling it again waits again."""
        self.closed = True
        await self.cancel_all(bound)


class Loops:
    """The node's long-running loops (its peer links, discovery, replication, the LockFile
    arbiter, the disk alarm), one task each under its name, each stopped by name at its
    point of the node's stop (the order matters: the lock goes before replication stops)."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=name)

    def task(self, name: str) -> asyncio.Task[None] | None:
        return self._tasks.get(name)

    async def stop(self, name: str, *, failed_too: bool = False) -> None:
        """Cancel loop ``name`` (if running) and wait for it; its failure, if it failed, is
        raised (``failed_too``: dropped, as a cancellation is)."""
        task = self._tasks.pop(name, None)
        if task is None:
            return
        task.cancel()
        if failed_too:
            await asyncio.gather(task, return_exceptions=True)
            return
        try:
            await task
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                raise  # the cancel was aimed at the caller, not only at the loop
            # we cancelled it: the expected end of the loop


async def to_the_end(stop: Coroutine[Any, Any, None], stopped: asyncio.Event, what: str) -> bool:
    """Run a node's ``stop``; whether it finished.  A step of it that fails ends it there, logged
    (a failing disk in one line, anything else with its traceback), and ``stopped`` is set all
    the same: a process that said it stops must not go on running (it exits with a failure
    status: broker.cli)."""
    try:
        await stop
        return True
    except (OSError, TandemError) as exc:  # a failing disk: its own words say enough
        log.error("%s did not finish (%s): it stops all the same", what, exc)
    except Exception:
        log.exception("%s did not finish: it stops all the same", what)
    finally:
        stopped.set()
    return False
