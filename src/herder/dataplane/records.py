"""Source records as Arrow: the one place records pass through Python one by one.

Moving rows from Python into Spark is the slow step of a pipeline (SPARK_NOTES: about
180k rows/s through pandas), so a poll's records become one Arrow table, column by
column, with everything the write needs already decided — partition and ``seq`` — and
Spark gets the table in a single ``createDataFrame``.

Partitioning is the same here and in Spark (see :mod:`.writer`), so a key
lands in the same partition whichever way its record came: the record's own partition
if it names one; else CRC-32 of the key bytes modulo the partition count (Spark's
``crc32``, Python's ``zlib.crc32``); else, for records with neither, one partition for
the whole batch (Kafka's "sticky" partitioner: fewer, bigger segments), rotating from
batch to batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from zlib import crc32

import numpy as np
import pyarrow as pa

from herder.connect.records import SourceRecord
from herder.errors import UnknownTopicOrPartition

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: The same type as Spark writes it.
HEADERS_DDL = "array<struct<key:string,value:binary>>"

#: The columns a staged batch carries into Spark: ``topic`` and ``partition`` become
#: directories, the rest is what a segment file holds.
STAGE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
        ("timestamp", pa.int64()),
        ("seq", pa.int64()),
    ]
)
#: The columns of a segment file; one may leave out ``key`` (no keys), ``headers`` (no
#: headers) and ``timestamp`` (all its segment's ``max_timestamp``), see :mod:`.writer`.
SEGMENT_SCHEMA = pa.schema([f for f in STAGE_SCHEMA if f.name not in ("topic", "partition")])


def no_headers(count: int) -> pa.ListArray:
    """``count`` empty header lists, built from their offsets: what each record without
    headers (most have none) is given. A list of empty Python lists, or ``fill_null``
    with an empty list, costs Arrow about 2 ms per thousand rows of this nested type;
    this takes 0.2 ms per ten thousand."""
    offsets = pa.array(np.zeros(count + 1, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], HEADER_TYPE.value_type), HEADER_TYPE)


def _as_bytes(value: object, what: str, index: int) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"record {index}: {what} must be bytes, str or None, not {type(value).__name__}"
    )


def _headers(record: SourceRecord, index: int) -> list[tuple[str, bytes | None]]:
    return [
        (str(name), _as_bytes(value, "a header value", index)) for name, value in record.headers
    ]


def records_to_table(
    records: Sequence[SourceRecord],
    partitions: Mapping[str, int],
    sticky: Mapping[str, int],
    now_ms: int,
) -> pa.Table:
    """``records`` as a table of :data:`STAGE_SCHEMA`, in their order.

    ``partitions`` gives each topic's partition count, ``sticky`` the partition of
    records with neither a partition nor a key, and ``now_ms`` the timestamp of records
    without one. ``seq`` counts from 0 in each (topic, partition), in record order.
    """
    plain = _plain_values(records, partitions, sticky, now_ms)
    if plain is not None:
        return plain
    topics: list[str] = []
    parts: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[tuple[str, bytes | None]]] = []
    stamps: list[int] = []
    seqs: list[int] = []
    next_seq: dict[tuple[str, int], int] = {}
    no_headers: list[tuple[str, bytes | None]] = []
    for index, record in enumerate(records):
        topic = record.topic
        count = partitions.get(topic)
        if count is None:
            raise UnknownTopicOrPartition(f"record {index}: topic {topic!r} does not exist")
        key = record.key
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key", index)
        value = record.value
        if value is not None and type(value) is not bytes:
            value = _as_bytes(value, "value", index)
        partition = record.partition
        if partition is None:
            partition = crc32(key) % count if key is not None else sticky[topic]
        elif not 0 <= partition < count:
            raise UnknownTopicOrPartition(
                f"record {index}: topic {topic!r} has no partition {partition} (it has {count})"
            )
        slot = (topic, partition)
        seq = next_seq.get(slot, 0)
        next_seq[slot] = seq + 1
        stamp = record.timestamp_ms
        topics.append(topic)
        parts.append(partition)
        keys.append(key)
        values.append(value)
        headers.append(_headers(record, index) if record.headers else no_headers)
        stamps.append(now_ms if stamp is None else stamp)
        seqs.append(seq)
    return pa.table(
        [
            pa.array(topics, pa.string()),
            pa.array(parts, pa.int32()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, HEADER_TYPE),
            pa.array(stamps, pa.int64()),
            pa.array(seqs, pa.int64()),
        ],
        schema=STAGE_SCHEMA,
    )


def _plain_values(
    records: Sequence[SourceRecord],
    partitions: Mapping[str, int],
    sticky: Mapping[str, int],
    now_ms: int,
) -> pa.Table | None:
    """:func:`records_to_table` for the common poll — values of bytes for one topic, no
    keys, partitions, headers or timestamps of their own (a file's lines) — a column at
    a time, at a fraction of a record-by-record pass's cost; None for any other poll."""
    if not records:
        return None
    topic = records[0].topic
    if topic not in partitions:
        return None
    values = []
    for record in records:
        value = record.value
        if (
            record.topic != topic
            or record.key is not None
            or record.partition is not None
            or record.headers
            or record.timestamp_ms is not None
            or (value is not None and type(value) is not bytes)
        ):
            return None
        values.append(value)
    count = len(records)
    return pa.table(
        [
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(sticky[topic], pa.int32()), count),
            pa.nulls(count, pa.binary()),
            pa.array(values, pa.binary()),
            no_headers(count),
            pa.repeat(pa.scalar(now_ms, pa.int64()), count),
            pa.array(np.arange(count, dtype=np.int64)),
        ],
        schema=STAGE_SCHEMA,
    )
