"""Blocking AMQP clients for the group tests (tests/integration/test_amqp_group.py), each run in
a thread: pika's ``BlockingConnection`` and kombu's ``Connection``, each publishing with confirms
and then consuming with acks, and going to the next node of its list when the one it is on
fails, the way an application written for a RabbitMQ cluster does."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import kombu
import pika
import pika.exceptions

#: seconds between a failed request and the client's next try (a client's pacing, not a wait for a state)
PACE = 0.2


@dataclass
class Run:
    """What one client did: the bodies it had confirmed, the sends it repeated, what it consumed."""

    name: str
    confirmed: list[bytes] = field(default_factory=list)
    resent: int = 0
    got: list[bytes] = field(default_factory=list)


def pika_publish(urls: list[str], queue: str, n: int, run: Run, stop: threading.Event) -> None:
    params = [pika.URLParameters(u) for u in urls]
    conn: pika.BlockingConnection | None = None
    i = 0
    while i < n and not stop.is_set():
        try:
            if conn is None or conn.is_closed:
                conn = pika.BlockingConnection(params)  # (the first node of the list that answers)
                ch = conn.channel()
                ch.confirm_delivery()
            ch.basic_publish("", queue, f"{run.name}-{i}".encode(), mandatory=True)
            run.confirmed.append(f"{run.name}-{i}".encode())
            i += 1
        except (pika.exceptions.AMQPError, OSError):
            run.resent += 1  # (its outcome unknown: sent again)
            conn = None
            time.sleep(PACE)
    if conn is not None and conn.is_open:
        conn.close()


def pika_consume(urls: list[str], queue: str, run: Run, deadline: float) -> None:
    params = [pika.URLParameters(u) for u in urls]
    want = set(run.confirmed)
    while not want <= set(run.got) and time.monotonic() < deadline:
        try:
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)
                for method, _props, body in ch.consume(queue, inactivity_timeout=2):
                    if method is None:
                        if want <= set(run.got) or time.monotonic() > deadline:
                            break
                        continue
                    run.got.append(body)
                    ch.basic_ack(method.delivery_tag)
                ch.cancel()
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(PACE)


def kombu_publish(urls: list[str], queue: str, n: int, run: Run, stop: threading.Event) -> None:
    with kombu.Connection(";".join(urls), transport_options={"confirm_publish": True}) as conn:
        producer: kombu.Producer | None = None
        i = 0
        while i < n and not stop.is_set():
            try:
                if producer is None:
                    conn.ensure_connection(max_retries=50, interval_start=PACE, interval_step=PACE, interval_max=1)
                    producer = conn.Producer()
                producer.publish(f"{run.name}-{i}".encode(), routing_key=queue, exchange="", mandatory=True)
                run.confirmed.append(f"{run.name}-{i}".encode())
                i += 1
            except (*conn.connection_errors, *conn.channel_errors):
                run.resent += 1
                producer = None
                conn.close()  # (the next ensure_connection goes round the list: kombu's failover)
                time.sleep(PACE)


def kombu_consume(urls: list[str], queue: str, run: Run, deadline: float) -> None:
    want = set(run.confirmed)
    with kombu.Connection(";".join(urls)) as conn:
        while not want <= set(run.got) and time.monotonic() < deadline:
            try:
                conn.ensure_connection(max_retries=50, interval_start=PACE, interval_step=PACE, interval_max=1)
                with conn.SimpleQueue(kombu.Queue(queue, no_declare=True)) as sq:
                    while not want <= set(run.got) and time.monotonic() < deadline:
                        try:
                            m = sq.get(block=True, timeout=2)
                        except sq.Empty:
                            continue
                        run.got.append(m.body)
                        m.ack()
            except (*conn.connection_errors, *conn.channel_errors):
                conn.close()
                time.sleep(PACE)
