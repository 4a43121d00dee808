"""A replicated ensemble of real server processes: failover, catch-up, observers, pauses."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from pathlib import Path

import pytest

from herder.ensemble import apis
from herder.ensemble.client import EnsembleClient, server_status
from herder.ensemble.sync_client import SyncEnsembleClient
from herder.ensemble.txn import Append, zxid_epoch
from herder.errors import HerderError
from herder.wire import ApiRegistry, WireClient
from tests.harness import Processes, wait_until
from tests.integration.conftest import Ensemble, make_ensemble

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def status(server: object) -> apis.StatusResponse:
    return asyncio.run(server_status(server.bootstrap, timeout=1.0))  # type: ignore[attr-defined]


def statuses(ensemble: Ensemble) -> dict[int, apis.StatusResponse]:
    out = {}
    for sid, server in ensemble.servers.items():
        if server.proc is not None and server.proc.alive():
            with contextlib.suppress(HerderError):
                out[sid] = status(server)
    return out


def leader_of(ensemble: Ensemble, exclude: int | None = None) -> int:
    """Wait for a leader every live server agrees on (and that is not ``exclude``)."""

    def agreed() -> int | None:
        seen = statuses(ensemble)
        leaders = [sid for sid, st in seen.items() if st.role == "leader"]
        if len(leaders) != 1 or leaders[0] == exclude:
            return None
        leader = leaders[0]
        followers = [st for st in seen.values() if st.role in ("follower", "observer")]
        if len(followers) + 1 < len(seen) or any(st.leader != leader for st in followers):
            return None
        return leader

    return int(wait_until(agreed, timeout=60, what="one leader every live server follows"))  # type: ignore[arg-type]


def read_all(bootstrap: str, name: str) -> list[tuple[int, bytes | None, int]]:
    """(offset, value, zxid) of every record of ``name`` on the server at ``bootstrap``."""
    out = []
    with SyncEnsembleClient(bootstrap) as client:
        client.sync()
        position = 0
        while True:
            batch = client.read(name, position, max_records=5000)
            if not batch.records:
                break
            out += [(r.offset, r.value, r.zxid) for r in batch.records]
            position = batch.next_offset
    return out


class Writer(threading.Thread):
    """Appends 0, 1, 2, … to a log through the bootstrap list, pipelined, until stopped."""

    def __init__(self, bootstrap: str, log: str, in_flight: int = 20) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.log = log
        self.in_flight = in_flight
        self.acked: dict[int, int] = {}  # value -> zxid
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        counter = iter(range(1 << 30))
        async with EnsembleClient(
            self.bootstrap, session_timeout_ms=4000, give_up_after=60.0
        ) as client:

            async def one() -> None:
                while not self._halt.is_set():
                    value = next(counter)
                    try:
                        result = await client.transact(
                            [Append(self.log, None, str(value).encode(), [])]
                        )
                    except HerderError as exc:
                        self.errors.append(f"{value}: {exc}")
                        await asyncio.sleep(0.05)
                        continue
                    self.acked[value] = result.zxid

            await asyncio.gather(*(one() for _ in range(self.in_flight)))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=90)
        assert not self.is_alive(), "the writer did not stop"


def test_kill9_the_leader_five_times(processes: Processes, tmp_path: Path) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3, snapCount=500).start()
    first = leader_of(ensemble)
    with SyncEnsembleClient(ensemble.bootstrap) as client:
        client.create_log("events")
    writer = Writer(ensemble.bootstrap, "events")
    writer.start()
    leaders = [first]
    try:
        for _ in range(5):
            before = len(writer.acked)
            wait_until(lambda before=before: len(writer.acked) > before + 200, timeout=60)
            victim = leader_of(ensemble)
            ensemble[victim].kill9()
            new = leader_of(ensemble, exclude=victim)
            leaders.append(new)
            after = len(writer.acked)
            wait_until(lambda after=after: len(writer.acked) > after + 50, timeout=60)
            ensemble[victim].start()
    finally:
        writer.stop()
    # every server, each read on its own, holds the same log
    leader_of(ensemble)
    target = max(st.committed_zxid for st in statuses(ensemble).values())
    wait_until(
        lambda: (
            all(
                st.committed_zxid >= target and st.role in ("leader", "follower")
                for st in statuses(ensemble).values()
            )
            and len(statuses(ensemble)) == 3
        ),
        timeout=60,
    )
    logs = {sid: read_all(server.bootstrap, "events") for sid, server in ensemble.servers.items()}
    reference = logs[1]
    for sid, records in logs.items():
        assert records == reference, f"server {sid} differs from server 1"
    values = [int(v) for _, v, _ in reference if v is not None]
    assert len(values) == len(set(values)), "a record was stored twice"
    stored = dict(zip(values, (z for _, _, z in reference), strict=True))
    missing = [v for v in writer.acked if v not in stored]
    assert not missing, f"acknowledged but lost: {missing[:10]}"
    for value, zxid in writer.acked.items():
        assert stored[value] == zxid, (
            f"{value} acknowledged at {zxid:#x}, stored at {stored[value]:#x}"
        )
    assert len(writer.acked) > 1000
    # five elections, five new epochs
    epochs = {zxid_epoch(z) for z in stored.values()}
    assert len(epochs) >= 5, epochs


def test_a_follower_catches_up_by_diff_then_by_snap(processes: Processes, tmp_path: Path) -> None:
    ensemble = make_ensemble(
        processes, tmp_path, 3, snapCount=200, **{"zookeeper.commitLogCount": 50}
    ).start()
    leader = leader_of(ensemble)
    follower = next(sid for sid in ensemble.servers if sid != leader)
    others = ",".join(s.bootstrap for sid, s in ensemble.servers.items() if sid != follower)
    with SyncEnsembleClient(others) as client:
        client.create_log("t")
        for i in range(50):
            client.append("t", f"a{i}".encode())
        assert ensemble[follower].stop() == 0
        for i in range(20):  # a short gap: DIFF
            client.append("t", f"b{i}".encode())
        ensemble[follower].start()
        leader_zxid = status(ensemble[leader]).committed_zxid
        st = wait_until(
            lambda: (s := status(ensemble[follower])).last_zxid >= leader_zxid and s,
            what="the follower to catch up",
        )
        assert st.last_sync == "DIFF", st  # type: ignore[union-attr]
        assert ensemble[follower].stop() == 0
        # a long gap: more txns than the leader keeps in memory, and more bytes than a
        # third of its snapshot → SNAP
        for i in range(400):
            client.append("t", f"c{i}".encode() * 20)
        ensemble[follower].start()
        leader_zxid = status(ensemble[leader]).committed_zxid
        st = wait_until(
            lambda: (s := status(ensemble[follower])).last_zxid >= leader_zxid and s,
            what="the follower to catch up",
        )
        assert st.last_sync == "SNAP", st  # type: ignore[union-attr]
    assert read_all(ensemble[follower].bootstrap, "t") == read_all(ensemble[leader].bootstrap, "t")


def test_an_observer_serves_reads_after_sync_and_forwards_writes(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3, observers=1).start()
    leader = leader_of(ensemble)
    observer = ensemble[4]
    st = status(observer)
    assert st.role == "observer" and st.leader == leader
    leader_status = status(ensemble[leader])
    assert 4 in leader_status.learners
    with (
        SyncEnsembleClient(ensemble[leader].bootstrap) as at_leader,
        SyncEnsembleClient(observer.bootstrap) as at_observer,
    ):
        at_leader.create_log("o")
        for i in range(100):
            at_leader.append("o", str(i).encode())
        at_observer.sync()
        # no min_zxid: the read sees the writes because sync made the observer catch up
        records = at_observer.read("o", 0, max_records=1000, min_zxid=0).records
        assert [r.value for r in records] == [str(i).encode() for i in range(100)]
        offset = at_observer.append("o", b"from the observer")
        assert offset == 100
        at_leader.sync()
        assert at_leader.read("o", 100).records[0].value == b"from the observer"
    # an observer never votes: with two participants down there is no quorum even
    # though two servers (a participant and the observer) are up
    downs = [*[sid for sid in (1, 2, 3) if sid != leader][:1], leader]
    for sid in downs:
        ensemble[sid].kill9()
    survivors = [sid for sid in (1, 2, 3) if sid not in downs]
    wait_until(
        lambda: all(status(ensemble[sid]).role == "looking" for sid in [*survivors, 4]),
        what="the survivors to stop serving",
    )


def test_a_paused_leader_acknowledges_nothing_in_its_old_epoch(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3).start()
    old = leader_of(ensemble)
    old_epoch = status(ensemble[old]).epoch
    with SyncEnsembleClient(ensemble.bootstrap) as client:
        client.create_log("p")
        client.append("p", b"before")

    async def write_to_paused_leader() -> list[object]:
        wire = WireClient(
            "127.0.0.1",
            ensemble[old].port,
            ApiRegistry(apis.CLIENT_APIS),
            request_timeout=30.0,
        )
        outcomes: list[object] = []
        try:
            session = await wire.request(
                apis.CONNECT_SESSION,
                apis.ConnectSessionRequest(timeout_ms=4000, client_name="paused-test"),
            )
            sid = session.session_id
            assert ensemble[old].proc is not None
            ensemble[old].proc.signal(signal.SIGSTOP)
            sends = [
                wire.request(
                    apis.TRANSACT,
                    apis.TransactRequest(
                        session_id=sid, seq=i + 1, ops=[Append("p", None, f"w{i}".encode(), [])]
                    ),
                )
                for i in range(5)
            ]
            tasks = [asyncio.ensure_future(s) for s in sends]
            await asyncio.to_thread(leader_of, ensemble, old)
            ensemble[old].proc.signal(signal.SIGCONT)
            for task in tasks:
                try:
                    outcomes.append(await task)
                except HerderError as exc:
                    outcomes.append(exc)
        finally:
            await wire.close()
        return outcomes

    outcomes = asyncio.run(write_to_paused_leader())
    for outcome in outcomes:
        if isinstance(outcome, apis.TransactResponse) and outcome.result.ok:
            assert zxid_epoch(outcome.result.zxid) > old_epoch, (
                f"acknowledged in the old epoch: {outcome}"
            )
    new = leader_of(ensemble)
    assert new != old
    st = wait_until(
        lambda: (s := status(ensemble[old])).role == "follower" and s.leader == new and s,
        what="the old leader to rejoin as a follower",
    )
    assert st.epoch > old_epoch  # type: ignore[union-attr]
    assert read_all(ensemble[old].bootstrap, "p") == read_all(ensemble[new].bootstrap, "p")
    epochs = {zxid_epoch(z) for _, _, z in read_all(ensemble[new].bootstrap, "p")}
    assert old_epoch in epochs  # "before"
    # nothing written after the pause carries the old epoch, except what came before it
    stored = read_all(ensemble[new].bootstrap, "p")
    assert [v for v, z in ((v, z) for _, v, z in stored) if zxid_epoch(z) == old_epoch] == [
        b"before"
    ]
