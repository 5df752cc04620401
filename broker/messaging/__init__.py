"""Messaging: queues, the catalogue, publish, delivery, streams, sequences, the mapper, the
commit seam (``commit``) and the kinds of forwarded requests (``forward``).

The lowest layer of broker: it imports no other broker package (only ``broker.config`` and
``broker.logsafe``).  Everything above may import it.
"""
