"""The data plane: topics as Parquet segments on Spark, their metadata in the ensemble.

* :mod:`.spark` — the worker's one SparkSession and the threads its jobs run on;
* :mod:`.topics` — topic definitions, segment metadata, commits, retention, reaping;
* :mod:`.writer` — staging a batch (SourceRecords or a DataFrame) with one Spark job;
* :mod:`.reader` — committed segments back as a DataFrame (or Arrow, for the CLI).

A source task's batch goes::

    writer = SegmentWriter(topics, spark, task="conn-0", epoch=epoch)
    await writer.reap()                          # once the epoch is fenced in
    staged = await writer.stage(records)         # Spark job, invisible to readers
    await topics.commit(staged, ops=[...])       # + the caller's ops, atomically

and a sink task's read goes ``await topics.read(topic, {p: (from, to)})``.
"""

from herder.dataplane.metadata import (
    TOPIC_CONFIG,
    TOPICS_LOG,
    PartitionState,
    Segment,
    SegmentSlice,
    Topic,
    TopicSpec,
    segment_log,
)
from herder.dataplane.spark import (
    SparkRuntime,
    SparkSettings,
    register_module_by_value,
    run_in_spark,
    spark_runtime,
    stop_spark,
)
from herder.dataplane.staged import StagedBatch, StagedSegment
from herder.dataplane.storage import Storage
from herder.dataplane.topics import (
    BatchOps,
    Committed,
    RetentionReport,
    Topics,
    TxnRefused,
)
from herder.dataplane.writer import SegmentWriter

__all__ = [
    "TOPICS_LOG",
    "TOPIC_CONFIG",
    "BatchOps",
    "Committed",
    "PartitionState",
    "RetentionReport",
    "Segment",
    "SegmentSlice",
    "SegmentWriter",
    "SparkRuntime",
    "SparkSettings",
    "StagedBatch",
    "StagedSegment",
    "Storage",
    "Topic",
    "TopicSpec",
    "Topics",
    "TxnRefused",
    "register_module_by_value",
    "run_in_spark",
    "segment_log",
    "spark_runtime",
    "stop_spark",
]
