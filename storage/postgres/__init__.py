"""Shared mode's store on PostgreSQL (``database = "postgresql+psycopg://USER@HOST:PORT/DB"``),
via SQLAlchemy 2 Core and psycopg 3.

Every node of a group uses the one database.  The tables are SQLite's logical schema
(``schema``) and the statements, reads and recovery are SQLite's own modules
(``storage.sqlite.apply``, ``reads``, ``recovery``), run through an adapter that spells
placeholders as psycopg takes them and overrides the few statements whose SQL differs
(``engine.PgApplier``).  Group commit as in SQLite: one transaction per batch, the rows of
each statement sent with ``executemany`` (pipelined by psycopg).  ``sync`` maps to
``synchronous_commit``: ``on`` for SYNC, ``off`` otherwise (the server flushes the WAL
within ``wal_writer_delay``).  No replication log: the replication ops are refused
(``Capabilities.replication_log`` is false).

Fencing.  A fenced engine (:meth:`PostgresEngine.fence`) starts every write transaction
with ``SELECT epoch FROM tandem_lease WHERE id = 1 FOR SHARE`` and refuses to go on
(:class:`~storage.shared.FencedError`, rollback) unless the epoch is its own.  A takeover
is an ``UPDATE`` of that row (``epoch = epoch + 1``, ``storage.lease``).  ``FOR SHARE``
conflicts with ``FOR UPDATE`` and ``FOR NO KEY UPDATE``, the lock an ``UPDATE`` takes, so:

* a takeover waits for every write transaction holding the lock, i.e. one that has passed
  its check commits (or aborts) before the new epoch exists;
* a write transaction starting after the takeover waits for it and then, in READ COMMITTED,
  reads the row's newest version: the new epoch, and is refused.

So no row of a stale node is ever committed after the takeover is granted.  ``FOR KEY
SHARE`` would not do: it conflicts only with ``FOR UPDATE`` (deletes and updates of key
columns), and an ``UPDATE`` of non-key columns takes ``FOR NO KEY UPDATE``, which it lets
through: the takeover would not wait, and a transaction that read epoch N could commit after
epoch N + 1 was granted.

A node stopped (SIGSTOP, a long GC pause) inside a write transaction would hold that lock,
and so block the takeover, for as long as it is stopped.  Two things end such a transaction
(``idle_timeout``, default 2 s): the writer's session sets ``idle_in_transaction_session_timeout``,
so the server ends it, and since that timer is not always armed (not after a pipelined
``executemany``, whose trailing flush disarms it), a takeover that waited ``idle_timeout`` for
the row ends the sessions that lock it and have been idle in their transaction for longer
(``shared.PgLease``), then tries again.  The stopped node's commit then fails: nothing of it
is in the database.

Connection errors are :class:`~client.errors.StorageError` naming the database by its URL
without the password.  The writer reconnects by itself on its next batch (reloading its
index of the tables), and pooled reader connections are checked before use, so a database
back after an outage is used again without a restart.
"""

from storage.postgres.engine import PostgresEngine
from storage.postgres.shared import PostgresShared

__all__ = ["PostgresEngine", "PostgresShared"]
