"""The embedded default engine: one SQLite database per node, WAL mode, via SQLAlchemy Core.

Layout: the log is stored in *chunks*, one row per appended batch of a
partition (as a publish frame is one batch), not one row per message; a
message is settled by recording its offset range, and a chunk is deleted once
every message in it is settled.  So a batch of 256 messages costs one row
insert and, later, one range row and one delete, instead of 256 inserts, 256
deletes and 256 updates: SQLite's per-row cost (and the GIL hand-offs of the
``sqlite3`` module, one per row) stay off the hot path.

The replication log is not in the database: it is kept in append-only segment files
beside it (``tandem.db-log/``, ``storage/segments.py``, which says why).

Durability maps onto SQLite's own machinery: ``sync=True`` commits with
``PRAGMA synchronous=FULL`` (the WAL is fsynced before the commit returns);
``sync=False`` with ``synchronous=NORMAL`` (WAL frames written to the OS,
fsynced at the next checkpoint).  Torn writes: every WAL frame carries a
checksum chained over the frames before it and a commit is a frame with the
commit flag; on open SQLite replays the WAL only up to the last intact commit,
so a partial last write is ignored (``tests/storage/test_recovery.py``).

Modules:

* ``schema``: the tables (documented there), their creation and upgrade;
* ``apply``: a batch of write ops as statements in the writer's transaction, and the
  writer's index of chunks and settled ranges;
* ``recovery``: what opening finds, in the tables and in the log's segments;
* ``reads``: the reads of reader threads;
* ``checkpoints``: copying the WAL into the database outside of commits;
* ``engine``: :class:`SqliteEngine`, which holds the connections and ties these together.
"""

from storage.sqlite.engine import SqliteEngine

__all__ = ["SqliteEngine"]
