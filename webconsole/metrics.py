"""Prometheus metrics of a node, at ``/metrics`` (prometheus-client).

Read from the node's own state at scrape time (a custom collector on a registry
of the node's own), except two things only the moment can tell: commit latency,
observed by the store's writer thread into a histogram, and the counters the
node keeps as it goes (confirms, elections, HA-1014, the HA arbiter's renewals,
fencing refusals and state changes, peer links refused as intruders, the disk alarm's refusals).  Per node and per partition the node is
active for; scrape every node for the group.

Under shared mode or the LockFile arbiter (``node.ha``), ``tandem_ha_state`` has
one series per state of the mode, 1 for the current one, 0 for the others; none
under majority elections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.config import NodeConfig
from broker.security.auth import ClientGuard
from broker.sessions.status import DiskAlarmView, HaReport, partition_depth
from ha.membership import QuorumState
from storage.segments import SegmentLog
from webconsole.nodeview import NODE, NodeView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class NodeCollector(Collector):
    def __init__(self, view: NodeView) -> None:
        self.view = view

    def collect(self) -> Iterator[Any]:
        report, state, meters = self.view.report, self.view.state, self.view.meters
        name = report.config.name
        yield _gauge("tandem_connections", "client connections open", [("node", name)], len(state.sessions))
        yield _counter("tandem_publish_confirms", "messages confirmed to publishers (duplicates included)",
                       [("node", name)], meters.confirms)
        yield from _limit_metrics(name, self.view.guard)
        yield from _disk_metrics(name, report.disk_alarm)
        mem = meters.memory
        yield _gauge("tandem_memory_limit_bytes", "max_memory: bytes of ready messages the node may hold in "
                     "memory (0: no bound)", [("node", name)], mem.limit)
        yield _gauge("tandem_memory_held_bytes", "bytes of ready messages held in memory (bodies, headers and "
                     "an estimate of each message's object)", [("node", name)], mem.held)
        yield _gauge("tandem_messages_cold", "ready messages kept in the store only (past max_memory), read "
                     "back as they are delivered", [("node", name)], mem.cold)
        yield _gauge("tandem_cold_bytes", "bytes of the cold messages' bodies and headers, about",
                     [("node", name)], mem.cold_bytes)
        qs = sorted(state.queues.items())
        for metric, help_, attr in (("tandem_messages_published", "messages stored as active", "published"),
                                    ("tandem_messages_delivered", "deliveries made", "delivered"),
                                    ("tandem_messages_acked", "messages acked", "acked")):
            fam = CounterMetricFamily(metric, help_, labels=["node", "queue"])
            for qname, q in qs:
                fam.add_metric([name, qname], getattr(q, attr))
            yield fam
        depth = GaugeMetricFamily("tandem_partition_depth", "ready + unacked messages of a partition active here",
                                  labels=["node", "queue", "partition"])
        ready = GaugeMetricFamily("tandem_partition_ready", "ready messages of a partition active here",
                                  labels=["node", "queue", "partition"])
        for qname, q in qs:
            for p in range(q.meta.partitions):
                if state.serves(q, p):
                    depth.add_metric([name, qname, str(p)], partition_depth(state, q, p))
                    part = q.partitions[p]
                    ready.add_metric([name, qname, str(p)], len(part.ready) + part.cold_count)
        yield depth
        yield ready
        seglog = getattr(meters.engine, "log", None)
        if isinstance(seglog, SegmentLog):  # the replication log's files (storage/segments.py)
            yield _gauge("tandem_log_segments", "files of the replication log on disk", [("node", name)],
                         seglog.segments)
            yield _gauge("tandem_log_bytes", "bytes in the replication log's files", [("node", name)], seglog.size())
            yield _counter("tandem_log_segments_deleted", "replication log files deleted, all compacted",
                           [("node", name)], seglog.deleted_segments)
        ha, peers = report.ha, report.peers
        if ha is not None:
            yield from _ha_metrics(report.config, ha)
        if peers is not None:
            intruders = CounterMetricFamily("tandem_intruders", "peer links refused as intruders (failed "
                                            "authentication, not permitted), by reason", labels=["node", "reason"])
            for reason, count in sorted(peers.intruder_counts.items()):
                intruders.add_metric([name, reason], count)
            yield intruders
        rep = report.replication
        if rep is None:
            return
        lag = GaugeMetricFamily("tandem_replication_lag_entries", "log entries a replica is behind the active",
                                labels=["node", "queue", "partition", "replica", "kind"])
        lag_s = GaugeMetricFamily("tandem_replication_lag_seconds",
                                  "how long ago the active wrote the first entry a replica lacks",
                                  labels=["node", "queue", "partition", "replica", "kind"])
        commit = GaugeMetricFamily("tandem_partition_commit_index", "commit index of the partition's log",
                                   labels=["node", "queue", "partition", "role"])
        term = GaugeMetricFamily("tandem_partition_term", "current term of the partition's log",
                                 labels=["node", "queue", "partition"])
        for info in rep.partition_infos():
            qname = info.queue or "(catalogue)"
            commit.add_metric([name, qname, str(info.partition), info.role], info.commit)
            term.add_metric([name, qname, str(info.partition)], info.term)
            for r in info.replicas:
                lag.add_metric([name, qname, str(info.partition), r.node, r.kind], r.lag)
                lag_s.add_metric([name, qname, str(info.partition), r.node, r.kind], r.lag_seconds)
        yield lag
        yield lag_s
        yield commit
        yield term
        yield _counter("tandem_elections_won", "times this node became active for a partition", [("node", name)],
                       rep.elections)
        yield _counter("tandem_ha1014_discarded_entries", "HA-1014: log entries discarded on rejoin",
                       [("node", name)], rep.discarded_total)
        yield _counter("tandem_ha1014_discarded_messages", "HA-1014: messages in the discarded entries",
                       [("node", name)], rep.discarded_messages)
        yield _counter("tandem_ha1014_confirmed_lost_entries", "HA-1014: of the discarded entries, those this "
                       "node had counted as committed (confirmed and lost; at most, where a snapshot replaced "
                       "them)", [("node", name)], rep.confirmed_lost)
        yield _counter("tandem_ha1014_confirmed_lost_messages", "HA-1014: messages in the confirmed entries "
                       "lost", [("node", name)], rep.confirmed_lost_messages)
        disabled = peers is not None and peers.membership.quorum_state is QuorumState.DISABLED
        yield _gauge("tandem_quorum_active", "1 while this node has node quorum", [("node", name)],
                     0 if disabled else 1)


def _disk_metrics(name: str, alarm: DiskAlarmView | None) -> Iterator[Any]:
    """The disk alarm (broker/node/diskalarm.py): none in shared mode or with disk_free_limit 0."""
    if alarm is None:
        return
    yield _gauge("tandem_disk_alarm", "1 while the free space of the data dir is below disk_free_limit "
                 "(publishes and declares refused)", [("node", name)], 1 if alarm.raised else 0)
    if alarm.free is not None:
        yield _gauge("tandem_disk_free_bytes", "free space of the data dir's file system at the last check",
                     [("node", name)], alarm.free)
    yield _gauge("tandem_disk_free_limit_bytes", "disk_free_limit", [("node", name)], alarm.limit)
    yield _counter("tandem_disk_alarm_refusals", "publishes and declares refused by the disk alarm",
                   [("node", name)], alarm.refusals)


def _limit_metrics(name: str, guard: ClientGuard) -> Iterator[Any]:
    """The client port's refusals (broker.security.auth.ClientGuard)."""
    counts = guard.counters
    yield _counter("tandem_auth_failures", "client and console logins refused (wrong password, unknown user, "
                   "bad SCRAM exchange)", [("node", name)], counts.auth_failures)
    yield _counter("tandem_logins_throttled", "logins refused unheard: too many failed logins from the address",
                   [("node", name)], counts.logins_throttled)
    limits = CounterMetricFamily("tandem_limit_refusals", "requests refused by a limit against abuse",
                                 labels=["node", "limit"])
    limits.add_metric([name, "max_connections_per_user"], counts.connections_refused)
    limits.add_metric([name, "max_prefetch"], counts.prefetch_refused)
    limits.add_metric([name, "max_failed_logins"], counts.logins_throttled)
    yield limits
    yield _gauge("tandem_login_throttle_addresses", "client addresses with recent failed logins tracked",
                 [("node", name)], len(guard.throttle))


def _ha_metrics(cfg: NodeConfig, ha: HaReport) -> Iterator[Any]:
    name = cfg.name
    state = ha.state
    states = ha.states
    fam = GaugeMetricFamily("tandem_ha_state", "1 for the node's HA state (shared mode, LockFile arbiter), "
                            "0 for the mode's other states", labels=["node", "state"])
    for s in states if state in states else [*states, state]:
        fam.add_metric([name, s], 1 if s == state else 0)
    yield fam
    yield _gauge("tandem_ha_epoch", "the activation (shared) or lock (lockfile) epoch the node last served or saw",
                 [("node", name)], ha.epoch)
    yield _counter("tandem_lease_renewals", "lock or lease renewals confirmed", [("node", name)], ha.renewals)
    yield _counter("tandem_fencing_refusals", "writes or frames refused for a stale epoch", [("node", name)],
                   ha.fencing_refusals)
    yield _counter("tandem_ha_state_changes", "changes of the node's HA state", [("node", name)], ha.changes)


def _gauge(metric: str, help_: str, labels: list[tuple[str, str]], value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(metric, help_, labels=[k for k, _ in labels])
    fam.add_metric([v for _, v in labels], value)
    return fam


def _counter(metric: str, help_: str, labels: list[tuple[str, str]], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(metric, help_, labels=[k for k, _ in labels])
    fam.add_metric([v for _, v in labels], value)
    return fam


class Metrics:
    """A node's registry: its collector, and the histogram of its store's commits (observed
    by the node's writer, whichever is open, from the moment the console starts until it stops)."""

    def __init__(self, view: NodeView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(view))
        hist = Histogram("tandem_store_commit_seconds", "store commits (one transaction, fsync'd when sync)",
                         ["node", "sync"], registry=self.registry,
                         buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        name = view.node.config.name
        synced, unsynced = hist.labels(name, "true"), hist.labels(name, "false")

        def observe(seconds: float, sync: bool) -> None:
            (synced if sync else unsynced).observe(seconds)

        self._observe = observe
        self._observers = view.meters.commit_observers
        self._observers.append(observe)

    def close(self) -> None:
        """Stop observing the store's commits."""
        if self._observe in self._observers:
            self._observers.remove(self._observe)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE


METRICS = web.AppKey("metrics", Metrics)


async def metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    """The application's :class:`Metrics`, for as long as it runs (``cleanup_ctx``)."""
    app[METRICS] = metrics = Metrics(app[NODE])
    yield
    metrics.close()
