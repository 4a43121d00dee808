"""What the ensemble knows about topics: definitions, segments and start offsets.

Two kinds of ensemble log hold a topic's metadata; both are compacted logs of JSON
values, so ``herder logs read`` shows them as they are:

* ``_topics`` keeps one record per topic, keyed by its name: partitions, configs and
  creation time. The record's version (the zxid that wrote it) names the topic's
  *incarnation*: a topic that is deleted and created again gets a new one, and a batch
  staged for the old incarnation can never be committed into the new one.
* ``topic.<name>.<partition>`` (one *segment log* per partition) keeps a record per
  segment under the key ``s<base offset, 20 digits>`` and the partition's start offset
  under the key ``start``. A writer that commits a segment checks the log's end offset
  (:class:`~herder.ensemble.txn.CheckEndOffset`): every change to the partition moves it,
  so of two writers that planned the same base offset only the first commits and the
  other re-reads and retries. Compaction lets retention give the memory back: a segment
  past its retention is first rewritten as *retired* (with the time its files may go),
  then deleted by a tombstone once its files are gone.

Everything here is pure: records in, state out; the IO lives in :mod:`.topics`.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from herder.config import ConfigDef, Importance, Range, Type
from herder.ensemble.txn import Record
from herder.errors import ConfigError

#: The compacted log of topic definitions, keyed by topic name.
TOPICS_LOG = "_topics"
#: The key of a segment log's start-offset record.
START_KEY = b"start"

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_NAME_RULE = "use 1 to 200 of A-Z a-z 0-9 . _ - (and not '.' or '..')"

TOPIC_CONFIG = (
    ConfigDef()
    .define("retention.ms", Type.LONG, default=7 * 24 * 3600 * 1000,
            validator=Range.at_least(-1), importance=Importance.MEDIUM,
            documentation="Retire a segment once its newest record is this old (-1: never).")
    .define("retention.bytes", Type.LONG, default=-1, validator=Range.at_least(-1),
            importance=Importance.MEDIUM,
            documentation="Retire the oldest segments of a partition while it stays at least "
                          "this big without them (-1: no limit).")
    .define("retention.file.delete.delay.ms", Type.LONG, default=60_000,
            validator=Range.at_least(0), importance=Importance.LOW,
            documentation="How long a retired segment's files stay for readers that planned "
                          "on them.")
)  # fmt: skip


def check_topic_name(name: str) -> str:
    """``name`` if it can name a topic (and its segment logs), else ConfigError."""
    if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"{name!r} is not a valid topic name: {_NAME_RULE}")
    return name


def segment_log(topic: str, partition: int) -> str:
    """The ensemble log holding the segments of ``topic``'s ``partition``."""
    return f"topic.{topic}.{partition}"


def parse_topic_config(config: Mapping[str, Any]) -> dict[str, int]:
    """Typed topic configs with defaults filled in; an unknown key is a ConfigError."""
    unknown = sorted(set(config) - set(TOPIC_CONFIG.keys))
    if unknown:
        known = ", ".join(TOPIC_CONFIG.keys)
        raise ConfigError(f"unknown topic config {unknown[0]!r} (known: {known})")
    return {k: int(v) for k, v in TOPIC_CONFIG.parse(config).items()}


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A topic's definition as stored in ``_topics``."""

    name: str
    partitions: int
    config: dict[str, int]
    created_ms: int


@dataclass(frozen=True)
class Topic:
    """A topic definition and the version (zxid) of its record in ``_topics``."""

    spec: TopicSpec
    version: int

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def partitions(self) -> int:
        return self.spec.partitions

    @property
    def config(self) -> dict[str, int]:
        return self.spec.config


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """One committed segment: records ``base_offset`` … ``base_offset + count - 1``.

    ``files`` are Parquet files relative to ``storage.root``. ``delete_after_ms`` is set
    once retention retired the segment: readers no longer see it, and its files go after
    that time.

    ``file_counts``, when the writer gives it, is the number of records in each file
    and promises that the files, in their order, hold consecutive runs of offsets, each
    file's rows in offset order: a record's offset is ``base_offset``, plus the counts of
    the files before its own, plus its row's index in its file. A reader then reads only
    the files it needs and gets records in offset order without sorting them. Without it
    (a batch written across partitions in one job) nothing is promised about where a
    record is, and a record's offset is ``base_offset`` plus its ``seq`` column.

    ``key_type`` and ``value_type``, when set, say that the files hold that part as a
    native column of this Spark type (its JSON form, see :mod:`.typed`); without them
    it is bytes.

    ``value_constants``, when set, is a JSON object of top-level fields of the typed
    value that every record of the segment holds with the same value: the files leave
    them out, and readers put them back (see :mod:`.typed`).
    """

    partition: int
    base_offset: int
    count: int
    files: list[str]
    bytes: int
    max_timestamp: int
    delete_after_ms: int | None = None
    file_counts: list[int] | None = None
    key_type: str | None = None
    value_type: str | None = None
    value_constants: str | None = None

    @property
    def types(self) -> dict[str, str]:
        """The stored types of the typed parts, by part (``key``, ``value``)."""
        found = {"key": self.key_type, "value": self.value_type}
        return {part: stored for part, stored in found.items() if stored is not None}

    @property
    def constants(self) -> dict[str, Any]:
        """The value's fields its files leave out, and their one value (see above)."""
        return json.loads(self.value_constants) if self.value_constants else {}

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def ordered(self) -> bool:
        """Whether the files hold runs of offsets in order (see ``file_counts``)."""
        return self.file_counts is not None

    def file_ranges(self) -> list[tuple[str, int, int]]:
        """(file, first offset, end offset) of each file; needs ``file_counts``."""
        if self.file_counts is None:
            raise ValueError("this segment does not say which records each file holds")
        out, start = [], self.base_offset
        for path, count in zip(self.files, self.file_counts, strict=True):
            out.append((path, start, start + count))
            start += count
        return out

    @property
    def key(self) -> builtins.bytes:
        return segment_key(self.base_offset)

    @property
    def retired(self) -> bool:
        return self.delete_after_ms is not None


@dataclass(frozen=True)
class SegmentSlice:
    """Offsets [from_offset, to_offset) of one committed segment, for a reader."""

    topic: str
    segment: Segment
    from_offset: int
    to_offset: int

    @property
    def partition(self) -> int:
        return self.segment.partition


class StartOffset(msgspec.Struct, frozen=True):
    """A partition's start offset: readers see no record below it."""

    start_offset: int


def segment_key(base_offset: int) -> bytes:
    return b"s%020d" % base_offset


_encoder = msgspec.json.Encoder()
_spec_decoder = msgspec.json.Decoder(TopicSpec)
_segment_decoder = msgspec.json.Decoder(Segment)
_start_decoder = msgspec.json.Decoder(StartOffset)


def encode(value: TopicSpec | Segment | StartOffset) -> bytes:
    return _encoder.encode(value)


def decode_topic(record: Record) -> Topic | None:
    """The topic a ``_topics`` record defines (None for a tombstone)."""
    if record.value is None:
        return None
    return Topic(_spec_decoder.decode(record.value), record.zxid)


@dataclass
class PartitionState:
    """What a reader of one segment log knows of its partition.

    ``log_end`` is the segment log's end offset as last read: the value a commit
    checks. ``next_offset`` is the offset the next committed record gets.
    """

    topic: str
    partition: int
    log_end: int = 0
    start_offset: int = 0
    #: zxid of the start-offset record (None: never written); retention checks it
    start_version: int | None = None
    segments: dict[int, Segment] = field(default_factory=dict)

    @property
    def log(self) -> str:
        return segment_log(self.topic, self.partition)

    def apply(self, record: Record) -> None:
        """Take in one record of the segment log (records arrive in offset order)."""
        if record.key == START_KEY:
            if record.value is not None:
                self.start_offset = _start_decoder.decode(record.value).start_offset
                self.start_version = record.zxid
            self.segments = {
                b: s
                for b, s in self.segments.items()
                if s.end_offset > self.start_offset or s.retired
            }
        elif record.key is not None and record.key.startswith(b"s"):
            base = int(record.key[1:])
            if record.value is None:
                self.segments.pop(base, None)
            else:
                self.segments[base] = _segment_decoder.decode(record.value)

    @property
    def next_offset(self) -> int:
        ends = (s.end_offset for s in self.segments.values())
        return max(self.start_offset, *ends) if self.segments else self.start_offset

    def live(self) -> list[Segment]:
        """Segments readers see, oldest first."""
        return sorted(
            (
                s
                for s in self.segments.values()
                if not s.retired and s.end_offset > self.start_offset
            ),
            key=lambda s: s.base_offset,
        )

    def retired(self) -> list[Segment]:
        return sorted((s for s in self.segments.values() if s.retired), key=lambda s: s.base_offset)

    def overlapping(self, from_offset: int, to_offset: int | None) -> list[Segment]:
        """Live segments holding some offset of [from_offset, to_offset)."""
        return [
            s
            for s in self.live()
            if s.end_offset > from_offset and (to_offset is None or s.base_offset < to_offset)
        ]

    def piece_ends(self, position: int) -> Iterator[int]:
        """The end offsets of the pieces a read from ``position`` takes, in order: a
        piece is a file of a segment that says which run of offsets each file holds
        (:attr:`Segment.file_counts`), or a whole segment of another kind.

        Pieces are where reads may end. They follow from the committed segments alone,
        so every reader from ``position`` cuts at the same offsets, whenever it reads
        and however much it takes: a sink naming each output by its piece's first
        offset writes the same outputs under the same names as any other instance of
        it (a zombie included), never outputs that overlap.
        """
        for segment in self.overlapping(position, None):
            if not segment.ordered:
                yield segment.end_offset
                continue
            for _path, _first, file_end in segment.file_ranges():
                if file_end > position:
                    yield file_end

    def read_stop(
        self,
        position: int,
        budget: int,
        max_pieces: int | None = None,
        min_pieces: int = 1,
    ) -> int:
        """Where a read of about ``budget`` records from ``position`` should end.

        Reads end where pieces end (:meth:`piece_ends`), so no file is read twice by
        consecutive reads: at the last piece end within ``budget`` records and
        ``max_pieces`` pieces, or, if the first piece reaching past ``position`` is
        bigger than that, at its end (as Kafka returns a record batch larger than the
        fetch limit, so a consumer always progresses). ``position`` itself if there is
        nothing to read.

        ``min_pieces``: so that a ranged read (a Spark partition per piece) gives each of
        Spark's cores a file, it takes that many pieces (or all there are, within
        ``max_pieces``) past ``budget``, as long as they end within twice ``budget``:
        with pieces of more than half the budget, it would otherwise take one at a
        time, and one core would do the work.
        """
        limit, stretch = position + budget, position + 2 * budget
        stop: int | None = None
        for taken, end in enumerate(self.piece_ends(position)):
            if stop is not None and (
                (max_pieces is not None and taken >= max_pieces)
                or (end > limit and (taken >= min_pieces or end > stretch))
            ):
                break
            stop = end
        return position if stop is None else stop

    @property
    def size_bytes(self) -> int:
        return sum(s.bytes for s in self.live())


@dataclass(frozen=True)
class RetentionPlan:
    """What one retention pass does to a partition."""

    #: live segments to retire now, oldest first
    retire: list[Segment]
    #: the start offset once they are retired
    new_start: int
    #: retired segments whose delay is over: delete their files, then their records
    purge: list[Segment]


def plan_retention(state: PartitionState, config: Mapping[str, int], now_ms: int) -> RetentionPlan:
    """Which segments retention retires and purges at ``now_ms``.

    As in Kafka, only a prefix of the partition goes: the oldest segment while its
    newest record is older than ``retention.ms``, or while the partition without it is
    still at least ``retention.bytes``. Unlike Kafka there is no active segment to keep
    (segments are immutable), so a partition may retire every segment; its start
    offset then equals its end offset and the next record still gets the next offset.
    """
    retention_ms, retention_bytes = config["retention.ms"], config["retention.bytes"]
    live = state.live()
    total = sum(s.bytes for s in live)
    retire: list[Segment] = []
    for segment in live:
        too_old = retention_ms >= 0 and segment.max_timestamp < now_ms - retention_ms
        too_big = retention_bytes >= 0 and total - segment.bytes >= retention_bytes
        if not (too_old or too_big):
            break
        retire.append(segment)
        total -= segment.bytes
    new_start = retire[-1].end_offset if retire else state.start_offset
    purge = [
        s for s in state.retired() if s.delete_after_ms is not None and s.delete_after_ms <= now_ms
    ]
    return RetentionPlan(retire, new_start, purge)
