"""The AMQP 0-9-1 front door: pika, aio-pika and kombu clients on a node's amqp_port.

``wire`` is the sans-IO framing of a server's side of the connection (bytes in, events out;
methods in, bytes out), over pamqp's codec.
"""
