"""A server that cannot go on stops, says why, and exits non-zero; the others carry on.

A diverged history (told to truncate what it had applied) and a failed disk operation
(a full disk) each leave a server that must not take part any more. It closes its
links, so its leader (or its learners) drop it at once instead of keeping a zombie that
answers pings, and its exit status tells its supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from herder.ensemble.client import server_status
from herder.ensemble.storage.snapshots import SNAPSHOT_PREFIX
from herder.ensemble.storage.txnlog import LOG_PREFIX
from herder.ensemble.sync_client import SyncEnsembleClient
from herder.errors import HerderError
from tests.harness import Proc, Processes, wait_until
from tests.integration.conftest import Ensemble, ServerHandle, make_ensemble

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def role(server: ServerHandle) -> str | None:
    with contextlib.suppress(HerderError, OSError):
        return asyncio.run(server_status(server.bootstrap, timeout=1.0)).role
    return None


def leader_among(ensemble: Ensemble, ids: tuple[int, ...]) -> int:
    def found() -> int | None:
        roles = {sid: role(ensemble[sid]) for sid in ids}
        leaders = [sid for sid, r in roles.items() if r == "leader"]
        if len(leaders) == 1 and all(r in ("leader", "follower") for r in roles.values()):
            return leaders[0]
        return None

    return int(wait_until(found, timeout=60, what=f"a leader among {ids}"))  # type: ignore[arg-type]


def append(bootstrap: str, name: str, count: int) -> None:
    with SyncEnsembleClient(bootstrap) as client:
        for i in range(count):
            client.append(name, str(i).encode())


def exited(proc: Proc, timeout: float) -> int:
    wait_until(lambda: not proc.alive(), timeout=timeout, what=f"{proc.name} to exit")
    code = proc.popen.returncode
    assert code is not None
    return code


def test_a_server_told_to_truncate_what_it_applied_stops_with_a_nonzero_exit(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3, snapCount=20).start()
    leader_among(ensemble, (1, 2, 3))
    with SyncEnsembleClient(ensemble.bootstrap) as client:
        client.create_log("events")
    append(ensemble.bootstrap, "events", 120)
    wait_until(
        lambda: any(p.name.startswith(SNAPSHOT_PREFIX) for p in ensemble[3].data_dir.iterdir()),
        timeout=30,
        what="a snapshot on server 3",
    )
    for server in ensemble.servers.values():
        server.stop()
    # server 1 loses its log and snapshots, and its epoch files come back from elsewhere
    # with a later epoch: it wins the election on that epoch, and server 3, needed for
    # a quorum, is told to truncate below what it applied and snapshotted
    for path in ensemble[1].data_dir.iterdir():
        if path.name.startswith((LOG_PREFIX, SNAPSHOT_PREFIX)):
            path.unlink()
    for name in ("acceptedEpoch", "currentEpoch"):
        (ensemble[1].data_dir / name).write_text("7\n")
    server3 = ensemble[3]
    assert server3.proc is not None
    server3.proc = processes.start(server3.proc.args, name="diverged")
    ensemble[1].start()
    assert exited(server3.proc, timeout=60) != 0
    output = server3.proc.output()
    assert "stopping: its history diverged from the leader's" in output
    assert "Move its data directory aside" in output
    assert "handling a message from server" not in output  # no log-and-carry-on
    assert output.count("stopping:") == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> object:
    """A 24 MiB tmpfs, so that a server's data directory can really fill up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem to fill up needs root")
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], timeout=30, check=False)


def test_a_server_whose_disk_fills_up_stops_and_the_leader_drops_it(
    processes: Processes, tmp_path: Path, small_disk: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3, preAllocSize=64)
    # server 3 logs to the small disk; it takes no snapshot meanwhile
    victim = ensemble[3]
    victim.data_dir = small_disk / "server3"
    victim.data_dir.mkdir()
    text = victim.config_path.read_text()
    victim.config_path.write_text(
        text.replace(f"dataDir={tmp_path / 'server3'}", f"dataDir={victim.data_dir}")
        + "snapCount=1000000\n"
    )
    ensemble.start()
    leader = leader_among(ensemble, (1, 2, 3))
    with SyncEnsembleClient(ensemble.bootstrap) as client:
        client.create_log("events")
    append(ensemble.bootstrap, "events", 20)
    # fill the disk: the next log file server 3 preallocates no longer fits
    filler = small_disk / "filler"
    with open(filler, "wb") as out, contextlib.suppress(OSError):
        for _ in range(64):
            out.write(b"\0" * (1 << 20))
            out.flush()
            os.fsync(out.fileno())
    others = ",".join(ensemble[sid].bootstrap for sid in (1, 2))
    assert victim.proc is not None
    for _ in range(200):
        if not victim.proc.alive():
            break
        append(others, "events", 50)
    assert exited(victim.proc, timeout=60) != 0
    assert "stopping: a disk operation failed" in victim.proc.output()
    # its leader saw the connection close (or it was the leader, and 1 and 2 elect anew)
    survivors = (1, 2)
    new_leader = leader_among(ensemble, survivors)
    if leader != 3:
        log = ensemble[new_leader].proc.output()  # type: ignore[union-attr]
        assert "dropping learner 3" in log
    append(others, "events", 5)
