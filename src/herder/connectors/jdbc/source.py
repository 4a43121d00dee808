"""JdbcSource: tables (or a query) of a PostgreSQL database into topics, exactly once.

Config names and offsets are those of Confluent's JDBC source connector. Each table is a
source partition (``{"protocol": "1", "table": "<db>.<schema>.<table>"}``, or
``{"query": "query"}`` for a custom ``query``), and its offset says how far it was read:
``{"incrementing": id}``, ``{"timestamp": ms, "timestamp_nanos": ns}``, or all three.

Each poll plans one batch of one table before anything is read: the window of rows it
takes (``mode=incrementing``: ids past the offset, up to the ``batch.max.rows``-th;
``timestamp``: timestamps past the offset and older than ``timestamp.delay.interval.ms``;
``timestamp+incrementing``: (timestamp, id) pairs past the offset's, so rows sharing a
timestamp are neither lost nor read twice; ``bulk``: the whole table, every
``poll.interval.ms``) and the offset the batch reaches. The window's rows are read on
Spark's executors (:mod:`.reading`), cut into ranges of a numeric key (the incrementing
column, or a one-column integer primary key) when there are more than
``parallel.min.rows`` of them, and each row becomes a typed record, a struct of the
row's columns with their types (:mod:`herder.dataplane.typed`): the batch and its
offset commit in one transaction.

Tables are spread over ``tasks.max`` tasks; the connector looks for new and dropped
tables every ``table.poll.interval.ms`` and has the tasks reconfigured when the set
changes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, ConfigValue, Importance, Range, Type, ValidString
from herder.connect import SourceBatch, SourceConnector, SourceTask
from herder.connectors.jdbc.postgres import (
    Column,
    Database,
    DatabaseError,
    TableId,
    first_line,
    list_tables,
    primary_key,
    query_columns,
    quote,
    spark_schema,
    table_columns,
)
from herder.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from adbc_driver_manager.dbapi import Connection

log = logging.getLogger(__name__)

VERSION = "1.0"
CONNECTION_URL = "connection.url"
CONNECTION_USER = "connection.user"
CONNECTION_PASSWORD = "connection.password"
CONNECTION_ATTEMPTS = "connection.attempts"
CONNECTION_BACKOFF_MS = "connection.backoff.ms"
TABLE_WHITELIST = "table.whitelist"
TABLE_BLACKLIST = "table.blacklist"
QUERY = "query"
MODE = "mode"
INCREMENTING_COLUMN = "incrementing.column.name"
TIMESTAMP_COLUMN = "timestamp.column.name"
TIMESTAMP_DELAY_MS = "timestamp.delay.interval.ms"
VALIDATE_NON_NULL = "validate.non.null"
POLL_INTERVAL_MS = "poll.interval.ms"
BATCH_MAX_ROWS = "batch.max.rows"
TOPIC_PREFIX = "topic.prefix"
TABLE_POLL_INTERVAL_MS = "table.poll.interval.ms"
PARALLEL_MIN_ROWS = "parallel.min.rows"
PARALLEL_SPLIT_ROWS = "parallel.split.rows"
#: Set on each task's config: the tables it reads, comma-separated.
TABLES = "tables"

BULK = "bulk"
INCREMENTING = "incrementing"
TIMESTAMP = "timestamp"
TIMESTAMP_INCREMENTING = "timestamp+incrementing"
MODES = (BULK, INCREMENTING, TIMESTAMP, TIMESTAMP_INCREMENTING)
_INTEGER_TYPES = ("smallint", "integer", "bigint")


def connection_config(defs: ConfigDef) -> ConfigDef:
    """The connection keys JdbcSource and JdbcSink share."""
    return (
        defs.define(CONNECTION_URL, Type.STRING, importance=Importance.HIGH,
                    documentation="The database: jdbc:postgresql://host[:port]/database"
                    "[?param=value&…], libpq's parameters.")
        .define(CONNECTION_USER, Type.STRING, default="", importance=Importance.HIGH,
                documentation="The user to connect as.")
        .define(CONNECTION_PASSWORD, Type.PASSWORD, default="", importance=Importance.HIGH,
                documentation="The user's password (config providers work: ${file:…}).")
        .define(CONNECTION_ATTEMPTS, Type.INT, default=3, validator=Range.at_least(1),
                importance=Importance.LOW,
                documentation="How many times to try connecting before failing.")
        .define(CONNECTION_BACKOFF_MS, Type.LONG, default=10_000, validator=Range.at_least(0),
                importance=Importance.LOW, documentation="The wait between those attempts.")
    )  # fmt: skip


def database_of(settings: Mapping[str, Any]) -> Database:
    password = settings[CONNECTION_PASSWORD]
    return Database.from_url(
        settings[CONNECTION_URL],
        settings[CONNECTION_USER],
        password.value if hasattr(password, "value") else str(password or ""),
    )


def connect_with_retries(
    database: Database, settings: Mapping[str, Any], stopping: threading.Event | None = None
) -> Connection:
    """A connection, after up to ``connection.attempts`` tries ``connection.backoff.ms``
    apart; the last failure if none works."""
    attempts = settings[CONNECTION_ATTEMPTS]
    for attempt in range(1, attempts + 1):
        try:
            return database.connect()
        except DatabaseError as exc:
            if attempt == attempts or "password authentication failed" in str(exc):
                raise
            log.warning("%s (attempt %d of %d)", exc, attempt, attempts)
            wait = settings[CONNECTION_BACKOFF_MS] / 1000
            if stopping is not None and stopping.wait(wait):
                raise
            if stopping is None:
                time.sleep(wait)
    raise AssertionError("unreachable")


class JdbcSourceConnector(SourceConnector):
    """Tables of a PostgreSQL database (or one query) into topics ``topic.prefix`` + table."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            connection_config(ConfigDef())
            .define(TABLE_WHITELIST, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Tables to read (name or schema.name); empty for all but"
                    " the blacklisted.")
            .define(TABLE_BLACKLIST, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Tables not to read.")
            .define(QUERY, Type.STRING, default="", importance=Importance.MEDIUM,
                    documentation="A SELECT to read instead of tables; its rows go to the"
                    " topic named by topic.prefix.")
            .define(MODE, Type.STRING, validator=ValidString.in_(*MODES),
                    importance=Importance.HIGH,
                    documentation="bulk, incrementing, timestamp or timestamp+incrementing.")
            .define(INCREMENTING_COLUMN, Type.STRING, default="", importance=Importance.MEDIUM,
                    documentation="A strictly increasing integer column (incrementing modes).")
            .define(TIMESTAMP_COLUMN, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Timestamp columns, the first non-null one counting"
                    " (timestamp modes).")
            .define(TIMESTAMP_DELAY_MS, Type.LONG, default=0, validator=Range.at_least(0),
                    importance=Importance.LOW,
                    documentation="How old a timestamp must be before its row is read, for"
                    " transactions still writing rows with earlier timestamps.")
            .define(VALIDATE_NON_NULL, Type.BOOLEAN, default=True, importance=Importance.LOW,
                    documentation="Fail when an incrementing or timestamp column may hold"
                    " NULLs (such rows would never be read).")
            .define(POLL_INTERVAL_MS, Type.INT, default=5_000, validator=Range.at_least(1),
                    importance=Importance.HIGH,
                    documentation="How often each table is read for new data.")
            .define(BATCH_MAX_ROWS, Type.INT, default=1_000_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="Most rows one batch of a table takes (one Spark job and"
                    " one commit; the rest follow at once).")
            .define(TOPIC_PREFIX, Type.STRING, importance=Importance.HIGH,
                    documentation="Prefix of each table's topic; the topic itself with a"
                    " query.")
            .define(TABLE_POLL_INTERVAL_MS, Type.LONG, default=60_000,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="How often to look for new or dropped tables.")
            .define(PARALLEL_MIN_ROWS, Type.LONG, default=100_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="Batches of more rows are read in parallel by key ranges.")
            .define(PARALLEL_SPLIT_ROWS, Type.LONG, default=500_000,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="About how many rows each parallel read takes (fewer when"
                    " that gives every core the same share).")
        )  # fmt: skip

    def validate(self, config: Mapping[str, str]) -> dict[str, ConfigValue]:
        results = super().validate(config)
        if any(v.errors for v in results.values()):
            return results
        settings = self.config_def().parse(config)
        try:
            plan = _Settings(settings)
            with database_of(settings).connect() as conn:
                for name in plan.table_names(conn) if not plan.query else []:
                    _TableReader.describe(conn, plan, TableId.parse(name))
                if plan.query:
                    _TableReader.describe(conn, plan, None)
        except ConfigError as exc:
            key = _key_of(str(exc))
            results[key].errors.append(str(exc))
        return results

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)
        self.settings = self.config_def().parse(config)
        self.plan = _Settings(self.settings)
        self.database = database_of(self.settings)
        self._stopping = threading.Event()
        self.tables: list[str] = []
        if not self.plan.query:
            with connect_with_retries(self.database, self.settings) as conn:
                self.tables = self.plan.table_names(conn)
            self._monitor = threading.Thread(
                target=self._watch_tables, name=f"jdbc-tables-{self.database.where()}", daemon=True
            )
            self._monitor.start()

    def _watch_tables(self) -> None:
        interval = self.settings[TABLE_POLL_INTERVAL_MS] / 1000
        while not self._stopping.wait(interval):
            try:
                with self.database.connect() as conn:
                    tables = self.plan.table_names(conn)
            except Exception as exc:
                log.warning("JdbcSource: cannot list the tables of %s: %s", self.database, exc)
                continue
            if tables != self.tables:
                log.info("JdbcSource: tables of %s are now %s", self.database.where(), tables)
                self.tables = tables
                self.context.request_task_reconfiguration()

    def task_class(self) -> type[SourceTask]:
        return JdbcSourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        if self.plan.query:
            return [dict(self.config)]
        count = min(max_tasks, len(self.tables))
        return [{**self.config, TABLES: ",".join(self.tables[i::count])} for i in range(count)]

    def stop(self) -> None:
        if hasattr(self, "_stopping"):
            self._stopping.set()


def _key_of(message: str) -> str:
    """The config key a validation failure belongs to: the one its message starts with."""
    for key in (INCREMENTING_COLUMN, TIMESTAMP_COLUMN, QUERY, TABLE_WHITELIST, TABLE_BLACKLIST):
        if message.startswith(f"{key}:") or message.startswith(f"{key} "):
            return key
    if "password" in message:
        return CONNECTION_PASSWORD
    return CONNECTION_URL


class _Settings:
    """The parsed config, checked for keys that go together."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.mode: str = settings[MODE]
        self.query: str = settings[QUERY].strip().rstrip(";")
        self.whitelist: list[str] = [t for t in settings[TABLE_WHITELIST] if t]
        self.blacklist: list[str] = [t for t in settings[TABLE_BLACKLIST] if t]
        self.incrementing: str = settings[INCREMENTING_COLUMN]
        self.timestamps: list[str] = [c for c in settings[TIMESTAMP_COLUMN] if c]
        self.delay_ms: int = settings[TIMESTAMP_DELAY_MS]
        self.validate_non_null: bool = settings[VALIDATE_NON_NULL]
        self.topic_prefix: str = settings[TOPIC_PREFIX]
        self.max_rows: int = settings[BATCH_MAX_ROWS]
        self.parallel_min_rows: int = settings[PARALLEL_MIN_ROWS]
        self.split_rows: int = settings[PARALLEL_SPLIT_ROWS]
        if self.whitelist and self.blacklist:
            raise ConfigError(f"{TABLE_WHITELIST}: cannot be set with {TABLE_BLACKLIST}")
        if self.query and (self.whitelist or self.blacklist):
            raise ConfigError(f"{QUERY}: cannot be set with {TABLE_WHITELIST} or {TABLE_BLACKLIST}")
        if self.mode in (INCREMENTING, TIMESTAMP_INCREMENTING) and not self.incrementing:
            raise ConfigError(f"{INCREMENTING_COLUMN}: required with mode={self.mode}")
        if self.mode in (TIMESTAMP, TIMESTAMP_INCREMENTING) and not self.timestamps:
            raise ConfigError(f"{TIMESTAMP_COLUMN}: required with mode={self.mode}")

    def table_names(self, conn: Connection) -> list[str]:
        """The tables to read, as ``schema.name`` or ``name`` (public)."""
        found = {str(t): t for t in list_tables(conn)}
        if self.whitelist:
            missing = [t for t in self.whitelist if str(TableId.parse(t)) not in found]
            if missing:
                raise DatabaseError(
                    f"{TABLE_WHITELIST}: no table {', '.join(missing)} in the database"
                )
            return sorted(str(TableId.parse(t)) for t in self.whitelist)
        skipped = {str(TableId.parse(t)) for t in self.blacklist}
        return sorted(name for name in found if name not in skipped)


@dataclass
class _Window:
    """The rows of one planned batch: an SQL condition, and the offset it reaches."""

    condition: str
    offset: dict[str, Any] | None
    #: how many rows it holds (at most this many, when ``exact`` is false: the span of
    #: its unique keys)
    rows: int
    low: int | None
    high: int | None
    full: bool
    exact: bool = True


class _TableReader:
    """Reads one table (or the query): plans each batch from its offset."""

    def __init__(
        self,
        plan: _Settings,
        database: Database,
        table: TableId | None,
        columns: list[Column],
        split_column: str | None,
        offset: dict[str, Any] | None,
        unique_split: bool = False,
    ) -> None:
        self.plan = plan
        self.database = database
        self.table = table
        self.columns = columns
        self.split_column = split_column
        #: whether no two rows share a value of the split column (the primary key)
        self.unique_split = unique_split
        self.offset = offset
        self.next_poll = 0.0
        if table is None:
            self.base = plan.query
            self.partition: dict[str, Any] = {"query": "query"}
            self.topic = plan.topic_prefix
            self.what = "the query"
        else:
            self.base = f"SELECT * FROM {table.sql}"
            self.partition = {
                "protocol": "1",
                "table": f"{database.database}.{table.schema}.{table.name}",
            }
            self.topic = plan.topic_prefix + table.name
            self.what = f"table {table}"
        self.schema = spark_schema(columns, self.what)
        self.timestamp_type = "timestamp"
        if plan.timestamps:
            types = {c.name: c.pg_type for c in columns}
            if types.get(plan.timestamps[0]) == "timestamp with time zone":
                self.timestamp_type = "timestamptz"

    @staticmethod
    def describe(
        conn: Connection, plan: _Settings, table: TableId | None
    ) -> tuple[list[Column], str | None, bool]:
        """A table's (or the query's) columns, checked against the mode's; the column to
        split reads by; and whether that column is the table's primary key (its values
        unique). DatabaseError naming the table and column if wrong."""
        if table is None:
            try:
                columns = query_columns(conn, plan.query)
            except DatabaseError:
                raise
            except Exception as exc:
                conn.rollback()
                raise DatabaseError(f"{QUERY}: {first_line(exc)}") from exc
            what, keys = "the query", []
        else:
            columns = table_columns(conn, table)
            if not columns:
                raise DatabaseError(f"{TABLE_WHITELIST}: table {table} does not exist")
            what, keys = f"table {table}", primary_key(conn, table)
        by_name = {c.name: c for c in columns}
        needed = []
        if plan.mode in (INCREMENTING, TIMESTAMP_INCREMENTING):
            needed.append((INCREMENTING_COLUMN, plan.incrementing))
        if plan.mode in (TIMESTAMP, TIMESTAMP_INCREMENTING):
            needed += [(TIMESTAMP_COLUMN, c) for c in plan.timestamps]
        for key, name in needed:
            column = by_name.get(name)
            if column is None:
                raise DatabaseError(f"{key}: {what} has no column {name!r}")
            if key == INCREMENTING_COLUMN and column.pg_type not in _INTEGER_TYPES:
                raise DatabaseError(
                    f"{key}: column {name!r} of {what} is {column.pg_type}, not an integer"
                )
            if key == TIMESTAMP_COLUMN and not column.pg_type.startswith("timestamp"):
                raise DatabaseError(
                    f"{key}: column {name!r} of {what} is {column.pg_type}, not a timestamp"
                )
            if (
                plan.validate_non_null
                and column.nullable
                and table is not None
                and not (key == TIMESTAMP_COLUMN and len(plan.timestamps) > 1)
            ):
                raise DatabaseError(
                    f"{key}: column {name!r} of {what} is nullable; rows where it is NULL"
                    f" would never be read (make it NOT NULL, or set {VALIDATE_NON_NULL}=false)"
                )
        try:
            spark_schema(columns, what)  # every type maps
        except DatabaseError as exc:
            raise DatabaseError(f"{QUERY if table is None else TABLE_WHITELIST}: {exc}") from exc
        split = None
        if plan.mode in (INCREMENTING, TIMESTAMP_INCREMENTING):
            split = plan.incrementing
        elif len(keys) == 1 and by_name[keys[0]].pg_type in _INTEGER_TYPES:
            split = keys[0]
        return columns, split, split is not None and list(keys) == [split]

    # -- planning ----------------------------------------------------------------------

    @property
    def _ts(self) -> str:
        names = [quote(c) for c in self.plan.timestamps]
        return names[0] if len(names) == 1 else f"COALESCE({', '.join(names)})"

    def _ts_literal(self, micros: int) -> str:
        if self.timestamp_type == "timestamptz":
            return f"(TIMESTAMPTZ 'epoch' + {micros} * INTERVAL '1 microsecond')"
        return f"(TIMESTAMP 'epoch' + {micros} * INTERVAL '1 microsecond')"

    def _micros(self, sql: str) -> str:
        return f"(EXTRACT(EPOCH FROM {sql}) * 1000000)::bigint"

    def plan_batch(self, conn: Connection) -> _Window | None:
        """The next batch's window and offset, or None if it has no rows."""
        mode, inc = self.plan.mode, quote(self.plan.incrementing)
        conditions = []
        if mode in (TIMESTAMP, TIMESTAMP_INCREMENTING):
            now = "now()" if self.timestamp_type == "timestamptz" else "LOCALTIMESTAMP"
            conditions.append(f"{self._ts} < {now} - INTERVAL '{self.plan.delay_ms} milliseconds'")
        if self.offset is not None:
            if mode == INCREMENTING:
                conditions.append(f"{inc} > {int(self.offset[INCREMENTING])}")
            elif mode == TIMESTAMP:
                conditions.append(f"{self._ts} > {self._ts_literal(_offset_micros(self.offset))}")
            elif mode == TIMESTAMP_INCREMENTING:
                last = self._ts_literal(_offset_micros(self.offset))
                conditions.append(
                    f"({self._ts}, {inc}) > ({last}, {int(self.offset[INCREMENTING])})"
                )
        window = " AND ".join(conditions) or "TRUE"
        if (
            mode == INCREMENTING
            and self.split_column == self.plan.incrementing
            and self.unique_split
        ):
            # keys that are unique and span at most batch.max.rows values are at most that
            # many rows: the batch is all of them, known from the key's index at once
            # (their number is what the span says at most: pieces are cut by it)
            bounds = self._one(
                conn, f"SELECT min({inc}), max({inc}) FROM ({self.base}) AS q WHERE {window}"
            )
            low, high = bounds if bounds is not None else (None, None)
            if low is None or high is None:
                return None
            span = int(high) - int(low) + 1
            if span <= self.plan.max_rows:
                window += f" AND {inc} <= {int(high)}"
                reached = {INCREMENTING: int(high)}
                return _Window(window, reached, span, low, high, full=False, exact=False)
        order = {
            INCREMENTING: [inc],
            TIMESTAMP: [self._ts],
            TIMESTAMP_INCREMENTING: [self._ts, inc],
        }.get(mode)
        offset = None
        full = False
        if order is not None:
            # the last row of the batch: the batch.max.rows-th in order, or the last one
            keys = ", ".join(self._micros(o) if o == self._ts else o for o in order)
            limit = self.plan.max_rows
            sql = (
                f"SELECT {keys} FROM ({self.base}) AS q WHERE {window}"
                f" ORDER BY {', '.join(order)} OFFSET {limit - 1} LIMIT 1"
            )
            row = self._one(conn, sql)
            full = row is not None
            if row is None:
                sql = (
                    f"SELECT {keys} FROM ({self.base}) AS q WHERE {window}"
                    f" ORDER BY {', '.join(f'{o} DESC' for o in order)} LIMIT 1"
                )
                row = self._one(conn, sql)
                if row is None:
                    return None
            if mode == INCREMENTING:
                window += f" AND {inc} <= {int(row[0])}"
                offset = {INCREMENTING: int(row[0])}
            elif mode == TIMESTAMP:
                window += f" AND {self._ts} <= {self._ts_literal(int(row[0]))}"
                offset = _timestamp_offset(int(row[0]))
            else:
                window += (
                    f" AND ({self._ts}, {inc}) <= ({self._ts_literal(int(row[0]))}, {int(row[1])})"
                )
                offset = {**_timestamp_offset(int(row[0])), INCREMENTING: int(row[1])}
        rows, low, high = 0, None, None
        if self.split_column is not None:
            key = quote(self.split_column)
            stats = self._one(
                conn,
                f"SELECT count(*), min({key}), max({key}) FROM ({self.base}) AS q WHERE {window}",
            )
            assert stats is not None
            rows, low, high = int(stats[0]), stats[1], stats[2]
            if rows == 0:
                return None
        return _Window(window, offset, rows, low, high, full)

    def _one(self, conn: Connection, sql: str) -> tuple[Any, ...] | None:
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql)
                row = cursor.fetchone()
            conn.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise DatabaseError(f"{self.what}: {first_line(exc)}") from exc
        return tuple(row) if row is not None else None

    def pieces(self, window: _Window, parallelism: int | None) -> list[str]:
        """The window cut into key ranges for parallel reads (a multiple of
        ``parallelism``, Spark's cores), or one piece."""
        if (
            self.split_column is None
            or window.low is None
            or window.high is None
            or window.rows < self.plan.parallel_min_rows
        ):
            return [window.condition]
        from herder.connectors.jdbc.reading import key_ranges, piece_count

        key = quote(self.split_column)
        count = piece_count(window.rows, self.plan.split_rows, parallelism)
        pieces = [
            f"({window.condition}) AND {key} >= {start} AND {key} < {end}"
            for start, end in key_ranges(int(window.low), int(window.high), count)
        ]
        pieces[0] = f"({pieces[0]}) OR (({window.condition}) AND {key} IS NULL)"
        return pieces


def _offset_micros(offset: Mapping[str, Any]) -> int:
    """µs since the epoch from Connect's (ms, nanos within the second) pair."""
    millis = int(offset[TIMESTAMP])
    nanos = int(offset.get("timestamp_nanos", (millis % 1000) * 1_000_000))
    return (millis // 1000) * 1_000_000 + nanos // 1000


def _timestamp_offset(micros: int) -> dict[str, int]:
    return {TIMESTAMP: micros // 1000, "timestamp_nanos": (micros % 1_000_000) * 1000}


class JdbcSourceTask(SourceTask):
    """Reads its tables in turn: each poll, one batch of the table whose turn it is."""

    def version(self) -> str:
        return VERSION

    def start(self, config: dict[str, str]) -> None:
        self.settings = JdbcSourceConnector().config_def().parse(config)
        self.plan = _Settings(self.settings)
        self.database = database_of(self.settings)
        self.poll_interval = self.settings[POLL_INTERVAL_MS] / 1000
        self._stopping = threading.Event()
        self.conn: Connection | None = self._connect()
        names = [t for t in config.get(TABLES, "").split(",") if t]
        tables: list[TableId | None] = (
            [None] if self.plan.query else [TableId.parse(n) for n in names]
        )
        described = [_TableReader.describe(self.conn, self.plan, t) for t in tables]
        self.conn.commit()
        partitions = [self._partition(t) for t in tables]
        offsets = self.context.offset_reader.offsets(partitions) if partitions else []
        self.readers = [
            _TableReader(self.plan, self.database, t, columns, split, offset, unique)
            for t, (columns, split, unique), offset in zip(tables, described, offsets, strict=True)
        ]

    def _partition(self, table: TableId | None) -> dict[str, Any]:
        if table is None:
            return {"query": "query"}
        return {"protocol": "1", "table": f"{self.database.database}.{table.schema}.{table.name}"}

    def _connect(self) -> Connection:
        return connect_with_retries(self.database, self.settings, self._stopping)

    def poll(self) -> SourceBatch | None:
        deadline = time.monotonic() + min(self.poll_interval, 1.0)
        while not self._stopping.is_set():
            now = time.monotonic()
            for reader in sorted(self.readers, key=lambda r: r.next_poll):
                if reader.next_poll > now:
                    break
                batch = self._read(reader)
                if batch is not None:
                    return batch
            if time.monotonic() >= deadline:
                return None
            wake = min((r.next_poll for r in self.readers), default=deadline)
            self._stopping.wait(max(0.0, min(wake, deadline) - time.monotonic()))
        return None

    def _read(self, reader: _TableReader) -> SourceBatch | None:
        window = self._with_connection(reader.plan_batch)
        reader.next_poll = time.monotonic() + self.poll_interval
        if window is None:
            return None
        if window.full:
            reader.next_poll = 0.0  # a backlog: its next batch at once
        return self._batch(reader, window)

    def _with_connection(self, fn: Callable[[Connection], _Window | None]) -> _Window | None:
        """``fn`` on the task's connection, connecting again once if it was lost."""
        if self.conn is None:
            self.conn = self._connect()
        try:
            return fn(self.conn)
        except DatabaseError as exc:
            if not _connection_lost(exc):
                raise
            log.warning("JdbcSource: %s; connecting again", exc)
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = self._connect()
            return fn(self.conn)

    def _batch(self, reader: _TableReader, window: _Window) -> SourceBatch:
        from pyspark.sql.types import StructField, StructType

        from herder.connectors.jdbc.reading import row_pieces
        from herder.dataplane.spark import spark_runtime

        runtime = spark_runtime()
        pieces = reader.pieces(window, runtime.parallelism)
        # each row as a typed value: a struct of the table's columns, stored as it is;
        # the DataFrame is the pieces', for the runtime to use when transforms run
        records = row_pieces(self.database.libpq(), reader.base, reader.schema, pieces)
        data = records.dataframe(
            runtime.session, StructType([StructField("value", reader.schema, True)])
        )
        offsets = [(reader.partition, window.offset)] if window.offset is not None else []
        log.info(
            "JdbcSource: reading %s into %s (%s rows in %d pieces), offset %s",
            reader.what,
            reader.topic,
            (f"{'' if window.exact else 'at most '}{window.rows}" if reader.split_column else "?"),
            len(pieces),
            window.offset,
        )
        if window.offset is not None:
            reader.offset = window.offset
        return SourceBatch(data, offsets, reader.topic, pieces=records)

    def stop(self) -> None:
        self._stopping.set()
        conn, self.conn = getattr(self, "conn", None), None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _connection_lost(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(
        s in text
        for s in ("server closed the connection", "connection refused", "terminating connection",
                  "no connection to the server", "connection to server", "broken pipe")
    )  # fmt: skip
