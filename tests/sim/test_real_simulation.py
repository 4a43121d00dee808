"""The real-host simulator in the default suite: ``HERDER_SIM_REAL_SEEDS`` seeds (100 by
default; ``make sim`` runs more).

Each seed runs an ensemble of real :class:`~herder.ensemble.replica.ZabReplica` s with
their real storage and quorum networks on simulated loops, links and disks
(:mod:`tests.sim.real`). Each seed is one test, so a failure names its seed; the
failure message says how to replay it.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from herder.ensemble.storage import SimulatedFileSystem
from tests.sim.real.cluster import RealSimulation

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("HERDER_SIM_REAL_SEEDS", "100"))
STEPS = 4000


@pytest.mark.parametrize("seed", range(SEEDS))
def test_real_seed(seed: int) -> None:
    report = RealSimulation(seed, steps=STEPS).run()
    assert report.steps >= STEPS


def _disk(fs: SimulatedFileSystem, directory: str = "/") -> dict[str, bytes]:
    """Every file a simulated disk holds, by path, as it is now."""
    out: dict[str, bytes] = {}
    for name in fs.listdir(directory):
        if not name:
            continue  # the simulated root lists itself under an empty name
        path = os.path.join(directory, name)
        try:
            out[path] = fs.file_bytes(path)
        except FileNotFoundError:  # a directory
            out.update(_disk(fs, path))
    return out


def test_a_real_seed_replays_exactly() -> None:
    """Same seed, same history: the same steps, the same writes, the same bytes on disk."""
    first, second = RealSimulation(11), RealSimulation(11)
    a, b = first.run(), second.run()
    assert a == b
    assert a.crashes and a.acknowledged_writes
    assert first.checker.history == second.checker.history
    assert list(first.trace) == list(second.trace)
    for sid, host in first.hosts.items():
        assert _disk(host.fs) == _disk(second.hosts[sid].fs), sid


def test_the_real_simulator_reaches_every_corner_it_is_meant_to() -> None:
    """A simulator that never crashes a server, never syncs by SNAP, never takes a
    snapshot or resets a link would prove little about the host code."""
    totals: Counter[str] = Counter()
    topologies = set()
    for seed in range(16):
        report = RealSimulation(seed).run()
        topologies.add(tuple(sorted(report.servers.values(), key=lambda r: r.value)))
        totals.update(report.syncs)
        totals["crashes"] += report.crashes
        totals["epoch crashes"] += report.epoch_crashes
        totals["partitions"] += report.partitions
        totals["resets"] += report.resets
        totals["snapshots"] += report.snapshots
        totals["acknowledged"] += report.acknowledged_writes
    assert len(topologies) >= 3
    for key in ("DIFF", "SNAP", "crashes", "epoch crashes", "partitions", "resets", "snapshots"):
        assert totals[key] > 0, key
    assert totals["acknowledged"] > 1000
