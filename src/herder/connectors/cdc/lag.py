"""How far a CDC connector is behind its database, in bytes of WAL and in seconds.

Bytes are the slot's own figure: the server's current WAL position minus the position
the slot has confirmed (what the connector committed), the WAL the server must keep for
this connector. Seconds are the age of the oldest change the connector has not
committed yet: the commit time of the first transaction the slot still holds, 0 when it
holds none. That one takes a peek at the slot, so it is measured on a connection of its
own, and the caller keeps it from peeking at the same time as the task's poll (a slot
serves one reader at a time).

Both keep counting while the task is paused or down, which is when they matter: the
task's status shows them (``GET /connectors/<name>/status``, as ``lag``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from herder.connectors.cdc.pgoutput import Begin, decode
from herder.connectors.jdbc.postgres import Database, DatabaseError, first_line, literal

if TYPE_CHECKING:
    from adbc_driver_manager.dbapi import Connection

log = logging.getLogger(__name__)


class SlotLag:
    """Measures one slot's lag, on a connection opened on first use."""

    def __init__(self, database: Database, slot: str, publication: str) -> None:
        self.database = database
        self.slot = slot
        self.publication = publication
        self._conn: Connection | None = None

    def measure(self) -> dict[str, int | float] | None:
        """``{"bytes": …, "seconds": …}``, or None while the slot does not exist."""
        try:
            return self._measure()
        except Exception:
            # a broken connection is opened again at the next measure
            self.close()
            raise

    def _measure(self) -> dict[str, int | float] | None:
        rows = self._rows(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint"
            f" FROM pg_replication_slots WHERE slot_name = {literal(self.slot)}"
            " AND database = current_database()"
        )
        if not rows:
            return None
        lag_bytes = max(0, int(rows[0][0] or 0))  # type: ignore[call-overload]
        oldest = self._oldest_commit_micros() if lag_bytes else None
        seconds = 0.0
        if oldest is not None:
            seconds = max(0.0, round(time.time() - oldest / 1_000_000, 3))
        return {"bytes": lag_bytes, "seconds": seconds}

    def _oldest_commit_micros(self) -> int | None:
        """The commit time of the first transaction the slot holds (None if none): its
        Begin message, the first the peek gives (the server still decodes that whole
        transaction, but only the one row comes back)."""
        rows = self._rows(
            "SELECT data FROM pg_logical_slot_peek_binary_changes("
            f"{literal(self.slot)}, NULL, 1, 'proto_version', '1',"
            f" 'publication_names', {literal(self.publication)}) LIMIT 1"
        )
        for (data,) in rows:
            message = decode(data)  # type: ignore[arg-type]
            if isinstance(message, Begin):
                return message.commit_micros
        return None

    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        if self._conn is None:
            self._conn = self.database.connect(autocommit=True)
        try:
            with self._conn.cursor() as cursor:
                cursor.execute(sql)
                return [tuple(r) for r in cursor.fetchall()]
        except Exception as exc:
            raise DatabaseError(
                f"measuring the lag of slot {self.slot!r} on {self.database.where()}:"
                f" {first_line(exc)}"
            ) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
