"""What every benchmark's JSON says about where its figures come from.

Figures from two runs can only be compared honestly when each says what code it
measured and how busy the machine was meanwhile. :func:`_procs.run_and_report` (which
every benchmark ends with) adds both, from here:

* ``git``: the commit measured (read as the benchmark starts), and ``dirty: true``
  when tracked files differ from it (untracked files do not count: a benchmark's own
  output redirected into the tree would otherwise mark every run dirty);
* ``load``: the machine's load averages (1, 5 and 15 minutes) before and after the run,
  and its CPU count, against which a load average reads.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

#: the repository the benchmarks belong to
REPOSITORY = Path(__file__).resolve().parent.parent
_GIT_TIMEOUT_S = 10.0


def _git(repository: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repository), *args],
        capture_output=True,
        text=True,
        timeout=_GIT_TIMEOUT_S,
        check=True,
    )
    return done.stdout.strip()


def git_state(repository: Path = REPOSITORY) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}``; ``commit`` None (and why) outside a git tree."""
    try:
        commit = _git(repository, "rev-parse", "HEAD")
        changes = _git(repository, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError) as exc:
        stderr = getattr(exc, "stderr", None) or str(exc)
        return {"commit": None, "dirty": None, "error": stderr.strip().splitlines()[-1]}
    return {"commit": commit, "dirty": bool(changes)}


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded for reading."""
    return [round(x, 2) for x in os.getloadavg()]


class Provenance:
    """Read when a benchmark starts (the code it runs, the load it meets), completed
    when it ends (the load it leaves)."""

    def __init__(self) -> None:
        self.git = git_state()
        self.load_before = load_average()

    def stamp(self, figures: dict[str, Any]) -> dict[str, Any]:
        """``figures`` with ``git`` and ``load`` added."""
        return {
            **figures,
            "git": self.git,
            "load": {
                "cpu_count": os.cpu_count(),
                "before": self.load_before,
                "after": load_average(),
            },
        }
