"""The locustfile ``tandem load`` runs unless given another: producers and consumers of one
queue, half and half (``--tandem-*`` options set the queue, body size, batch and rate).

Loaded by locust only (``locust -f``): it imports locust, which monkey-patches the process.
"""

from __future__ import annotations

from locust import task

from client.locust import TandemUser


class Producer(TandemUser):
    """Publishes stamped messages at :attr:`rate` a second (``--tandem-rate``)."""

    rate = 100.0

    @task
    def send(self) -> None:
        self.publish()


class Consumer(TandemUser):
    """Consumes and acks; each message's publish-to-delivery time is a ``deliver`` event."""

    @task
    def receive(self) -> None:
        self.consume()
