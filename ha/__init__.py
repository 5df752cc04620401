"""Replication groups as sans-IO state machines: membership, placement, partition
lifecycle, and per-partition elections and log replication (docs/ha.md)."""
