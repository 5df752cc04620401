"""Node configuration: one frozen dataclass, validated on construction.

Loaded from TOML only at the entry point (``tandem broker start --config``);
command-line flags override file values.  Unknown keys are rejected by name.

Example ``tandem.toml``::

    name = "node1"
    data_dir = "/var/lib/tandem/node1"
    host = "127.0.0.1"
    port = 7780
    sync = "SYNC"               # SYNC | WRITE_NO_SYNC | NO_SYNC
    max_message_size = 5242880  # bytes
    max_frame_size = 8388608    # bytes
    heartbeat = 10.0            # seconds
    disk_free_limit = "64M"     # below this much free space in data_dir the node refuses publishes
    max_memory = "256M"         # bytes of ready messages held in memory; the rest is read from the store

    # replication group (leave out for a single node)
    peer_port = 7781            # node <-> node links
    peers = ["node2=10.0.0.2:7781", "node3=10.0.0.3:7781"]
    priority = 1                # 0 never active, 1 normal, 2 high, 3 highest
    votes = 1
    quorum_policy = "majority"  # majority | percentage:P | min_votes:N | disabled
    keepalive_interval = 0.25   # seconds
    non_response_timeout = 1.0  # seconds without a frame -> the peer is Down
    remote_sync = "SYNC"        # how replicas write what the active ships them (one fdatasync per batch)
    replicas = 2                # copies of each partition besides its active
    sync_replicas = 2           # how many of those vote (the rest are async learners)
    zones = ["node1=a", "node2=b", "node3=c"]  # every member's zone (the same on each): copies spread over zones
    availability_zones = ["east=node1,node2:majority"]  # members with a quorum of their own: Disabled in any -> HA off
    designated_primary = false  # two-node group: this node may go on alone
    join = false                # a new member of a running group (tandem group add): takes the group's state
    seeds = ["10.0.0.1:7781"]   # members' peer ports, no names: join by them; asked for addresses a member lacks
    log_segment_size = 67108864 # bytes a file of the replication log grows to before the next
    ack_linger = 0.01           # seconds an ack may wait to ride in its partition's next entry
    failback_after = 5.0        # seconds a partition's placed active must be back before it takes over again (0: never)
    objects_locked_per_transaction = 1000  # messages per part of a snapshot sent to a replica (new or behind)
    compensation = "orders"     # a restore's key conflicts go to this hook (entry point tandem.compensation)
    weak_hold_bytes = "256M"    # per partition: a weak override's active takes publishes up to this (then: retry)

    # two-node groups (docs/shared-mode.md): who may be active when there is no third node
    arbiter = "majority"        # majority | lockfile | witness
    lockfile = "/mnt/gateway/tandem.lock"   # arbiter = "lockfile": a path both nodes reach
    witness = "w1=10.0.0.3:7781"           # arbiter = "witness": the group's data-less third vote
    lease = 1.0                 # seconds a lock holder may go without renewing before it stops serving

    # shared mode: one database for the group, the lock holder active for every partition
    mode = "shared"             # replicated (default) | shared
    database = "postgresql+psycopg://tandem@db.example:5432/tandem"   # or sqlite:///PATH on one machine
    lock = "database"           # database (a lease row) | file:/path/on/gateway/tandem.lock

    # security (docs/security.md)
    cluster_secret_file = "/etc/tandem/cluster.secret"  # a group's peer links prove they hold it
    permitted_nodes = ["node2", "node3@10.0.0.3"]        # who may join (names, optionally @address)
    tls_cert = "/etc/tandem/node1.crt"   # with tls_key: TLS on the client, peer and console ports
    tls_key = "/etc/tandem/node1.key"
    tls_ca = "/etc/tandem/ca.crt"        # the CA peers' (and clients') certificates are checked against
    peer_tls = "auto"           # auto (on when certificates are set) | on | off (logged as a warning)
    max_connections_per_user = 1000
    max_prefetch = 10000        # the ceiling on a consumer's prefetch
    max_failed_logins = 5       # per client address before its logins are slowed down
    login_timeout = 10.0        # seconds from connect to a finished login on the client port
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.errors import InvalidArgumentError
from ha.membership import AvailabilityZone, QuorumPolicy
from ha.placement import DistributionPolicy
from storage.base import DurabilityPolicy

DEFAULT_PORT = 7780
#: A replica whose replies have been held this many ``non_response_timeout``s by its log
#: writes stops sending the active Alive: its disk or writer is stuck (docs/replication.md).
ALIVE_GIVE_UP = 10
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HOST = re.compile(r"^\[?[A-Za-z0-9_.:-]{1,253}\]?$")  # a host name, IPv4 or [IPv6] address


class ConfigError(InvalidArgumentError):
    """A configuration value is wrong; the message names the key."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    name: str = "node1"
    data_dir: Path = Path(".tandem/node1")
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    sync: DurabilityPolicy = DurabilityPolicy.SYNC
    max_message_size: int = 5 * 1024 * 1024
    max_frame_size: int = 8 * 1024 * 1024
    heartbeat: float = 10.0
    max_connections: int = 10000
    peer_port: int | None = None  # None: no replication group
    peers: tuple[str, ...] = ()  # "name=host:port" of the other members
    priority: int = 1
    votes: int = 1
    quorum_policy: str = "majority"
    keepalive_interval: float = 0.25
    non_response_timeout: float = 1.0
    #: replicas fsync what they ack (group commit: one fdatasync per batch the writer takes),
    #: so a confirmed entry is on the disks of a majority and a power cut of every node loses
    #: nothing confirmed, whichever node comes back first (docs/drills.md)
    remote_sync: DurabilityPolicy = DurabilityPolicy.SYNC
    replicas: int = 2
    sync_replicas: int = 2
    #: "name=zone" for every member (this node included), the same on each: a partition's
    #: copies go to as many distinct zones as there are (ha.placement); empty: no zones
    zones: tuple[str, ...] = ()
    #: "NAME=MEMBER,MEMBER,...[:POLICY]": availability zones, sets of members giving each other
    #: quorum under a policy of their own (ha.membership.AvailabilityZone); this node is
    #: Disabled, its HA services off, when any zone it is in loses quorum; empty: none
    availability_zones: tuple[str, ...] = ()
    designated_primary: bool = False
    #: this node joins a running group (``tandem group add``, broker.partitions.members): on its first
    #: start it holds nothing and votes in nothing until the group's state reaches it;
    #: ``peers`` names the members it finds the group by (any of them will do)
    join: bool = False
    #: "host:port" of members' peer ports, no names needed (broker.peers.discovery): a node that
    #: ``join``s finds the group by them, and any member asks them for the address of a
    #: member it has none for
    seeds: tuple[str, ...] = ()
    #: bytes a segment file of the replication log grows to (storage/segments.py): space is
    #: reclaimed a whole segment at a time
    log_segment_size: int = 64 * 1024 * 1024
    #: seconds an ack (a settlement) may wait to ride in its partition's next log entry, in a
    #: group (docs/replication.md, "settlements ride in the next entry"); 0: an entry at once
    ack_linger: float = 0.01
    #: failback: a partition's preferred node (placement's first), back, caught up and
    #: answering for this many seconds, is handed the partition again (0: never;
    #: docs/replication.md, "failback")
    failback_after: float = 5.0
    #: a partition's snapshot goes to a replica (a new copy, tandem partition move; one too
    #: far behind) in parts of at most this many messages (and 4 MiB), each read from the
    #: store in a transaction of its own: the active never stops for a large partition
    objects_locked_per_transaction: int = 1000
    #: the compensation hook a restore run by the group (admin API, console) asks about each
    #: key conflict (broker.partitions.compensation; an entry point of tandem.compensation, installed on
    #: every member); empty: the quarantined message is restored beside the source's
    compensation: str = ""
    #: bytes of entries a weak active (quorum_override, designated_primary) wrote that no
    #: majority is known to hold, kept in a partition's log (and memory) so that a heal can
    #: compare them and quarantine what it discards: a publish past it is refused (retry;
    #: broker.modes.replicated.compaction.WeakHold); past twice as much (acks, deliveries) they are
    #: compacted, and a heal against another active loses them, reported
    weak_hold_bytes: int = 256 * 1024 * 1024
    #: host:port clients are told to reach this node at (partition maps, tandem status), when
    #: that is not where it listens: behind NAT, a load balancer or a fault-injecting proxy
    advertise: str | None = None
    #: the management console and admin REST API (webconsole/); None: not served
    http_port: int | None = None
    #: the AMQP 0-9-1 front door (broker/amqp/, docs/amqp.md); None: not served
    amqp_port: int | None = None
    #: seconds a producer may stay idle before a partition forgets its sequence (a resend after
    #: that is stored again); bounds the state every short-lived producer id leaves behind
    producer_expiry: float = 24 * 3600.0
    #: seconds a transaction may stay open: a partition holding what one prepared for longer, with
    #: no outcome decided, aborts it (docs/transactions.md)
    transaction_timeout: float = 60.0
    #: seconds a transaction coordinator keeps each outcome it decided, to answer participants
    #: that ask late (docs/transactions.md, "The outcome history")
    transaction_history: float = 3600.0
    #: who decides which node may be active in a two-node replicated group: ``majority`` (the
    #: votes, or ``designated_primary``), ``lockfile`` (the holder of ``lockfile``), ``witness``
    #: (a data-less third voter, ``tandem witness start``)
    arbiter: str = "majority"
    lockfile: str | None = None
    witness: str | None = None  # "name=host:port" of the group's witness
    #: seconds a lock or lease holder may go without a confirmed renewal before it stops serving
    #: (the LockFile arbiter, shared mode's lease row); failover takes about this long
    lease: float = 1.0
    #: ``replicated`` (each node its own store, log shipping) or ``shared`` (one database)
    mode: str = "replicated"
    database: str | None = None  # shared mode: postgresql+psycopg://USER@HOST:PORT/DB or sqlite:///PATH
    lock: str = "database"  # shared mode: "database" (a lease row) or "file:/path/tandem.lock"
    #: a file holding the group secret every peer link proves it knows (challenge-response);
    #: a group member needs it (or mutual TLS on its peer links)
    cluster_secret_file: Path | None = None
    #: members allowed on the peer port: "name" or "name@host"; empty: the names in peers
    permitted_nodes: tuple[str, ...] = ()
    #: PEM certificate and key of this node: with both, the client, peer and console ports speak TLS
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: PEM CA bundle that peers' certificates (and clients' ones, when they present any) chain to
    tls_ca: Path | None = None
    #: TLS on peer links: "auto" (on when tls_cert is set), "on", or "off" (plaintext, a warning)
    peer_tls: str = "auto"
    #: client connections one user may hold at once on this node
    max_connections_per_user: int = 1000
    #: the largest prefetch a consumer may ask for
    max_prefetch: int = 10000
    #: failed logins from one client address before each further attempt is delayed
    max_failed_logins: int = 5
    #: seconds a client connection has from connect to a finished login, whatever it sends
    login_timeout: float = 10.0
    #: bytes: while the file system of ``data_dir`` has less free space than this, the node
    #: refuses publishes and declares (the disk alarm, broker/node/diskalarm.py); 0: no alarm
    disk_free_limit: int = 64 * 1024 * 1024
    #: bytes of ready messages (bodies, headers, and an estimate of each one's object) the
    #: node holds in memory, split evenly over its partitions; past a partition's share its
    #: messages stay in the store and are read back when delivered (broker.messaging.queues); 0: no bound
    max_memory: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"name {self.name!r}: 1-63 letters, digits, '_', '.', '-'")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port!r}: must be 0..65535 (0 = any free port)")
        if not 1024 <= self.max_message_size <= 256 * 1024 * 1024:
            raise ConfigError("max_message_size: must be 1 KiB .. 256 MiB")
        if self.max_frame_size < self.max_message_size + 4096:
            raise ConfigError(
                f"max_frame_size {self.max_frame_size}: must exceed max_message_size "
                f"({self.max_message_size}) by at least 4096 bytes of framing"
            )
        if not 0.5 <= self.heartbeat <= 3600:
            raise ConfigError("heartbeat: must be 0.5 .. 3600 seconds")
        if self.max_connections < 1:
            raise ConfigError("max_connections: must be >= 1")
        if self.peer_port is not None and not 0 <= self.peer_port <= 65535:
            raise ConfigError(f"peer_port {self.peer_port!r}: must be 0..65535")
        if self.peers and self.peer_port is None:
            raise ConfigError("peers: a group member needs a peer_port")
        for spec in self.peers:
            parse_peer(spec)
        if not 0 <= self.priority <= 3:
            raise ConfigError("priority: 0 (never active), 1, 2 or 3 (highest)")
        if self.votes < 0:
            raise ConfigError("votes: must be >= 0")
        try:
            QuorumPolicy.parse(self.quorum_policy)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not 0 <= self.sync_replicas <= self.replicas:
            raise ConfigError("sync_replicas: must be 0..replicas")
        if self.designated_primary and len(self.peers) != 1:
            raise ConfigError("designated_primary: only in a two-node group (exactly one peer)")
        self._check_zones()
        self._check_availability_zones()
        for spec in self.seeds:
            parse_seed(spec)
        if self.seeds and (self.peer_port is None or self.mode != "replicated" or self.arbiter != "majority"):
            raise ConfigError("seeds: only for a member of a replicated group under majority elections (with a "
                              "peer_port)")
        if self.join and (not (self.peers or self.seeds) or self.mode != "replicated" or self.arbiter != "majority"):
            raise ConfigError("join: only for a new member of a replicated group under majority elections (with "
                              "peers or seeds: the members it finds the group by)")
        if not 0.01 <= self.keepalive_interval < self.non_response_timeout:
            raise ConfigError("keepalive_interval: must be >= 0.01 s and below non_response_timeout")
        if not 1024 * 1024 <= self.log_segment_size <= 4 * 1024 * 1024 * 1024:
            raise ConfigError("log_segment_size: must be 1 MiB .. 4 GiB")
        if not 0 <= self.ack_linger <= 60:
            raise ConfigError("ack_linger: must be 0 .. 60 seconds")
        if not isinstance(self.objects_locked_per_transaction, int) or \
                not 1 <= self.objects_locked_per_transaction <= 1_000_000:
            raise ConfigError("objects_locked_per_transaction: must be 1 .. 1000000 messages")
        if not 0 <= self.failback_after <= 24 * 3600:
            raise ConfigError("failback_after: must be 0 (never) .. 86400 seconds")
        if not 1.0 <= self.producer_expiry <= 365 * 24 * 3600:
            raise ConfigError("producer_expiry: must be 1 s .. 365 days")
        if not 1.0 <= self.transaction_timeout <= 24 * 3600:
            raise ConfigError("transaction_timeout: must be 1 s .. 1 day")
        if not self.transaction_timeout * 2 <= self.transaction_history <= 365 * 24 * 3600:
            raise ConfigError("transaction_history: must be twice transaction_timeout .. 365 days (a decision "
                              "must outlive every transaction that may ask for it)")
        for key in ("http_port", "amqp_port"):
            port = getattr(self, key)
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{key} {port!r}: must be 0..65535 (0 = any free port)")
        if not isinstance(self.max_memory, int) or not (self.max_memory == 0 or self.max_memory >= 1024 * 1024):
            raise ConfigError(f"max_memory {self.max_memory!r}: must be at least 1M bytes (0: no bound)")
        if not isinstance(self.disk_free_limit, int) or self.disk_free_limit < 0:
            raise ConfigError(f"disk_free_limit {self.disk_free_limit!r}: must be >= 0 bytes (0: no disk alarm)")
        if self.advertise is not None:
            host, _, port = self.advertise.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"advertise {self.advertise!r}: expected HOST:PORT")
        self._check_ha()
        self._check_security()

    def _check_security(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key: give both (the node's certificate and its key) or neither")
        if self.peer_tls not in ("auto", "on", "off"):
            raise ConfigError(f"peer_tls {self.peer_tls!r}: auto, on or off")
        if self.peer_tls == "on" and self.tls_cert is None:
            raise ConfigError("peer_tls = \"on\" needs tls_cert and tls_key (and tls_ca)")
        for spec in self.permitted_nodes:
            name, at, host = spec.partition("@")
            if not _NAME.match(name) or (at and not host):
                raise ConfigError(f"permitted_nodes: {spec!r} is not NAME or NAME@HOST")
        if self.max_connections_per_user < 1:
            raise ConfigError("max_connections_per_user: must be >= 1")
        if not 1 <= self.max_prefetch <= 65535:
            raise ConfigError("max_prefetch: must be 1 .. 65535")
        if self.max_failed_logins < 1:
            raise ConfigError("max_failed_logins: must be >= 1")
        if not 0.5 <= self.login_timeout <= 3600:
            raise ConfigError("login_timeout: must be 0.5 .. 3600 seconds")
        if not isinstance(self.weak_hold_bytes, int) or self.weak_hold_bytes < 0:
            raise ConfigError(f"weak_hold_bytes {self.weak_hold_bytes!r}: must be >= 0 bytes")

    def _check_zones(self) -> None:
        if not self.zones:
            return
        if not self.peers or self.mode != "replicated":
            raise ConfigError("zones: only in a replicated group (with peers)")
        zone_of = self.zone_map()
        members = {self.name, *self.peer_addresses()}
        missing, unknown = sorted(members - set(zone_of)), sorted(set(zone_of) - members)
        if missing or unknown:
            raise ConfigError("zones: name every member once, this node included"
                              + (f"; no zone for {', '.join(missing)}" if missing else "")
                              + (f"; not a member: {', '.join(unknown)}" if unknown else ""))

    def _check_availability_zones(self) -> None:
        if not self.availability_zones:
            return
        if not self.peers or self.mode != "replicated" or self.arbiter != "majority":
            raise ConfigError("availability_zones: only in a replicated group under majority elections (with peers)")
        members = {self.name, *self.peer_addresses()}
        names: set[str] = set()
        for zone in self.zone_list():
            if zone.name in names:
                raise ConfigError(f"availability_zones: {zone.name} is named twice")
            names.add(zone.name)
            unknown = sorted(set(zone.members) - members)
            if unknown and not self.join:
                raise ConfigError(f"availability_zones: {zone.name}: not a member of the group: {', '.join(unknown)}")

    def zone_list(self) -> tuple[AvailabilityZone, ...]:
        """The availability zones (() without)."""
        try:
            return tuple(AvailabilityZone.parse(spec) for spec in self.availability_zones)
        except ValueError as exc:
            raise ConfigError(f"availability_zones: {exc}") from None

    def zone_map(self) -> dict[str, str]:
        """Member -> zone label ({} without zones)."""
        out: dict[str, str] = {}
        for spec in self.zones:
            name, sep, zone = spec.partition("=")
            if not sep or not _NAME.match(name) or not _NAME.match(zone):
                raise ConfigError(f"zones: {spec!r} is not name=zone (letters, digits, '_', '.', '-')")
            if name in out:
                raise ConfigError(f"zones: {name} is named twice")
            out[name] = zone
        return out

    def placement_settings(self) -> str:
        """What every member must agree on for partitions to be placed alike on each (the
        members, replicas, sync_replicas, zones), as the peer handshake carries it:
        "members=a,b,c replicas=2 sync_replicas=2 zones=a:x,b:y,c:z".  A node that ``join``s
        is not among the members: the group's state, once it has it, says where it is."""
        members = sorted([*([] if self.join else [self.name]), *self.peer_addresses()])
        zones = ",".join(f"{n}:{z}" for n, z in sorted(self.zone_map().items()) if n in members)
        return (f"members={','.join(members)} replicas={self.replicas} "
                f"sync_replicas={self.sync_replicas} zones={zones}")

    def placement(self) -> tuple[list[str], DistributionPolicy]:
        """The members (sorted) and the policy this node places partitions by."""
        return placement_of(self.placement_settings())

    @property
    def ha_mode(self) -> str:
        """How this node runs, as status reports it: ``shared``, ``replicated`` (a group member)
        or ``single``."""
        if self.mode == "shared":
            return "shared"
        return "replicated" if self.peer_port is not None else "single"

    @property
    def client_heartbeat(self) -> float:
        """The heartbeat the node offers its clients.  In shared mode at most half the lease:
        clients learn that a paused or cut-off active is gone by its silence (the passive cannot
        tell them)."""
        return min(self.heartbeat, max(0.5, self.lease / 2)) if self.mode == "shared" else self.heartbeat

    @property
    def peer_tls_on(self) -> bool:
        """Whether peer links speak TLS: on when certificates are set, unless peer_tls = "off"."""
        return self.peer_tls == "on" or (self.peer_tls == "auto" and self.tls_cert is not None)

    def _check_ha(self) -> None:
        """The two-node arbiters and shared mode: each setting checked against the others."""
        if not 0.2 <= self.lease <= 300:
            raise ConfigError("lease: must be 0.2 .. 300 seconds")
        if self.mode not in ("replicated", "shared"):
            raise ConfigError(f"mode {self.mode!r}: replicated or shared")
        if self.arbiter not in ("majority", "lockfile", "witness"):
            raise ConfigError(f"arbiter {self.arbiter!r}: majority, lockfile or witness")
        if self.mode == "shared":
            if not self.database:
                raise ConfigError("mode = \"shared\" needs database = \"postgresql+psycopg://USER@HOST:PORT/DB\" "
                                  "(or sqlite:///PATH on one machine)")
            if not self.database.startswith(("postgresql+psycopg://", "sqlite:///")):
                raise ConfigError(f"database {redact_url(self.database)!r}: expected postgresql+psycopg://"
                                  "USER@HOST:PORT/DB or sqlite:///PATH")
            if self.lock != "database" and not (self.lock.startswith("file:") and len(self.lock) > 5):
                raise ConfigError(f"lock {self.lock!r}: \"database\" or \"file:/path/tandem.lock\"")
            if self.arbiter != "majority":
                raise ConfigError(f"arbiter {self.arbiter!r}: shared mode is arbitrated by its lock "
                                  "(the lock setting), not by an arbiter")
            if self.designated_primary:
                raise ConfigError("designated_primary: not in shared mode (the lock holder is active)")
        elif self.database is not None:
            raise ConfigError("database: only with mode = \"shared\"")
        if self.arbiter == "lockfile":
            if not self.lockfile:
                raise ConfigError("arbiter = \"lockfile\" needs lockfile = \"/path/both/nodes/reach/tandem.lock\"")
            if len(self.peers) != 1:
                raise ConfigError("arbiter = \"lockfile\": only in a two-node group (exactly one peer)")
        elif self.lockfile is not None:
            raise ConfigError("lockfile: only with arbiter = \"lockfile\"")
        if self.arbiter == "witness":
            if not self.witness:
                raise ConfigError("arbiter = \"witness\" needs witness = \"NAME=HOST:PORT\"")
            if len(self.peers) != 1:
                raise ConfigError("arbiter = \"witness\": only in a two-node group (exactly one peer)")
        elif self.witness is not None:
            raise ConfigError("witness: only with arbiter = \"witness\"")
        if self.witness is not None:
            try:
                parse_peer(self.witness)
            except ConfigError:
                raise ConfigError(f"witness {self.witness!r}: expected NAME=HOST:PORT") from None
        if self.arbiter != "majority" and self.designated_primary:
            raise ConfigError(f"designated_primary: not with arbiter = \"{self.arbiter}\" (the arbiter decides)")

    @property
    def db_path(self) -> Path:
        return self.data_dir / "tandem.db"

    def peer_addresses(self) -> dict[str, tuple[str, int]]:
        return dict(parse_peer(spec) for spec in self.peers)

    def witness_address(self) -> tuple[str, tuple[str, int]] | None:
        """(name, (host, port)) of the group's witness under ``arbiter = "witness"``, else None:
        a member of the peer links and a voter of every log, never a data replica."""
        return parse_peer(self.witness) if self.arbiter == "witness" and self.witness else None


def placement_of(settings: str) -> tuple[list[str], DistributionPolicy]:
    """(members, policy) from ``NodeConfig.placement_settings``'s text (as a store keeps it)."""
    kv = dict(part.partition("=")[::2] for part in settings.split(" "))
    zones = tuple(tuple(z.split(":", 1)) for z in kv.get("zones", "").split(",") if z)
    return (sorted(m for m in kv.get("members", "").split(",") if m),
            DistributionPolicy(replicas=int(kv.get("replicas", "2")), sync_replicas=int(kv.get("sync_replicas", "2")),
                               zones=zones))  # type: ignore[arg-type]


def redact_url(url: str) -> str:
    """A database URL with its password replaced (for logs, errors and ``tandem status``): the
    one of ``user:password@`` and a ``password=`` option (libpq takes either)."""
    url = re.sub(r"([?&]password=)[^&]*", r"\1***", url)
    head, sep, rest = url.partition("://")
    cred, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in cred:
        return url
    return f"{head}://{cred.split(':', 1)[0]}:***@{host}"


def parse_seed(spec: str) -> tuple[str, int]:
    """``host:port`` (a member's peer port) -> (host, port)."""
    host, colon, port = spec.rpartition(":")
    if not colon or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"seeds: {spec!r} is not host:port")
    return host.strip("[]"), int(port)


def parse_peer(spec: str) -> tuple[str, tuple[str, int]]:
    """``name=host:port`` -> (name, (host, port))."""
    name, sep, addr = spec.partition("=")
    host, colon, port = addr.rpartition(":")
    if not sep or not colon or not _NAME.match(name) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"peers: {spec!r} is not name=host:port")
    return name, (host, int(port))


_FIELDS = {f.name: f for f in dataclasses.fields(NodeConfig)}


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, key: str = "size") -> int:
    """Bytes from ``text``: a number, optionally with a K, M, G or T suffix (powers of 1024;
    ``64M``, ``64MB`` and ``64MiB`` are the same)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(f"{key} {text!r}: expected bytes, e.g. 67108864, 512K, 64M or 1G")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


def _coerce(key: str, value: Any) -> Any:
    if key == "data_dir":
        return Path(value)
    if key in ("cluster_secret_file", "tls_cert", "tls_key", "tls_ca"):
        if value is None or isinstance(value, Path):
            return value
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a file path, got {value!r}")
        return Path(value)
    if key == "permitted_nodes":
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError("permitted_nodes: expected a list of \"NAME\" or \"NAME@HOST\" strings")
        return tuple(value)
    if key in ("disk_free_limit", "max_memory", "weak_hold_bytes"):
        return parse_size(value, key)
    if key in ("designated_primary", "join"):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if key in ("sync", "remote_sync"):
        return value if isinstance(value, DurabilityPolicy) else DurabilityPolicy.parse(str(value))
    if key in ("peers", "zones", "seeds"):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            form = {"peers": "name=host:port", "zones": "name=zone", "seeds": "host:port"}[key]
            raise ConfigError(f"{key}: expected a list of \"{form}\" strings")
        return tuple(value)
    if key == "availability_zones":
        if isinstance(value, str):
            value = [value]  # (a zone's members are separated by commas: one zone)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError("availability_zones: expected a list of \"NAME=MEMBER,MEMBER,...[:POLICY]\" strings")
        return tuple(value)
    if key in ("advertise", "lockfile", "witness", "database"):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if key in ("peer_port", "http_port", "amqp_port"):
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected int, got {type(value).__name__} {value!r}")
        return value
    field_type = _FIELDS[key].type
    expected = {"int": int, "float": float, "str": str}.get(str(field_type))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is not None and (not isinstance(value, expected) or isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def build_config(values: dict[str, Any]) -> NodeConfig:
    """A NodeConfig from a flat mapping; unknown keys and bad values named."""
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)} (known: {', '.join(sorted(_FIELDS))})")
    try:
        return NodeConfig(**{k: _coerce(k, v) for k, v in values.items()})
    except InvalidArgumentError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    node = data.pop("node", None)
    if isinstance(node, dict):  # accept a [node] table as well as top-level keys
        data = {**data, **node}
    return data
