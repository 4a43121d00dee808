"""An ensemble server's admin port: ZooKeeper's ``mntr`` names on ``/metrics`` and
``/commands/mntr``, after writes and after the leader is killed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from herder.ensemble.sync_client import SyncEnsembleClient
from herder.ensemble.txn import Append
from tests.harness import Processes, free_port, wait_until
from tests.integration.conftest import make_ensemble
from tests.integration.test_replication import leader_of
from tests.ops.metrics_text import parse, value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert reply.status_code == 200, reply.text
    return parse(reply.text)


def write(bootstrap: str, count: int, size: int = 100) -> None:
    with SyncEnsembleClient(bootstrap) as client:
        client.create_log("metrics-test", if_absent=True)
        for i in range(count):
            client.transact([Append("metrics-test", None, b"x" * size + str(i).encode(), [])])


def test_mntr_names_after_writes_and_a_failover(processes: Processes, tmp_path: Path) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3)
    admin = {}
    for sid, server in ensemble.servers.items():
        admin[sid] = free_port()
        with open(server.config_path, "a") as f:
            # one server on each of ZooKeeper's two names
            key = "admin.serverPort" if sid == 1 else "metricsProvider.httpPort"
            f.write(f"{key}={admin[sid]}\nadmin.serverAddress=127.0.0.1\n")
            f.write("metricsProvider.httpHost=127.0.0.1\n")
    ensemble.start()
    leader = leader_of(ensemble)
    write(ensemble.bootstrap, 50, size=500)

    def leader_synced(sid: int, followers: int) -> dict | None:  # type: ignore[type-arg]
        m = scrape(admin[sid])
        if value(m, "zk_synced_followers") == followers:
            return m
        return None

    m = wait_until(lambda: leader_synced(leader, 2), timeout=30, what="two synced followers")
    assert isinstance(m, dict)
    assert value(m, "zk_server_state", state="leader") == 1
    assert value(m, "zk_followers") == 2
    assert value(m, "zk_learners") == 2
    assert value(m, "zk_pending_syncs") == 0
    # the largest proposal was one of our appends (500-byte values); the last one is the
    # client's session closing
    assert (value(m, "zk_max_proposal_size") or 0) > 500
    assert 0 < (value(m, "zk_last_proposal_size") or 0) <= (value(m, "zk_max_proposal_size") or 0)
    assert 0 < (value(m, "zk_min_proposal_size") or 0) < 500
    assert value(m, "zk_outstanding_requests") == 0
    assert value(m, "zk_fsync_threshold_exceed_count") == 0
    assert value(m, "zk_quorum_size") == 3
    assert value(m, "process_resident_memory_bytes") is not None
    # latencies are in milliseconds, plausible for a local ensemble
    for sid in admin:
        m = scrape(admin[sid])
        avg, top = value(m, "zk_avg_latency"), value(m, "zk_max_latency")
        assert avg is not None and top is not None
        if (value(m, "zk_packets_received") or 0) > 0:
            assert 0 < avg <= top < 10_000, (sid, avg, top)
        assert (value(m, "zk_num_alive_connections") or 0) >= 0
        if sid != leader:
            assert value(m, "zk_server_state", state="follower") == 1
            assert value(m, "zk_followers") is None  # leader-only, as in ZooKeeper
    mntr = httpx.get(f"http://127.0.0.1:{admin[leader]}/commands/mntr", timeout=10).json()
    assert mntr["zk_server_state"] == "leader"
    assert mntr["zk_synced_followers"] == 2
    assert mntr["error"] is None
    assert httpx.get(f"http://127.0.0.1:{admin[leader]}/commands/ruok").json()["error"] is None
    assert httpx.get(f"http://127.0.0.1:{admin[leader]}/nope").status_code == 404

    # failover: the new leader has one follower left, synced, and takes writes
    ensemble[leader].kill9()
    new_leader = leader_of(ensemble, exclude=leader)
    write(ensemble.bootstrap, 10)
    m = wait_until(lambda: leader_synced(new_leader, 1), timeout=30, what="one synced follower")
    assert isinstance(m, dict)
    assert value(m, "zk_server_state", state="leader") == 1
    assert value(m, "zk_followers") == 1
    assert (value(m, "zk_max_proposal_size") or 0) > 100
    assert (value(m, "herder_epoch") or 0) >= 2
