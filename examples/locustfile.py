"""A locustfile for Tandem: three producers for every consumer, 1 KiB messages in batches of 10.

    locust -f examples/locustfile.py --host tandem://admin:PW@127.0.0.1:7780
        (the web UI at http://localhost:8089: users, spawn rate, live charts)
    locust -f examples/locustfile.py --host tandem://admin:PW@127.0.0.1:7780 \\
        --headless -u 20 -r 5 -t 1m --csv out/locust --html out/report.html
    tandem load --url tandem://admin:PW@127.0.0.1:7780 --locustfile examples/locustfile.py

Options on locust's command line override the class attributes below: --tandem-queue,
--tandem-partitions, --tandem-body-size, --tandem-batch-size, --tandem-rate, --tandem-prefetch.
"""

from __future__ import annotations

from locust import task

from client.locust import TandemUser


class OrderProducer(TandemUser):
    weight = 3
    queue = "orders"
    body_size = 1024
    batch_size = 10
    rate = 200.0  # messages a second, per user: 20 batches

    @task
    def send(self) -> None:
        self.publish()


class OrderConsumer(TandemUser):
    weight = 1
    queue = "orders"
    prefetch = 200

    @task
    def receive(self) -> None:
        self.consume()
