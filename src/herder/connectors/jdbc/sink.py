"""JdbcSink: typed records of topics into PostgreSQL tables, exactly once.

Config names are those of Confluent's JDBC sink connector. Records must be typed:
typed columns as topics hold them (:mod:`herder.dataplane.typed`), whose Spark types
give the table's columns with no pass over the rows, or bytes in JsonConverter's
envelope (:mod:`herder.dataplane.schemas`, a topic written before typed columns, or
JSON read with ``schemas.enable=true``), whose schemas are found in the batch. A
batch becomes rows of
the table ``table.name.format`` names, whose columns are the key's (``pk.mode``) and
the value's fields (``fields.whitelist``). With ``auto.create`` a missing table is
created from the records' schema, with ``auto.evolve`` a field the table lacks becomes
``ALTER TABLE … ADD COLUMN`` and a field whose type grew wider upstream (``integer`` to
``bigint``, ``real`` to ``double precision``) widens its column.

**Exactly once.** Each ``put`` has Spark's executors copy the batch, in parallel and
through PostgreSQL's binary COPY (ADBC's bulk ingest), into a staging table of its
own (unlogged, dropped once used). Then, when the runtime commits offsets
(:meth:`JdbcSinkTask.pre_commit`), one database transaction moves the staged rows into
the table — inserted, upserted (``INSERT … ON CONFLICT``, or a plain ``INSERT`` where
no staged key can be in the table yet: :class:`Optimistic`), updated, or deleted for a
tombstone with ``delete.enabled`` — and records in the table ``herder_sink_offsets``
how far each topic partition has been written. Rows at offsets the table already holds
are skipped, so a batch delivered again (after a crash, or by a zombie task whose
partitions moved) changes nothing. When a task is given partitions it resumes from the
offsets that table holds, not from the group's committed offsets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, ConfigValue, Importance, Range, Type, ValidString
from herder.connect import SinkConnector, SinkTask, TopicPartition
from herder.connectors.jdbc.postgres import (
    DatabaseError,
    TableId,
    first_line,
    literal,
    pg_type_of,
    quote,
    table_columns,
)
from herder.connectors.jdbc.source import (
    CONNECTION_PASSWORD,
    CONNECTION_URL,
    VERSION,
    connect_with_retries,
    connection_config,
    database_of,
)
from herder.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructField

log = logging.getLogger(__name__)

TOPICS = "topics"
TABLE_NAME_FORMAT = "table.name.format"
INSERT_MODE = "insert.mode"
PK_MODE = "pk.mode"
PK_FIELDS = "pk.fields"
FIELDS_WHITELIST = "fields.whitelist"
AUTO_CREATE = "auto.create"
AUTO_EVOLVE = "auto.evolve"
DELETE_ENABLED = "delete.enabled"
BATCH_SIZE = "batch.size"
OFFSETS_TABLE = "offsets.table.name"
#: Set on each task's config: the connector's name (the offsets table's key) and the
#: task's number (its staging tables' names).
CONNECTOR_NAME = "connector.name"
TASK_INDEX = "task.index"

INSERT, UPSERT, UPDATE = "insert", "upsert", "update"
PK_NONE, PK_KAFKA, PK_RECORD_KEY, PK_RECORD_VALUE = "none", "kafka", "record_key", "record_value"
KAFKA_PK = ["__connect_topic", "__connect_partition", "__connect_offset"]
#: The staged rows' own columns: where each record came from, and whether it deletes.
_LOCATION = ["__topic", "__partition", "__offset", "__deleted"]
#: PostgreSQL's work_mem for the transaction that moves staged rows in.
MOVE_WORK_MEM = "256MB"
#: Set on rows whose records have a schema the batch was not planned for.
_UNEXPECTED = "__unexpected"


@dataclass(frozen=True)
class Optimistic:
    """An upsert that is a plain ``INSERT`` when ``check`` (a query of one boolean) says
    no staged key can be in the table yet: the table is empty, or its keys' range and
    the staged keys' are apart. PostgreSQL's ``ON CONFLICT`` tries each row as a
    speculative insertion, which doubles the cost of moving rows into a table they are
    new to (a first load, keys that only grow). Should a row's key be there after all
    (a writer of its own inserted it meanwhile), the plain insert fails on it, is rolled
    back (a PL/pgSQL exception block: a subtransaction, on the server) and the upsert
    runs instead, in the same transaction. Which of the three happened is left in the
    transaction's setting ``herder.move``."""

    #: the table moved into
    table: str
    check: str
    plain: str
    upsert: str

    def sql(self) -> str:
        body = (
            f"BEGIN IF ({self.check}) THEN"
            f" BEGIN {self.plain}; PERFORM set_config('herder.move', 'insert', true);"
            " EXCEPTION WHEN unique_violation THEN"
            f" {self.upsert}; PERFORM set_config('herder.move', 'upsert after a conflict', true);"
            f" END; ELSE {self.upsert}; PERFORM set_config('herder.move', 'upsert', true);"
            " END IF; END"
        )
        tag = "$herder_move$"
        if tag in body:  # a name that holds the quote's tag: the upsert alone
            return self.upsert
        return f"DO {tag} {body} {tag}"


class JdbcSinkConnector(SinkConnector):
    """Writes the typed records of ``topics`` into PostgreSQL tables."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            connection_config(ConfigDef())
            .define(TOPICS, Type.LIST, default="", importance=Importance.HIGH,
                    documentation="The topics to read.")
            .define(TABLE_NAME_FORMAT, Type.STRING, default="${topic}",
                    importance=Importance.MEDIUM,
                    documentation="The table of each topic; ${topic} is the topic's name"
                    " (schema.table to name a schema).")
            .define(INSERT_MODE, Type.STRING, default=INSERT,
                    validator=ValidString.in_(INSERT, UPSERT, UPDATE),
                    importance=Importance.HIGH,
                    documentation="insert, upsert (insert or update by primary key) or update.")
            .define(PK_MODE, Type.STRING, default=PK_NONE,
                    validator=ValidString.in_(PK_NONE, PK_KAFKA, PK_RECORD_KEY, PK_RECORD_VALUE),
                    importance=Importance.HIGH,
                    documentation="Where the primary key comes from: none, kafka (topic,"
                    " partition, offset), record_key or record_value.")
            .define(PK_FIELDS, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="The primary key's fields (all of the key's, or of the"
                    " value's, when empty).")
            .define(FIELDS_WHITELIST, Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="The value's fields to write; empty for all.")
            .define(AUTO_CREATE, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                    documentation="Create a missing table from the records' schema.")
            .define(AUTO_EVOLVE, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                    documentation="Add a column for a field the table lacks; widen one"
                    " whose field's integer or float type grew wider.")
            .define(DELETE_ENABLED, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                    documentation="A tombstone (null value) deletes its key's row; needs"
                    " pk.mode=record_key.")
            .define(BATCH_SIZE, Type.INT, default=100_000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="Rows each executor sends to the database in one COPY.")
            .define(OFFSETS_TABLE, Type.STRING, default="herder_sink_offsets",
                    importance=Importance.LOW,
                    documentation="The table (in the target database) that holds how far"
                    " each topic partition has been written.")
        )  # fmt: skip

    def validate(self, config: Mapping[str, str]) -> dict[str, ConfigValue]:
        results = super().validate(config)
        if any(v.errors for v in results.values()):
            return results
        settings = self.config_def().parse(config)
        try:
            _check(settings)
        except ConfigError as exc:
            results[_key_of(str(exc))].errors.append(str(exc))
            return results
        try:
            database_of(settings).connect().close()
        except ConfigError as exc:
            key = CONNECTION_PASSWORD if "password" in str(exc) else CONNECTION_URL
            results[key].errors.append(str(exc))
        return results

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)
        _check(self.config_def().parse(config))

    def task_class(self) -> type[SinkTask]:
        return JdbcSinkTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        name = self.config.get("name") or ",".join(sorted(self.config.get(TOPICS, "").split(",")))
        return [{**self.config, CONNECTOR_NAME: name, TASK_INDEX: str(i)} for i in range(max_tasks)]

    def stop(self) -> None:
        return None


def _key_of(message: str) -> str:
    for key in (DELETE_ENABLED, INSERT_MODE, PK_FIELDS, PK_MODE):
        if message.startswith(key):
            return key
    return PK_MODE


def _check(settings: Mapping[str, Any]) -> None:
    """Keys that go together (ConfigError naming the first one that does not)."""
    mode, pk_mode = settings[INSERT_MODE], settings[PK_MODE]
    if settings[DELETE_ENABLED] and pk_mode != PK_RECORD_KEY:
        raise ConfigError(f"{DELETE_ENABLED}=true needs {PK_MODE}=record_key, not {pk_mode}")
    if mode in (UPSERT, UPDATE) and pk_mode == PK_NONE:
        raise ConfigError(f"{INSERT_MODE}={mode} needs a primary key: set {PK_MODE}")
    if pk_mode == PK_KAFKA and settings[PK_FIELDS] and len(settings[PK_FIELDS]) != 3:
        raise ConfigError(
            f"{PK_FIELDS}: pk.mode=kafka takes three names (topic, partition, offset)"
        )


@dataclass
class _Schemas:
    """A batch's topic, its table, and the schemas of its keys and values, with the
    heads of the envelopes that carry them (:func:`~herder.dataplane.schemas.schema_of`);
    ``complete`` if they are every schema of the batch, not its first record's."""

    topic: str
    table: TableId
    values: list[dict]
    value_heads: list[str]
    keys: list[dict]
    key_heads: list[str]
    complete: bool
    #: the parts (``key``, ``value``) the batch holds as typed columns, not envelopes
    native: frozenset[str] = frozenset()

    def unexpected(self) -> Column:
        """Whether a record's key or value has a schema not among these."""
        from pyspark.sql import functions as F

        from herder.dataplane.schemas import has_schema

        flag = F.lit(False)
        for column, heads in (("value", self.value_heads), ("key", self.key_heads)):
            if heads:
                raw = F.col(column)
                flag = flag | (raw.isNotNull() & ~has_schema(raw, heads))
        return flag


@dataclass
class _Staged:
    """One put's rows in a staging table, waiting for the transaction that moves them."""

    stage: TableId
    table: TableId
    columns: list[str]
    keys: list[str]
    rows: int


class JdbcSinkTask(SinkTask):
    """Stages each put with Spark's executors; moves it in with the offsets at commit."""

    typed_records = True

    def version(self) -> str:
        return VERSION

    def start(self, config: dict[str, str]) -> None:
        self.settings = JdbcSinkConnector().config_def().parse(config)
        _check(self.settings)
        self.database = database_of(self.settings)
        self.connector = config.get(CONNECTOR_NAME) or ",".join(self.settings[TOPICS])
        self.insert_mode: str = self.settings[INSERT_MODE]
        self.pk_mode: str = self.settings[PK_MODE]
        self.pk_fields: list[str] = [f for f in self.settings[PK_FIELDS] if f]
        self.whitelist: set[str] = {f for f in self.settings[FIELDS_WHITELIST] if f}
        self.offsets_table = TableId.parse(self.settings[OFFSETS_TABLE])
        digest = hashlib.sha1(self.connector.encode()).hexdigest()[:10]
        self._stage_prefix = f"herder_stage_{digest}_{config.get(TASK_INDEX, '0')}_"
        self._run = uuid.uuid4().hex[:12]
        self._staged_count = 0
        self._lock = threading.Lock()
        self.pending: list[_Staged] = []
        #: the schemas the last batch was staged with
        self._expected: _Schemas | None = None
        #: whether an upsert may try a plain insert first (:class:`Optimistic`): not in a
        #: database without PL/pgSQL, which its exception block needs
        self._optimistic = True
        #: tables a plain insert of whose staged rows as they were failed: their batches
        #: repeat keys, so their plain inserts take each key's latest row
        self._repeating: set[str] = set()
        self.conn = connect_with_retries(self.database, self.settings)
        self._execute(
            f"CREATE TABLE IF NOT EXISTS {self.offsets_table.sql} (connector text NOT NULL,"
            " topic text NOT NULL, partition integer NOT NULL, next_offset bigint NOT NULL,"
            " PRIMARY KEY (connector, topic, partition))",
            what=f"offsets table {self.offsets_table}",
        )
        self._drop_stages(lambda name: True)

    # -- database helpers ------------------------------------------------------------

    def _execute(self, *statements: str | Optimistic, what: str) -> None:
        """``statements`` in one transaction on the task's connection."""
        try:
            with self.conn.cursor() as cursor:
                for sql in statements:
                    if isinstance(sql, Optimistic):
                        self._upsert(cursor, sql)
                    else:
                        cursor.execute(sql)
            self.conn.commit()
        except Exception as exc:
            self._rollback()
            if (
                self._optimistic
                and 'language "plpgsql" does not exist' in str(exc)
                and any(isinstance(s, Optimistic) for s in statements)
            ):
                log.info(
                    "JdbcSink %s: PL/pgSQL is not installed in %s, so upserts into %s always"
                    " use ON CONFLICT (CREATE EXTENSION plpgsql lets them insert new keys"
                    " plainly, at half the cost)",
                    self.connector,
                    self.database.where(),
                    what,
                )
                self._optimistic = False
                self._execute(*statements, what=what)
                return
            raise DatabaseError(f"{what}: {first_line(exc)}") from exc

    def _upsert(self, cursor: Any, upsert: Optimistic) -> None:
        if not self._optimistic:
            cursor.execute(upsert.upsert)
            return
        cursor.execute(upsert.sql())
        cursor.execute("SELECT current_setting('herder.move', true)")
        row = cursor.fetchone()
        moved = row[0] if row else None
        if moved == "upsert after a conflict":
            self._repeating.add(upsert.table)
        log.debug("JdbcSink %s: moved by %s", self.connector, moved)

    def _query(self, sql: str, what: str) -> list[tuple[Any, ...]]:
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(sql)
                rows = [tuple(r) for r in cursor.fetchall()]
            self.conn.commit()
        except Exception as exc:
            self._rollback()
            raise DatabaseError(f"{what}: {first_line(exc)}") from exc
        return rows

    def _rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception:
            log.debug("JdbcSink %s: rollback failed", self.connector, exc_info=True)

    def _drop_stages(self, wanted: Any) -> None:
        """Drop this task's staging tables (an earlier instance's, when it starts)."""
        prefix = self._stage_prefix.replace("_", r"\_")
        rows = self._query(
            "SELECT schemaname, tablename FROM pg_tables"
            f" WHERE tablename LIKE {literal(prefix + '%')}",
            what="staging tables",
        )
        for schema, name in rows:
            if wanted(name):
                self._execute(
                    f"DROP TABLE IF EXISTS {TableId(schema, name).sql}", what=f"staging {name}"
                )

    # -- partitions --------------------------------------------------------------------

    def open(self, partitions: Collection[TopicPartition]) -> None:
        if not partitions:
            return
        rows = self._query(
            f"SELECT topic, partition, next_offset FROM {self.offsets_table.sql}"
            f" WHERE connector = {literal(self.connector)}",
            what=f"offsets table {self.offsets_table}",
        )
        stored = {TopicPartition(t, p): int(n) for t, p, n in rows}
        for tp in partitions:
            if tp in stored:
                self.context.offset(tp, stored[tp])

    # -- put ---------------------------------------------------------------------------

    def put(self, df: DataFrame) -> None:
        """Stage ``df``'s rows. A batch's records nearly always share one schema: the
        first record's is taken (a cheap job) and the copy checks that every record has
        it; only when some do not is the batch staged again, after a pass that finds
        every schema it holds."""
        began = time.monotonic()
        topics = [t for t in self.settings[TOPICS] if t]
        native = self._native(df, topics)
        if native is not None:
            _complete, staged = self._stage(df, native, began)
            if staged is not None:
                with self._lock:
                    self.pending.append(staged)
            return
        # with one topic, the schemas of the batch before are checked as a first record's
        expected = self._expected if len(topics) == 1 else None
        if expected is None:
            expected = self._schemas(df, every=False)
            if expected is None:
                return
        while True:
            complete, staged = self._stage(df, expected, began)
            if complete:
                # the next batch's records are checked against these, whatever they are
                self._expected = dataclasses.replace(expected, complete=False)
                if staged is not None:
                    with self._lock:
                        self.pending.append(staged)
                return
            log.info(
                "JdbcSink %s: a batch of topic %s holds records of schemas not seen before",
                self.connector,
                expected.topic,
            )
            everything = self._schemas(df, every=True)
            if everything is None:
                return
            expected = everything

    def _native(self, df: DataFrame, topics: Sequence[str]) -> _Schemas | None:
        """The schemas of a batch whose values are typed columns (see
        :mod:`herder.dataplane.typed`): their Spark types say it all, no job needed
        but, with several topics, one that finds the batch's. None for a batch of
        bytes (envelopes: :meth:`_schemas`)."""
        from pyspark.sql import types as T

        from herder.dataplane.schemas import connect_schema

        types = {f.name: f.dataType for f in df.schema.fields}
        value, key = types["value"], types["key"]
        if isinstance(value, T.BinaryType) or not isinstance(value, T.StructType):
            return None
        if len(topics) == 1:
            topic = topics[0]
        else:
            first = df.select("topic").limit(1).collect()
            if not first:
                return None
            topic = first[0]["topic"]
        table = TableId.parse(self.settings[TABLE_NAME_FORMAT].replace("${topic}", topic))
        typed_key = not isinstance(key, T.BinaryType)
        keys = [connect_schema(key, optional=False)] if typed_key else []
        native = frozenset({"value", "key"} if typed_key else {"value"})
        return _Schemas(
            topic, table, [connect_schema(value, optional=False)], [], keys, [], True, native
        )

    def _schemas(self, df: DataFrame, *, every: bool) -> _Schemas | None:
        """The schemas of ``df``'s keys and values: of its first record with a value
        (``every`` false), or all of them, oldest first. None for an empty batch."""
        from pyspark.sql import functions as F

        from herder.dataplane.schemas import parse_schema, schema_of

        described = df.select(
            schema_of(F.col("key")).alias("k"),
            schema_of(F.col("value")).alias("v"),
            F.col("value").isNotNull().alias("has_value"),
            F.col("topic"),
            F.col("offset"),
        )
        if every:
            found = (
                described.groupBy("k", "v", "has_value", "topic")
                .agg(F.count(F.lit(1)).alias("count"), F.min("offset").alias("first"))
                .collect()
            )
            found = sorted(found, key=lambda r: r["first"])
        else:
            found = described.where("has_value").limit(1).collect()
            if not found:
                return self._schemas(df, every=True)  # tombstones, perhaps only
        if not found:
            return None
        topics = {r["topic"] for r in found}
        if len(topics) != 1:
            raise ConfigError(f"JdbcSink: one topic per put expected, got {sorted(topics)}")
        topic = topics.pop()
        table = TableId.parse(self.settings[TABLE_NAME_FORMAT].replace("${topic}", topic))
        schemas = _Schemas(topic, table, [], [], [], [], complete=every)
        for row in found:
            if row["has_value"] and row["v"] is None:
                count = f"{row['count']} records" if every else "records"
                raise DatabaseError(
                    f"table {table}: {count} of topic {topic} have a value without a"
                    " schema; JdbcSink needs typed records (JsonConverter's envelope,"
                    " value.converter.schemas.enable=true)"
                )
            value_schema, key_schema = parse_schema(row["v"]), parse_schema(row["k"])
            if value_schema is not None and value_schema not in schemas.values:
                schemas.values.append(value_schema)
                schemas.value_heads.append(row["v"])
            if key_schema is not None and key_schema not in schemas.keys:
                schemas.keys.append(key_schema)
                schemas.key_heads.append(row["k"])
        return schemas

    def _stage(self, df: DataFrame, schemas: _Schemas, began: float) -> tuple[bool, _Staged | None]:
        """``df``'s rows copied into a new staging table (None if nothing is to be
        written), after whether every record had a schema of ``schemas`` (False only
        when they are not ``complete``: then nothing was staged)."""
        from pyspark.sql import functions as F

        from herder.dataplane.schemas import merged_struct, with_decoded

        topic, table = schemas.topic, schemas.table
        value_schemas, key_schemas = schemas.values, schemas.keys
        value = merged_struct(value_schemas) if value_schemas else None
        if value is not None and self.whitelist:
            value = {
                **value,
                "fields": [f for f in value["fields"] if f["field"] in self.whitelist],
            }
        columns: list[Any] = [
            F.col("topic").alias("__topic"),
            F.col("partition").alias("__partition"),
            F.col("offset").alias("__offset"),
            F.col("value").isNull().alias("__deleted"),
        ]
        keys: list[str] = []
        #: typed columns to decode: name → (raw column, schema)
        decodes: dict[str, tuple[str, dict]] = {}
        if self.pk_mode == PK_KAFKA:
            keys = self.pk_fields or KAFKA_PK
            columns += [
                F.col("topic").alias(keys[0]),
                F.col("partition").alias(keys[1]),
                F.col("offset").alias(keys[2]),
            ]
        elif self.pk_mode == PK_RECORD_KEY:
            native_key = "key" in schemas.native
            keys, key_columns = self._key_columns(key_schemas, table, decodes, native_key)
            columns += key_columns
        if value is not None:
            if "value" in schemas.native:
                decoded = F.col("value")
            else:
                decodes["__value"] = ("value", value)
                decoded = F.col("__value")
            value_fields = [f["field"] for f in value["fields"]]
            if self.pk_mode == PK_RECORD_VALUE:
                keys = self.pk_fields or value_fields
                missing = [k for k in keys if k not in value_fields]
                if missing:
                    raise DatabaseError(
                        f"table {table}: {PK_FIELDS} names {missing[0]!r}, which the values"
                        f" of topic {topic} do not have"
                    )
            taken = set(keys) if self.pk_mode != PK_RECORD_VALUE else set()
            columns += [decoded[f].alias(f) for f in value_fields if f not in taken]
        elif self.pk_mode != PK_RECORD_KEY:
            return True, None  # tombstones only, and nothing they could delete
        if not schemas.complete:
            columns.append(schemas.unexpected().alias(_UNEXPECTED))
        rows = (with_decoded(df, decodes) if decodes else df).select(*columns)
        if not self.settings[DELETE_ENABLED]:
            rows = rows.where(~F.col("__deleted"))
        fields = [f for f in rows.schema.fields if f.name not in (*_LOCATION, _UNEXPECTED)]
        planned = time.monotonic()
        self._prepare_table(table, fields, keys)
        stage = self._create_stage([f for f in rows.schema.fields if f.name != _UNEXPECTED], table)
        prepared = time.monotonic()
        written, unexpected = self._copy(rows, stage)
        if unexpected:
            self._execute(f"DROP TABLE {stage.sql}", what=f"table {table} (staging)")
            return False, None
        log.debug(
            "JdbcSink %s: %d rows staged for %s: schemas read in %.3f s, tables ready in"
            " %.3f s, copied in %.3f s",
            self.connector,
            written,
            table,
            planned - began,
            prepared - planned,
            time.monotonic() - prepared,
        )
        return True, _Staged(stage, table, [f.name for f in fields], keys, written)

    def _key_columns(
        self,
        key_schemas: list[dict],
        table: TableId,
        decodes: dict[str, tuple[str, dict]],
        native: bool,
    ) -> tuple[list[str], list[Any]]:
        """The primary key's names, and its columns (``decodes`` gets the key's schema,
        unless the keys are ``native``: typed columns already)."""
        from pyspark.sql import functions as F

        from herder.dataplane.schemas import merged_struct

        if not key_schemas:
            # keys without a schema: their text, one column
            name = self.pk_fields[0] if self.pk_fields else "__connect_key"
            return [name], [F.col("key").cast("string").alias(name)]
        structs = [s for s in key_schemas if s.get("type") == "struct"]
        if structs:
            merged = merged_struct(structs)
            if native:
                decoded = F.col("key")
            else:
                decodes["__key"] = ("key", merged)
                decoded = F.col("__key")
            names = [f["field"] for f in merged["fields"]]
            keys = self.pk_fields or names
            missing = [k for k in keys if k not in names]
            if missing:
                raise DatabaseError(
                    f"table {table}: {PK_FIELDS} names {missing[0]!r}, which the keys lack"
                )
            return keys, [decoded[k].alias(k) for k in keys]
        if len(self.pk_fields) > 1:
            raise DatabaseError(f"table {table}: a primitive key fills one {PK_FIELDS} column")
        name = self.pk_fields[0] if self.pk_fields else "__connect_key"
        if native:
            return [name], [F.col("key").alias(name)]
        decodes["__key"] = ("key", key_schemas[-1])
        return [name], [F.col("__key").alias(name)]

    def _prepare_table(
        self, table: TableId, fields: Sequence[StructField], keys: list[str]
    ) -> None:
        """Create the table (``auto.create``) or add the columns it lacks (``auto.evolve``)."""
        existing = self._columns(table)
        where = f"table {table}"
        if not existing:
            if not self.settings[AUTO_CREATE]:
                raise DatabaseError(f"{where} does not exist (and {AUTO_CREATE}=false)")
            definitions = [
                f"{quote(f.name)} {pg_type_of(f.dataType, where)}"
                + (" NOT NULL" if f.name in keys else "")
                for f in fields
            ]
            if keys:
                definitions.append(f"PRIMARY KEY ({', '.join(quote(k) for k in keys)})")
            self._execute(
                f"CREATE TABLE IF NOT EXISTS {table.sql} ({', '.join(definitions)})",
                what=where,
            )
            log.info("JdbcSink %s: created %s", self.connector, table)
            return
        missing = [f for f in fields if f.name not in existing]
        # a column whose records' type grew wider upstream (integer to bigint): its old
        # type would refuse the values that need the new one
        widened = {
            f.name: wanted
            for f in fields
            if f.name in existing
            and widens(existing[f.name], wanted := pg_type_of(f.dataType, where))
        }
        if not missing and not (widened and self.settings[AUTO_EVOLVE]):
            return
        if not self.settings[AUTO_EVOLVE]:
            raise DatabaseError(
                f"{where} has no column {missing[0].name!r} (and {AUTO_EVOLVE}=false)"
            )
        self._execute(
            *[
                f"ALTER TABLE {table.sql} ADD COLUMN IF NOT EXISTS {quote(f.name)}"
                f" {pg_type_of(f.dataType, f'{where}, column {f.name!r}')}"
                for f in missing
            ],
            *[
                f"ALTER TABLE {table.sql} ALTER COLUMN {quote(name)} TYPE {wanted}"
                for name, wanted in widened.items()
            ],
            what=where,
        )
        if missing:
            log.info(
                "JdbcSink %s: added %s to %s", self.connector, [f.name for f in missing], table
            )
        for name, wanted in widened.items():
            log.info(
                "JdbcSink %s: widened column %s of %s from %s to %s",
                self.connector, name, table, existing[name], wanted,
            )  # fmt: skip

    def _columns(self, table: TableId) -> dict[str, str]:
        try:
            found = table_columns(self.conn, table)
            self.conn.commit()
        except Exception as exc:
            self._rollback()
            raise DatabaseError(f"table {table}: {first_line(exc)}") from exc
        return {c.name: c.pg_type for c in found}

    def _create_stage(self, fields: Sequence[StructField], table: TableId) -> TableId:
        self._staged_count += 1
        stage = TableId(table.schema, f"{self._stage_prefix}{self._run}_{self._staged_count}")
        definitions = [
            f"{quote(f.name)} {pg_type_of(f.dataType, f'table {table}, column {f.name!r}')}"
            for f in fields
        ]
        self._execute(
            f"CREATE UNLOGGED TABLE {stage.sql} ({', '.join(definitions)})",
            what=f"table {table} (staging)",
        )
        return stage

    def _copy(self, rows: DataFrame, stage: TableId) -> tuple[int, int]:
        """Copy ``rows`` into ``stage`` from the executors, each partition through a
        connection of its own; how many rows were copied, and how many of them were
        marked unexpected (their records' schemas were not those planned for)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from herder.dataplane.spark import spark_runtime

        jsonish = (T.StructType, T.MapType)
        projected = [
            F.to_json(F.col(f"`{f.name}`")).alias(f.name)
            if isinstance(f.dataType, jsonish)
            or (
                isinstance(f.dataType, T.ArrayType)
                and isinstance(f.dataType.elementType, (*jsonish, T.ArrayType))
            )
            else F.col(f"`{f.name}`")
            for f in rows.schema.fields
        ]
        dsn, target, batch_rows = self.database.libpq(), stage.sql, self.settings[BATCH_SIZE]
        parallelism = spark_runtime().parallelism
        if parallelism:
            # A delivery of many small pieces (a change stream's batches, a partition
            # per piece) is copied through as many connections as Spark runs tasks at
            # once, not one per piece, which costs a connection and a round trip each.
            # The staging table's order does not matter: moving the rows keeps each
            # key's latest by its offset.
            rows = rows.coalesce(parallelism)

        def copy(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield from _copy_partition(dsn, target, batch_rows, batches)

        try:
            counted = (
                rows.select(*projected).mapInArrow(copy, "rows long, unexpected long").collect()
            )
        except Exception as exc:
            raise DatabaseError(f"copying into {stage}: {first_line(exc)}") from exc
        return sum(r["rows"] for r in counted), sum(r["unexpected"] for r in counted)

    # -- commit ------------------------------------------------------------------------

    def pre_commit(self, offsets: Mapping[TopicPartition, int]) -> Mapping[TopicPartition, int]:
        with self._lock:
            pending, self.pending = self.pending, []
        if not pending and not offsets:
            return offsets
        offsets_sql = self.offsets_table.sql
        me = literal(self.connector)
        # a batch's rows are sorted by key to keep the latest of each: in memory, not on disk
        statements: list[str | Optimistic] = (
            [f"SET LOCAL work_mem = '{MOVE_WORK_MEM}'"] if pending else []
        )
        if offsets:
            values = ", ".join(
                f"({me}, {literal(tp.topic)}, {tp.partition}, 0)" for tp in sorted(offsets)
            )
            statements.append(f"INSERT INTO {offsets_sql} VALUES {values} ON CONFLICT DO NOTHING")
            statements.append(f"SELECT 1 FROM {offsets_sql} WHERE connector = {me} FOR UPDATE")
        for staged in pending:
            statements += self._apply(staged)
            statements.append(
                f"UPDATE {offsets_sql} o SET next_offset = GREATEST(o.next_offset, s.reached)"
                f" FROM (SELECT __topic, __partition, max(__offset) + 1 AS reached"
                f" FROM {staged.stage.sql} GROUP BY 1, 2) s"
                f" WHERE o.connector = {me} AND o.topic = s.__topic"
                f" AND o.partition = s.__partition"
            )
            statements.append(f"DROP TABLE {staged.stage.sql}")
        for tp, offset in sorted(offsets.items()):
            statements.append(
                f"UPDATE {offsets_sql} SET next_offset = GREATEST(next_offset, {int(offset)})"
                f" WHERE connector = {me} AND topic = {literal(tp.topic)}"
                f" AND partition = {tp.partition}"
            )
        tables = ", ".join(sorted({str(s.table) for s in pending})) or str(self.offsets_table)
        began = time.monotonic()
        self._execute(*statements, what=f"table {tables}")
        if pending:
            log.debug(
                "JdbcSink %s: %d staged rows moved into %s in %.3f s",
                self.connector,
                sum(s.rows for s in pending),
                tables,
                time.monotonic() - began,
            )
        return offsets

    def _apply(self, staged: _Staged) -> list[str | Optimistic]:
        """SQL that moves a staging table's new rows into its table."""
        me = literal(self.connector)
        columns = ", ".join(quote(c) for c in staged.columns)
        fresh = (
            f"SELECT s.* FROM {staged.stage.sql} s JOIN {self.offsets_table.sql} o"
            f" ON o.connector = {me} AND o.topic = s.__topic AND o.partition = s.__partition"
            " WHERE s.__offset >= o.next_offset"
        )
        target = staged.table.sql
        if not staged.keys or (self.insert_mode == INSERT and not self.settings[DELETE_ENABLED]):
            return [f"INSERT INTO {target} ({columns}) SELECT {columns} FROM ({fresh}) f"
                    " WHERE NOT f.__deleted"]  # fmt: skip
        keys = ", ".join(quote(k) for k in staged.keys)
        latest = (
            f"SELECT DISTINCT ON ({keys}) * FROM ({fresh}) f"
            f" ORDER BY {keys}, f.__topic, f.__partition, f.__offset DESC"
        )
        match = " AND ".join(f"t.{quote(k)} = l.{quote(k)}" for k in staged.keys)
        statements: list[str | Optimistic] = []
        if self.settings[DELETE_ENABLED]:
            statements.append(
                f"DELETE FROM {target} t USING ({latest}) l WHERE l.__deleted AND {match}"
            )
        others = [c for c in staged.columns if c not in staged.keys]
        if self.insert_mode == UPDATE:
            if others:
                sets = ", ".join(f"{quote(c)} = l.{quote(c)}" for c in others)
                statements.append(
                    f"UPDATE {target} t SET {sets} FROM ({latest}) l"
                    f" WHERE NOT l.__deleted AND {match}"
                )
            return statements
        if self.insert_mode == INSERT:
            statements.append(
                f"INSERT INTO {target} ({columns}) SELECT {columns} FROM ({fresh}) f"
                " WHERE NOT f.__deleted"
            )
            return statements
        conflict = (
            "DO UPDATE SET " + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in others)
            if others
            else "DO NOTHING"
        )
        upsert = (
            f"INSERT INTO {target} ({columns}) SELECT {columns} FROM ({latest}) l"
            f" WHERE NOT l.__deleted ON CONFLICT ({keys}) {conflict}"
        )
        # Without deletes, the plain insert need not keep each key's latest: a key staged
        # twice fails it as a key already in the table does, and the upsert then keeps
        # the latest. (A key inserted, then deleted, must not be inserted: with deletes
        # the latest of each key decides.)
        # Once a plain insert of a table's rows as they were has failed, its batches are
        # taken to repeat keys (a row inserted then updated within a batch), and its
        # plain inserts take each key's latest: one that fails costs a move twice.
        as_staged = not self.settings[DELETE_ENABLED] and target not in self._repeating
        rows = fresh if as_staged else latest
        plain = (
            f"INSERT INTO {target} ({columns}) SELECT {columns} FROM ({rows}) l"
            " WHERE NOT l.__deleted"
        )
        check = plain_insert_check(target, staged.stage.sql, staged.keys)
        statements.append(Optimistic(target, check, plain, upsert))
        return statements

    def stop(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is None:
            return
        try:
            self._drop_stages(lambda name: self._run in name)
        except DatabaseError as exc:
            log.info("JdbcSink %s: staging tables left for the next start: %s", self.connector, exc)
        try:
            conn.close()
        except Exception:
            log.debug("JdbcSink %s: close failed", self.connector, exc_info=True)


def plain_insert_check(target: str, stage: str, keys: Sequence[str]) -> str:
    """A query whether a plain insert of ``stage``'s rows into ``target`` does what an
    upsert on ``keys`` would: ``target`` has the unique index the upsert's ``ON CONFLICT
    (keys)`` needs (without one the upsert fails, and so must this), and no key staged
    can be in it: it is empty, or (one key column) the staged keys' range and its own
    do not meet. The target's range comes from that index, at once."""
    columns = ", ".join(literal(k) for k in sorted(keys))
    indexed = (
        f"EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = {literal(target)}::regclass"
        " AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL"
        ' AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text COLLATE "C")'
        " FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey))"
        f" = ARRAY[{columns}]::text[])"
    )
    if len(keys) != 1:
        return f"SELECT {indexed} AND NOT EXISTS (SELECT 1 FROM {target})"
    key = quote(keys[0])
    return (
        f"SELECT {indexed} AND (t.hi IS NULL OR s.lo > t.hi OR s.hi < t.lo)"
        f" FROM (SELECT min({key}) AS lo, max({key}) AS hi FROM {target}) t,"
        f" (SELECT min({key}) AS lo, max({key}) AS hi FROM {stage}) s"
    )


#: Column types each of which holds every value of those before it.
_WIDENING = (("smallint", "integer", "bigint"), ("real", "double precision"))


def widens(current: str, wanted: str) -> bool:
    """Whether column type ``wanted`` is a wider kind of ``current`` (``integer`` →
    ``bigint``, ``real`` → ``double precision``), as a source's column widened."""
    for ladder in _WIDENING:
        if current in ladder and wanted in ladder:
            return ladder.index(wanted) > ladder.index(current)
    return False


def _copy_partition(
    dsn: str, target: str, batch_rows: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark partition's rows into ``target`` (on an executor): a binary COPY per
    ``batch_rows`` rows, all in one transaction of a connection of its own."""
    import adbc_driver_postgresql.dbapi as dbapi
    import pyarrow as pa
    import pyarrow.compute as pc

    schema_name, _, table = (part.strip('"').replace('""', '"') for part in target.partition('"."'))
    total = unexpected = 0
    conn = None
    try:
        group: list[pa.RecordBatch] = []
        rows = 0
        for batch in _chained(batches, None):
            if batch is not None and _UNEXPECTED in batch.schema.names:
                flags = batch.column(_UNEXPECTED)
                unexpected += int(pc.sum(flags).as_py() or 0)
                batch = batch.drop_columns([_UNEXPECTED])
            if unexpected:
                continue  # the batch is staged again: these rows are not needed
            if batch is not None:
                group.append(batch)
                rows += batch.num_rows
            if group and (batch is None or rows >= batch_rows):
                if conn is None:
                    conn = dbapi.connect(dsn)
                with conn.cursor() as cursor:
                    cursor.adbc_ingest(
                        table, pa.Table.from_batches(group), mode="append",
                        db_schema_name=schema_name,
                    )  # fmt: skip
                total += rows
                group, rows = [], 0
        if conn is not None and not unexpected:
            conn.commit()
    finally:
        if conn is not None:
            conn.close()
    yield pa.RecordBatch.from_pydict({"rows": [total], "unexpected": [unexpected]})


def _chained(batches: Iterator[pa.RecordBatch], last: None) -> Iterator[pa.RecordBatch | None]:
    """``batches``, then ``last`` (None: the end)."""
    yield from batches
    yield last
