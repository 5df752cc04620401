"""The witness: the data-less third voter of a two-node replicated group (``tandem witness start``).

With ``arbiter = "witness"`` and ``witness = "w1=HOST:PORT"`` in both data nodes' settings,
the witness is a member of the group's peer links (handshake, keep-alives: the nodes count
its vote in the node quorum and show it in ``tandem status``) and a voter of every
partition's log and of the catalogue's.  It is never active and never a data replica:

* it keeps, per log, the term and its vote, the commit index, and the positions
  (index, term, origin, weak) of the entries it was shown, never their data; entries up
  to its commit index are folded into one snapshot position.  The positions are what
  lets it judge a candidate's recency: a vote goes only to a data node whose log is at
  least as recent as what the witness acknowledged (:mod:`ha.elections`);
* the active counts its acknowledgement toward a commit only while the other data node
  is silent or behind (:meth:`ha.replica.Replica.witness_counts`), so while both data
  nodes answer every commit is on both;
* everything is on disk (SQLite, ``synchronous = FULL``) before it answers: a vote, a
  term, an acknowledged position.  Messages are taken in batches, one transaction and
  one fsync per batch, then the answers go out;
* each log's row and each entry position carry a CRC-32 of their values (``hard.crc``;
  ``entry_sums`` beside ``entries``, whose layout an older build writes by position),
  checked at start: a witness whose term, vote or acknowledged positions took damage at rest
  does not start, naming the row.  A trigger clears a row's checksum when a writer changes
  the row without one (an older build, after a rollback): that row is then read unchecked
  until it is written again.

Losing the witness's data directory while a data node is down can lose confirmed
messages (a wiped witness votes for a stale node): replace a witness only while both
data nodes are up.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import random
import sqlite3
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.config import ConfigError, NodeConfig, parse_peer
from broker.security import tls
from broker.peers.links import Link
from broker.peers.peers import PeerManager
from broker.messaging.queues import Queue
from broker.security.secret import group_secret
from broker.peers.codec import (
    CATALOGUE,
    Key,
    MalformedReplicationError,
    UnknownMessageKind,
    decode_message,
    decode_replicate,
    encode_message,
    encode_replicate,
)
from client.clock import Clock, SystemClock
from storage.sqlite.rowsums import DamagedRow, row_crc
from client.errors import UnavailableError
from client.protocol.frames import Replicate
from ha.messages import EntriesDiscarded, Entry, Envelope, Ready
from ha.replica import Replica, ReplicaConfig

log = logging.getLogger("tandem.ha.witness")

#: a log's positions up to its commit index are folded into its snapshot position once
#: this many have piled up
COMPACT_EVERY = 256
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hard (qid INTEGER, part INTEGER, term INTEGER NOT NULL, voted_for TEXT,
    commit_index INTEGER NOT NULL, snap_index INTEGER NOT NULL DEFAULT 0, snap_term INTEGER NOT NULL DEFAULT 0,
    snap_origin TEXT NOT NULL DEFAULT '', PRIMARY KEY (qid, part));
CREATE TABLE IF NOT EXISTS entries (qid INTEGER, part INTEGER, idx INTEGER, term INTEGER NOT NULL,
    origin TEXT NOT NULL, weak INTEGER NOT NULL, PRIMARY KEY (qid, part, idx));
CREATE TABLE IF NOT EXISTS entry_sums (qid INTEGER, part INTEGER, idx INTEGER, crc INTEGER NOT NULL,
    PRIMARY KEY (qid, part, idx));
"""
#: the checksums (broker.arbiters.witness's docstring): a change a writer makes without them
#: (a build older than the checksums, say, after a rollback) leaves its row unchecked
CHECKSUMS = """
CREATE TRIGGER IF NOT EXISTS hard_unsummed AFTER UPDATE OF term, voted_for, commit_index, snap_index, snap_term,
    snap_origin ON hard BEGIN UPDATE hard SET crc = NULL WHERE qid = NEW.qid AND part = NEW.part; END;
CREATE TRIGGER IF NOT EXISTS entry_unsummed AFTER INSERT ON entries BEGIN
    DELETE FROM entry_sums WHERE qid = NEW.qid AND part = NEW.part AND idx = NEW.idx; END;
CREATE TRIGGER IF NOT EXISTS entry_gone AFTER DELETE ON entries BEGIN
    DELETE FROM entry_sums WHERE qid = OLD.qid AND part = OLD.part AND idx = OLD.idx; END;
"""
_HARD = "qid, part, term, voted_for, commit_index, snap_index, snap_term, snap_origin"


@dataclass(frozen=True, kw_only=True, slots=True)
class WitnessConfig:
    name: str
    peer_port: int
    peers: tuple[str, ...]  # "name=host:port" of the two data nodes
    host: str = "127.0.0.1"
    data_dir: Path = Path(".tandem/witness")
    keepalive_interval: float = 0.25
    non_response_timeout: float = 1.0
    #: TLS on its peer links, as the data nodes' settings of the same names (broker/security/tls.py)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    peer_tls: str = "auto"
    #: the group secret the data nodes hold (cluster_secret_file): the witness proves it on each link
    cluster_secret_file: Path | None = None

    def __post_init__(self) -> None:
        names = [parse_peer(p)[0] for p in self.peers]
        if len(names) != 2 or len(set(names)) != 2:
            raise ConfigError(f"peers: a witness serves a two-node group: give its two data nodes as "
                              f"name=host:port,name=host:port (got {len(names)})")
        if self.name in names:
            raise ConfigError(f"name {self.name!r}: also the name of a data node in peers")
        self.node_config()  # the name, ports and timeouts, checked as a node's are

    def node_config(self) -> NodeConfig:
        """The settings the peer links read (a node's, with priority 0: it is never active)."""
        return NodeConfig(name=self.name, host=self.host, port=0, peer_port=self.peer_port, peers=self.peers,
                          data_dir=self.data_dir, priority=0, keepalive_interval=self.keepalive_interval,
                          non_response_timeout=self.non_response_timeout, tls_cert=self.tls_cert,
                          tls_key=self.tls_key, tls_ca=self.tls_ca, peer_tls=self.peer_tls,
                          cluster_secret_file=self.cluster_secret_file)


@dataclass
class _Saved:
    term: int = 0
    voted_for: str | None = None
    commit: int = 0
    snapshot: tuple[int, int, str] = (0, 0, "")
    entries: list[Entry] = field(default_factory=list)


def _rows(db: sqlite3.Connection) -> Iterator[tuple[str, tuple[Any, ...], int | None]]:
    """Each log's row, then each entry position in order: (table, values, checksum or None)."""
    for row in db.execute(f"SELECT {_HARD}, crc FROM hard"):
        yield "hard", tuple(row[:-1]), row[-1]
    for row in db.execute("SELECT e.qid, e.part, e.idx, e.term, e.origin, e.weak, s.crc FROM entries e LEFT JOIN "
                          "entry_sums s ON s.qid = e.qid AND s.part = e.part AND s.idx = e.idx "
                          "ORDER BY e.qid, e.part, e.idx"):
        yield "entries", tuple(row[:-1]), row[-1]


def _damage(table: str, values: tuple[Any, ...], crc: int | None) -> str | None:
    """What is wrong with a row that fails its checksum (None: it passes, or has none)."""
    if crc is None or row_crc(*values) == crc:
        return None
    what = "term, vote and commit index" if table == "hard" else f"position of entry {values[2]}"
    return f"the {what} of log {values[0]}/{values[1]} (table {table}) fails its checksum: damaged at rest"


def scrub(path: Path) -> tuple[int, int, list[str]]:
    """``tandem scrub`` of a witness's store, read-only (the witness may be running): the rows
    that passed their checksums, those written without one, and each damaged one, named."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        passed, unchecked, damage = 0, 0, []
        if "crc" not in [r[1] for r in db.execute("PRAGMA table_info(hard)")]:  # (no write since the checksums)
            return 0, sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("hard", "entries")), []
        for table, row, crc in _rows(db):
            found = _damage(table, row, crc)
            if found is not None:
                damage.append(f"{path}: {found}")
            elif crc is None:
                unchecked += 1
            else:
                passed += 1
        return passed, unchecked, damage
    finally:
        db.close()


class WitnessStore:
    """Terms, votes and entry positions, per log, in one SQLite file (``witness.db``);
    every :meth:`write` is one transaction, fsynced before it returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one witness per data dir: two would each vote once per term, together twice
        self._lock = open(path.with_suffix(".lock"), "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ConfigError(f"data dir {path.parent}: another witness is running on it") from None
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.executescript(SCHEMA)
        if "crc" not in [row[1] for row in self._db.execute("PRAGMA table_info(hard)")]:
            self._db.execute("ALTER TABLE hard ADD COLUMN crc INTEGER")
        self._db.executescript(CHECKSUMS)
        self.path = path

    def stamp(self, fresh: str) -> str:
        """This witness's store stamp (``fresh`` on first use): peers refuse a copy of it."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'store_stamp'").fetchone()
        if row is not None:
            return str(row[0])
        self._db.execute("INSERT INTO meta VALUES ('store_stamp', ?)", (fresh,))
        return fresh

    def load(self) -> dict[Key, _Saved]:
        """Every log's saved state; DamagedRow (naming the file and the row) if a row fails its
        checksum: a witness unsure of its vote or of what it acknowledged could vote twice in a
        term or for a stale node, so it does not start on it."""
        out: dict[Key, _Saved] = {}
        for table, row, crc in _rows(self._db):
            damage = _damage(table, row, crc)
            if damage is not None:
                raise DamagedRow(f"witness store {self.path}: {damage}. This witness does not start: a witness unsure "
                                 f"of its votes could help elect a stale node. Replace it on an empty data directory "
                                 f"while both data nodes are up (docs/witness.md)")
            if table == "hard":
                qid, part, term, voted, commit, si, st, so = row
                out[(qid, part)] = _Saved(term, voted, commit, (si, st, so))
            else:
                qid, part, idx, term, origin, weak = row
                saved = out.setdefault((qid, part), _Saved())
                if idx > saved.snapshot[0]:
                    saved.entries.append(Entry(term, idx, None, origin, bool(weak)))
        return out

    def write(self, ops: list[tuple[Any, ...]]) -> None:
        db = self._db
        touched: set[Key] = set()
        db.execute("BEGIN")
        try:
            for op in ops:
                kind, (qid, part) = op[0], op[1]
                if kind == "hard":
                    db.execute("INSERT INTO hard (qid, part, term, voted_for, commit_index) VALUES (?, ?, ?, ?, ?) "
                               "ON CONFLICT (qid, part) DO UPDATE SET term = excluded.term, "
                               "voted_for = excluded.voted_for, commit_index = excluded.commit_index",
                               (qid, part, op[2], op[3], op[4]))
                elif kind == "truncate":
                    db.execute("DELETE FROM entries WHERE qid = ? AND part = ? AND idx >= ?", (qid, part, op[2]))
                elif kind == "snapshot":
                    db.execute("INSERT INTO hard (qid, part, term, commit_index) VALUES (?, ?, 0, 0) "
                               "ON CONFLICT (qid, part) DO NOTHING", (qid, part))
                    db.execute("UPDATE hard SET snap_index = ?, snap_term = ?, snap_origin = ?, "
                               "commit_index = MAX(commit_index, ?) WHERE qid = ? AND part = ?",
                               (op[2], op[3], op[4], op[2], qid, part))
                    db.execute("DELETE FROM entries WHERE qid = ? AND part = ? AND idx <= ?", (qid, part, op[2]))
                elif kind == "append":
                    rows = [(qid, part, e.index, e.term, e.origin, int(e.weak)) for e in op[2]]
                    db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)", rows)
                    db.executemany("INSERT OR REPLACE INTO entry_sums VALUES (?, ?, ?, ?)",
                                   [(*r[:3], row_crc(*r)) for r in rows])
                if kind in ("hard", "snapshot"):
                    touched.add((qid, part))
            for qid, part in touched:  # (each row as it now stands, written whole or in part above)
                row = db.execute(f"SELECT {_HARD} FROM hard WHERE qid = ? AND part = ?", (qid, part)).fetchone()
                if row is not None:
                    db.execute("UPDATE hard SET crc = ? WHERE qid = ? AND part = ?", (row_crc(*row), qid, part))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
        self._lock.close()


class _NoDelivery:
    def schedule(self, q: Queue) -> None:
        pass  # a witness has no queues


class Witness:
    """The witness process: the peer links (:class:`broker.peers.peers.PeerManager`, as a node's)
    and one :class:`ha.replica.Replica` per log, created when the first message of that
    log arrives."""

    def __init__(self, wcfg: WitnessConfig, *, clock: Clock | None = None) -> None:
        self.wconfig = wcfg
        self.config = wcfg.node_config()
        self.clock: Clock = clock or SystemClock()
        self.store_stamp = ""
        self.peers: PeerManager | None = None
        self.logs: dict[Key, Replica] = {}
        self._voters = tuple(sorted(parse_peer(p)[0] for p in wcfg.peers)) + (wcfg.name,)
        self._store: WitnessStore | None = None
        self._saved: dict[Key, _Saved] = {}
        self._pending: deque[tuple[str, bytes]] = deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._writing: asyncio.Future[None] | None = None  # the store write in flight (on a thread)
        self._unknown_kinds: set[tuple[str, str]] = set()
        self._votes: dict[Key, tuple[int, str]] = {}  # the vote last logged, per log
        self._delivery = _NoDelivery()
        #: set when the witness cannot go on (its store failed): the process exits
        self.failed = asyncio.Event()

    # -- what the peer links need (broker.peers.host.PeerHost) -----------------------------------------

    @property
    def receiver(self) -> Witness:
        return self

    @property
    def client_address(self) -> str:
        return ""  # no clients

    @property
    def queues(self) -> dict[str, Queue]:
        return {}

    @property
    def delivery(self) -> _NoDelivery:
        return self._delivery

    def served(self) -> list[tuple[tuple[int, int], int]]:
        return []  # it serves nothing

    def holds(self, key: tuple[int, int]) -> bool:
        return False

    def map_changed(self) -> None:
        pass  # no client sessions

    def quorum_changed(self) -> None:
        pass  # (nothing on a witness waits for an active)

    def ha_disabled_changed(self) -> None:
        pass  # (a witness is in no availability zone: it holds no partition)

    async def handle_forward(self, link: Link, kind: int, payload: bytes) -> bytes:
        raise UnavailableError(f"{self.config.name} is a witness: it serves no requests")

    def link_lost(self, link: Link) -> None:
        pass  # nothing is bound to a witness's links

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        secret = await asyncio.to_thread(group_secret, self.config)  # a witness is a member: it needs one
        path = self.config.data_dir / "witness.db"
        await asyncio.to_thread(tls.check, self.config)  # a bad certificate or key stops the start, named
        try:
            self._store = await asyncio.to_thread(WitnessStore, path)
            self.store_stamp = self._store.stamp(f"witness-{int(self.clock.time() * 1000):x}-"
                                                 f"{random.getrandbits(32):08x}")
            self._saved = await asyncio.to_thread(self._store.load)
        except (sqlite3.Error, OSError) as exc:
            raise ConfigError(f"data dir {self.config.data_dir}: cannot open the witness's store {path}: "
                              f"{exc}") from None
        except DamagedRow as exc:
            raise ConfigError(exc.message) from None
        self.peers = PeerManager(self, secret=secret, places=False)
        await self.peers.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.peers.run(), name="tandem-witness-peers"),
                       loop.create_task(self._work(), name="tandem-witness-votes")]
        log.info("witness started name=%s peer_address=%s:%d data_nodes=%s logs=%d store=%s", self.config.name,
                 *(self.peers.address or ("?", 0)), ",".join(self._voters[:-1]), len(self._saved), path)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self.peers is not None:
            await self.peers.stop()
        if self._writing is not None:
            try:
                await self._writing
            except (sqlite3.Error, OSError) as exc:
                # its answers never went out: no data node counts on what it did not write
                log.error("witness %s: writing its votes failed while stopping: %s", self.config.name, exc)
        if self._store is not None:
            self._store.close()
        log.info("witness %s stopped", self.config.name)

    # -- messages ----------------------------------------------------------------------------------

    def receive(self, src: str, payload: bytes) -> None:
        """A Replicate frame from data node ``src``: taken in the next batch."""
        self._pending.append((src, payload))
        self._wake.set()

    def _replica(self, key: Key) -> Replica:
        r = self.logs.get(key)
        if r is None:
            s = self._saved.pop(key, None) or _Saved()
            cfg = ReplicaConfig(node=self.config.name, voters=self._voters, witnesses=(self.config.name,),
                                election_timeout=self.config.non_response_timeout,
                                heartbeat_interval=self.config.keepalive_interval)
            r = Replica(cfg, rng=random.Random(), now=self.clock.monotonic(), term=s.term, voted_for=s.voted_for,
                        log=s.entries, commit=s.commit, snapshot=s.snapshot)
            self.logs[key] = r
        return r

    async def _work(self) -> None:
        try:
            await self._answer()
        except (sqlite3.Error, OSError) as exc:
            # Unanswered, the data nodes count this witness as silent: better gone than mute.
            log.critical("witness %s: writing its votes failed (%s): it stops answering and exits",
                         self.config.name, exc)
            self.failed.set()

    async def _answer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, deque()
            ops: list[tuple[Any, ...]] = []
            out: dict[str, list[list[Any]]] = {}
            now = self.clock.monotonic()
            for src, payload in batch:
                for key, msg in self._decode(src, payload):
                    r = self._replica(key)
                    if now - r.now > 0.01:
                        r.tick(now)
                    self._carry_out(key, r, r.step(Envelope(src, self.config.name, msg)), ops, out)
            if ops and self._store is not None:
                # on disk before any answer goes; shielded: a stop waits for it (stop()) rather
                # than close the store under the thread still writing
                self._writing = asyncio.ensure_future(asyncio.to_thread(self._store.write, ops))
                await asyncio.shield(self._writing)
                self._writing = None
            peers = self.peers
            for dst, items in out.items():
                link = peers.links.get(dst) if peers is not None else None
                if link is not None:
                    link.send(Replicate(payload=encode_replicate(items)))

    def _decode(self, src: str, payload: bytes) -> list[tuple[Key, Any]]:
        msgs: list[tuple[Key, Any]] = []
        try:
            items = decode_replicate(payload)
        except MalformedReplicationError as exc:
            log.warning("bad replication frame from %s dropped: %s", src, exc.message)
            return msgs
        for qid, p, raw in items:
            try:
                msgs.append(((qid, p), decode_message(raw)))
            except UnknownMessageKind as exc:
                if (src, repr(exc.kind)) not in self._unknown_kinds:
                    self._unknown_kinds.add((src, repr(exc.kind)))
                    log.warning("%s sends replication messages of kind %r, which this build does not know: "
                                "dropped, and not logged again", src, exc.kind)
            except MalformedReplicationError as exc:
                log.warning("bad replication message from %s for %d/%d dropped: %s", src, qid, p, exc.message)
        return msgs

    def _carry_out(self, key: Key, r: Replica, ready: Ready, ops: list[tuple[Any, ...]],
                   out: dict[str, list[list[Any]]]) -> None:
        if ready.truncate_from is not None:
            ops.append(("truncate", key, ready.truncate_from))
        if ready.snapshot is not None:
            m = ready.snapshot
            ops.append(("snapshot", key, m.index, m.last_term, m.last_origin))
        if ready.append:
            ops.append(("append", key, list(ready.append)))
        if ready.hard_state is not None:
            ops.append(("hard", key, ready.hard_state.term, ready.hard_state.voted_for, ready.hard_state.commit))
        if r.applied - r.snap_index >= COMPACT_EVERY:
            r.compact(r.applied)
            ops.append(("snapshot", key, r.snap_index, r.snap_term, r.snap_origin))
        hs = ready.hard_state
        if hs is not None and hs.voted_for is not None and self._votes.get(key) != (hs.term, hs.voted_for):
            self._votes[key] = (hs.term, hs.voted_for)
            log.info("log %s: vote for %s in term %d", _name(key), hs.voted_for, hs.term)
        for ev in ready.events:
            if isinstance(ev, EntriesDiscarded):
                log.info("log %s: %d entry positions from index %d dropped in term %d (never committed)",
                         _name(key), ev.count, ev.first_index, ev.term)
        for env in ready.messages:
            out.setdefault(env.dst, []).append([key[0], key[1], encode_message(env.msg)])


def _name(key: Key) -> str:
    return "catalogue" if key == CATALOGUE else f"{key[0]}/{key[1]}"
