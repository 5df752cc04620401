"""Tandem client SDK: ``await client.connect(url)`` or ``client.blocking.connect(url)``."""

from client.connection import Connection, connect
from client.consumer import Consumer, Message
from client.producer import Producer

__all__ = ["Connection", "Consumer", "Message", "Producer", "connect"]
