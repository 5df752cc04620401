"""Locust users for Tandem: load tests with the blocking client (plain sockets, so it runs
under the gevent monkey-patching that locust applies).

    from locust import task
    from client.locust import TandemUser

    class Producer(TandemUser):
        rate = 100                    # messages a second, this user (0: as fast as confirms come)
        @task
        def send(self):
            self.publish()

    class Consumer(TandemUser):
        @task
        def receive(self):
            self.consume()

    $ locust -f mylocustfile.py --host tandem://admin:PW@127.0.0.1:7780

What locust records (one request event each; failures carry the exception):

* ``publish``: publish-to-confirm time of one batch of :attr:`batch_size` messages;
* ``deliver``: end-to-end time of one message, from its send (a stamp in the body,
  :mod:`client.stamp`) to its delivery to a consumer here;
* ``ack``: the round trip of one ack.

Each user holds one blocking connection (not thread-safe: one per user).  It connects to
the node active for "its" partition (users take the queue's partitions in turn), so a
producer's sends are not forwarded and a consumer gets that partition's messages; every
:attr:`rebalance_every` seconds a consumer checks the partition map and moves to the new
active after a failover.  Settings are class attributes; the ``--tandem-*`` options of
the locust command line (and web UI) override them.
"""

from __future__ import annotations

import itertools
from typing import Any

try:
    from locust import User, events
except ImportError:  # pragma: no cover - the optional extra
    raise ImportError("client.locust needs locust: pip install 'tandem-broker[load]'") from None

from client import blocking
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, QueueExistsError, TandemError, TimeoutError_
from client.stamp import HEADER_SIZE, new_producer, read_stamp, stamp
from client.mapper import make_mapper
from client.protocol.frames import QueueInfo
from client.url import format_url, parse_url

#: the class attributes the ``--tandem-*`` options override (option name -> attribute, type)
OPTIONS: dict[str, tuple[str, type, str]] = {
    "tandem_queue": ("queue", str, "queue to publish to and consume from"),
    "tandem_partitions": ("partitions", int, "partitions of the queue when a user declares it"),
    "tandem_body_size": ("body_size", int, f"bytes per message (>= {HEADER_SIZE})"),
    "tandem_batch_size": ("batch_size", int, "messages per publish (one confirm each)"),
    "tandem_rate": ("rate", float, "messages a second per producer user (0: no pacing)"),
    "tandem_prefetch": ("prefetch", int, "unacked deliveries per consumer user"),
}


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_kw: Any) -> None:
    for name, (attr, kind, text) in OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                            help=f"Tandem: {text} (default: the user class's {attr!r})")


_users = itertools.count()


class TandemUser(User):
    """A locust user with one blocking Tandem connection; subclass it and write tasks that
    call :meth:`publish` and :meth:`consume`."""

    abstract = True

    queue = "locust"
    #: partitions if the queue is declared here (a user declares it if it does not exist; one
    #: that exists with other settings is used as it is)
    partitions = 1
    body_size = 256
    batch_size = 1
    #: messages a second this user publishes (paced like locust's ``constant_throughput``); 0: no pacing
    rate = 0.0
    prefetch = 64
    #: seconds a consumer waits for a message before its task returns (no message is no failure)
    consume_timeout = 1.0
    #: messages one :meth:`consume` call takes at most
    consume_max = 100
    #: seconds between a consumer's looks at the partition map (0: never move)
    rebalance_every = 5.0
    #: seconds a publish may take across failovers before it fails
    send_timeout = 60.0
    #: the key of every message this user sends: "" (default) a key of its own (its messages
    #: keep to one partition, in order, and a resend after a failover goes to the same
    #: partition, where it is stored once); None: no key (the node spreads them round-robin
    #: over the partitions, and a resend may land in another one: see docs/load.md)
    key: str | None = ""

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        opts = getattr(environment, "parsed_options", None)
        for name, (attr, kind, _text) in OPTIONS.items():
            value = getattr(opts, name, None)
            if value is not None:
                setattr(self, attr, kind(value))
        if self.body_size < HEADER_SIZE:
            raise InvalidArgumentError(f"body_size {self.body_size}: at least {HEADER_SIZE} bytes (the stamp)")
        if self.batch_size < 1:
            raise InvalidArgumentError(f"batch_size {self.batch_size}: at least 1")
        self.index = next(_users)
        self.url = self.host or environment.host or ""
        if not self.url:
            raise InvalidArgumentError("no Tandem URL: give --host tandem://user:password@host:port")
        self.conn: blocking.BlockingConnection | None = None
        self.producer_tag = new_producer()
        #: the key this user's messages carry (:attr:`key`), None: none
        self.message_key = self.producer_tag.hex() if self.key == "" else self.key
        self.sent = 0  # messages this user stamped so far (the next one's n)
        self._producer: blocking.BlockingProducer | None = None
        self._consumer: blocking.BlockingConsumer | None = None
        self._partition = 0
        self._next_look = 0.0
        self._paced_at: float | None = None
        self._consuming = False  # set by the first consume(): a user is a producer or a consumer

    # -- pacing --------------------------------------------------------------------------------

    def wait_time(self) -> float:
        """With :attr:`rate`: wait so that publishes come every ``batch_size / rate`` seconds
        (none after one that took longer); else none."""
        if self.rate <= 0:
            return 0.0
        now = SYSTEM_CLOCK.monotonic()
        period = self.batch_size / self.rate
        if self._paced_at is None:
            self._paced_at = now
        self._paced_at = max(self._paced_at + period, now)
        return self._paced_at - now

    # -- connection ----------------------------------------------------------------------------

    def on_stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _connect(self, first: str | None = None) -> blocking.BlockingConnection:
        """A connection to ``first`` ("host:port") if given, else to the node active for this
        user's partition (the URL's other nodes after it, for failover)."""
        if self.conn is not None:
            self.conn.close()
        params = parse_url(self.url)
        hosts = [f"{h}:{p}" for h, p in params.hosts]
        if first is not None:
            hosts = [first, *(h for h in hosts if h != first)]
        # a consumer's reads time out (its task returns when no message comes); a producer's
        # wait for the confirm, across failovers, up to send_timeout
        timeout = self.consume_timeout if self._consuming else None
        conn = blocking.connect(format_url(params, ",".join(hosts)), client_name=f"locust-{self.index}",
                                timeout=timeout, send_timeout=self.send_timeout)
        self.conn = conn
        self._producer = None
        self._consumer = None
        if first is None:
            try:
                info = conn.declare_queue(self.queue, partitions=self.partitions)
            except QueueExistsError:  # declared otherwise by someone else: use it as it is
                info = conn.partition_map(self.queue).queue
            self._partition = self._my_partition(info)
            where = self._elsewhere()
            if where is not None:
                return self._connect(where)
        return conn

    def _my_partition(self, info: QueueInfo) -> int:
        """A producer's: the partition its key maps to (where all its messages go); a
        consumer's (or a keyless producer's): the queue's partitions in turn, one per user."""
        if not self._consuming and self.message_key is not None and info.mapper != "round_robin":
            return make_mapper(info.mapper, info.partitions, info.ring_size).partition(self.message_key)
        return self.index % max(1, info.partitions)

    def _elsewhere(self) -> str | None:
        """host:port of the node active for this user's partition when that is not the node
        this user is connected to; None when it is (or while the partition has no active)."""
        assert self.conn is not None
        pm = self.conn.partition_map(self.queue)
        if self._partition >= len(pm.actives) or not pm.actives[self._partition]:
            return None
        active = pm.actives[self._partition]
        return pm.addresses.get(active) if active != self.conn.node else None

    def _connect_or_fire(self) -> blocking.BlockingConnection | None:
        """:meth:`_connect`, or None after a ``connect`` failure event."""
        started = SYSTEM_CLOCK.monotonic()
        try:
            return self._connect()
        except (TandemError, OSError) as exc:
            self.conn = None
            self._fire("connect", started, 0, exc)
            SYSTEM_CLOCK.sleep_blocking(1.0)  # not a retry loop at full speed (gevent's sleep under locust)
            return None

    def _fire(self, kind: str, started: float, length: int, exc: BaseException | None = None,
              elapsed_ms: float | None = None) -> None:
        ms = elapsed_ms if elapsed_ms is not None else (SYSTEM_CLOCK.monotonic() - started) * 1000
        self.environment.events.request.fire(request_type=kind, name=self.queue, response_time=ms,
                                             response_length=length, exception=exc, context={})

    # -- hooks (the soak's ledger) ---------------------------------------------------------------

    def sending(self, first: int, count: int) -> None:
        """Messages ``first .. first+count-1`` of this user are about to be sent."""

    def confirmed(self, first: int, count: int, latency: float) -> None:
        """... were confirmed, ``latency`` seconds after the send."""

    def failed(self, first: int, count: int, exc: BaseException) -> None:
        """... failed with ``exc`` (their outcome is unknown: they may be stored)."""

    # -- the two tasks' bodies -------------------------------------------------------------------

    def publish(self, count: int | None = None) -> bool:
        """Publish one batch of ``count`` (default :attr:`batch_size`) stamped messages and wait
        for its confirm; one ``publish`` event.  False if it failed."""
        count = count or self.batch_size
        conn = self.conn if self.conn is not None else self._connect_or_fire()
        if conn is None:
            return False
        if self._producer is None:
            self._producer = conn.producer(self.queue)
        first = self.sent
        self.sent += count
        now = SYSTEM_CLOCK.time()
        bodies = [stamp(now, self.producer_tag, first + i, self.body_size) for i in range(count)]
        self.sending(first, count)
        started = SYSTEM_CLOCK.monotonic()
        try:
            if count == 1:
                self._producer.send(bodies[0], key=self.message_key)
            else:
                self._producer.send_many(bodies, key=self.message_key)
        except (TandemError, OSError) as exc:
            self.failed(first, count, exc)
            self._fire("publish", started, 0, exc)
            return False
        latency = SYSTEM_CLOCK.monotonic() - started
        self.confirmed(first, count, latency)
        self._fire("publish", started, count * self.body_size, elapsed_ms=latency * 1000)
        return True

    def consume(self, max_messages: int | None = None) -> int:
        """Take up to ``max_messages`` (default :attr:`consume_max`) messages, acking each;
        returns when none came for :attr:`consume_timeout` seconds.  One ``deliver`` event per
        stamped message (its end-to-end time) and one ``ack`` event per ack."""
        self._consuming = True
        now = SYSTEM_CLOCK.monotonic()
        if self.conn is None:
            if self._connect_or_fire() is None:
                return 0
        elif self.rebalance_every > 0 and now >= self._next_look:
            self._next_look = now + self.rebalance_every
            try:
                where = self._elsewhere()
                if where is not None:
                    self._connect(where)
            except TimeoutError_:
                pass  # the node is slow to answer: look again next time
            except (TandemError, OSError) as exc:
                self._fire("connect", now, 0, exc)
                self.conn = None
                return 0
        conn = self.conn
        assert conn is not None
        if self._consumer is None:
            # its node's partitions only (it connects to its partition's active): no relayed messages
            self._consumer = conn.consumer(self.queue, prefetch=self.prefetch, local=True)
        taken = 0
        for _ in range(max_messages or self.consume_max):
            try:
                m = self._consumer.next()
            except TimeoutError_:
                break  # nothing to take just now
            except TandemError as exc:
                self._fire("deliver", SYSTEM_CLOCK.monotonic(), 0, exc)
                self.conn = None  # a new connection next time
                break
            taken += 1
            st = read_stamp(m.body)
            if st is not None:
                e2e = max(0.0, SYSTEM_CLOCK.time() - st.sent_at) * 1000
                self._fire("deliver", 0.0, len(m.body), elapsed_ms=e2e)
            started = SYSTEM_CLOCK.monotonic()
            try:
                m.ack()
            except TandemError as exc:
                self._fire("ack", started, 0, exc)
                continue
            self._fire("ack", started, 0)
        return taken


def tandem_options(environment: Any) -> dict[str, Any]:
    """The ``--tandem-*`` options given on locust's command line (for a locustfile's own use)."""
    opts = getattr(environment, "parsed_options", None)
    return {n: getattr(opts, n) for n in OPTIONS if getattr(opts, n, None) is not None}


__all__ = ["OPTIONS", "TandemUser", "tandem_options"]
