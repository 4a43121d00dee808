"""The database side of change data capture: checks, the publication, the slot.

The slot is read through PostgreSQL's SQL interface to logical decoding rather than the
streaming replication protocol: ``pg_logical_slot_peek_binary_changes`` decodes the
slot's changes *without consuming them*, and ``pg_replication_slot_advance`` moves the
slot on once the changes are committed to their topics. That split is exactly what an
exactly-once source needs (a change leaves the slot only after its batch and offset
committed, whatever crashes in between), it needs no driver beyond the ADBC one the JDBC
connectors use (psycopg 3 has no replication protocol), and its cost, a round trip per
poll, is small beside a batch's Spark job. The peek stops only at transaction ends, so
a poll never splits a transaction.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from herder.connectors.cdc.pgoutput import format_lsn, parse_lsn
from herder.connectors.jdbc.postgres import Database, DatabaseError, TableId, first_line, literal

if TYPE_CHECKING:
    from adbc_driver_manager.dbapi import Connection

log = logging.getLogger(__name__)

T = TypeVar("T")

ALL_TABLES = "all_tables"
FILTERED = "filtered"
DISABLED = "disabled"
AUTOCREATE_MODES = (ALL_TABLES, FILTERED, DISABLED)


class SetupError(DatabaseError):
    """The database is not ready for change data capture; the message says what to do."""


@dataclass(frozen=True)
class SlotState:
    exists: bool
    confirmed_flush: int = 0
    #: bytes of WAL the slot holds back: the current position minus its confirmed one
    lag_bytes: int = 0


class Slot:
    """One logical replication slot with ``pgoutput``, on a connection of its own.

    A slot serves one session at a time. When another holds it (a predecessor's server
    process still finishing a peek after its worker was killed, or a client reading the
    slot), a statement that needs it is tried again ``busy_retries`` times,
    ``busy_delay`` seconds apart, as Debezium's ``slot.max.retries`` and
    ``slot.retry.delay.ms`` do, before the task fails saying who holds it."""

    def __init__(
        self,
        database: Database,
        name: str,
        publication: str,
        *,
        busy_retries: int = 6,
        busy_delay: float = 10.0,
    ) -> None:
        self.database = database
        self.name = name
        self.publication = publication
        self.busy_retries = busy_retries
        self.busy_delay = busy_delay
        self.conn: Connection = database.connect(autocommit=True)
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(Exception):
            self.conn.close()

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        try:
            return self._run(sql, _fetch_rows)
        except DatabaseError:
            raise
        except Exception as exc:
            raise DatabaseError(f"{self.database.where()}: {first_line(exc)}") from exc

    def _run(self, sql: str, fetch: Callable[[Any], T]) -> T:
        """:meth:`_run_once`, again while another session holds the slot (bounded)."""
        attempt = 0
        while True:
            try:
                return self._run_once(sql, fetch)
            except Exception as exc:
                if not _slot_in_use(exc) or self._closed.is_set():
                    raise
                if attempt == self.busy_retries:
                    raise SetupError(
                        f"replication slot {self.name!r} on {self.database.where()} is held"
                        f" by another session ({first_line(exc)}) after {attempt} retries"
                        f" {self.busy_delay:g} s apart: stop whatever reads it (see"
                        " pg_stat_replication, or pg_replication_slots.active_pid), or give"
                        " this connector a slot of its own (slot.name)"
                    ) from exc
                attempt += 1
                # a wait of under a second (a drop while the task's own peek ends) is
                # routine; one that has lasted longer is news
                log.log(
                    logging.WARNING if attempt * self.busy_delay >= 1.0 else logging.DEBUG,
                    "replication slot %s is held by another session (%s); trying again in"
                    " %g s (%d of %d)",
                    self.name,
                    first_line(exc),
                    self.busy_delay,
                    attempt,
                    self.busy_retries,
                )
                if self._closed.wait(self.busy_delay):
                    raise

    def _run_once(self, sql: str, fetch: Callable[[Any], T]) -> T:
        """Run ``sql`` and ``fetch`` its result; once more on a new connection if the
        server dropped this one (a restart, ``pg_terminate_backend``, a network blip).

        What a running task asks can be repeated safely: reads, peeks (which leave the
        slot as it was) and advances (to a position, not by an amount). A setup statement
        that took effect before the connection went fails when repeated, saying what
        exists already."""
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(sql)
                return fetch(cursor)
        except Exception as exc:
            if self._closed.is_set() or not _connection_lost(exc):
                raise
            log.warning(
                "slot %s lost its connection to %s (%s); connecting again",
                self.name,
                self.database.where(),
                first_line(exc),
            )
            with contextlib.suppress(Exception):
                self.conn.close()
            try:
                self.conn = self.database.connect(autocommit=True)
            except DatabaseError as again:
                raise DatabaseError(
                    f"slot {self.name!r} lost its connection to {self.database.where()}"
                    f" ({first_line(exc)}) and cannot connect again: {again}; the task"
                    " resumes from its last committed position once it is restarted"
                ) from exc
        with self.conn.cursor() as cursor:
            cursor.execute(sql)
            return fetch(cursor)

    def value(self, sql: str) -> object:
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    # -- checks ----------------------------------------------------------------------------

    def check_server(self) -> None:
        """``wal_level=logical`` and a user allowed to replicate; SetupError saying how."""
        level = self.value("SELECT current_setting('wal_level')")
        if level != "logical":
            raise SetupError(
                f"wal_level is {level!r} on {self.database.where()}: change data capture needs"
                " wal_level=logical (run ALTER SYSTEM SET wal_level = logical; then restart"
                " PostgreSQL)"
            )
        user = self.database.user or str(self.value("SELECT current_user"))
        allowed = self.value(
            "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        if not allowed:
            raise SetupError(
                f"user {user!r} lacks the REPLICATION privilege on {self.database.where()}"
                f" (run ALTER ROLE {user} WITH REPLICATION;)"
            )

    # -- the publication -------------------------------------------------------------------

    def ensure_publication(self, mode: str, tables: Sequence[TableId]) -> None:
        """The publication exists (and, when ``filtered``, publishes ``tables``)."""
        exists = bool(
            self.value(
                f"SELECT count(*) FROM pg_publication WHERE pubname = {literal(self.publication)}"
            )
        )
        name = _ident(self.publication)
        if mode == DISABLED:
            if not exists:
                raise SetupError(
                    f"publication {self.publication!r} does not exist on"
                    f" {self.database.where()} and publication.autocreate.mode=disabled"
                    f" (run CREATE PUBLICATION {name} FOR TABLE …; or set"
                    " publication.autocreate.mode=filtered)"
                )
            return
        listed = ", ".join(t.sql for t in tables)
        try:
            if mode == ALL_TABLES and not exists:
                self.rows(f"CREATE PUBLICATION {name} FOR ALL TABLES")
            elif mode == FILTERED:
                if not tables:
                    raise SetupError(
                        "publication.autocreate.mode=filtered: no table matches table.include.list"
                    )
                verb = "ALTER" if exists else "CREATE"
                action = "SET TABLE" if exists else "FOR TABLE"
                self.rows(f"{verb} PUBLICATION {name} {action} {listed}")
        except SetupError:
            raise
        except DatabaseError as exc:
            raise SetupError(
                f"cannot create publication {self.publication!r}: {exc} (create it as a"
                " superuser, or grant this user CREATE on the database and ownership of"
                " the tables)"
            ) from exc
        log.info("publication %s on %s ready (%s)", self.publication, self.database.where(), mode)

    def published(self) -> set[TableId]:
        rows = self.rows(
            "SELECT schemaname, tablename FROM pg_publication_tables"
            f" WHERE pubname = {literal(self.publication)}"
        )
        return {TableId(str(s), str(t)) for s, t in rows}

    # -- the slot --------------------------------------------------------------------------

    def state(self) -> SlotState:
        rows = self.rows(
            "SELECT confirmed_flush_lsn::text,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, plugin"
            f" FROM pg_replication_slots WHERE slot_name = {literal(self.name)}"
            f" AND database = current_database()"
        )
        if not rows:
            return SlotState(False)
        flush, lag, plugin = rows[0]
        if plugin != "pgoutput":
            raise SetupError(
                f"slot {self.name!r} uses plugin {plugin!r}, not pgoutput"
                " (drop it, or name another slot in slot.name)"
            )
        return SlotState(True, parse_lsn(str(flush)), int(lag or 0))  # type: ignore[call-overload]

    def create(self) -> int:
        """A new slot; the position it starts decoding at."""
        try:
            lsn = self.value(
                "SELECT lsn::text FROM pg_create_logical_replication_slot"
                f"({literal(self.name)}, 'pgoutput')"
            )
        except DatabaseError as exc:
            raise SetupError(f"cannot create replication slot {self.name!r}: {exc}") from exc
        log.info("replication slot %s created at %s", self.name, lsn)
        return parse_lsn(str(lsn))

    def drop(self) -> None:
        self.rows(f"SELECT 1 FROM pg_drop_replication_slot({literal(self.name)})")
        log.info("replication slot %s dropped", self.name)

    def advance(self, lsn: int) -> None:
        """Confirm everything up to ``lsn``: the server may recycle that WAL."""
        self.rows(
            f"SELECT end_lsn::text FROM pg_replication_slot_advance({literal(self.name)},"
            f" {literal(format_lsn(lsn))}::pg_lsn)"
        )

    def flushed_lsn(self) -> int:
        """Where the WAL is written to disk: what decoding can reach now. (Transactions
        of the insert position beyond it, committed asynchronously, are not yet
        decodable: a position past them would skip them.)"""
        return parse_lsn(str(self.value("SELECT pg_current_wal_flush_lsn()::text")))

    def insert_lsn(self) -> int:
        """Where the next WAL record goes: a record boundary, so every transaction commits
        wholly before or wholly after it (unlike the flush position, which can fall in
        the middle of a record)."""
        return parse_lsn(str(self.value("SELECT pg_current_wal_insert_lsn()::text")))

    def peek(self, upto_lsn: int, max_changes: int) -> Iterator[tuple[int, bytes]]:
        """The slot's messages of transactions that commit before ``upto_lsn``, whole
        transactions until more than ``max_changes`` messages: (position, message)."""
        sql = (
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
            f"{literal(self.name)}, {literal(format_lsn(upto_lsn))}::pg_lsn, {int(max_changes)},"
            f" 'proto_version', '1', 'publication_names', {literal(self.publication)})"
        )
        try:
            table = self._run(sql, lambda cursor: cursor.fetch_arrow_table())
        except DatabaseError:
            raise  # says all already: the slot held too long, or no connection again
        except Exception as exc:
            text = first_line(exc)
            if "does not exist" in text and "publication" in text:
                raise SetupError(
                    f"publication {self.publication!r} was dropped from"
                    f" {self.database.where()}: {text}"
                ) from exc
            raise DatabaseError(f"slot {self.name!r} on {self.database.where()}: {text}") from exc
        for lsn, data in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
            yield parse_lsn(lsn), data


def _fetch_rows(cursor: Any) -> list[tuple[object, ...]]:
    return [tuple(r) for r in cursor.fetchall()] if cursor.description else []


def _slot_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` says another session holds the slot (SQLSTATE 55006)."""
    return getattr(exc, "sqlstate", None) == "55006" or "is active for PID" in str(exc)


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself is gone, not that a statement failed."""
    from adbc_driver_manager import AdbcStatusCode, OperationalError

    return isinstance(exc, OperationalError) and exc.status_code == AdbcStatusCode.IO


def _ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'
