"""Every benchmark's JSON says what commit it measured and how loaded the machine was."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from bench import _procs, provenance

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def test_the_figures_carry_the_commit_and_the_load_before_and_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = _procs.run_and_report(lambda: ({"writes_per_s": 1}, 3))
    assert status == 3
    figures = json.loads(capsys.readouterr().out)
    assert figures["writes_per_s"] == 1
    assert figures["git"]["commit"] == git(provenance.REPOSITORY, "rev-parse", "HEAD")
    assert isinstance(figures["git"]["dirty"], bool)
    load = figures["load"]
    assert load["cpu_count"] == os.cpu_count()
    for when in ("before", "after"):
        assert len(load[when]) == 3 and all(x >= 0 for x in load[when])


def test_a_changed_tracked_file_marks_the_tree_dirty_an_untracked_one_does_not(
    tmp_path: Path,
) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "a")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "figures.json").write_text("{}\n")  # a benchmark's own output
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("two\n")
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": True}


def test_outside_a_git_tree_the_commit_is_unknown_and_says_why(tmp_path: Path) -> None:
    state = provenance.git_state(tmp_path)
    assert state["commit"] is None and state["dirty"] is None
    assert "not a git repository" in state["error"]
