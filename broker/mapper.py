"""Data mappers live in :mod:`client.mapper`: a durable connection maps messages to
partitions itself, with exactly the broker's code."""

from client.mapper import MAPPERS, ConsistentHashMapper, DataMapper, RoundRobinMapper, make_mapper

__all__ = ["MAPPERS", "ConsistentHashMapper", "DataMapper", "RoundRobinMapper", "make_mapper"]
