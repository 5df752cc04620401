"""Node processes forked from a server that imported the node's code once.

``python -m broker.cli broker start`` spends about 0.45 s of CPU importing its modules (the
SQL toolkit alone 0.2 s) before it does anything, and a test suite starts hundreds of nodes.
:func:`start_forked` runs the same command in a process forked from a multiprocessing fork
server that imported those modules once (:func:`multiprocessing.set_forkserver_preload`):
a process of its own, with its own pid, output, exit status and signals (``kill -9``,
SIGSTOP), started without the imports.  The interpreter's own start-up settings cannot
differ from the server's, so a node that needs its own (a preloaded library: libfaketime;
a command it runs under: ``ip netns exec``) is started with a fresh interpreter instead
(:attr:`broker.tools.process.NodeProcess.forked`).

The tests turn it on (tests/conftest.py) and run their ``tandem`` commands the same way
(:func:`run_forked`, tests/helpers.py); ``tandem`` itself, the bench and the drills start each
node with a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import signal
import sys
from multiprocessing import reduction
from typing import Any

#: what a node process runs (as ``python -m``), as :func:`broker.tools.process.node_command` does
ENTRY_POINT = "broker.cli"
#: what the fork server imports once: the entry point, the node and its console
PRELOAD = [ENTRY_POINT, "broker.node.node", "webconsole.app", "webconsole.nodeview"]

#: environment variables an interpreter reads as it starts (a fork has the server's)
_INTERPRETER = ("PYTHON", "LD_")
_IGNORED = {"PYTHONPATH", "PYTHONUNBUFFERED"}  # (compared on its own; the fork flushes its output)

_context: multiprocessing.context.ForkServerContext | None = None
_server_settings: dict[str, str] = {}


def _settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_INTERPRETER) and k not in _IGNORED}


def _server() -> multiprocessing.context.ForkServerContext:
    global _context, _server_settings
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
        _server_settings = _settings(dict(os.environ))  # the fork server starts with this environment
    return _context


def can_fork(env: dict[str, str]) -> bool:
    """Whether a fork would start as a fresh interpreter with ``env`` would: every
    ``PYTHONPATH`` entry already on this process's path (a fork imports from it), and the
    interpreter's other start-up variables (``PYTHON*``, ``LD_*``) those of the fork server."""
    on_path = {os.path.abspath(p) for p in sys.path}
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) not in on_path]
    settings = _server_settings if _context is not None else _settings(dict(os.environ))
    return not extra and _settings(env) == settings


class _Fd:
    """A file descriptor handed to the forked process (duplicated into it by the fork server)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup: Any) -> int:
    return int(dup.detach())


def _run(argv: list[str], env: dict[str, str], out: int, err: int | None = None, cwd: str | None = None) -> None:
    """In the forked process: its output to ``out`` and its errors to ``err`` (None: to ``out``
    too), its environment ``env`` and working directory ``cwd``, then what ``python -m
    broker.cli ARGV`` runs (the entry point's ``main``: its modules are the server's,
    imported).  The module ``random`` reseeds itself in a forked child, and the node makes its
    own generators as it starts, after the fork: no two nodes draw alike."""
    os.dup2(out, 1)
    os.dup2(out if err is None else err, 2)
    os.close(out)
    if err is not None:
        os.close(err)
    if cwd is not None:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [ENTRY_POINT, *argv]
    try:
        sys.exit(importlib.import_module(ENTRY_POINT).main(argv))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class ForkedProcess:
    """What :class:`~broker.tools.process.NodeProcess` uses of an asyncio subprocess: ``pid``,
    ``returncode`` (negative: the signal that ended it), ``wait()``, ``send_signal()`` and
    ``stdout`` (output and errors, as one stream)."""

    def __init__(self, proc: multiprocessing.process.BaseProcess, stdout: asyncio.StreamReader) -> None:
        self._proc = proc
        self.stdout = stdout
        self.pid = int(proc.pid or 0)
        self._ended: asyncio.Future[None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    async def wait(self) -> int:
        if self.returncode is None:
            if self._ended is None:
                loop = asyncio.get_running_loop()
                ended: asyncio.Future[None] = loop.create_future()
                sentinel = self._proc.sentinel

                def readable() -> None:  # the fork server wrote the exit status
                    loop.remove_reader(sentinel)
                    if not ended.done():
                        ended.set_result(None)

                loop.add_reader(sentinel, readable)
                self._ended = ended
            await asyncio.shield(self._ended)
        code = self._proc.exitcode
        return 255 if code is None else code  # (None: the fork server itself went; multiprocessing says 255)


async def start_forked(argv: list[str], env: dict[str, str]) -> ForkedProcess:
    """``tandem ARGV`` (``broker start ...``) in a process forked from the fork server, with
    ``env`` as its environment."""
    r, w = os.pipe()
    try:
        proc = _server().Process(target=_run, args=(argv, env, _Fd(w)), daemon=True, name="tandem-node")
        # (a blocking hand-shake with the fork server: the first one starts it and its imports)
        await asyncio.to_thread(proc.start)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(r, "rb", 0))
    return ForkedProcess(proc, reader)


async def run_forked(argv: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """``tandem ARGV`` run to its end in a process forked from the fork server, with ``env`` as
    its environment and this process's working directory: its exit status, output and errors
    (the tests' CLI runs: a command as a user runs it, without a fresh interpreter's imports)."""
    fds = [*os.pipe(), *os.pipe()]  # out read, out write, err read, err write
    try:
        def start() -> multiprocessing.process.BaseProcess:
            proc = _server().Process(target=_run, args=(argv, env, _Fd(fds[1]), _Fd(fds[3]), os.getcwd()),
                                     daemon=True, name="tandem-cli")
            proc.start()
            return proc

        proc = await asyncio.to_thread(start)
    except BaseException:
        os.close(fds[0])
        os.close(fds[2])
        raise
    finally:
        os.close(fds[1])
        os.close(fds[3])
    with os.fdopen(fds[0], "rb") as out, os.fdopen(fds[2], "rb") as err:
        try:
            both = await asyncio.gather(asyncio.to_thread(out.read), asyncio.to_thread(err.read))
            await asyncio.to_thread(proc.join)  # (its exit status comes from the fork server: a read)
        except BaseException:
            # (cancelled: a caller's deadline) the command does not outlive its caller, and its
            # end closes the pipes the reading threads wait on, before the files are closed
            if proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            raise
    code = proc.exitcode
    return 255 if code is None else code, both[0], both[1]
