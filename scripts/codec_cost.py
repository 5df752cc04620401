"""What encoding and decoding costs per message in the client protocol's frames.

    .venv/bin/python scripts/codec_cost.py

Encodes and decodes a ``Publish`` and a ``Deliver`` frame of 256 messages of 1 KiB with
``client.protocol.codec`` 2,000 times each and prints the time per message.  A diagnostic;
``tandem bench`` is the benchmark.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from client.protocol.codec import decode_payload, encode
from client.protocol.frames import Deliver, Delivery, Publish, PublishMessage

N = 256
ROUNDS = 2000


def per_message(name: str, fn: Callable[[], object]) -> None:
    fn()
    started = time.perf_counter()
    for _ in range(ROUNDS):
        fn()
    print(f"{name:16} {(time.perf_counter() - started) / ROUNDS / N * 1e6:.2f} us a message")


def main() -> None:
    body = os.urandom(1024)
    publish = Publish(rid=1, queue="q", messages=[PublishMessage(None, {}, body, i) for i in range(N)],
                      producer_id="p", partition=0)
    deliver = Deliver(consumer=1, messages=[Delivery(i, 0, i, None, {}, body, False, 1, 1.0, f"0-{i}")
                                            for i in range(N)])
    raw_publish, raw_deliver = encode(publish)[4:], encode(deliver)[4:]
    per_message("encode Publish", lambda: encode(publish))
    per_message("decode Publish", lambda: decode_payload(raw_publish))
    per_message("encode Deliver", lambda: encode(deliver))
    per_message("decode Deliver", lambda: decode_payload(raw_deliver))


if __name__ == "__main__":
    main()
