"""The connector API's own behaviour: records, defaults, and the contracts authors rely on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import FrozenInstanceError
from typing import Any, cast

import pytest

from herder.config import ConfigDef, Importance, Range, Type
from herder.connect import (
    Connector,
    ConnectorContext,
    ConnectorType,
    OffsetReader,
    SinkConnector,
    SinkTask,
    SourceBatch,
    SourceConnector,
    SourceOffset,
    SourcePartition,
    SourceRecord,
    SourceTask,
    TopicPartition,
)

pytestmark = pytest.mark.unit

# SourceBatch never touches its DataFrame; the data plane does. A stand-in is enough here.
DF = cast(Any, object())


class Lines(SourceConnector):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define("file", Type.STRING, importance=Importance.HIGH, documentation="Input.")
            .define("tasks.max", Type.INT, default=1, validator=Range.at_least(1))
        )

    def start(self, config: dict[str, str]) -> None:
        self.calls.append(f"start {config['file']}")

    def task_class(self) -> type[SourceTask]:
        return LinesTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [{"n": str(i)} for i in range(max_tasks)]

    def stop(self) -> None:
        self.calls.append("stop")


class LinesTask(SourceTask):
    def start(self, config: dict[str, str]) -> None:
        pass

    def poll(self) -> list[SourceRecord] | SourceBatch | None:
        return None

    def stop(self) -> None:
        pass


class Printer(SinkTask):
    def __init__(self) -> None:
        self.flushed: list[Mapping[TopicPartition, int]] = []

    def start(self, config: dict[str, str]) -> None:
        pass

    def put(self, df: Any) -> None:
        pass

    def flush(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.flushed.append(dict(offsets))

    def stop(self) -> None:
        pass


class PrinterConnector(SinkConnector):
    def start(self, config: dict[str, str]) -> None:
        pass

    def task_class(self) -> type[SinkTask]:
        return Printer

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return []

    def stop(self) -> None:
        pass


def test_topic_partitions_are_frozen_hashable_ordered_values() -> None:
    tp = TopicPartition("lines", 3)
    assert tp == TopicPartition("lines", 3)
    assert {tp: 10}[TopicPartition("lines", 3)] == 10
    assert sorted([TopicPartition("b", 0), TopicPartition("a", 10), TopicPartition("a", 2)]) == [
        TopicPartition("a", 2),
        TopicPartition("a", 10),
        TopicPartition("b", 0),
    ]
    assert str(tp) == "lines-3"
    with pytest.raises(FrozenInstanceError):
        tp.partition = 4  # type: ignore[misc]


def test_source_records_are_lean_and_keyword_only_past_the_value() -> None:
    record = SourceRecord({"file": "a"}, {"pos": 10}, "lines", "hello", key=b"k", timestamp_ms=5)
    assert not hasattr(record, "__dict__")
    assert (record.partition, record.headers, record.key) == (None, (), b"k")
    assert record == SourceRecord(
        {"file": "a"}, {"pos": 10}, "lines", "hello", key=b"k", timestamp_ms=5
    )
    with pytest.raises(TypeError):
        SourceRecord({"file": "a"}, {"pos": 10}, "lines", "hello", b"k")  # type: ignore[call-arg]


def test_a_source_batch_names_each_source_partition_once() -> None:
    batch = SourceBatch(DF, [({"file": "a"}, {"pos": 100}), ({"file": "b"}, {"pos": 7})], "lines")
    assert batch.topic == "lines"
    assert [p for p, _ in batch.offsets] == [{"file": "a"}, {"file": "b"}]
    with pytest.raises(ValueError, match="appears twice"):
        SourceBatch(DF, [({"file": "a"}, {"pos": 1}), ({"file": "a"}, {"pos": 2})])
    with pytest.raises(TypeError, match="pairs"):
        SourceBatch(DF, [("a", {"pos": 1})])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not JSON serializable"):
        SourceBatch(DF, [({"file": "a"}, {"pos": object()})])


def test_connector_validation_defaults_to_its_config_def() -> None:
    results = Lines().validate({"tasks.max": "0"})
    assert results["file"].errors == [
        'Missing required configuration "file" which has no default value.'
    ]
    assert results["tasks.max"].errors
    ok = Lines().validate({"file": "/tmp/in", "tasks.max": "2"})
    assert all(not v.errors for v in ok.values())
    assert ok["tasks.max"].value == 2


def test_connectors_without_a_config_def_accept_anything() -> None:
    assert PrinterConnector().validate({"anything": "goes"}) == {}


def test_reconfigure_defaults_to_stop_then_start() -> None:
    connector = Lines()
    connector.reconfigure({"file": "/tmp/b"})
    assert connector.calls == ["stop", "start /tmp/b"]


def test_initialize_hands_the_connector_its_context() -> None:
    class Context(ConnectorContext):
        def __init__(self) -> None:
            self.requests = 0

        def request_task_reconfiguration(self) -> None:
            self.requests += 1

        def raise_error(self, error: BaseException) -> None:
            raise AssertionError(error)

    connector, context = Lines(), Context()
    connector.initialize(context)
    connector.context.request_task_reconfiguration()
    assert context.requests == 1


def test_connector_types() -> None:
    assert ConnectorType.of(Lines) is ConnectorType.SOURCE
    assert ConnectorType.of(PrinterConnector()) is ConnectorType.SINK
    assert ConnectorType.of(Connector) is ConnectorType.UNKNOWN
    assert ConnectorType.SOURCE == "source"
    assert Lines().version() == LinesTask().version() == "undefined"


def test_tasks_must_implement_their_abstract_methods() -> None:
    class Lazy(SourceTask):
        def start(self, config: dict[str, str]) -> None:
            pass

        def stop(self) -> None:
            pass

    with pytest.raises(TypeError, match="poll"):
        Lazy()  # type: ignore[abstract]


def test_pre_commit_defaults_to_flushing_and_committing_everything() -> None:
    task = Printer()
    offsets = {TopicPartition("lines", 0): 42}
    assert task.pre_commit(offsets) == offsets
    assert task.flushed == [offsets]


def test_one_offset_is_read_through_the_batch_lookup() -> None:
    class Stored(OffsetReader):
        def __init__(self) -> None:
            self.asked: list[list[SourcePartition]] = []

        def offsets(self, partitions: Sequence[SourcePartition]) -> list[SourceOffset | None]:
            self.asked.append(list(partitions))
            return [{"pos": 9} if p == {"file": "a"} else None for p in partitions]

    reader = Stored()
    assert reader.offset({"file": "a"}) == {"pos": 9}
    assert reader.offset({"file": "b"}) is None
    assert reader.asked == [[{"file": "a"}], [{"file": "b"}]]


def test_partitions_of_and_rows_in_pick_each_partitions_records_in_order() -> None:
    import pyarrow as pa

    from herder.connect import OffsetRange, TopicPartition, partitions_of, rows_in

    table = pa.table(
        {
            "topic": ["a", "b", "a", "a", "b"],
            "partition": [1, 0, 0, 1, 0],
            "offset": [7, 3, 0, 8, 4],
        }
    )
    split = [(tp, rows["offset"].to_pylist()) for tp, rows in partitions_of(table)]
    assert split == [
        (TopicPartition("a", 1), [7, 8]),
        (TopicPartition("b", 0), [3, 4]),
        (TopicPartition("a", 0), [0]),
    ]
    picked = rows_in(table, OffsetRange(TopicPartition("a", 1), 8, 9))
    assert picked["offset"].to_pylist() == [8]
