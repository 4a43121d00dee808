"""The data plane's pure parts: metadata state, retention plans, records to Arrow, settings."""

from __future__ import annotations

import sys
from pathlib import Path
from zlib import crc32

import pyspark
import pytest

from herder.connect import OffsetRange, SourceRecord, TopicPartition
from herder.dataplane.delivery import DeliveryPlan, in_turn
from herder.dataplane.execution import TaskExecutions
from herder.dataplane.metadata import (
    START_KEY,
    PartitionState,
    Segment,
    StartOffset,
    check_topic_name,
    encode,
    parse_topic_config,
    plan_retention,
    segment_key,
    segment_log,
)
from herder.dataplane.reader import MAX_FILES_UNIONED
from herder.dataplane.records import records_to_table
from herder.dataplane.spark import DEFAULT_CONF, SparkRuntime, SparkSettings, check_spark_home
from herder.dataplane.storage import (
    batch_dir,
    batch_of,
    check_reachable,
    literal,
    parse_writer_dir,
)
from herder.ensemble.txn import Record
from herder.errors import ConfigError, UnknownTopicOrPartition
from herder.runtime.worker_config import WorkerConfig

pytestmark = pytest.mark.unit


def seg(base: int, count: int, *, ts: int = 0, size: int = 100, retired: int | None = None):
    return Segment(
        partition=0,
        base_offset=base,
        count=count,
        files=[f"_staging/t-e1/{base:010d}/topic=x/partition=0/f.parquet"],
        bytes=size,
        max_timestamp=ts,
        delete_after_ms=retired,
    )


def record(offset: int, key: bytes, value: bytes | None, zxid: int = 1) -> Record:
    return Record(offset, key, value, [], 0, zxid)


def state_of(*segments: Segment, start: int = 0) -> PartitionState:
    state = PartitionState("x", 0)
    for i, s in enumerate(segments):
        state.apply(record(i, s.key, encode(s)))
    if start:
        state.apply(record(len(segments), START_KEY, encode(StartOffset(start)), zxid=7))
    return state


def test_partition_state_follows_segments_start_and_tombstones() -> None:
    state = state_of(seg(0, 5), seg(5, 3), seg(8, 2))
    assert state.next_offset == 10
    assert [s.base_offset for s in state.overlapping(6, 9)] == [5, 8]
    assert [s.base_offset for s in state.overlapping(10, None)] == []
    state.apply(record(3, START_KEY, encode(StartOffset(5)), zxid=9))
    assert state.start_offset == 5 and state.start_version == 9
    assert [s.base_offset for s in state.live()] == [5, 8]
    state.apply(record(4, segment_key(8), None))
    assert [s.base_offset for s in state.live()] == [5]
    # the next offset never goes back, even when every segment is gone
    state.apply(record(5, START_KEY, encode(StartOffset(10))))
    state.apply(record(6, segment_key(5), None))
    assert state.live() == [] and state.next_offset == 10


def ordered_seg(base: int, *counts: int) -> Segment:
    return Segment(
        partition=0,
        base_offset=base,
        count=sum(counts),
        files=[
            f"_staging/t-e1/{base:010d}/topic=x/partition=0/f{i}.parquet"
            for i in range(len(counts))
        ],
        bytes=100,
        max_timestamp=0,
        file_counts=list(counts),
    )


def test_segments_with_file_counts_say_which_offsets_each_file_holds() -> None:
    segment = ordered_seg(10, 4, 6)
    assert segment.ordered and not seg(0, 5).ordered
    assert [(first, end) for _, first, end in segment.file_ranges()] == [(10, 14), (14, 20)]
    with pytest.raises(ValueError, match="does not say"):
        seg(0, 5).file_ranges()
    # older segments, stored without the field, decode with none
    assert state_of(seg(0, 5)).live()[0].file_counts is None
    assert state_of(segment).live()[0].file_counts == [4, 6]


def test_reads_stop_where_files_end() -> None:
    state = state_of(ordered_seg(0, 4, 6), ordered_seg(10, 5), ordered_seg(15, 3, 3))
    assert state.read_stop(0, 100) == 21  # everything
    assert state.read_stop(0, 12) == 10  # the last file end within the budget
    assert state.read_stop(0, 3) == 4  # a first file bigger than the budget, whole
    assert state.read_stop(2, 3) == 4  # from inside a file: its end
    assert state.read_stop(4, 11) == 15  # files of two segments
    assert state.read_stop(16, 1) == 18
    assert state.read_stop(21, 10) == 21  # nothing to read
    # a segment without file counts is one piece: read whole
    mixed = state_of(ordered_seg(0, 4), seg(4, 10), seg(14, 2))
    assert mixed.read_stop(0, 3) == 4
    assert mixed.read_stop(0, 8) == 4  # stops before the segment it cannot cut at a file
    assert mixed.read_stop(4, 3) == 14  # bigger than the budget, whole
    assert mixed.read_stop(5, 100) == 16  # from inside a segment: its end
    assert mixed.read_stop(4, 100) == 16


def test_reads_take_at_most_max_pieces_and_cut_where_any_other_reader_would() -> None:
    state = state_of(ordered_seg(0, 4, 6), seg(10, 5), ordered_seg(15, 3, 3))
    assert list(state.piece_ends(0)) == [4, 10, 15, 18, 21]
    assert list(state.piece_ends(12)) == [15, 18, 21]
    assert state.read_stop(0, 100, max_pieces=2) == 10
    assert state.read_stop(0, 100, max_pieces=0) == 4  # always at least one piece
    # a read that takes less, or one that starts later, ends where a bigger one cuts
    ends = set(state.piece_ends(0))
    for budget in range(1, 25):
        for pieces in range(1, 6):
            assert state.read_stop(0, budget, max_pieces=pieces) in ends


def test_retired_segments_are_invisible_but_kept_until_purged() -> None:
    state = state_of(seg(0, 5, retired=1_000), seg(5, 5), start=5)
    assert [s.base_offset for s in state.live()] == [5]
    assert [s.base_offset for s in state.retired()] == [0]
    config = {"retention.ms": -1, "retention.bytes": -1}
    assert plan_retention(state, config, now_ms=999).purge == []
    assert [s.base_offset for s in plan_retention(state, config, now_ms=1_000).purge] == [0]


def test_retention_by_age_takes_the_oldest_prefix_only() -> None:
    state = state_of(seg(0, 5, ts=100), seg(5, 5, ts=5_000), seg(10, 5, ts=200))
    plan = plan_retention(state, {"retention.ms": 1_000, "retention.bytes": -1}, now_ms=3_000)
    # the third segment is old too, but a newer one stands before it
    assert [s.base_offset for s in plan.retire] == [0] and plan.new_start == 5
    keep_all = plan_retention(state, {"retention.ms": -1, "retention.bytes": -1}, 10**12)
    assert keep_all.retire == [] and keep_all.new_start == 0


def test_retention_by_size_keeps_at_least_the_limit() -> None:
    state = state_of(seg(0, 1, size=100), seg(1, 1, size=100), seg(2, 1, size=100))
    config = {"retention.ms": -1, "retention.bytes": 150}
    plan = plan_retention(state, config, now_ms=0)
    assert [s.base_offset for s in plan.retire] == [0] and plan.new_start == 1
    everything_but_last = plan_retention(state, {**config, "retention.bytes": 1}, now_ms=0)
    assert [s.base_offset for s in everything_but_last.retire] == [0, 1]


def test_topic_names_and_configs() -> None:
    assert check_topic_name("orders.v1_x-2") == "orders.v1_x-2"
    for bad in ("", "a/b", "..", "a b", "x" * 201):
        with pytest.raises(ConfigError):
            check_topic_name(bad)
    assert segment_log("a.1", 0) == "topic.a.1.0"
    config = parse_topic_config({"retention.ms": "5000"})
    assert config == {
        "retention.ms": 5000,
        "retention.bytes": -1,
        "retention.file.delete.delay.ms": 60_000,
    }
    with pytest.raises(ConfigError, match=r"unknown topic config 'cleanup\.policy'"):
        parse_topic_config({"cleanup.policy": "compact"})
    with pytest.raises(ConfigError, match=r"retention\.bytes"):
        parse_topic_config({"retention.bytes": "-7"})


def test_staging_layout() -> None:
    path = batch_dir("my-export-0", 12, 3)
    assert path == "_staging/my-export-0-e12/0000000003"
    assert parse_writer_dir("my-export-0-e12") == ("my-export-0", 12)
    assert parse_writer_dir("my-export-0") is None
    assert batch_of(f"{path}/topic=t/partition=1/part-0.parquet") == path


def test_records_get_partitions_and_contiguous_seqs_in_order() -> None:
    records = [
        SourceRecord({}, {}, "a", b"v0", key=b"k1"),
        SourceRecord({}, {}, "a", "v1", partition=2, headers=[("h", "x"), ("h", b"\x00")]),
        SourceRecord({}, {}, "b", None),
        SourceRecord({}, {}, "a", b"v3", key="k1", timestamp_ms=42),
        SourceRecord({}, {}, "a", b"v4"),
        SourceRecord({}, {}, "a", b"v5"),
    ]
    table = records_to_table(records, {"a": 3, "b": 1}, {"a": 1, "b": 0}, now_ms=7)
    rows = table.to_pylist()
    by_key = crc32(b"k1") % 3
    assert [r["partition"] for r in rows] == [by_key, 2, 0, by_key, 1, 1]
    seqs: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        seqs.setdefault((r["topic"], r["partition"]), []).append(r["seq"])
    assert all(s == list(range(len(s))) for s in seqs.values())
    assert rows[1]["value"] == b"v1" and rows[2]["value"] is None
    assert rows[1]["headers"] == [{"key": "h", "value": b"x"}, {"key": "h", "value": b"\x00"}]
    assert [r["timestamp"] for r in rows] == [7, 7, 7, 42, 7, 7]
    with pytest.raises(UnknownTopicOrPartition, match="no partition 3"):
        records_to_table([SourceRecord({}, {}, "a", b"", partition=3)], {"a": 3}, {"a": 0}, 0)
    with pytest.raises(UnknownTopicOrPartition, match="'c' does not exist"):
        records_to_table([SourceRecord({}, {}, "c", b"")], {"a": 3}, {"a": 0}, 0)
    with pytest.raises(TypeError, match="record 0: value must be bytes"):
        records_to_table([SourceRecord({}, {}, "a", 5)], {"a": 3}, {"a": 0}, 0)  # type: ignore[arg-type]


def test_spark_settings_from_worker_properties() -> None:
    settings = SparkSettings.from_properties(
        {"group.id": "g", "spark.executor.memory": "2g", "dataplane.job.threads": "2"}
    )
    assert settings.conf["spark.executor.memory"] == "2g"
    assert settings.conf["spark.master"] == "local[*]" and settings.local
    assert settings.conf["spark.scheduler.mode"] == "FAIR"
    assert settings.conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert settings.job_threads == 2 and "group.id" not in settings.conf
    remote = SparkSettings.from_properties(
        {"spark.remote": "sc://spark:15002", "spark.sql.shuffle.partitions": "8"}
    )
    assert remote.remote == "sc://spark:15002" and not remote.local
    assert "spark.master" not in remote.conf and "spark.ui.enabled" not in remote.conf
    assert remote.conf["spark.sql.shuffle.partitions"] == "8"
    assert set(DEFAULT_CONF) <= set(SparkSettings.from_properties({}).conf)
    with pytest.raises(ConfigError, match="sc://"):
        SparkSettings.from_properties({"spark.remote": "http://x"})
    with pytest.raises(ConfigError, match=r"dataplane\.job\.threads"):
        SparkSettings.from_properties({"dataplane.job.threads": "0"})


def test_spark_connect_without_its_client_libraries_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as if gRPC were not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "grpc", None)
    runtime = SparkRuntime(SparkSettings.from_properties({"spark.remote": "sc://127.0.0.1:1"}))
    with pytest.raises(ConfigError, match=r"pip install 'herder\[connect\]'"):
        runtime.start()


def test_staged_files_sort_by_spark_task_then_by_file_within_it() -> None:
    from herder.dataplane.writer import _file_order

    uuid = "edd145f0-94b6-44d7-bbd6-5e71315c75aa"
    names = [
        f"d/part-{task:05d}-{uuid}-c{n:03d}.snappy.parquet"
        for task in (1, 0)
        for n in (1000, 999, 0)
    ]
    assert sorted(names, key=_file_order) == [
        f"d/part-{task:05d}-{uuid}-c{n:03d}.snappy.parquet"
        for task in (0, 1)
        for n in (0, 999, 1000)
    ]


def test_files_written_in_order_must_carry_sparks_names(tmp_path: Path) -> None:
    """A batch staged without ``seq`` is ordered by its files' names alone: a file whose
    name does not say its task and number cannot be placed, and staging says so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from herder.dataplane.storage import Storage
    from herder.dataplane.writer import _describe

    storage = Storage(str(tmp_path))
    batch = batch_dir("t-0", 1, 0)
    folder = tmp_path / batch / "topic=t" / "partition=0"
    folder.mkdir(parents=True)
    table = pa.table({"value": [b"a", b"b"]})
    pq.write_table(table, folder / "part-00000-e1-c000.snappy.parquet")
    pq.write_table(table, folder / "part-00001-e1-c000.snappy.parquet")
    [segment] = _describe(storage, batch, positional=True, timestamp=7)
    assert segment.file_counts == [2, 2] and segment.max_timestamp == 7
    pq.write_table(table, folder / "renamed.parquet")
    with pytest.raises(RuntimeError, match=r"cannot tell where .*renamed\.parquet goes"):
        _describe(storage, batch, positional=True, timestamp=7)
    # a batch written with seq (spread over partitions) needs no order from names
    assert _describe(storage, batch, timestamp=7)[0].file_counts is None


@pytest.mark.parametrize(
    ("props", "spans"),
    [
        ({}, False),
        ({"spark.master": "local[2]"}, False),
        ({"spark.master": "spark://127.0.0.1:7077"}, False),
        ({"spark.master": "spark://localhost:7077"}, False),
        ({"spark.master": "spark://10.1.2.3:7077"}, True),
        ({"spark.master": "spark://a.example:7077,b.example:7077"}, True),
        ({"spark.master": "yarn"}, True),
        ({"spark.master": "k8s://https://10.1.2.3:6443"}, True),
        ({"spark.remote": "sc://127.0.0.1:15002"}, False),
        ({"spark.remote": "sc://[::1]:15002"}, False),
        ({"spark.remote": "sc://connect.example:15002/;user_id=x"}, True),
    ],
)
def test_whether_spark_jobs_may_run_on_other_machines(props: dict[str, str], spans: bool) -> None:
    assert SparkSettings.from_properties(props).spans_machines is spans


def test_a_local_storage_root_is_refused_for_a_cluster_unless_declared_shared() -> None:
    cluster = SparkSettings.from_properties({"spark.master": "spark://10.1.2.3:7077"})
    with pytest.raises(
        ConfigError,
        match=r"storage.root=/data/topics is a local path.*"
        r"spark.master=spark://10.1.2.3:7077.*storage.root.shared=true",
    ):
        check_reachable("/data/topics", cluster.where, cluster.spans_machines, shared=False)
    with pytest.raises(ConfigError, match="local path"):
        check_reachable("file:///data/topics", cluster.where, cluster.spans_machines, False)
    check_reachable("/data/topics", cluster.where, cluster.spans_machines, shared=True)
    check_reachable("hdfs://nn:8020/topics", cluster.where, cluster.spans_machines, False)
    check_reachable("s3a://bucket/topics", cluster.where, cluster.spans_machines, False)
    local = SparkSettings.from_properties({})
    check_reachable("/data/topics", local.where, local.spans_machines, shared=False)


def test_a_worker_with_a_cluster_and_a_local_root_does_not_start(tmp_path: Path) -> None:
    config = WorkerConfig.from_properties(
        {
            "group.id": "g",
            "bootstrap.servers": "127.0.0.1:1",
            "storage.root": str(tmp_path),
            "spark.master": "yarn",
        }
    )
    assert config.storage_root_shared is False
    with pytest.raises(ConfigError, match=r"storage\.root\.shared=true"):
        TaskExecutions(config)


def test_a_spark_home_pyspark_cannot_launch_is_one_clear_error(tmp_path: Path) -> None:
    check_spark_home(None)
    with pytest.raises(ConfigError, match=r"has no bin/spark-submit: unset SPARK_HOME"):
        check_spark_home(str(tmp_path / "gone"))
    other = tmp_path / "spark-3.5"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (other / "jars").mkdir()
    (other / "jars" / "spark-core_2.12-3.5.1.jar").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is Spark 3.5.1, but herder runs pyspark 4\.3"):
        check_spark_home(str(other))
    (other / "jars" / "spark-core_2.12-3.5.1.jar").rename(
        other / "jars" / f"spark-core_2.13-{pyspark.__version__}.jar"
    )
    check_spark_home(str(other))


def test_ranged_reads_take_a_piece_per_core_within_twice_the_budget() -> None:
    """Files of more than half the budget would otherwise go one a read, to one core."""
    state = state_of(ordered_seg(0, 6, 6, 6, 6, 6))
    assert state.read_stop(0, 10) == 6
    assert state.read_stop(0, 10, min_pieces=2) == 12
    assert state.read_stop(0, 10, min_pieces=4) == 18  # 24 would be past twice the budget
    assert state.read_stop(0, 10, max_pieces=1, min_pieces=4) == 6
    assert state.read_stop(24, 10, min_pieces=4) == 30  # all there are
    assert state.read_stop(0, 30, min_pieces=2) == 30  # the budget takes more already
    # a delivery counts the pieces of all of a topic's partitions against Spark's cores
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    plan = DeliveryPlan(budget=10, ranged=True, spread=2)
    plan.take(a, 0, state)
    assert plan.reached == {a: 12} and not plan.wants("t")
    plan = DeliveryPlan(budget=20, ranged=True, spread=2)
    plan.take(a, 0, state_of(ordered_seg(0, 11)))
    plan.take(b, 0, state)  # 9 left: its first file, the core's second piece
    assert plan.reached == {a: 11, b: 6}
    assert [r.until_offset for r in plan.ranges["t"]] == [11, 6]
    # a read that is not ranged is split for the cores by Spark, and keeps to its
    # budget: its sink may collect it to the driver
    plain = DeliveryPlan(budget=10, ranged=False, spread=3)
    plain.take(a, 0, state)
    assert plain.reached == {a: 6}
    # each topic's read is a Spark job of its own: its pieces are counted apart
    u = TopicPartition("u", 0)
    plan = DeliveryPlan(budget=20, ranged=True, spread=2)
    plan.take(a, 0, state_of(ordered_seg(0, 11)))
    plan.take(u, 0, state)  # 9 left: still two files, for its own job's two cores
    assert plan.reached == {a: 11, u: 12}


def test_a_ranged_delivery_takes_at_most_a_read_of_pieces_per_topic() -> None:
    many = state_of(*(ordered_seg(i, 1) for i in range(MAX_FILES_UNIONED + 8)))
    a, b = TopicPartition("t", 0), TopicPartition("u", 0)
    plan = DeliveryPlan(budget=1_000, ranged=True)
    plan.take(a, 0, many)
    plan.take(b, 3, many)
    assert plan.reached == {a: MAX_FILES_UNIONED, b: 3 + MAX_FILES_UNIONED}
    assert plan.ranges["t"] == [OffsetRange(a, i, i + 1) for i in range(MAX_FILES_UNIONED)]
    assert not plan.wants("t") and plan.wants("v")
    plain = DeliveryPlan(budget=1_000, ranged=False)
    plain.take(a, 0, many)
    assert plain.reached == {a: MAX_FILES_UNIONED + 8}
    assert plain.budget == 1_000 - MAX_FILES_UNIONED - 8


def test_a_delivery_of_small_files_is_cut_to_the_trickle_budget_but_a_big_file_goes_whole() -> None:
    small = state_of(*(ordered_seg(i * 10, 10) for i in range(10)))
    plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=25)
    plan.take(TopicPartition("t", 0), 0, small)
    assert plan.by_topic == {"t": {0: (0, 20)}}
    assert [(r.from_offset, r.until_offset) for r in plan.ranges["t"]] == [(0, 10), (10, 20)]
    big = state_of(ordered_seg(0, 500), ordered_seg(500, 10))
    plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=25)
    plan.take(TopicPartition("t", 0), 0, big)
    assert plan.by_topic == {"t": {0: (0, 510)}}


def test_a_delivery_of_small_files_stays_small_over_its_partitions() -> None:
    """Once a delivery's first piece fits the trickle budget, the partitions after it
    give only what still fits: a backlog of small files in several partitions goes in
    several trickle deliveries, not gathered into one for a Spark job."""
    small = state_of(*(ordered_seg(i * 10, 10) for i in range(10)))
    big = state_of(ordered_seg(0, 500))
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=25)
    plan.take(t0, 0, small)
    plan.take(t1, 0, small)  # 5 left of 25: its first file, of 10, waits
    plan.take(t2, 0, big)  # bulk data waits for a delivery of its own
    assert plan.by_topic == {"t": {0: (0, 20)}}
    assert plan.small_budget == 5
    # the budget used up, the delivery wants no more
    plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=20)
    plan.take(t0, 0, small)
    assert not plan.wants("t")
    # that big piece first: the delivery is bulk, and takes the others up to the budget
    plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=25)
    plan.take(t2, 0, big)
    plan.take(t0, 0, small)
    assert plan.by_topic == {"t": {2: (0, 500), 0: (0, 100)}}
    # its ranges come in partition order, whatever order the partitions were taken in
    assert [r.topic_partition.partition for r in plan.ranges["t"]] == [0] * 10 + [2]


def test_each_delivery_starts_at_the_next_partition() -> None:
    partitions = [TopicPartition("t", p) for p in range(3)]
    assert in_turn(partitions, 0) == partitions
    assert in_turn(partitions, 1) == partitions[1:] + partitions[:1]
    assert in_turn(partitions, 5) == partitions[2:] + partitions[:2]
    assert in_turn([], 3) == []
    # a big piece left out of deliveries of small files is first in a later one
    small = state_of(*(ordered_seg(i * 10, 10) for i in range(10)))
    big = state_of(ordered_seg(0, 500))
    states = {partitions[0]: small, partitions[1]: small, partitions[2]: big}
    delivered = set()
    for turn in range(3):
        plan = DeliveryPlan(budget=1_000, ranged=True, small_budget=25)
        for tp in in_turn(partitions, turn):
            plan.take(tp, 0, states[tp])
        delivered |= {tp for tp, stop in plan.reached.items() if stop > 0}
    assert partitions[2] in delivered


def test_a_read_path_has_the_glob_characters_of_its_path_escaped_and_no_others() -> None:
    """Hadoop reads ``\\c`` as ``c`` itself in a pattern; a URI's scheme and host are not
    a pattern (an IPv6 host is in brackets), so they are left as they are."""
    assert literal("/data/root/a.parquet") == "/data/root/a.parquet"
    assert literal("/d/in [1] {a,b}/x*?\\y") == "/d/in \\[1\\] \\{a,b\\}/x\\*\\?\\\\y"
    assert literal("file:///d/a[1]") == "file:///d/a\\[1\\]"
    assert literal("hdfs://[::1]:8020/t/p{1}") == "hdfs://[::1]:8020/t/p\\{1\\}"
    assert literal("s3a://bucket/k*") == "s3a://bucket/k\\*"
