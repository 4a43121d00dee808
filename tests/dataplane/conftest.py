"""Fixtures for the data plane: one SparkSession per test process, one ensemble server.

``spark`` is the process's :class:`~herder.dataplane.spark.SparkRuntime` (its
``session`` is the SparkSession), started once on ``local[1]`` with a small driver
heap, as CI's 2 cores want; ``ensemble`` is one real ensemble server process shared by
the data-plane tests, each of which uses topics of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from herder.dataplane import SparkRuntime, Storage, Topics, spark_runtime, stop_spark
from herder.dataplane.execution import TaskExecutions
from herder.dataplane.metadata import SegmentSlice
from herder.dataplane.reader import slice_batches
from herder.ensemble.client import EnsembleClient
from herder.runtime.worker_config import WorkerConfig
from tests.harness import Processes
from tests.integration.conftest import ServerHandle, make_server

TEST_SPARK_CONF = {
    "spark.master": "local[1]",
    "spark.driver.memory": "512m",
    "spark.sql.shuffle.partitions": "2",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkRuntime]:
    runtime = spark_runtime(TEST_SPARK_CONF)
    runtime.start()
    try:
        yield runtime
    finally:
        stop_spark()


@pytest.fixture(scope="session")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    path = tmp_path_factory.mktemp("dataplane-ensemble")
    processes = Processes(path)
    try:
        # Spark jobs hold the GIL for stretches on a busy 2-core machine; give sessions
        # room so a test's client is not expired by a late ping
        yield make_server(processes, path, maxSessionTimeout=60_000).start()
    finally:
        processes.stop_all()


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path / "data"))


@asynccontextmanager
async def connected(
    ensemble: ServerHandle, storage: Storage | None, spark: SparkRuntime | None = None, **kw: object
) -> AsyncIterator[Topics]:
    """A :class:`Topics` on a client of its own (so two of them race like two workers)."""
    async with EnsembleClient(ensemble.bootstrap, session_timeout_ms=30_000) as client:
        yield Topics(client, storage, spark=spark, **kw)  # type: ignore[arg-type]


def worker_executions(tmp_path: Path, ensemble: ServerHandle, **properties: str) -> TaskExecutions:
    """A worker's task executions on the shared ensemble and Spark, with the worker
    ``properties`` given (the test opens and closes them on its own event loop)."""
    return TaskExecutions(
        WorkerConfig.from_properties(
            {
                "group.id": "g",
                "bootstrap.servers": ensemble.bootstrap,
                "storage.root": str(tmp_path / "data"),
                "dataplane.spark.warmup": "false",
                **TEST_SPARK_CONF,
                **properties,
            }
        )
    )


def slice_rows(storage: Storage, pieces: Iterable[SegmentSlice], max_rows: int = 7) -> list[Any]:
    """The records of ``pieces`` as the CLI reads them, in tables of at most ``max_rows``
    (few, so that a slice's ends fall inside a table)."""
    rows = []
    for piece in pieces:
        for table in slice_batches(storage, piece, max_rows):
            assert 0 < table.num_rows <= max_rows
            rows += table.to_pylist()
    return rows
