"""The LockFile arbiter of a two-node replicated group (``arbiter = "lockfile"``): the I/O
around :class:`ha.lockfile.LockArbiter`.

The driver takes and renews the lock (:mod:`broker.arbiters.lockrecord`: a flock guarding a lease
record with an epoch, on a path both nodes reach), watches the peer link, and tells the
replication who may be active:

* **Only the holder serves.**  While this node holds the lock (``STANDALONE``,
  ``ACTIVE_SYNC``, ``ACTIVE``) it keeps node quorum alone (as a designated primary
  does) and is elected for every partition on its own vote
  (:meth:`broker.modes.replicated.Replication.arbitrate`); with its peer in step it commits with
  the peer (nothing it confirmed is lost if it dies), and alone only while the peer is gone
  (``STANDALONE``).  The other node never stands (priority 0).  Every state change
  reconfigures every log at once; a node that loses the lock steps down everywhere.
* **Nothing confirmed without the lease.**  The replication asks :meth:`may_confirm` before
  every proposal and every confirm: it checks the lease on the node's clock, so a holder
  whose lease ran out (a renewal that failed or hung, a process paused by SIGSTOP) refuses
  from that instant, before any other part of it has run, and steps down in the next turn.
* **Epochs on the wire.**  The peer link's handshake (``PeerHello``, ``PeerWelcome``) and
  every ``Heartbeat`` and ``Replicate`` frame on it carry the latest epoch this node has seen; a later one than this node's makes it step
  down at once.  The heartbeat also carries the HA state, and goes out at once on every
  change with the state before it; the peer follows a serving peer (``PASSIVE_SYNC``), and
  is told ``ACTIVE`` once it is in step (``PASSIVE``).
* **In step.**  ``ACTIVE_SYNC -> ACTIVE`` once the peer's match index reaches this node's
  commit index in every log; in ``ACTIVE_SYNC`` commits already wait for the peer, so the
  passive catches up before new writes are confirmed.

File-system errors (the gateway gone, an NFS hiccup) are a lost lock for the holder and a
failed attempt for the waiting node: logged, never a crash.  The file calls run on a
thread of the driver's own, one at a time; one that hangs only delays the next, and the
holder's lease runs out on its own clock meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from broker.config import NodeConfig
from broker.arbiters.lockrecord import LockFile, LockFileError, Record, Taken
from client.clock import Clock
from client.protocol.frames import Frame, Heartbeat, PeerHello, PeerWelcome, Replicate
from ha.errors import IllegalTransition
from ha.lockfile import SERVING, HaState, LockArbiter, StateChanged
from ha.membership import Change, Membership, RemoteState

log = logging.getLogger("tandem.ha")

T = TypeVar("T")
SERVING_NAMES = frozenset(s.value for s in SERVING)


class Arbitrated(Protocol):
    """The replication, as the arbiter steers it (broker.modes.replicated.Replication)."""

    confirm_gate: Callable[[], bool] | None
    lock_role: tuple[bool, bool] | None

    @property
    def gate_refusals(self) -> int: ...

    def arbitrate(self, holder: bool, alone: bool, reason: str) -> None: ...

    def caught_up(self, peer: str) -> bool: ...


class PeerLinkView(Protocol):
    def send(self, frame: Heartbeat) -> None: ...


class PeersView(Protocol):
    """The peer links (broker.peers.peers.PeerManager)."""

    arbiter: Any
    epoch: int

    @property
    def links(self) -> Mapping[str, PeerLinkView]: ...

    @property
    def membership(self) -> Membership: ...

    def report(self, changes: list[Change]) -> None: ...


class LockFileDriver:
    """One node's LockFile arbiter: drives :class:`LockArbiter` with the node's clock, and
    reports as :class:`broker.sessions.status.HaReport` (``Node.ha``)."""

    def __init__(self, config: NodeConfig, clock: Clock, replication: Arbitrated, peers: PeersView) -> None:
        if config.lockfile is None:
            raise ValueError("the LockFile arbiter needs a lockfile path")
        others = list(config.peer_addresses())
        if len(others) != 1:
            raise ValueError("the LockFile arbiter needs exactly one peer")
        self.me = config.name
        self.peer = others[0]
        self.lease = config.lease
        self.clock = clock
        self.arbiter = LockArbiter(self.me, lease=config.lease)
        self._warned_alone = -1  # the epoch of the last record we refused because its holder went alone
        self.file = LockFile(config.lockfile, self.me, lease=config.lease, flock_timeout=min(config.lease / 4, 1.0))
        self.replication = replication
        self.peers = peers
        self.renewals = 0  # lock renewals written since start
        self.changes = 0  # HA state changes since start
        self._refused = 0  # frames refused for a stale epoch
        self.lock_holder: str | None = None
        self.peer_state = ""  # the peer's HA state as it last said
        self._previous = ""  # this node's state before its last change
        self._op: asyncio.Future[Any] | None = None  # the file call in flight
        self._next_file_at = 0.0
        self._seen: tuple[tuple[str | None, int, int], float] | None = None  # record key, first seen (monotonic)
        self._last_error = ""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tandem-lockfile-{self.me}")
        self._stopped = False
        # Until the arbiter says otherwise, this node stands for nothing and confirms nothing.
        replication.lock_role = (False, False)
        replication.confirm_gate = self.may_confirm
        peers.arbiter = self

    # -- HaReport -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self.arbiter.state.value

    @property
    def states(self) -> list[str]:
        return [s.value for s in HaState]

    @property
    def epoch(self) -> int:
        return self.arbiter.seen_epoch

    @property
    def fencing_refusals(self) -> int:
        return self._refused + self.replication.gate_refusals

    # -- what the replication and the peer links ask -------------------------------------------

    def may_confirm(self) -> bool:
        """May this node propose or confirm a write now?  Ticks the arbiter first: a lease
        that ran out (a paused process waking up) closes the gate before anything else."""
        now = self.clock.monotonic()
        if self.arbiter.serving(now):
            return True
        if self.arbiter.state in SERVING and not self._stopped:
            # the lease ran out: step down in a turn of its own (the caller is in the middle
            # of the replication's work, which the step-down reconfigures)
            asyncio.get_running_loop().call_soon(self.step)
        return False

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(epoch=self.arbiter.seen_epoch, ha_state=self.arbiter.state.value,
                         ha_previous=self._previous)

    def heard(self, src: str, frame: Frame) -> None:
        """A frame from the peer: its epoch first (it may fence this node), then its state."""
        if src != self.peer:
            return
        if isinstance(frame, (PeerHello, PeerWelcome)):  # a link (re)opens: its epoch first
            if frame.epoch > self.arbiter.seen_epoch:
                self._observe(frame.epoch)
            return
        if isinstance(frame, Replicate):
            if frame.epoch > self.arbiter.seen_epoch:
                self._observe(frame.epoch)
            elif 0 < frame.epoch < self.arbiter.epoch and self.arbiter.state in SERVING:
                self._refused += 1  # a stale holder's appends: its terms are refused as well
            return
        if not isinstance(frame, Heartbeat) or not frame.ha_state:
            return
        if frame.epoch > self.arbiter.seen_epoch:
            self._observe(frame.epoch)
        self._sync_peer_link()
        if frame.ha_state != self.peer_state:
            log.info("peer %s: HA state %s -> %s epoch %d", src, frame.ha_previous or self.peer_state or "?",
                     frame.ha_state, frame.epoch)
            self.peer_state = frame.ha_state
        mine = self.arbiter.state
        try:
            if frame.ha_state in SERVING_NAMES:
                if mine in SERVING:
                    if frame.epoch < self.arbiter.epoch:
                        self._refused += 1  # a stale holder: our later epoch fences it
                    return
                if mine in (HaState.WAITING, HaState.PASSIVE_SYNC, HaState.PASSIVE) and self.arbiter.peer_up:
                    self.lock_holder = src
                    self._apply(self.arbiter.peer_serving(frame.epoch))
                    if frame.ha_state == HaState.ACTIVE.value and self.arbiter.state is HaState.PASSIVE_SYNC:
                        self._apply(self.arbiter.synced())
            elif mine in (HaState.PASSIVE_SYNC, HaState.PASSIVE):
                self._apply(self.arbiter.peer_idle(f"peer {src} is {frame.ha_state}"))
        except IllegalTransition as exc:
            log.error("LockFile arbiter: peer %s says %s epoch %d while this node is %s epoch %d: %s",
                      src, frame.ha_state, frame.epoch, mine.value, self.arbiter.epoch, exc)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Tick, watch the peer link, renew or try the lock; until cancelled."""
        interval = min(self.lease / 8, 0.05)
        log.info("LockFile arbiter started node=%s peer=%s lockfile=%s lease=%.2fs", self.me, self.peer,
                 self.file.path, self.lease)
        while True:
            self.step()
            await self.clock.sleep(interval)

    def step(self) -> None:
        now = self.clock.monotonic()
        self._apply(self.arbiter.tick(now))
        self._sync_peer_link()
        if self.arbiter.state is HaState.ACTIVE_SYNC and self.replication.caught_up(self.peer):
            self._apply(self.arbiter.synced())
        if self._op is None and now >= self._next_file_at and not self._stopped:
            self._next_file_at = now + self.lease / 4
            self._start_file_call(now)

    async def stop(self) -> None:
        """A clean stop: release the lock (the peer may take it at once), then DEAD."""
        if self._stopped:
            return
        self._stopped = True
        op, self._op = self._op, None
        if op is not None:  # its result is not wanted now (finished() drops it): ended here, not left running
            op.cancel()
            await asyncio.gather(op, return_exceptions=True)
        held = self.arbiter.state in SERVING
        epoch = self.arbiter.epoch
        if self.arbiter.state is not HaState.DEAD:
            self._apply(self.arbiter.stop())
        if held:
            try:
                async with self.clock.timeout(self.lease):
                    released = await self._call(self.file.release, epoch)
                log.info("LockFile released node=%s epoch=%d%s", self.me, epoch, "" if released else
                         " (not released: the record no longer names this node, or this node confirmed "
                         "writes alone and keeps it until it is back)")
            except (LockFileError, TimeoutError) as exc:
                log.warning("LockFile not released node=%s epoch=%d: %s (the peer takes over once the lease "
                            "runs out)", self.me, epoch, exc)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the file ---------------------------------------------------------------------------------

    def _start_file_call(self, now: float) -> None:
        a = self.arbiter
        if a.state in SERVING:
            # alone until the peer is in step again: in ACTIVE_SYNC it still lacks what was
            # confirmed without it (the record then keeps the other from taking over)
            epoch, alone = a.epoch, a.state in (HaState.STANDALONE, HaState.ACTIVE_SYNC)
            self._launch(self._call(self.file.renew, epoch, alone=alone),
                         lambda res: self._renewed(epoch, now, res))
        elif a.wants_lock:
            stale = self._seen[0] if self._seen is not None and now - self._seen[1] > self.lease else None
            self._launch(self._call(self.file.try_take, stale), lambda res: self._took(now, res))
        elif a.state is not HaState.DEAD:
            self._launch(self._call(self.file.read), self._read)

    def _launch(self, coro: Any, done: Callable[[Any], None]) -> None:
        """Run the file call ``coro`` as the one in flight (``_op``, ended by :meth:`stop`);
        ``done`` gets its result, or the exception it raised."""
        fut = asyncio.ensure_future(coro)
        self._op = fut

        def finished(f: asyncio.Future[Any]) -> None:
            self._op = None
            if f.cancelled() or self._stopped:
                return
            exc = f.exception()
            try:
                done(exc if exc is not None else f.result())
            except Exception:  # a bug here must not stop the arbiter's loop: it is logged
                log.exception("LockFile arbiter: handling a file call's result failed")

        fut.add_done_callback(finished)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _failed(self, what: str, exc: BaseException) -> None:
        text = f"{what}: {exc}"
        if text != self._last_error:  # (said once while the same error repeats)
            self._last_error = text
            log.warning("LockFile %s", text)

    def _renewed(self, epoch: int, started: float, res: Record | BaseException) -> None:
        a = self.arbiter
        if isinstance(res, BaseException):
            self._failed(f"renewal failed node={self.me} epoch={epoch}", res)
            if a.state in SERVING and a.epoch == epoch:
                self._apply(a.lock_lost(f"renewal failed: {res}"))
            return
        self._last_error = ""
        self._see(res)
        if a.state in SERVING and a.epoch == epoch:
            a.renewed(started)  # the lease runs from the renewal's start, not its end
            self.renewals += 1

    def _took(self, started: float, res: Taken | BaseException) -> None:
        a = self.arbiter
        if isinstance(res, BaseException):
            self._failed(f"cannot try the lock node={self.me}", res)
            return
        self._last_error = ""
        self._see(res.record)
        if not res.taken:
            rec = res.record
            if rec.alone and rec.holder not in (None, self.me) and self._warned_alone != rec.epoch:
                self._warned_alone = rec.epoch
                log.error("LockFile: %s confirmed writes alone under epoch %d (its peer was gone), which %s may "
                          "not have: %s does not take the lock over, so nothing confirmed is lost. Start %s "
                          "again; or, to serve without those writes, remove %s while no node runs", rec.holder,
                          rec.epoch, self.me, self.me, rec.holder, self.file.record_path)
            return
        prev = res.previous
        if a.state is not HaState.WAITING:
            # the peer said it serves while this call ran: give the lock back (its lease had
            # run out, so it stops by itself; the next round settles who holds it)
            log.warning("LockFile taken with epoch %d while %s: released again", res.record.epoch, a.state.value)
            self._launch(self._call(self.file.release, res.record.epoch), lambda _res: None)
            return
        try:
            changes = a.lock_acquired(res.record.epoch, started)
        except IllegalTransition as exc:
            log.error("LockFile taken with epoch %d, but epoch %d was seen: not serving (%s)", res.record.epoch,
                      a.seen_epoch, exc)
            return
        self.lock_holder = self.me
        if prev.holder not in (None, self.me):
            log.warning("LockFile taken over from %s (epoch %d, its lease ran out %.2fs ago on the gateway's "
                        "clock)", prev.holder, prev.epoch, (prev.age or 0.0) - self.lease)
        self._apply(changes)

    def _read(self, res: Record | BaseException) -> None:
        if isinstance(res, BaseException):
            self._failed(f"cannot read the lock record node={self.me}", res)
            return
        self._last_error = ""
        self._see(res)

    def _see(self, rec: Record) -> None:
        """Track how long the record has stayed the same, on this node's clock (from when this
        call came back: the record was written before that)."""
        if self._seen is None or self._seen[0] != rec.key:
            self._seen = (rec.key, self.clock.monotonic())
        if self.arbiter.state not in SERVING:
            self.lock_holder = rec.holder

    # -- state changes ---------------------------------------------------------------------------

    def _observe(self, epoch: int) -> None:
        self._apply(self.arbiter.observe_epoch(epoch))

    def _sync_peer_link(self) -> None:
        m = self.peers.membership
        up = self.peer in self.peers.links and m.state(self.peer) is RemoteState.UP
        if up and not self.arbiter.peer_up:
            self._apply(self.arbiter.peer_connected())
        elif not up and self.arbiter.peer_up:
            self.peer_state = ""
            self._apply(self.arbiter.peer_lost("peer link lost"))

    def _apply(self, changes: list[StateChanged]) -> None:
        for c in changes:
            self.changes += 1
            self._previous = c.previous.value
            log.warning("HA state %s -> %s (%s) epoch %d", c.previous.value, c.present.value, c.reason,
                        self.arbiter.seen_epoch)
            serving = c.present in SERVING
            if serving:
                self.lock_holder = self.me
            elif c.previous in SERVING:
                self.lock_holder = None
            if serving != (c.previous in SERVING):
                # node quorum: the holder goes on alone, as a designated primary does
                self.peers.report(self.peers.membership.set_designated_primary(serving))
            self.replication.arbitrate(serving, c.present is HaState.STANDALONE,
                                       f"LockFile {c.previous.value} -> {c.present.value}: {c.reason}")
            if c.present is HaState.ACTIVE:
                self._next_file_at = 0.0  # renew now: the record stops saying "alone" at once
        self.peers.epoch = self.arbiter.seen_epoch
        if changes:
            beat = self.heartbeat()
            for link in list(self.peers.links.values()):
                link.send(beat)
