"""The HA setup of a local group the tools start: replicated (majority, LockFile or witness
arbiter) or shared mode, and how to tell from the nodes' status who serves.

One :class:`HaSetup` travels from ``tandem cluster up``, ``tandem drill`` and ``tandem bench``
to :class:`~broker.tools.cluster.LocalCluster`, which turns it into node flags (``--mode shared
--database URL [--lock ...]``, ``--arbiter lockfile --lockfile PATH``, ``--arbiter witness
--witness NAME=HOST:PORT``) and, for the witness, a process of its own.

Who serves, as each setup reports it in ``tandem status``:

* replicated with the majority or the witness arbiter: per partition, the node whose status
  says it is active for it (elections per partition);
* the LockFile arbiter: the same, and only a node that holds the lock (``ha_state``
  ``STANDALONE``, ``ACTIVE_SYNC`` or ``ACTIVE``) counts: a holder paused past its lease may
  still list itself as a partition's active until it sees the later epoch;
* shared mode: the one node whose ``ha_state`` is ``ACTIVE`` serves every partition.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from client.errors import InvalidArgumentError
from client.protocol.frames import StatusOk

ARBITERS = ("majority", "lockfile", "witness")
MODES = ("replicated", "shared")
#: the LockFile states in which a node holds the lock and serves
LOCK_SERVING = frozenset({"STANDALONE", "ACTIVE_SYNC", "ACTIVE"})
#: the witness of a local pair
WITNESS_NAME = "w1"


@dataclass(frozen=True, kw_only=True, slots=True)
class HaSetup:
    mode: str = "replicated"
    database: str | None = None  # shared mode: the group's database URL
    lock: str | None = None  # shared mode: "database" or "file:PATH" (None: the node default)
    arbiter: str = "majority"
    lockfile: str | None = None  # the LockFile arbiter's path (None: DATA_DIR/tandem.lock)
    lease: float | None = None  # seconds (None: the node default)

    def check(self, nodes: int) -> None:
        """Wrong combinations as the operator typed them (flag names in the messages)."""
        if self.mode not in MODES:
            raise InvalidArgumentError(f"--mode {self.mode!r}: replicated or shared")
        if self.arbiter not in ARBITERS:
            raise InvalidArgumentError(f"--arbiter {self.arbiter!r}: majority, lockfile or witness")
        if self.mode == "shared":
            if not self.database:
                raise InvalidArgumentError("--mode shared needs --database URL (postgresql+psycopg://USER@HOST:PORT/DB, "
                                           "or sqlite:///PATH for nodes on this machine)")
            if not self.database.startswith(("postgresql+psycopg://", "sqlite:///")):
                raise InvalidArgumentError("--database: expected postgresql+psycopg://USER@HOST:PORT/DB or "
                                           "sqlite:///PATH")
            if self.arbiter != "majority":
                raise InvalidArgumentError(f"--arbiter {self.arbiter} is for replicated pairs: shared mode is "
                                           "arbitrated by its lock (--lock database|file:PATH)")
            if self.lock is not None and self.lock != "database" and \
                    not (self.lock.startswith("file:") and len(self.lock) > 5):
                raise InvalidArgumentError(f"--lock {self.lock!r}: database or file:PATH")
            if nodes < 2:
                raise InvalidArgumentError("--mode shared: a group of at least 2 nodes (one active, the others "
                                           "passive)")
        else:
            if self.database is not None:
                raise InvalidArgumentError("--database goes with --mode shared")
            if self.lock is not None:
                raise InvalidArgumentError("--lock goes with --mode shared (the LockFile arbiter of a replicated "
                                           "pair: --arbiter lockfile --lockfile PATH)")
        if self.arbiter != "majority" and nodes != 2:
            raise InvalidArgumentError(f"--arbiter {self.arbiter}: for a pair of nodes (--nodes 2), got --nodes "
                                       f"{nodes}")
        if self.lockfile is not None and self.arbiter != "lockfile":
            raise InvalidArgumentError("--lockfile goes with --arbiter lockfile")
        if self.lease is not None and not 0.2 <= self.lease <= 300:
            raise InvalidArgumentError("--lease: 0.2 .. 300 seconds")

    @property
    def shared(self) -> bool:
        return self.mode == "shared"

    @property
    def witness(self) -> bool:
        return self.arbiter == "witness"

    def lockfile_path(self, data_dir: Path) -> Path:
        return Path(self.lockfile) if self.lockfile else data_dir / "tandem.lock"

    def node_args(self, data_dir: Path, witness: str | None = None) -> list[str]:
        """The flags every node of the group gets; ``witness``: NAME=HOST:PORT of the witness."""
        args: list[str] = []
        if self.shared:
            args += ["--mode", "shared", "--database", str(self.database)]
            if self.lock is not None:
                args += ["--lock", self.lock]
        if self.arbiter == "lockfile":
            args += ["--arbiter", "lockfile", "--lockfile", str(self.lockfile_path(data_dir))]
        elif self.arbiter == "witness":
            if witness is None:
                raise InvalidArgumentError("--arbiter witness: the witness's address is not known yet")
            args += ["--arbiter", "witness", "--witness", witness]
        if self.lease is not None:
            args += ["--lease", f"{self.lease:g}"]
        return args

    def label(self, nodes: int) -> str:
        """What a report line says about the group: 'shared, 2 nodes, postgresql', ..."""
        if self.shared:
            engine = "postgresql" if str(self.database).startswith("postgresql") else "sqlite"
            lock = f", lock {self.lock}" if self.lock and self.lock != "database" else ""
            return f"shared, {nodes} nodes, {engine}{lock}"
        if nodes == 1:
            return "single node"
        arbiter = "" if self.arbiter == "majority" else f", {self.arbiter}"
        return f"replicated, {nodes} nodes{arbiter}"


REPLICATED = HaSetup()


def add_ha_args(p: argparse.ArgumentParser, *, arbiters: bool = True) -> None:
    """``--mode``, ``--database``, ``--lock``, ``--lease`` and (``arbiters``) ``--arbiter``,
    ``--lockfile``: the HA setup of a group the tool starts."""
    g = p.add_argument_group("two-node groups and shared mode (docs/shared-mode.md)")
    g.add_argument("--mode", choices=("replicated", "shared"), default="replicated",
                   help="replicated (each node its own store; default) or shared (every node on --database, "
                        "the lock holder ACTIVE for every partition)")
    g.add_argument("--database", metavar="URL", help="--mode shared: postgresql+psycopg://USER@HOST:PORT/DB, or "
                                                    "sqlite:///PATH (nodes on this machine)")
    g.add_argument("--lock", metavar="database|file:PATH",
                   help="--mode shared: who holds the lease: a row in the database (default) or a lock file")
    if arbiters:
        g.add_argument("--arbiter", choices=("majority", "lockfile", "witness"), default="majority",
                       help="a replicated pair (--nodes 2): majority (the default; only a designated "
                            "primary goes on alone), lockfile (the holder of --lockfile serves) or witness "
                            "(a witness process is the third vote)")
        g.add_argument("--lockfile", metavar="PATH", help="--arbiter lockfile: the lock file (default "
                                                         "DATA_DIR/tandem.lock)")
    g.add_argument("--lease", type=float, metavar="SECONDS",
                   help="the lock's or lease's length (default: the node's, 1 s); a failover takes about this long")


def ha_setup(args: argparse.Namespace, nodes: int) -> HaSetup:
    """The HA setup the flags of :func:`add_ha_args` ask for, checked against ``nodes``."""
    setup = HaSetup(mode=args.mode, database=args.database, lock=args.lock,
                    arbiter=getattr(args, "arbiter", "majority"), lockfile=getattr(args, "lockfile", None),
                    lease=args.lease)
    setup.check(nodes)
    return setup


def serving_actives(setup: HaSetup, statuses: list[tuple[str, StatusOk]], queue: str,
                    partitions: int | None = None) -> dict[int, str]:
    """partition -> the node serving it, as the live nodes report (partitions without one left
    out).  Shared mode: the one ``ACTIVE`` node for every partition it lists of ``queue``, or
    for ``range(partitions)`` when it lists none; two nodes saying ``ACTIVE``: nobody yet."""
    if setup.shared:
        holders = [(name, st) for name, st in statuses if st.ha_state == "ACTIVE"]
        if len(holders) != 1:
            return {}
        name, st = holders[0]
        listed = {p.partition for p in st.partitions if p.queue == queue}
        parts = listed or set(range(partitions or 0))
        return {p: name for p in sorted(parts)}
    out: dict[int, str] = {}
    for name, st in statuses:
        if setup.arbiter == "lockfile" and st.ha_state not in LOCK_SERVING:
            continue
        for part in st.partitions:
            if part.queue == queue and part.role == "active" and part.active == name:
                out[part.partition] = name
    return out


def reported_setup(statuses: list[tuple[str, StatusOk]]) -> HaSetup:
    """The mode and arbiter a running group's nodes report (enough for :func:`serving_actives`)."""
    for _name, st in statuses:
        if st.mode == "shared":
            return HaSetup(mode="shared", database="(the group's)")
        if st.arbiter in ARBITERS:
            return HaSetup(arbiter=st.arbiter)
    return REPLICATED


def group_ready(setup: HaSetup, statuses: list[tuple[str, StatusOk]]) -> bool:
    """Some node serves clients: shared mode, an ``ACTIVE`` node; the LockFile arbiter, the
    lock holder ``ACTIVE`` (the pair in step: a holder still ``STANDALONE`` may confirm writes
    its peer lacks, and if it died then the peer would rightly wait for it) with an active for
    the queue catalogue; else node quorum and a catalogue active."""
    for _name, st in statuses:
        if setup.shared:
            if st.ha_state == "ACTIVE":
                return True
            continue
        cat = [x for x in st.partitions if x.queue == "" and x.active]
        if setup.arbiter == "lockfile":
            if st.ha_state == "ACTIVE" and cat:
                return True
        elif st.quorum_state != "Disabled" and cat:
            return True
    return False
