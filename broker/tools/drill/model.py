"""A drill's settings and the result of one run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.tools.pair import REPLICATED, HaSetup

SCENARIOS = ("kill-active", "kill-replica", "pause-active", "partition-active", "restart-all", "rolling-restart",
             "slow-disk", "rolling-upgrade")
QUEUE = "drill"
WORKLOADS = ("plain", "transactional")


@dataclass(slots=True)
class DrillConfig:
    scenario: str
    nodes: int = 3
    partitions: int = 6
    producers: int = 2
    consumers: int = 2
    messages: int = 3000  # per run, over all producers
    window: int = 64  # sends in flight per producer
    keys: int = 64
    #: seconds each consumer holds a message before it acks (0: none): a backlog builds
    consume_pause: float = 0.0
    seed: int = 1
    local_sync: str = "SYNC"
    remote_sync: str = "SYNC"
    non_response_timeout: float | None = None  # None: the node default
    timeout: float = 180.0  # per run
    data_dir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    url: str | None = None  # an existing group instead of a spawned one
    inject: str | None = None  # shell command injecting the fault ({node}: the target)
    heal: str | None = None  # shell command healing it
    #: seconds between inject and heal: an existing group's (None: 5), a spawned group's
    #: pause-active and partition-active (None: :attr:`pause`'s default)
    hold: float | None = None
    #: shared mode, or the LockFile / witness arbiter of a pair (a spawned group's)
    ha: HaSetup = REPLICATED
    #: TLS on every link of a spawned group (clients on tandems://, mutual TLS between nodes)
    tls: bool = False
    #: a spawned group's network: "proxy" (this machine's loopback; partition-active cuts through
    #: fault-injecting proxies), "netns" (each node in a network namespace); None: netns for
    #: the families that need it, proxy otherwise
    net: str | None = None
    #: the loss family's share of packets dropped
    loss: float = 0.2
    #: a fault family's run: seconds past every peer being Up again that the drill keeps looking
    #: for a healthy active deposed (None: ``WATCH_FACTOR`` x :attr:`nrt`, broker.tools.drill.healing)
    watch: float | None = None
    #: rolling-upgrade: the older build the group starts on (a git ref of this repository, or a
    #: venv's path: broker.tools.builds), and whether it goes back to it instead of finalizing
    from_ref: str | None = None
    from_venv: str | None = None
    rollback: bool = False
    #: rolling-upgrade: once ``hold_after`` nodes run the new build, hold the group there for
    #: ``upgrade_hold`` seconds under the load (0: no hold)
    hold_after: int = 1
    upgrade_hold: float = 0.0
    #: messages a second over all producers, sent until the fault is over (rolling-upgrade: the
    #: load runs through every step); None: ``messages`` in all, as fast as the window allows
    steady_rate: float | None = None
    #: "plain" (producers and consumers) or "transactional" (consumers that turn each input into
    #: an output in another queue, in transactions: broker.tools.drill.txload)
    workload: str = "plain"

    def node_args(self) -> list[str]:
        args = ["--remote-sync", self.remote_sync, *self.extra_args]
        if self.non_response_timeout is not None:
            args += ["--non-response-timeout", str(self.non_response_timeout),
                      "--keepalive-interval", str(self.non_response_timeout / 4)]
        return args

    @property
    def nrt(self) -> float:
        return self.non_response_timeout or 1.0

    @property
    def pause(self) -> float:
        """How long a fault lasts: ``hold`` if given; against an existing group 5 s; for
        pause-active and partition-active 2 x the failure detection + 1 s, and past twice the
        lease where a lock or lease decides (so the other node can take it over before the
        paused one wakes up)."""
        if self.hold is not None:
            return self.hold
        if self.url is not None:
            return 5.0
        hold = 2 * self.nrt + 1.0
        if self.ha.shared or self.ha.arbiter == "lockfile":
            hold = max(hold, 2 * (self.ha.lease or 1.0) + 1.0)
        return hold


@dataclass(slots=True)
class RunResult:
    run: int
    target: str
    sent: int = 0
    confirmed: int = 0
    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    unexpected: int = 0
    unconfirmed_delivered: int = 0
    reordered: int = 0  # first deliveries out of their producer's order in a partition (checker.reordered)
    failed_sends: int = 0
    reported_lost: int = 0
    unreported_lost: int = 0  # lost messages no messages_lost event covers
    weak: bool = False  # a policy that may lose confirmed messages (NO_SYNC somewhere)
    failover_ms: float = 0.0
    #: from the fault (kill -9, SIGSTOP, cut) to the first confirm on the new active: the
    #: longest pause in confirms that ends after the fault, over the target's partitions
    takeover_ms: float | None = None
    #: the node serving most partitions once the fault was over (the target again: no takeover)
    after: str = ""
    kept: str = ""  # a failed run's directory, its node logs left there
    #: a fault family's run: what it injected (its schedule, one line per step)
    fault: str = ""
    #: from the heal until every node reported every peer Up (None: not measured)
    heal_up_ms: float | None = None
    #: partitions whose active at the heal was on a node the fault never cut and whose active
    #: or term changed after it (a failback to the partition's placed node is not counted)
    deposed: int = 0
    ha_events: list[str] = field(default_factory=list)
    #: a fault family's schedule: what it injected and healed, one line each (replayable)
    schedule: list[str] = field(default_factory=list)
    #: the ranges Tandem reported lost (the SDK's messages_lost events): "producer/partition:first+count"
    lost_ranges: list[str] = field(default_factory=list)
    #: rolling-upgrade: each step, its figures and the upgrade status after it (broker.tools.drill.upgrade)
    steps: list[dict[str, Any]] = field(default_factory=list)
    #: the transactional workload: transactions ended (committed, aborted), the partial ones and
    #: the inputs two committed transactions acked (broker.tools.checker.atomicity), and
    #: transactions whose outcome no answer told
    transactions: int = 0
    tx_committed: int = 0
    tx_aborted: int = 0
    partial: int = 0
    acked_twice: int = 0
    tx_unknown: int = 0
    error: str = ""

    @property
    def passed(self) -> bool:
        """Nothing duplicated, unexpected or reordered, and nothing lost; under weak policies a loss is
        allowed only where Tandem reported it (the lost messages' sequences lie in the
        ranges of the SDK's ConfirmedMessagesLost events).  The transactional workload: no
        transaction partial or of unknown outcome, no input acked by two committed transactions."""
        if self.error or self.duplicated or self.unexpected or self.reordered:
            return False
        if self.partial or self.acked_twice or self.tx_unknown:
            return False
        return self.lost == 0 or (self.weak and self.unreported_lost == 0)

