"""Compensation hooks: what a restore does with a key conflict, decided by the operator's code.

A restore (:mod:`broker.partitions.restore`) puts each quarantined message back into its queue.  When
its old id, the partition and offset the losing side stored it at, names another message
of the queue now (a key conflict), the source keeps its own message, and by default the
quarantined one is added beside it with a new id.  A compensation hook, installed as an
entry point in the group ``tandem.compensation``, sees both versions and decides instead::

    # pyproject.toml of the operator's package
    [project.entry-points."tandem.compensation"]
    orders = "myhooks:compensate"

    # myhooks.py
    from broker.partitions.compensation import DROP, Conflict, Version

    def compensate(c: Conflict) -> Version | str | None:
        if c.kept is not None and c.kept.body == c.discarded.body:
            return DROP                        # the same order on both sides: restore nothing
        return None                            # KEEP: restore it beside the source's (the default)

It returns :data:`KEEP` (or None): the quarantined message is restored as it is;
:data:`DROP`: it is not restored (it leaves the quarantine, and the log says so); or a
:class:`Version`: that message is restored in its place (a merge of the two, say).  The
source's own message is never changed: a queue is a log, and consumers may have seen it.
A hook that raises or returns anything else leaves the message in the quarantine, logged
with the error, and the restore goes on: nothing is lost to a bug in a hook.

``tandem restore --compensation NAME`` runs the hook in the command's process; the admin
API and the console run the one the node was started with (``--compensation NAME``), on
the member serving the quarantine's partition, so every member names the same one.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from client.errors import InvalidArgumentError
from broker.config import ConfigError, NodeConfig

log = logging.getLogger("tandem.broker")

#: the entry-point group hooks are installed under
ENTRY_POINTS = "tandem.compensation"

KEEP = "keep"  # restore the quarantined message beside the source's (the default)
DROP = "drop"  # do not restore it


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a message: its key, its own headers (not the quarantine's) and body."""

    key: str | None
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Conflict:
    """A quarantined message whose old id names another message of its queue now."""

    queue: str
    partition: int
    offset: int  # where the losing side had stored it; the source's message is there now
    node: str  # the node that discarded it
    discarded: Version  # the quarantined message
    kept: Version | None  # the source's message at that id (None: no longer stored there)

    @property
    def id(self) -> str:
        return f"{self.partition}-{self.offset}"


Hook = Callable[[Conflict], Any]


def load(name: str) -> Hook:
    """The hook installed under ``name``; InvalidArgumentError naming what is wrong."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}
    ep = found.get(name)
    if ep is None:
        have = ", ".join(sorted(found)) or "none is installed"
        raise InvalidArgumentError(f"compensation hook {name!r} is not installed (entry points {ENTRY_POINTS}: "
                                   f"{have})")
    try:
        hook = ep.load()
    except Exception as e:  # (the plug-in's own import failed)
        raise InvalidArgumentError(f"compensation hook {name!r} ({ep.value}) cannot be loaded: "
                                   f"{type(e).__name__}: {e}") from None
    if not callable(hook):
        raise InvalidArgumentError(f"compensation hook {name!r} ({ep.value}) is not callable")
    return hook


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a hook decided for one conflict: ``outcome`` is "kept", "dropped", "merged" or
    "failed"; ``version``, the message to restore (None: none)."""

    outcome: str
    version: Version | None
    why: str = ""  # "failed": the hook's error


def resolve(hook: Hook | None, c: Conflict) -> Resolution:
    """Ask ``hook`` about ``c`` (no hook: keep both)."""
    if hook is None:
        return Resolution("kept", c.discarded)
    try:
        got = hook(c)
    except Exception as e:
        return Resolution("failed", None, f"{type(e).__name__}: {e}")
    if got is None or got == KEEP:
        return Resolution("kept", c.discarded)
    if got == DROP:
        return Resolution("dropped", None)
    if isinstance(got, Version):
        bad = _bad_version(got)
        if bad:
            return Resolution("failed", None, bad)
        return Resolution("merged", got)
    return Resolution("failed", None, f"returned {type(got).__name__} {_short(got)}: a hook returns "
                                      f"{KEEP!r}, {DROP!r}, None or a Version")


def _bad_version(v: Version) -> str:
    if v.key is not None and not isinstance(v.key, str):
        return "returned a Version whose key is not a string"
    if not isinstance(v.body, bytes):
        return "returned a Version whose body is not bytes"
    if not isinstance(v.headers, Mapping) or not all(isinstance(k, str) and isinstance(x, str)
                                                      for k, x in v.headers.items()):
        return "returned a Version whose headers are not a map of strings"
    return ""


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_compensation(config: NodeConfig) -> None:
    """ConfigError unless the node's ``compensation`` hook, if it names one, is installed
    and loads (scans the installed packages only when one is named)."""
    if config.compensation:
        try:
            load(config.compensation)
        except InvalidArgumentError as e:
            raise ConfigError(f"compensation: {e.message}") from None
