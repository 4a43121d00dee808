"""Debezium's ``ExtractNewRecordState`` (``unwrap``): a change event becomes the row.

A change event's value is an envelope (``before``, ``after``, ``op``, ``source`` …); a
sink that writes rows wants the row. This transform replaces each change event's value
by its ``after`` (with its schema, when the value is a typed record: JsonConverter's
schema-and-payload object), so a CDC topic feeds JdbcSink upserts directly:

* ``delete.handling.mode``: what a delete becomes: ``drop`` (the default: nothing),
  ``none`` (a tombstone, which JdbcSink with ``delete.enabled=true`` deletes by key), or
  ``rewrite`` (the ``before`` row with ``__deleted`` = ``"true"``; other rows get
  ``"false"``);
* ``drop.tombstones``: drop the tombstones that follow deletes (default true);
* ``add.fields``: envelope fields to copy into the row, prefixed with
  ``add.fields.prefix`` (``__``): ``op``, ``ts_ms`` from the envelope, ``source.<f>`` or
  ``<f>`` from its source block (``table``, ``lsn``, ``txId`` …): ``source.ts_ms``
  becomes ``__source_ts_ms``.

Truncate events are dropped (a row sink has nothing to write for them); records that
are not change events (heartbeats, other producers' records) pass untouched. The value
is read as JSON: the value converter with ``schemas.enable=false`` (its default) shows a
typed record's envelope as a plain object, which this transform reads whole. With
``value.converter.schemas.enable=true`` the chain gives the envelopes as typed values
(Spark structs, their schema in their type, not in the value), and the row comes out
typed too: the ``after`` struct, the added fields appended, so a sink writes it with
its columns' types as it would a table's rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from herder.config import ConfigDef, Importance, Type, ValidString
from herder.connect.transforms import VALUE, Outcome, Record
from herder.dataplane.transforms.builtin import BuiltInTransformation, is_absent, kind_of

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

DELETE_HANDLING = "delete.handling.mode"
DROP_TOMBSTONES = "drop.tombstones"
ADD_FIELDS = "add.fields"
ADD_FIELDS_PREFIX = "add.fields.prefix"
DROP, REWRITE, NONE = "drop", "rewrite", "none"
DELETED = "deleted"
#: the envelope's own fields (others named in add.fields come from its source block)
_ENVELOPE_FIELDS = ("op", "ts_ms")
_INT64_FIELDS = ("ts_ms", "ts_us", "ts_ns", "lsn", "txId", "xmin")


class ExtractNewRecordState(BuiltInTransformation):
    """A change event's value replaced by its new row (Debezium's ``unwrap``)."""

    class_name: ClassVar[str] = "io.debezium.transforms.ExtractNewRecordState"
    reads: ClassVar[frozenset[str]] = frozenset({VALUE})
    typed = True

    @classmethod
    def config_def(cls) -> ConfigDef:
        return (
            ConfigDef()
            .define(DELETE_HANDLING, Type.STRING, default=DROP,
                    validator=ValidString.in_(DROP, REWRITE, NONE), importance=Importance.MEDIUM,
                    documentation="What a delete becomes: drop (nothing), none (a"
                    " tombstone), rewrite (the old row with __deleted=true).")
            .define(DROP_TOMBSTONES, Type.BOOLEAN, default=True, importance=Importance.MEDIUM,
                    documentation="Drop tombstones (null values).")
            .define(ADD_FIELDS, Type.LIST, default="", importance=Importance.LOW,
                    documentation="Envelope fields to add to the row: op, ts_ms, or a source"
                    " field (table, lsn, source.ts_ms …).")
            .define(ADD_FIELDS_PREFIX, Type.STRING, default="__", importance=Importance.LOW,
                    documentation="The prefix of the added fields' names.")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.delete_mode: str = config[DELETE_HANDLING]
        self.drop_tombstones: bool = config[DROP_TOMBSTONES]
        self.prefix: str = config[ADD_FIELDS_PREFIX]
        self.added: list[tuple[str, str]] = []  # (new field name, path in the envelope)
        for name in (f.strip() for f in config[ADD_FIELDS] if f.strip()):
            if name in _ENVELOPE_FIELDS:
                path = f"$.{name}"
            else:
                path = "$.source." + name.removeprefix("source.")
            self.added.append((self.prefix + name.replace(".", "_"), path))

    def _field_schema(self, name: str, path: str) -> str:
        kind = "int64" if path.rsplit(".", 1)[1] in _INT64_FIELDS else "string"
        return json.dumps({"field": name, "type": kind, "optional": True})

    def _keep(self, record: Record, deleted: Column, truncated: Column) -> Column:
        """Which records stay: not tombstones (``drop.tombstones``), deletes (``drop``)
        nor truncates."""
        from pyspark.sql import functions as F

        keep = F.lit(True)
        if self.drop_tombstones:
            keep = ~record.is_null(VALUE)
        if self.delete_mode == DROP:
            keep = keep & ~F.coalesce(deleted, F.lit(False))
        return keep & ~F.coalesce(truncated, F.lit(False))

    def _typed(self, record: Record, dtype: StructType) -> Outcome:
        """The row of typed change events: ``after`` (``before`` for a rewritten
        delete), with the added fields, as a struct of its own type."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        value = record.part(VALUE)
        op = value["op"]
        deleted = op == "d"
        source = dtype["source"].dataType if "source" in dtype.names else None
        row_type = dtype["after"].dataType
        if not isinstance(row_type, T.StructType):
            return Outcome()  # not Debezium's envelope: its rows are structs
        row = F.when(deleted, value["before"]).otherwise(value["after"])
        # every column optional: the key's is not in a delete's ``after``
        fields = [T.StructField(f.name, f.dataType, True) for f in row_type.fields]
        for name, path in self.added:
            kind = T.LongType() if path.rsplit(".", 1)[1] in _INT64_FIELDS else T.StringType()
            field_name = path.removeprefix("$.").removeprefix("source.")
            if path.startswith("$.source."):
                known = isinstance(source, T.StructType) and field_name in source.names
                column = value["source"][field_name] if known else F.lit(None)
            else:
                column = value[field_name] if field_name in dtype.names else F.lit(None)
            row = row.withField(name, column.cast(kind))
            fields.append(T.StructField(name, kind, True))
        if self.delete_mode == REWRITE:
            flag = F.when(deleted, F.lit("true")).otherwise(F.lit("false"))
            row = row.withField(self.prefix + DELETED, flag)
            fields.append(T.StructField(self.prefix + DELETED, T.StringType(), True))
        new_type = T.StructType(fields)
        if self.delete_mode == NONE:
            row = F.when(deleted, F.lit(None).cast(new_type)).otherwise(row)
        return Outcome(
            updates={VALUE: row.cast(new_type)},
            keep=self._keep(record, deleted, op == "t"),
            types={VALUE: new_type},
        )

    def apply(self, record: Record) -> Outcome:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        dtype = record.type_of(VALUE)
        if dtype is not None:
            if isinstance(dtype, T.StructType) and {"op", "before", "after"} <= set(dtype.names):
                return self._typed(record, dtype)
            return Outcome()  # typed records that are not change events pass untouched
        value = record.part(VALUE)
        payload_field = F.try_variant_get(value, "$.payload", "variant")
        schema = F.try_variant_get(value, "$.schema", "variant")
        typed = (kind_of(value) == "OBJECT") & ~is_absent(payload_field) & ~is_absent(schema)
        payload = F.when(typed, payload_field).otherwise(value)
        op = F.try_variant_get(payload, "$.op", "string")
        is_change = (kind_of(payload) == "OBJECT") & op.isNotNull()
        deleted = is_change & (op == "d")
        rewrite = self.delete_mode == REWRITE

        extra: list[Column] = []
        for name, path in self.added:
            extra += [F.lit(name), F.try_variant_get(payload, path, "variant")]
        if rewrite:
            flag = F.when(deleted, F.lit("true")).otherwise(F.lit("false"))
            extra += [F.lit(self.prefix + DELETED), flag.cast("variant")]
        row_of = F.when(
            deleted,
            F.try_variant_get(payload, "$.before", "map<string,variant>"),
        ).otherwise(F.try_variant_get(payload, "$.after", "map<string,variant>"))
        row = F.map_concat(row_of, F.create_map(*extra)) if extra else row_of
        new_row = F.to_variant_object(row)

        # the row's schema: the envelope's ``after`` field, with the added fields
        fields = F.try_variant_get(schema, "$.fields", "array<variant>")
        after_schema = F.filter(
            fields, lambda f: F.try_variant_get(f, "$.field", "string") == F.lit("after")
        )[0]
        added = [self._field_schema(name, path) for name, path in self.added]
        if rewrite:
            added.append(json.dumps({"field": self.prefix + DELETED, "type": "string",
                                     "optional": True}))  # fmt: skip
        row_fields = F.try_variant_get(after_schema, "$.fields", "array<variant>")
        if added:
            row_fields = F.concat(row_fields, F.array(*[F.parse_json(F.lit(a)) for a in added]))
        schema_map = F.map_filter(
            F.try_variant_get(after_schema, "$", "map<string,variant>"),
            lambda k, _: ~k.isin("field", "fields"),
        )
        row_schema = F.to_variant_object(
            F.map_concat(schema_map, F.create_map(F.lit("fields"), F.to_variant_object(row_fields)))
        )
        envelope = F.to_variant_object(
            F.create_map(F.lit("schema"), row_schema, F.lit("payload"), new_row)
        )
        unwrapped = F.when(typed, envelope).otherwise(new_row)
        if self.delete_mode == NONE:
            unwrapped = F.when(deleted, F.lit(None).cast("variant")).otherwise(unwrapped)
        new_value = F.when(is_change & (op != "t"), unwrapped).otherwise(value)

        return Outcome(
            updates={VALUE: new_value}, keep=self._keep(record, deleted, is_change & (op == "t"))
        )
