"""The ``cluster`` fixture of the pipeline tests: workers on one ensemble server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_pipeline import Cluster
from tests.harness import Processes


@pytest.fixture
def cluster(processes: Processes, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(processes, tmp_path)
    try:
        yield c
    finally:
        c.http.close()
