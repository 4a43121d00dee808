"""The README's first command, end to end: ``herder quickstart``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.harness import HERDER

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(900)]


def test_quickstart_runs_and_verifies(tmp_path: Path) -> None:
    out = subprocess.run(
        [*HERDER, "quickstart", "--records", "20000", "--dir", str(tmp_path / "qs")],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verified: 20,000 records" in out.stdout
    produced = (tmp_path / "qs" / "output.txt").read_bytes()
    assert produced == (tmp_path / "qs" / "input.txt").read_bytes()
    assert produced.count(b"\n") == 20000
