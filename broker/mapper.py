"""Data mappers live in :mod:`client.mapper`: a durable connection maps messages to
partitions itself, with exactly the broker's code."""

from client.mapper import (DEFAULT_MAPPER, MAPPERS, ConsistentHashMapper, DataMapper, JumpHashMapper,
                           RoundRobinMapper, make_mapper)

__all__ = ["DEFAULT_MAPPER", "MAPPERS", "ConsistentHashMapper", "DataMapper", "JumpHashMapper", "RoundRobinMapper",
           "make_mapper"]
