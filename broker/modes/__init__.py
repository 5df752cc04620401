"""HA modes: ``replicated`` (each member its own store, logs shipped between them) and
``shared`` (one PostgreSQL database, only the lease holder active).

The two are independent of each other.  Only ``broker.node`` imports this package: nothing
else asks which mode is running.
"""
