"""Reads of the SQLite store on a reader thread's connection, each in one read
transaction (one snapshot of the database, whatever the writer commits meanwhile)."""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from client.errors import StorageError
from storage.base import PartitionState, StoredMessage, unpack_run
from storage.intervals import IntervalSet


def read_partition(conn: Connection, queue_id: int, partition: int) -> PartitionState:
    st = PartitionState()
    key = (queue_id, partition)
    try:
        with conn.begin():
            row = conn.exec_driver_sql(
                "SELECT next_offset, delivered_upto FROM partitions WHERE queue_id = ? AND partition = ?",
                key).first()
            if row is not None:
                st.next_offset, st.delivered_upto = row
            settled = IntervalSet(conn.exec_driver_sql(
                'SELECT start, "end" FROM settled WHERE queue_id = ? AND partition = ?', key).all())
            dcs: dict[int, int] = dict(conn.exec_driver_sql(
                'SELECT "offset", dc FROM counts WHERE queue_id = ? AND partition = ?', key).all())
            for start, payload in conn.exec_driver_sql(
                    "SELECT start, payload FROM chunks WHERE queue_id = ? AND partition = ? ORDER BY start", key):
                for m in unpack_run(start, payload):
                    if not settled.contains(m.offset):
                        m.dc = dcs.get(m.offset, 0) + (1 if m.offset < st.delivered_upto else 0)
                        st.messages.append(m)
            if st.messages and st.messages[-1].offset >= st.next_offset:
                st.next_offset = st.messages[-1].offset + 1
            st.producers = dict(conn.exec_driver_sql(
                "SELECT producer_id, last_seq FROM producers WHERE queue_id = ? AND partition = ?", key).all())
            pos = conn.exec_driver_sql("SELECT applied_index, applied_term, applied_origin FROM ha_state "
                                       "WHERE queue_id = ? AND partition = ?", key).first()
            if pos is not None:
                st.applied = (pos[0], pos[1], pos[2])
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {exc}", orig=exc) from exc
    return st


def read_stored_end(conn: Connection, queue_id: int, partition: int) -> int:
    try:
        with conn.begin():
            end = conn.exec_driver_sql("SELECT next_offset FROM partitions WHERE queue_id = ? AND partition = ?",
                                       (queue_id, partition)).scalar()
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {exc}", orig=exc) from exc
    return int(end or 0)


def read_messages(conn: Connection, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    try:
        with conn.begin():
            settled = IntervalSet(conn.exec_driver_sql(
                'SELECT start, "end" FROM settled WHERE queue_id = ? AND partition = ? AND "end" > ?',
                (queue_id, partition, offset)).all())
            first = conn.exec_driver_sql(
                "SELECT start FROM chunks WHERE queue_id = ? AND partition = ? AND start <= ? "
                "ORDER BY start DESC LIMIT 1", (queue_id, partition, offset)).scalar()
            rows = conn.exec_driver_sql(
                "SELECT start, payload FROM chunks WHERE queue_id = ? AND partition = ? AND start >= ? "
                "ORDER BY start", (queue_id, partition, offset if first is None else first))
            for start, payload in rows:
                for m in unpack_run(start, payload):
                    if m.offset >= offset and not settled.contains(m.offset):
                        out.append(m)
                        if len(out) >= limit:
                            return out
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {exc}", orig=exc) from exc
    return out
