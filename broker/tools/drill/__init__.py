"""``tandem drill SCENARIO``: inject a fault into a running group under load and check
every message.

One run: a fresh local group (``--nodes``, default 3, the default policies unless
flags say otherwise), one queue, P producers and C consumers on durable
connections (confirms, acks, a unique payload per message).  Once a third of the
messages are confirmed the fault is injected; it is healed; the producers finish;
the consumers drain the queue; the checker classifies every message (see
:mod:`broker.tools.checker`).  A run passes when nothing is duplicated or unexpected
and nothing confirmed is lost, or, under weak policies, when every loss was
reported by Tandem itself (the SDK's ``messages_lost`` events).

Scenarios (the *target* is the node active for the most partitions):

* ``kill-active``: ``kill -9`` the target; once every partition has an active
  again, start it again (it rejoins and catches up).
* ``kill-replica``: the group's last node has priority 0, so it is a replica of
  every partition and active for none: ``kill -9`` it, start it again.
* ``pause-active``: SIGSTOP the target for 2 x ``non_response_timeout`` + 1 s,
  then SIGCONT: it must step down, not write.
* ``partition-active``: every peer link and client connection of the target goes
  through a fault-injecting proxy; cut them all for 2 x ``non_response_timeout``
  + 1 s, then heal.
* ``restart-all``: ``kill -9`` every node, start them all again.
* ``rolling-restart``: stop (SIGTERM) and start each node in turn, waiting after
  each until every partition has an active and every replica has caught up.
* ``slow-disk``: the disks of every node but the target stop for 2 x
  ``non_response_timeout`` + 1 s, at most 5 x (half of ``ALIVE_GIVE_UP``, past which an
  active is meant to step down) (strace delays the next fsync of each of their
  threads, :func:`broker.tools.faults.stall_disk`): the replicas of the target's
  partitions are up but cannot write.  No partition may change its active or
  its term (a slow disk is not a dead node); confirms wait for the stall, so
  ``failover_ms`` is about the stall's length.  Spawned groups only.

The disk fault families (:mod:`broker.tools.drill.diskfaults`, root; every node's data dir
on powerfs, :mod:`broker.tools.powerfs`, or on a tmpfs of its own): ``power-loss`` (kill -9 the
target, roll its disk back to its last fsync, start it again), ``power-loss-all`` (every node,
restarted in a seeded random order), ``disk-full`` (the target's disk full for the hold) and
``disk-error`` (EIO on a priority-0 replica's writes and fsyncs for the hold).
Network faults (:mod:`broker.tools.drill.netfaults`, root): ``isolate-active``, ``partition``,
``bridge``, ``one-way``, ``one-way-reverse``, ``flap`` and ``loss`` run the group with each node
in a network namespace of its own (``--net netns``, :mod:`broker.tools.netns`) and cut links with
iptables rules there, never the clients'.  They also report the time from the heal until every
node sees every peer Up (``heal_up_ms``) and the healthy actives deposed after the heal
(``deposed``; :mod:`broker.tools.drill.healing`), which fails ``isolate-active`` and ``partition``.

Two-node setups and shared mode (``DrillConfig.ha``, flags ``--mode shared --database URL``,
``--arbiter lockfile|witness``; kill-active and pause-active): the target is the one node whose
status says ``ha_state`` ACTIVE (shared mode), the lock holder (LockFile arbiter), or the node
active for most partitions (witness).  A shared-mode run gets a database of its own beside
``URL`` (:mod:`broker.tools.scratch_db`), dropped afterwards.  Besides the longest wait for a
confirm, each run reports the time from the fault to the first confirm on the new active
(:func:`broker.tools.drill.load.takeover_time`) and who served once the fault was over.

Against a group that is already running (``--url``), the drill cannot reach the
nodes' processes itself: the operator gives the fault and its healing as shell
commands (``--inject``, ``--heal``; ``{node}`` stands for the target's name, e.g.
``ssh {node} sudo systemctl kill -s KILL tandem``), and the drill runs its
workload on a queue of its own (``drill-<random>``, deleted afterwards).
"""

from __future__ import annotations

from broker.tools.drill.model import QUEUE, SCENARIOS, DrillConfig, RunResult
from broker.tools.drill.report import progress_line, report_text, summarize
from broker.tools.drill.run import drill, run_existing, run_once

__all__ = ["QUEUE", "SCENARIOS", "DrillConfig", "RunResult", "drill", "progress_line", "report_text", "run_existing",
           "run_once", "summarize"]
