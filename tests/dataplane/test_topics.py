"""Topics end to end: stage with Spark, commit through a real ensemble, read back."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from zlib import crc32

import pytest

from herder.connect import SourceBatch, SourceRecord, SourceTask, TopicPartition
from herder.dataplane import SegmentWriter, SparkRuntime, Storage, TxnRefused
from herder.dataplane.spark import spark_runtime
from herder.ensemble.client import EnsembleClient
from herder.ensemble.txn import Append, CheckKeyValue, CreateLog
from herder.errors import HerderError, RetriableError, UnknownTopicOrPartition
from tests.dataplane.conftest import connected, slice_rows
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def recs(topic: str, n: int, prefix: str, **kw: Any) -> list[SourceRecord]:
    return [SourceRecord({"s": 0}, {"i": i}, topic, f"{prefix}{i}", **kw) for i in range(n)]


async def collect(spark: SparkRuntime, df: Any) -> list[Any]:
    return await spark.run(df.collect)


def by_partition(rows: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        out[row["partition"]].append(row)
    return out


async def test_round_trip_across_partitions_and_batches(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("roundtrip", 3)
        writer = SegmentWriter(topics, spark, "rt-0", 1)
        first = [
            *recs("roundtrip", 12, "keyed", key="k"),
            *[SourceRecord({}, {}, "roundtrip", f"k{i}", key=f"k{i}") for i in range(9)],
            SourceRecord(
                {}, {}, "roundtrip", b"\xff", partition=2, headers=[("h", b"\x00")], timestamp_ms=5
            ),
            *recs("roundtrip", 4, "loose"),
        ]
        second = recs("roundtrip", 6, "second", key="k")
        committed = []
        for batch in (first, second):
            staged = await writer.stage(batch)
            assert staged.records == len(batch)
            committed.append(await topics.commit(staged))

        k_partition = crc32(b"k") % 3
        rows = await collect(spark, await topics.read("roundtrip", ordered=True))
        parts = by_partition([r.asDict() for r in rows])
        for part_rows in parts.values():
            assert [r["offset"] for r in part_rows] == list(range(len(part_rows)))
        expected_k = [f"keyed{i}" for i in range(12)] + [f"second{i}" for i in range(6)]
        assert [r["value"].decode() for r in parts[k_partition] if r["key"] == b"k"] == expected_k
        for i in range(9):
            (row,) = [r for r in rows if r["key"] == f"k{i}".encode()]
            assert row["partition"] == crc32(f"k{i}".encode()) % 3
        special = [r for r in rows if r["value"] == b"\xff"]
        assert special[0]["partition"] == 2 and special[0]["headers"][0]["value"] == b"\x00"
        assert special[0]["timestamp"] == dt.datetime.fromtimestamp(0.005)
        # a batch's keyless records go to one partition together
        assert len({r["partition"] for r in rows if r["value"].startswith(b"loose")}) == 1

        # the second batch's segment starts where the first's ended: offset = base + seq
        tp = TopicPartition("roundtrip", k_partition)
        first_seg, second_seg = committed[0].segments[tp], committed[1].segments[tp]
        assert second_seg.base_offset == first_seg.base_offset + first_seg.count
        ends = await topics.end_offsets("roundtrip")
        assert ends == {p: len(parts.get(p, [])) for p in range(3)}
        assert sum(ends.values()) == len(first) + len(second)

        # a range read touches only the overlapping segments and filters by offset
        lo, hi = first_seg.count - 2, first_seg.count + 3
        window = await collect(
            spark, await topics.read("roundtrip", {k_partition: (lo, hi)}, ordered=True)
        )
        assert [r["offset"] for r in window] == list(range(lo, hi))
        assert [r["value"] for r in window] == [r["value"] for r in parts[k_partition][lo:hi]]
        assert list(window[0].asDict()) == [
            "topic", "partition", "offset", "timestamp", "key", "value", "headers",
        ]  # fmt: skip
        # the CLI's pyarrow reader sees the same records
        plan = await topics.plan_read("roundtrip", {k_partition: (lo, hi)})
        assert [s.segment.base_offset for s in plan] == [0, first_seg.count]
        arrow_rows = slice_rows(storage, plan)
        assert [(r["offset"], r["value"]) for r in arrow_rows] == [
            (r["offset"], r["value"]) for r in window
        ]
        # a read of many files scans them in one pass instead of one by one: same records
        monkeypatch.setattr("herder.dataplane.reader.MAX_FILES_UNIONED", 0)
        one_scan = await collect(spark, await topics.read("roundtrip", ordered=True))
        assert [r.asDict() for r in one_scan] == [r.asDict() for r in rows]
        one_scan_window = await collect(
            spark, await topics.read("roundtrip", {k_partition: (lo, hi)}, ordered=True)
        )
        assert [r.asDict() for r in one_scan_window] == [r.asDict() for r in window]


async def test_dataframe_batches_partition_like_records(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("df-a", 4)
        await topics.create("df-b", 2)
        rows = [("df-a", f"key{i % 6}", f"a{i}", None) for i in range(40)]
        rows += [("df-b", None, f"b{i}", i % 2) for i in range(10)]
        rows += [("df-a", None, f"loose{i}", None) for i in range(5)]
        frame = await spark.run(
            spark.session.createDataFrame,
            rows,
            "topic string, key string, value string, partition int",
        )
        writer = SegmentWriter(topics, spark, "df-0", 3)
        staged = await writer.stage(frame)
        assert staged.records == len(rows)
        assert set(staged.topic_versions) == {"df-a", "df-b"}
        stored = storage.footer(staged.segments[0].files[0]).schema.to_arrow_schema()
        assert str(stored.field("value").type) == "string"  # as given: not copied to binary
        await topics.commit(staged)

        got = [r.asDict() for r in await collect(spark, await topics.read("df-a", ordered=True))]
        assert len(got) == 45
        for p, part_rows in by_partition(got).items():
            assert [r["offset"] for r in part_rows] == list(range(len(part_rows)))
            keyed = [r for r in part_rows if r["key"] is not None]
            # the same partition as a SourceRecord with that key gets, in input order
            assert all(crc32(r["key"]) % 4 == p for r in keyed)
            values = [int(r["value"][1:]) for r in keyed]
            assert values == sorted(values)
        assert len({r["partition"] for r in got if r["key"] is None}) == 1
        b_rows = await collect(spark, await topics.read("df-b", ordered=True))
        assert sorted(int(r["value"][1:]) for r in b_rows if r["partition"] == 1) == [1, 3, 5, 7, 9]

        bad = await spark.run(
            spark.session.createDataFrame, [("x", 9)], "value string, partition int"
        )
        with pytest.raises(Exception, match="has no partition 9"):
            await writer.stage(bad, "df-b")


async def test_concurrent_writers_get_disjoint_contiguous_offsets(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with (
        connected(ensemble, storage, spark) as one,
        connected(ensemble, storage, spark) as two,
    ):
        await one.create("race", 1)
        w1, w2 = SegmentWriter(one, spark, "w1", 1), SegmentWriter(two, spark, "w2", 1)
        # both views of the partition are warm (and about to be stale for one of them)
        await one.partition("race", 0)
        await two.partition("race", 0)
        s1 = await w1.stage(recs("race", 10, "one"))
        s2 = await w2.stage(recs("race", 7, "two"))
        c1 = await one.commit(s1)
        c2 = await two.commit(s2)
        tp = TopicPartition("race", 0)
        assert (c1.attempts, c1.segments[tp].base_offset) == (1, 0)
        # the second commit lost the CheckEndOffset race, re-read and moved on
        assert (c2.attempts, c2.segments[tp].base_offset) == (2, 10)
        assert c2.segments[tp].files == s2.segments[0].files  # files are never rewritten

        more = await asyncio.gather(
            *(w.stage(recs("race", 3 + i, f"{name}-{i}-")) for i in range(2)
              for name, w in (("a", w1), ("b", w2)))
        )  # fmt: skip
        writers = [one, two, one, two]
        done = await asyncio.gather(*(t.commit(s) for t, s in zip(writers, more, strict=True)))
        spans = sorted(
            (c.segments[tp].base_offset, c.segments[tp].end_offset) for c in [c1, c2, *done]
        )
        assert spans[0][0] == 0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        rows = await collect(spark, await one.read("race", ordered=True))
        assert [r["offset"] for r in rows] == list(range(spans[-1][1]))
        for committed in done:
            seg = committed.segments[tp]
            values = [r["value"] for r in rows[seg.base_offset : seg.end_offset]]
            assert len({v.rsplit(b"-", 1)[0] for v in values}) == 1  # a batch stays contiguous


async def test_staged_batches_are_invisible_until_committed(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("hidden", 2)
        writer = SegmentWriter(topics, spark, "hid-0", 1)
        staged = await writer.stage(recs("hidden", 20, "h", key="k"))
        assert staged.records == 20
        assert Path(storage.root, staged.dir).is_dir()
        assert await topics.end_offsets("hidden") == {0: 0, 1: 0}
        assert await topics.plan_read("hidden") == []
        assert await collect(spark, await topics.read("hidden")) == []
        # a batch staged for a topic that is deleted (and created again) never lands in it
        await topics.delete("hidden")
        await topics.create("hidden", 3)
        with pytest.raises(UnknownTopicOrPartition, match="deleted since batch"):
            await topics.commit(staged)
        assert await topics.end_offsets("hidden") == {0: 0, 1: 0, 2: 0}
        await writer.discard(staged)
        assert not Path(storage.root, staged.dir).exists()


async def test_callers_ops_commit_atomically_with_the_segments(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with (
        EnsembleClient(ensemble.bootstrap) as client,
        connected(ensemble, storage, spark) as topics,
    ):
        await client.transact(
            [CreateLog("fence-x", compacted=True), CreateLog("offsets-x", compacted=True)]
        )
        await client.append("fence-x", b"2", key=b"task-0")
        await topics.create("atomic", 2)
        writer = SegmentWriter(topics, spark, "task-0", 2)
        staged = await writer.stage(recs("atomic", 8, "x", key="k"))
        offset_op = Append("offsets-x", b'{"file":"a"}', b'{"position":8}')

        stale = CheckKeyValue("fence-x", b"task-0", b"1")
        with pytest.raises(TxnRefused) as refused:
            await topics.commit(staged, [offset_op, stale])
        assert refused.value.index == 1 and refused.value.code.name == "CHECK_FAILED"
        assert await topics.end_offsets("atomic") == {0: 0, 1: 0}
        assert (await client.end_offsets(["offsets-x"]))["offsets-x"] == 0

        current = CheckKeyValue("fence-x", b"task-0", b"2")
        committed = await topics.commit(staged, [offset_op, current])
        assert committed.result.offsets[0] == 0  # the caller's ops keep their indexes
        assert sum((await topics.end_offsets("atomic")).values()) == 8
        assert (await client.end_offsets(["offsets-x"]))["offsets-x"] == 1


async def test_retention_retires_oldest_segments_and_deletes_files_after_the_delay(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        config = {"retention.ms": 1_000, "retention.file.delete.delay.ms": 5_000}
        await topics.create("aging", 1, config)
        writer = SegmentWriter(topics, spark, "age-0", 1)
        batches = [(1_000, 4), (2_000, 3), (10_000, 2)]
        for stamp, n in batches:
            await topics.commit(
                await writer.stage(recs("aging", n, f"t{stamp}-", timestamp_ms=stamp))
            )
        first = (await topics.partition("aging", 0)).live()[0]
        first_dir = Path(storage.root, first.files[0]).parent

        report = await topics.enforce_retention("aging", now_ms=2_500)
        assert report.retired == {0: [0]} and report.purged == {}
        assert await topics.start_offsets("aging") == {0: 4}
        rows = await collect(spark, await topics.read("aging", ordered=True))
        assert [r["offset"] for r in rows] == list(range(4, 9))
        assert first_dir.is_dir()  # a reader that planned on it still finds it

        report = await topics.enforce_retention("aging", now_ms=7_000)
        assert report.purged == {} and report.retired == {0: [4]}
        assert first_dir.is_dir()
        report = await topics.enforce_retention("aging", now_ms=7_500)
        assert report.purged == {0: [0]} and report.retired == {}
        assert not first_dir.exists()
        state = await topics.partition("aging", 0)
        assert 0 not in state.segments and state.start_offset == 7

        # offsets go on from the end, whatever retention removed
        committed = await topics.commit(await writer.stage(recs("aging", 2, "late-")))
        assert committed.segments[TopicPartition("aging", 0)].base_offset == 9

        await topics.create("sized", 1, {"retention.bytes": 1})
        for i in range(3):
            await topics.commit(await writer.stage(recs("sized", 2, f"s{i}-")))
        report = await topics.enforce_retention("sized")
        assert report.retired == {0: [0, 2]}  # all but the newest segment
        assert await topics.start_offsets("sized") == {0: 4}


async def test_reaping_removes_only_uncommitted_staging_of_older_epochs(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("reaped", 2)
        old = SegmentWriter(topics, spark, "reap-0", 1)
        kept = await old.stage(recs("reaped", 6, "kept", key="a"))
        await topics.commit(kept)
        orphan = await old.stage(recs("reaped", 6, "orphan", key="a"))
        failed_job = Path(storage.root, "_staging/reap-0-e1/0000000099/_temporary/0")
        failed_job.mkdir(parents=True)
        (failed_job / "part-0.parquet").write_bytes(b"half")
        bystander = await SegmentWriter(topics, spark, "other-0", 0).stage(recs("reaped", 2, "o"))

        new = SegmentWriter(topics, spark, "reap-0", 2)
        current = await new.stage(recs("reaped", 3, "new"))
        deleted = await new.reap()

        root = Path(storage.root)
        assert not (root / orphan.dir).exists()
        assert not (root / "_staging/reap-0-e1/0000000099").exists()
        assert all((root / f).is_file() for s in kept.segments for f in s.files)
        assert (root / current.dir).is_dir() and (root / bystander.dir).is_dir()
        assert any(p.startswith(orphan.dir) for p in deleted)
        rows = await collect(spark, await topics.read("reaped"))
        assert sorted(r["value"] for r in rows) == sorted(f"kept{i}".encode() for i in range(6))
        assert await new.reap() == []  # nothing left to reap


async def test_jobs_run_in_their_scheduler_pool(spark: SparkRuntime) -> None:
    def pool_and_count() -> tuple[str | None, int]:
        context = spark.session.sparkContext
        return context.getLocalProperty("spark.scheduler.pool"), spark.session.range(5).count()

    assert await spark.run(pool_and_count, pool="task-a") == ("task-a", 5)
    # the job threads are reused: the pool does not stick to the thread
    assert (await spark.run(pool_and_count))[0] is None


async def test_modules_spark_cannot_import_travel_by_value(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    import importlib
    import sys

    from pyspark.sql import functions as F

    from herder.dataplane import register_module_by_value

    (tmp_path / "herder_test_only_mod.py").write_text("def shout(s):\n    return s.upper() + '!'\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("herder_test_only_mod")
        register_module_by_value(module)
        shout = F.udf(module.shout, "string")

        def run() -> list[Any]:
            return spark.session.createDataFrame([("hi",)], "s string").select(shout("s")).collect()

        assert [r[0] for r in await spark.run(run)] == ["HI!"]
    finally:
        sys.path.remove(str(tmp_path))


async def test_workers_run_retention_on_their_own(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    from herder.dataplane.execution import TaskExecutions
    from herder.runtime.worker_config import WorkerConfig

    async with connected(ensemble, storage, spark) as topics:
        config = {"retention.ms": 1, "retention.file.delete.delay.ms": 0}
        await topics.create("expiring", 1, config)
        writer = SegmentWriter(topics, spark, "exp-0", 1)
        await topics.commit(await writer.stage(recs("expiring", 3, "old-", timestamp_ms=1)))
        assert await topics.start_offsets("expiring") == {0: 0}
        executions = TaskExecutions(
            WorkerConfig.from_properties(
                {
                    "group.id": "retention",
                    "bootstrap.servers": ensemble.bootstrap,
                    "storage.root": storage.root,
                    "retention.check.interval.ms": 100,
                }
            )
        )
        try:
            await executions.open()  # as the worker's first task does
            deadline = asyncio.get_running_loop().time() + 30
            while await topics.start_offsets("expiring") != {0: 3}:
                assert asyncio.get_running_loop().time() < deadline, "retention never ran"
                await asyncio.sleep(0.1)  # the passes' own interval: nothing to wait on
        finally:
            # a worker that stops ends its passes, which would otherwise go on over the
            # shared ensemble's topics in later tests
            async with asyncio.timeout(30):
                await executions.close()
            assert executions.retention_stopped, "retention did not stop"


class _PollsOnce(SourceTask):
    """A source task whose first poll returns ``records``, and every later one nothing."""

    def __init__(self, records: list[SourceRecord]) -> None:
        self.batches = [records]

    def start(self, config: dict[str, str]) -> None:
        pass

    def poll(self) -> list[SourceRecord] | None:
        return self.batches.pop() if self.batches else None

    def stop(self) -> None:
        pass


@asynccontextmanager
async def running_source(
    ensemble: ServerHandle, storage: Storage, name: str, task: SourceTask, settings: dict[str, str]
) -> AsyncIterator[None]:
    """``task`` run by a real source execution (on this loop, its task's calls on a
    thread of its own) meanwhile."""
    from herder.dataplane.execution import TaskExecutions
    from herder.runtime.core.protocol import ConnectorTaskId
    from herder.runtime.worker import TaskControl
    from herder.runtime.worker_config import WorkerConfig

    executions = TaskExecutions(
        WorkerConfig.from_properties(
            {"group.id": name, "bootstrap.servers": ensemble.bootstrap,
             "storage.root": storage.root}
        )
    )  # fmt: skip
    execution = executions(ConnectorTaskId(name, 0), task, settings, {"connector.class": "x"})
    control = TaskControl()
    runner = asyncio.ensure_future(execution.execute(control))
    try:
        yield
    finally:
        control.stop()
        async with asyncio.timeout(30):
            await runner
        # its retention passes would otherwise go on over the shared ensemble's topics
        async with asyncio.timeout(30):
            await executions.close()


async def wait_for_records(topics: Any, topic: str, count: int, what: str) -> dict[int, int]:
    """The end offsets of ``topic`` once they add up to ``count`` (within 60 s): checked
    again whenever the source (a task of this process) commits to it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        marks = topics.commit_marks([topic])
        try:
            ends = await topics.end_offsets(topic)
        except HerderError:  # not created yet: its creation is no commit, so look again
            ends = {}
        if sum(ends.values()) == count:
            return ends
        remaining = deadline - loop.time()
        assert remaining > 0, what
        await topics.wait_for_commit(marks, remaining if ends else min(remaining, 0.5))


async def test_a_source_creates_its_topic_with_the_configured_partitions(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    task = _PollsOnce(
        [SourceRecord({"p": 0}, {"n": i}, "autocreated", b"v%d" % i) for i in range(3)]
    )
    settings = {"topic.creation.default.partitions": "3", "batch.max.ms": "50"}
    async with (
        running_source(ensemble, storage, "autocreate", task, settings),
        connected(ensemble, storage, spark) as topics,
    ):
        ends = await wait_for_records(topics, "autocreated", 3, "no records arrived")
        assert len(ends) == 3, "the topic got topic.creation.default.partitions partitions"


async def test_a_batch_goes_as_soon_as_the_source_has_nothing_more(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    # batch.max.ms is how long a batch may keep gathering while records keep coming,
    # not how long a record waits: a poll that returns nothing ends the batch
    task = _PollsOnce([SourceRecord({"p": 0}, {"n": 0}, "lingering", b"only")])
    settings = {"batch.max.ms": "600000", "batch.max.records": "1000"}
    async with (
        running_source(ensemble, storage, "lingering", task, settings),
        connected(ensemble, storage, spark) as topics,
    ):
        await wait_for_records(topics, "lingering", 1, "the record waited for batch.max.ms")


class _CheckFailsOnce(SourceTask):
    """A source task whose batch's check fails the first time, as FileStreamSource's does
    when the file grew while Spark read it whole; it then offers the batch again."""

    def __init__(self, values: list[bytes]) -> None:
        self.values = values
        self.checks = 0
        self.committed = False

    def start(self, config: dict[str, str]) -> None:
        pass

    def poll(self) -> SourceBatch | None:
        if self.committed:
            time.sleep(0.05)
            return None
        session = spark_runtime().session
        df = session.createDataFrame([(v,) for v in self.values], "value binary")
        return SourceBatch(df, [({"p": 0}, {"n": len(self.values)})], "rechecked", self.check)

    def check(self) -> None:
        self.checks += 1
        if self.checks == 1:
            raise RetriableError("the input changed while it was read")

    def commit(self) -> None:
        self.committed = True

    def stop(self) -> None:
        pass


async def test_a_batch_whose_check_fails_for_now_is_discarded_and_polled_again(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    values = [b"r%03d" % i for i in range(50)]
    task = _CheckFailsOnce(values)
    async with (
        running_source(ensemble, storage, "rechecked", task, {"batch.max.ms": "50"}),
        connected(ensemble, storage, spark) as topics,
    ):
        await wait_for_records(topics, "rechecked", len(values), "the batch never committed")
        rows = await collect(spark, await topics.read("rechecked", ordered=True))
        assert [r["value"] for r in rows] == values  # once: the first write was discarded
        assert task.checks == 2 and task.committed
    # what the refused batch wrote is gone; only the committed batch's files remain
    staged = [
        e.path
        for e in storage.list_dir("_staging", recursive=True)
        if e.path.startswith("_staging/rechecked-") and e.path.endswith(".parquet")
        and not e.path.rsplit("/", 1)[-1].startswith(".")
    ]  # fmt: skip
    [segment] = (await topics_partition(ensemble, storage, "rechecked")).live()
    assert sorted(staged) == sorted(segment.files)


async def topics_partition(ensemble: ServerHandle, storage: Storage, topic: str) -> Any:
    async with connected(ensemble, storage) as topics:
        return await topics.partition(topic, 0)


async def test_a_commit_wakes_readers_of_its_topic_in_the_same_process(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """A sink waiting for records is woken by a source task of its own worker (another
    thread, event loop and Topics) committing to the topic, not at its next poll."""

    async def commit_one() -> None:
        async with connected(ensemble, storage, spark) as other:
            writer = SegmentWriter(other, spark, "woken-0", 1)
            await other.commit(await writer.stage([SourceRecord({}, {}, "woken", b"v")]))

    async with connected(ensemble, storage, spark) as topics:
        await topics.create("woken", 1)
        await topics.create("unrelated", 1)
        marks = topics.commit_marks(["woken"])
        assert not await topics.wait_for_commit(marks, 0.05)  # nothing committed yet
        waiting = asyncio.create_task(topics.wait_for_commit(marks, 60))
        await asyncio.to_thread(asyncio.run, commit_one())
        assert await waiting, "the commit did not wake the reader"
        # marks taken before a commit see it without waiting; other topics' do not
        assert await topics.wait_for_commit(marks, 0)
        unrelated = topics.commit_marks(["unrelated"])
        await asyncio.to_thread(asyncio.run, commit_one())
        assert not await topics.wait_for_commit(unrelated, 0.05)


async def test_files_leave_out_what_every_record_shares(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    import pyarrow.parquet as pq

    now = int(time.time() * 1000)  # recent: retention passes elsewhere leave them alone
    plain = [SourceRecord({}, {}, "lean", b"v%d" % i, timestamp_ms=now) for i in range(5)]
    rich = [
        SourceRecord({}, {}, "lean", b"w0", key=b"k", headers=[("h", b"1")], timestamp_ms=now - 7),
        SourceRecord({}, {}, "lean", b"w1", timestamp_ms=now - 9),
    ]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("lean", 1)
        writer = SegmentWriter(topics, spark, "lean-0", 1)
        for batch in (plain, rich):
            await topics.commit(await writer.stage(batch))
        state = await topics.partition("lean", 0)
        first, second = state.live()
        columns = [pq.read_schema(storage.fs_path(s.files[0])).names for s in (first, second)]
        # one partition: no seq; then no keys, no headers, one timestamp
        assert columns[0] == ["value"]
        assert columns[1] == ["key", "value", "headers", "timestamp"]
        assert first.max_timestamp == now

        expected = [
            *((None, f"v{i}".encode(), [], now) for i in range(5)),
            (b"k", b"w0", [("h", b"1")], now - 7),
            (None, b"w1", [], now - 9),
        ]
        rows = await collect(spark, await topics.read("lean", ordered=True))
        assert [
            (
                r["key"],
                r["value"],
                [(h["key"], h["value"]) for h in r["headers"]],
                round(r["timestamp"].timestamp() * 1000),  # naive, local time, as Spark gives
            )
            for r in rows
        ] == expected
        slices = await topics.plan_read("lean")
        assert [
            (r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]], r["timestamp"])
            for r in slice_rows(storage, slices)
        ] == expected
