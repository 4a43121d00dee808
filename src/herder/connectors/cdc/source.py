"""PostgresCdcSource: a PostgreSQL database's row changes into topics, exactly once.

Debezium's PostgreSQL connector, with its config names and its change events
(:mod:`.events`): one topic per table, ``<topic.prefix>.<schema>.<table>``. One task
reads a logical replication slot with the ``pgoutput`` plugin through a publication
(:mod:`.slot`), decodes its messages (:mod:`.pgoutput`, :mod:`.changes`) and returns
each poll's whole transactions as one batch. The batch's offset is the slot position it
reaches (``{"server": <topic.prefix>}`` → ``{"lsn": …, "txId": …, "ts_usec": …}``) and
commits in the same transaction as its records; only then is the slot advanced to it.
A restarted task skips what the slot still holds below its committed offset, so no
change is lost or written twice. With ``snapshot.mode=initial`` the tables' existing
rows come first, chunk by chunk, merged into the stream (:mod:`.snapshot`).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, ConfigValue, Importance, Range, Type, ValidString
from herder.connect import SourceBatch, SourceConnector, SourceTask
from herder.connectors.cdc.changes import (
    Transaction,
    TransactionAssembler,
    key_changed,
)
from herder.connectors.cdc.events import (
    EventBatch,
    TableShape,
    heartbeat,
    source_block,
)
from herder.connectors.cdc.lag import SlotLag
from herder.connectors.cdc.pgoutput import Relation, decode, format_lsn
from herder.connectors.cdc.slot import ALL_TABLES, AUTOCREATE_MODES, SetupError, Slot
from herder.connectors.cdc.snapshot import (
    ExportedSnapshot,
    SnapshotExporter,
    SnapshotProgress,
    plan_chunk,
    read_chunk,
    snapshot_constants,
    snapshot_end,
    snapshot_events,
    snapshot_pieces,
)
from herder.connectors.jdbc.postgres import (
    Column,
    Database,
    DatabaseError,
    TableId,
    literal,
    primary_key,
    table_columns,
)
from herder.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping


log = logging.getLogger(__name__)

VERSION = "1.0"
HOSTNAME = "database.hostname"
PORT = "database.port"
USER = "database.user"
PASSWORD = "database.password"
DBNAME = "database.dbname"
TOPIC_PREFIX = "topic.prefix"
INCLUDE = "table.include.list"
EXCLUDE = "table.exclude.list"
PLUGIN = "plugin.name"
SLOT = "slot.name"
PUBLICATION = "publication.name"
AUTOCREATE = "publication.autocreate.mode"
SNAPSHOT_MODE = "snapshot.mode"
HEARTBEAT_MS = "heartbeat.interval.ms"
SLOT_DROP = "slot.drop.on.stop"
SLOT_RETRIES = "slot.max.retries"
SLOT_RETRY_MS = "slot.retry.delay.ms"
POLL_MS = "poll.interval.ms"
MAX_BATCH = "max.batch.size"
TOMBSTONES = "tombstones.on.delete"
SKIPPED = "skipped.operations"
CHUNK_ROWS = "snapshot.chunk.rows"
SPLIT_ROWS = "snapshot.split.rows"

INITIAL = "initial"
NEVER = "never"
INITIAL_ONLY = "initial_only"
NO_DATA = "no_data"
SNAPSHOT_MODES = (INITIAL, NEVER, INITIAL_ONLY, NO_DATA)


class PostgresCdcSourceConnector(SourceConnector):
    """Row changes of a PostgreSQL database, from a logical replication slot."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define(HOSTNAME, Type.STRING, importance=Importance.HIGH,
                    documentation="The PostgreSQL server's host.")
            .define(PORT, Type.INT, default=5432, validator=Range.between(1, 65535),
                    importance=Importance.HIGH, documentation="Its port.")
            .define(USER, Type.STRING, importance=Importance.HIGH,
                    documentation="A user with the REPLICATION privilege.")
            .define(PASSWORD, Type.PASSWORD, default="", importance=Importance.HIGH,
                    documentation="The user's password (config providers work).")
            .define(DBNAME, Type.STRING, importance=Importance.HIGH,
                    documentation="The database whose changes are captured.")
            .define(TOPIC_PREFIX, Type.STRING, importance=Importance.HIGH,
                    documentation="The server's logical name: topics are"
                    " <topic.prefix>.<schema>.<table>.")
            .define(INCLUDE, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Regular expressions matching schema.table of the tables"
                    " to capture; empty for all but the excluded.")
            .define(EXCLUDE, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Regular expressions matching schema.table of tables not"
                    " to capture.")
            .define(PLUGIN, Type.STRING, default="pgoutput",
                    validator=ValidString.in_("pgoutput"), importance=Importance.MEDIUM,
                    documentation="The logical decoding plugin: pgoutput.")
            .define(SLOT, Type.STRING, default="debezium", importance=Importance.MEDIUM,
                    documentation="The replication slot, created if missing.")
            .define(PUBLICATION, Type.STRING, default="dbz_publication",
                    importance=Importance.MEDIUM, documentation="The publication to decode.")
            .define(AUTOCREATE, Type.STRING, default=ALL_TABLES,
                    validator=ValidString.in_(*AUTOCREATE_MODES), importance=Importance.MEDIUM,
                    documentation="all_tables: create the publication FOR ALL TABLES if"
                    " missing; filtered: create it (or set its tables) for the captured"
                    " tables; disabled: it must exist.")
            .define(SNAPSHOT_MODE, Type.STRING, default=INITIAL,
                    validator=ValidString.in_(*SNAPSHOT_MODES), importance=Importance.MEDIUM,
                    documentation="initial: read the tables' rows first, then stream;"
                    " initial_only: read them and stop; never, no_data: stream only.")
            .define(HEARTBEAT_MS, Type.LONG, default=0, validator=Range.at_least(0),
                    importance=Importance.MEDIUM,
                    documentation="When no captured table changes for this long, a"
                    " heartbeat record commits the slot's newer position, so the server"
                    " can recycle its WAL; 0 for none.")
            .define(SLOT_DROP, Type.BOOLEAN, default=False, importance=Importance.LOW,
                    documentation="Drop the slot when the task stops (its changes since are"
                    " then lost to this connector).")
            .define(SLOT_RETRIES, Type.INT, default=6, validator=Range.at_least(0),
                    importance=Importance.LOW,
                    documentation="How many times to try again when another session holds"
                    " the slot (a stopped worker's server process finishing its read).")
            .define(SLOT_RETRY_MS, Type.LONG, default=10_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="How long to wait between those tries.")
            .define(POLL_MS, Type.LONG, default=500, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="How long to wait for changes when there were none.")
            .define(MAX_BATCH, Type.INT, default=20_480, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="About how many slot messages one batch takes (whole"
                    " transactions always).")
            .define(TOMBSTONES, Type.BOOLEAN, default=True, importance=Importance.LOW,
                    documentation="Follow each delete with a tombstone.")
            .define(SKIPPED, Type.LIST, default="t", importance=Importance.LOW,
                    documentation="Operations not to emit (c, u, d, t), or none.")
            .define(CHUNK_ROWS, Type.LONG, default=200_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="Rows of a snapshot chunk: a batch and a commit each.")
            .define(SPLIT_ROWS, Type.LONG, default=50_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="About how many rows of a chunk each parallel read takes.")
        )  # fmt: skip

    def validate(self, config: Mapping[str, str]) -> dict[str, ConfigValue]:
        results = super().validate(config)
        if any(v.errors for v in results.values()):
            return results
        settings = self.config_def().parse(config)
        try:
            _Settings(settings)
            slot = Slot(_database(settings), settings[SLOT], settings[PUBLICATION])
            try:
                if settings[SNAPSHOT_MODE] != INITIAL_ONLY:
                    slot.check_server()
            finally:
                slot.close()
        except SetupError as exc:
            results[USER if "REPLICATION" in str(exc) else HOSTNAME].errors.append(str(exc))
        except ConfigError as exc:
            results[HOSTNAME].errors.append(str(exc))
        return results

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)
        _Settings(self.config_def().parse(config))

    def task_class(self) -> type[SourceTask]:
        return PostgresCdcSourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        # one slot is read in order by one reader
        return [dict(self.config)]

    def stop(self) -> None:
        return None


def _database(settings: Mapping[str, Any]) -> Database:
    password = settings[PASSWORD]
    return Database(
        settings[HOSTNAME],
        settings[PORT],
        settings[DBNAME],
        settings[USER],
        password.value if hasattr(password, "value") else str(password or ""),
    )


class _Settings:
    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.prefix: str = settings[TOPIC_PREFIX]
        self.include = [_pattern(INCLUDE, p) for p in settings[INCLUDE] if p]
        self.exclude = [_pattern(EXCLUDE, p) for p in settings[EXCLUDE] if p]
        if self.include and self.exclude:
            raise ConfigError(f"{INCLUDE}: cannot be set with {EXCLUDE}")
        self.skipped = {s.strip() for s in settings[SKIPPED] if s.strip() and s != "none"}
        unknown = self.skipped - {"c", "u", "d", "t"}
        if unknown:
            raise ConfigError(f"{SKIPPED}: unknown operations {sorted(unknown)} (c, u, d, t)")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.prefix):
            raise ConfigError(f"{TOPIC_PREFIX}: {self.prefix!r} is not a topic name prefix")

    def captures(self, table: TableId) -> bool:
        name = f"{table.schema}.{table.name}"
        if self.include:
            return any(p.fullmatch(name) for p in self.include)
        return not any(p.fullmatch(name) for p in self.exclude)


def _pattern(key: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text.strip())
    except re.error as exc:
        raise ConfigError(f"{key}: {text!r} is not a regular expression: {exc}") from exc


class PostgresCdcSourceTask(SourceTask):
    """Reads the slot: each poll, whole transactions (or a snapshot chunk) as one batch."""

    def version(self) -> str:
        return VERSION

    def start(self, config: dict[str, str]) -> None:
        settings = PostgresCdcSourceConnector().config_def().parse(config)
        self.plan = _Settings(settings)
        self.database = _database(settings)
        self.prefix = self.plan.prefix
        self.partition = {"server": self.prefix}
        self.mode: str = settings[SNAPSHOT_MODE]
        self.poll_wait = settings[POLL_MS] / 1000
        self.heartbeat_s = settings[HEARTBEAT_MS] / 1000
        self.max_batch: int = settings[MAX_BATCH]
        self.tombstones: bool = settings[TOMBSTONES]
        self.chunk_rows: int = settings[CHUNK_ROWS]
        self.split_rows: int = settings[SPLIT_ROWS]
        self.drop_on_stop: bool = settings[SLOT_DROP]
        self._stopping = threading.Event()
        #: the snapshot the last chunk's rows are read in, until they are written
        self._exported: ExportedSnapshot | None = None
        self._exporter: SnapshotExporter | None = None
        #: batches polled together, to return one by one, each with the position the
        #: slot may be confirmed at once it is committed
        self._queue: collections.deque[tuple[SourceBatch, int]] = collections.deque()
        #: (position, runs done) of a poll's batches an earlier incarnation left half
        #: committed: the rest is polled first
        self._resume: tuple[int, int] | None = None
        #: held while the slot is used (peeked, advanced, its lag measured): it serves
        #: one session at a time
        self._reading = threading.Lock()
        self.slot = Slot(
            self.database,
            settings[SLOT],
            settings[PUBLICATION],
            busy_retries=settings[SLOT_RETRIES],
            busy_delay=settings[SLOT_RETRY_MS] / 1000,
        )
        self.lag_meter = SlotLag(self.database, settings[SLOT], settings[PUBLICATION])
        try:
            self._prepare(settings)
        except BaseException:
            self.slot.close()
            raise

    def _prepare(self, settings: Mapping[str, Any]) -> None:
        """Checks, the publication, the slot, and where to start reading."""
        if self.mode != INITIAL_ONLY:
            # initial_only reads tables and nothing else: any wal_level, no REPLICATION
            self.slot.check_server()
        tables = self._tables()
        offset = self.context.offset_reader.offset(self.partition)
        self.snapshot: SnapshotProgress | None = None
        if self.mode == INITIAL_ONLY:
            # Debezium's initial_only: the rows and nothing after, so no publication and
            # no slot, which would hold WAL back for a stream that never comes
            self.position = self.slot.flushed_lsn()
            if offset is None:
                self.snapshot = SnapshotProgress(tuple(str(t) for t in tables)) if tables else None
            else:
                self.snapshot = SnapshotProgress.from_offset(offset)
        else:
            self._prepare_stream(settings, tables, offset)
        self.assembler = TransactionAssembler()
        #: each table's last Relation message, and the shape it gave
        self.shapes: dict[int, tuple[Relation, TableShape | None]] = {}
        self.type_names: dict[tuple[int, int], str] = {}
        self.confirmable = self.position
        self.mark: int | None = None
        self.last_emit = time.monotonic()
        self.last_tx: dict[str, Any] = {}
        log.info(
            "PostgresCdcSource %s: %s%s",
            self.prefix,
            "no stream (snapshot.mode=initial_only)"
            if self.mode == INITIAL_ONLY
            else f"slot {self.slot.name} from {format_lsn(self.position)}",
            f", snapshot of {len(self.snapshot.tables)} tables first" if self.snapshot else "",
        )

    def _prepare_stream(
        self, settings: Mapping[str, Any], tables: list[TableId], offset: dict[str, Any] | None
    ) -> None:
        """The publication, the slot, and the position to stream from."""
        self.slot.ensure_publication(settings[AUTOCREATE], tables)
        state = self.slot.state()
        if offset is None:
            self.position = state.confirmed_flush if state.exists else self.slot.create()
            if self.mode == INITIAL and tables:
                self.snapshot = SnapshotProgress(tuple(str(t) for t in tables))
        else:
            if not state.exists:
                raise SetupError(
                    f"replication slot {self.slot.name!r} is gone from {self.database.where()},"
                    f" and with it the changes after {format_lsn(int(offset['lsn']))} this"
                    " connector committed last: delete and create the connector again (it"
                    " snapshots anew), or recreate the slot and accept the gap"
                )
            self.position = int(offset["lsn"])
            self.snapshot = SnapshotProgress.from_offset(offset)
            if "batch_upto" in offset:
                self._resume = (int(offset["batch_upto"]), int(offset["batch_runs"]))
            if state.confirmed_flush < self.position:
                # committed, not yet confirmed when the last incarnation stopped
                self._advance(self.position)

    def _tables(self) -> list[TableId]:
        rows = self.slot.rows(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
            " AND table_schema NOT LIKE 'pg_temp%' AND table_type = 'BASE TABLE' ORDER BY 1, 2"
        )
        return [t for t in (TableId(str(s), str(n)) for s, n in rows) if self.plan.captures(t)]

    # -- polling -----------------------------------------------------------------------------

    def poll(self) -> SourceBatch | None:
        if self._stopping.is_set():
            return None
        if self._queue:
            return self._next_queued()
        if self._resume is not None:
            return self._resumed(*self._resume)
        if self.snapshot is not None:
            return self._snapshot_chunk(self.snapshot)
        if self.mode == INITIAL_ONLY:
            # the snapshot is done, and initial_only streams nothing
            self._stopping.wait(self.poll_wait)
            return None
        upto = self.slot.flushed_lsn()
        events, reached = self._stream(upto)
        if events.count:
            self._queue_runs(events, reached, None)
            return self._next_queued()
        self.position = reached
        if self.heartbeat_s and time.monotonic() - self.last_emit >= self.heartbeat_s:
            # a heartbeat moves the slot to a WAL record boundary that decoding has passed
            # with nothing captured: the later of the last transaction seen and the mark
            if self.mark is None:
                self.mark = self.slot.insert_lsn()
            if self.mark <= upto:
                mark, self.mark = max(self.mark, reached), None
                if mark > self.confirmable:
                    return self._heartbeat(mark)
        self._stopping.wait(self.poll_wait)
        return None

    def _stream(self, upto: int, limit: int | None = None) -> tuple[EventBatch, int]:
        """The events of the transactions past our position that commit before ``upto``
        (until about ``limit`` messages), and the position they reach."""
        events = EventBatch()
        reached = self.position
        with self._reading:
            messages = list(self.slot.peek(upto, limit or self.max_batch))
        for lsn, data in messages:
            txn = self.assembler.feed(lsn, decode(data))
            if txn is None or txn.end_lsn <= self.position:
                continue
            self._transaction(txn, events)
            reached = txn.end_lsn
        return events, reached

    def _transaction(self, txn: Transaction, events: EventBatch) -> None:
        ts_ms = txn.commit_micros // 1000
        self.last_tx = {"txId": txn.xid, "ts_usec": txn.commit_micros}
        now = int(time.time() * 1000)
        for change in txn.changes:
            shape = self._shape(change.relation)
            if shape is None or change.op in self.plan.skipped:
                continue
            source = source_block(
                shape, self.prefix, self.database.database, ts_ms, "false", txn.xid, change.lsn
            )
            if change.op == "t":
                events.add(
                    shape, None, {"before": None, "after": None, "source": source, "op": "t",
                                  "ts_ms": now},
                )  # fmt: skip
                continue
            before = self._row(shape, change.before)
            after = self._row(shape, change.after)
            if key_changed(change, shape.key):
                # a new primary key: Debezium's delete of the old row, then a create
                self._delete(events, shape, before, source, now)
                events.add(shape, _key(shape, after), _value(None, after, source, "c", now))
            elif change.op == "d":
                self._delete(events, shape, before, source, now)
            else:
                events.add(shape, _key(shape, after), _value(before, after, source, change.op, now))

    def _delete(
        self,
        events: EventBatch,
        shape: TableShape,
        before: dict[str, Any] | None,
        source: dict[str, Any],
        now: int,
    ) -> None:
        if "d" in self.plan.skipped:
            return
        key = _key(shape, before)
        events.add(shape, key, _value(before, None, source, "d", now))
        if self.tombstones and key is not None:
            events.add(shape, key, None)

    def _row(self, shape: TableShape, values: tuple[object, ...] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        return {
            name: read(v) for name, read, v in zip(shape.names, shape.readers, values, strict=True)
        }

    def _shape(self, relation: Relation) -> TableShape | None:
        """The shape of a relation's changes (None for a table not captured)."""
        known = self.shapes.get(relation.oid)
        if known is not None and known[0] is relation:
            return known[1]
        table = TableId(relation.schema, relation.name)
        shape = known[1] if known is not None else None
        if not self.plan.captures(table):
            shape = None
        elif shape is None or shape.columns != self._columns(relation):
            # the primary key, as Debezium keys events; else the replica identity's columns
            # (with REPLICA IDENTITY FULL the relation flags every column)
            key = self._primary_key(table) or [
                c.name for c in relation.columns if c.key and relation.replica_identity != "f"
            ]
            topic = f"{self.prefix}.{table.schema}.{table.name}"
            shape = TableShape(table, topic, self._columns(relation), tuple(key))
        self.shapes[relation.oid] = (relation, shape)
        return shape

    def _primary_key(self, table: TableId) -> list[str]:
        """The table's primary key now; none if it was dropped since the change was made
        (Debezium goes on too: its changes still in the slot come, keyed as the slot's
        Relation message flags the key)."""
        if not self.slot.value(f"SELECT to_regclass({literal(table.sql)}) IS NOT NULL"):
            log.warning(
                "PostgresCdcSource %s: table %s was dropped; its last changes come keyed"
                " by its replica identity",
                self.prefix,
                table,
            )
            return []
        return primary_key(self.slot.conn, table)

    def _columns(self, relation: Relation) -> tuple[Column, ...]:
        missing = [
            (c.type_oid, c.typmod)
            for c in relation.columns
            if (c.type_oid, c.typmod) not in self.type_names
        ]
        for oid, typmod in missing:
            self.type_names[(oid, typmod)] = str(
                self.slot.value(f"SELECT format_type({int(oid)}, {int(typmod)})")
            )
        return tuple(
            Column(c.name, self.type_names[(c.type_oid, c.typmod)]) for c in relation.columns
        )

    def _offset(self, reached: int, snapshot: SnapshotProgress | None) -> dict[str, Any]:
        offset: dict[str, Any] = {"lsn": reached, **self.last_tx}
        if snapshot is not None:
            offset.update(snapshot.to_offset())
        return offset

    def _queue_runs(
        self,
        events: EventBatch,
        reached: int,
        snapshot: SnapshotProgress | None,
        done: int = 0,
    ) -> None:
        """Queue a poll's change events as batches, one per run of a table shape (a
        topic's records have one type per batch), in order.

        Each batch commits an offset, so a crash between them must neither lose nor
        repeat a run: all but the last keep the position the poll began at and say how
        far the poll reached and how many of its runs are committed (``batch_upto``,
        ``batch_runs``), and the slot is confirmed past them only with the last. A
        restarted task decodes the same transactions again and skips the runs done
        (:meth:`_resumed`)."""
        from herder.dataplane.spark import spark_runtime

        session = spark_runtime().session
        began = self.position
        runs = events.runs
        for number, run in enumerate(runs[done:], start=done + 1):
            if number == len(runs):
                offset, confirmable = self._offset(reached, snapshot), reached
            else:
                offset = self._offset(began, snapshot) | {
                    "batch_upto": reached,
                    "batch_runs": number,
                }
                confirmable = began
            batch = SourceBatch(run.dataframe(session), [(self.partition, offset)], run.shape.topic)
            self._queue.append((batch, confirmable))
        self.position = reached
        self.last_emit = time.monotonic()
        log.debug(
            "PostgresCdcSource %s: %d change events in %d batches up to %s",
            self.prefix,
            events.count,
            len(runs) - done,
            format_lsn(reached),
        )

    def _next_queued(self) -> SourceBatch:
        batch, self.confirmable = self._queue.popleft()
        return batch

    def _resumed(self, upto: int, done: int) -> SourceBatch:
        """The runs an earlier incarnation did not commit of the poll that reached
        ``upto``: the same transactions, decoded again."""
        self._resume = None
        events, reached = self._stream(upto, limit=2**31 - 1)
        if reached != upto or len(events.runs) <= done:
            raise DatabaseError(
                f"slot {self.slot.name!r} no longer gives the changes up to"
                f" {format_lsn(upto)} that a batch of {len(events.runs)} runs committed"
                f" {done} of: delete and create the connector again (it snapshots anew)"
            )
        log.info(
            "PostgresCdcSource %s: the last %d of %d batches up to %s, again",
            self.prefix,
            len(events.runs) - done,
            len(events.runs),
            format_lsn(upto),
        )
        self._queue_runs(events, reached, self.snapshot, done)
        return self._next_queued()

    def _heartbeat(self, upto: int) -> SourceBatch:
        from herder.dataplane.spark import spark_runtime

        self.position = self.confirmable = upto
        self.last_emit = time.monotonic()
        data = heartbeat(spark_runtime().session, self.prefix, int(time.time() * 1000))
        return SourceBatch(data, [(self.partition, self._offset(upto, None))])

    # -- snapshots ---------------------------------------------------------------------------

    def _snapshot_chunk(self, progress: SnapshotProgress) -> SourceBatch | None:
        """The next chunk of the snapshot: the changes up to its high watermark first,
        as a batch of their own if there are any, then its rows (:mod:`.snapshot`).

        The rows are a batch of one topic: written in the order read, with no shuffle.
        A crash between the two batches loses nothing: the changes' batch commits the
        stream's position with the chunk still to read, and a restarted task reads the
        chunk again, in a new snapshot, after them."""
        from herder.dataplane.spark import spark_runtime

        self._release_snapshot()
        runtime = spark_runtime()
        session = runtime.session
        table = TableId.parse(progress.tables[0])
        # the table's columns, its bounds and its rows, all as one snapshot sees them
        if self._exporter is None:
            self._exporter = SnapshotExporter(self.database)
        self._exported = self._exporter.export()
        shape = self._table_shape(table, self._exported.conn)
        chunk = None
        until = progress.until
        if shape is not None:
            query = self._exported.first_row
            if progress.after is None:
                until = snapshot_end(query, shape)
            chunk = plan_chunk(
                query, shape, progress.after, self.chunk_rows, self.split_rows, until,
                runtime.parallelism,
            )  # fmt: skip
        if shape is None or chunk is None:
            self._release_snapshot()
            self.snapshot = progress.chunk_done(None)
            return self._snapshot_chunk(self.snapshot) if self.snapshot else None
        assert self._exported is not None
        rows = read_chunk(session, self.database.libpq(), shape, chunk, self._exported.id)
        # the high watermark: past every change the exported snapshot sees
        high = self.slot.flushed_lsn()
        if self.mode == INITIAL_ONLY:
            # no stream to merge: the chunk's rows as read, nothing else
            events, reached, touched = EventBatch(), high, []
        else:
            events, reached = self._stream(high, limit=2**31 - 1)
            touched = [
                k
                for run in events.runs
                if run.shape.table == table
                for k in (r["key"] for r in run.rows)
                if k is not None
            ]
        after = progress.chunk_done(chunk.last, until)
        now = int(time.time() * 1000)
        source = source_block(
            shape, self.prefix, self.database.database, now, "true" if after else "last",
            None, reached,
        )  # fmt: skip
        reads = snapshot_events(session, rows, shape, touched, source, now)
        log.info(
            "PostgresCdcSource %s: snapshot of %s, chunk up to key %s (%d pieces), after %d"
            " change events",
            self.prefix,
            table,
            chunk.last if chunk.last is not None else "the end",
            len(chunk.pieces),
            events.count,
        )
        if events.count:
            self._queue_runs(events, reached, progress)
        self.position = reached
        self.last_emit = time.monotonic()
        chunk_batch = SourceBatch(
            reads,
            [(self.partition, self._offset(reached, after))],
            shape.topic,
            check=self._release_snapshot,
            constants=snapshot_constants(source, now),
            pieces=snapshot_pieces(self.database.libpq(), shape, chunk, self._exported.id, touched),
        )
        self._queue.append((chunk_batch, reached))
        self.snapshot = after
        return self._next_queued()

    def _release_snapshot(self) -> None:
        """End the exported snapshot of the last chunk: its rows are written (or will
        never be)."""
        exported, self._exported = self._exported, None
        if exported is not None:
            exported.close()
        if self.snapshot is None and self._exporter is not None:
            # the snapshot is over: its connection is not needed any more
            self._exporter.close()
            self._exporter = None

    def _table_shape(self, table: TableId, conn: Any) -> TableShape | None:
        """A table's shape from the catalog, read through ``conn``; None (and a
        warning) if it was dropped."""
        columns = table_columns(conn, table)
        if not columns:
            log.warning(
                "PostgresCdcSource %s: table %s was dropped before its snapshot; skipped",
                self.prefix,
                table,
            )
            return None
        key = primary_key(conn, table)
        if not key:
            raise DatabaseError(
                f"table {table} has no primary key: snapshot.mode={self.mode} reads tables by"
                " key ranges (add a primary key, or set snapshot.mode=no_data)"
            )
        return TableShape(
            table, f"{self.prefix}.{table.schema}.{table.name}", tuple(columns), tuple(key)
        )

    # -- confirming, stopping ----------------------------------------------------------------

    def commit(self) -> None:
        """The last batch and its offset are committed: the slot may let go of them (and,
        once a chunk's rows are, the snapshot they were read in)."""
        if not self._queue:
            self._release_snapshot()
        if self.confirmable > 0 and self.mode != INITIAL_ONLY and not self._stopping.is_set():
            self._advance(self.confirmable)

    def _advance(self, lsn: int) -> None:
        """Confirm ``lsn`` to the slot, never while the lag meter peeks at it (the slot
        would be another session's for that moment, and the advance fail)."""
        with self._reading:
            self.slot.advance(lsn)

    def lag(self) -> dict[str, int | float] | None:
        """WAL bytes the slot holds for this connector, and the age in seconds of the
        oldest change not committed yet (:mod:`.lag`), paused or not."""
        if self._stopping.is_set() or self.mode == INITIAL_ONLY:
            return None
        with self._reading:
            if self._stopping.is_set():
                return None
            return self.lag_meter.measure()

    def stop(self) -> None:
        self._stopping.set()
        if getattr(self, "_exported", None) is not None:
            self._release_snapshot()
        exporter = getattr(self, "_exporter", None)
        if exporter is not None:
            exporter.close()
        slot = getattr(self, "slot", None)
        if slot is None:
            return
        slot.close()
        # a measure in progress ends first (its peek is short)
        measuring = self._reading.acquire(timeout=10)
        try:
            self.lag_meter.close()
        finally:
            if measuring:
                self._reading.release()
        if self.drop_on_stop:
            self._drop_slot(slot)

    def _drop_slot(self, slot: Slot) -> None:
        """Drop the slot once no session holds it (the poll's may take a moment to
        end: the drop is tried again, every 0.1 s for up to 10 s)."""
        dropper = Slot(self.database, slot.name, slot.publication, busy_retries=100,
                       busy_delay=0.1)  # fmt: skip
        try:
            if dropper.state().exists:
                dropper.drop()
        finally:
            dropper.close()


def _key(shape: TableShape, row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None or not shape.key:
        return None
    return {k: row[k] for k in shape.key}


def _value(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    source: dict[str, Any],
    op: str,
    now: int,
) -> dict[str, Any]:
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": now}
