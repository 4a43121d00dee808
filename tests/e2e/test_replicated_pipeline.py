"""A pipeline on a replicated ensemble whose leader is killed while records flow.

Three ensemble servers, one worker listing all three, FileStreamSource → topic →
FileStreamSink with numbered lines appended throughout; the ensemble leader (which also
runs the group coordinator) is killed with ``kill -9`` twice and restarted. Every
client of the worker — its herder, its tasks' sessions, their groups — fails over, and
the sink file holds every line exactly once, in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_pipeline import (
    Cluster,
    assert_exactly_once,
    count_lines,
    numbers_pipeline,
)
from tests.harness import Processes, wait_until
from tests.integration.conftest import make_ensemble
from tests.integration.test_replication import leader_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class ReplicatedCluster(Cluster):
    """:class:`Cluster` with a three-server ensemble in place of one server."""

    def __init__(self, processes: Processes, tmp_path: Path) -> None:
        import httpx

        self.processes = processes
        self.tmp_path = tmp_path
        self.storage = tmp_path / "topics"
        self.ensemble = make_ensemble(
            processes,
            tmp_path,
            3,
            maxSessionTimeout=60_000,
            **{"group.min.session.timeout.ms": 1000},
        ).start()
        self.server = self.ensemble  # type: ignore[assignment]  # what workers bootstrap from
        self.workers = []
        self.frozen = set()
        self.http = httpx.Client(timeout=60)


@pytest.mark.timeout(600)
def test_kill9_of_the_ensemble_leader_under_a_running_pipeline(
    processes: Processes, tmp_path: Path
) -> None:
    cluster = ReplicatedCluster(processes, tmp_path)
    try:
        leader_of(cluster.ensemble)
        cluster.start_worker()
        output, writer = numbers_pipeline(cluster, tmp_path)
        try:
            for _ in range(2):
                before = count_lines(output)
                wait_until(
                    lambda before=before: count_lines(output) > before + 500,
                    timeout=180,
                    interval=0.2,
                    what="lines reaching the sink",
                )
                victim = leader_of(cluster.ensemble)
                cluster.ensemble[victim].kill9()
                leader_of(cluster.ensemble, exclude=victim)
                cluster.ensemble[victim].start()
            after = count_lines(output)
            wait_until(
                lambda: count_lines(output) > after + 500,
                timeout=180,
                interval=0.2,
                what="lines reaching the sink after the failovers",
            )
        finally:
            total = writer.stop()
        wait_until(
            lambda: count_lines(output) >= total,
            timeout=240,
            interval=0.5,
            what=f"all {total} lines at the sink",
        )
        for name in ("numbers-source", "numbers-sink"):
            tasks = cluster.status(name)["tasks"]
            assert [t["state"] for t in tasks] == ["RUNNING"], tasks
        assert_exactly_once(output, total)
    finally:
        cluster.http.close()
