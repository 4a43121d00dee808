"""Drive Zab peers by hand in unit tests: a fake host, instant disks, packet capture."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from herder.ensemble.zab import (
    Envelope,
    Event,
    Peer,
    PersistedState,
    Ready,
    Role,
    ServerState,
    Snapshot,
    Txn,
    ZabConfig,
    make_zxid,
)
from herder.ensemble.zab.messages import Committed, Notification, QuorumPacket


def z(epoch: int, counter: int) -> int:
    return make_zxid(epoch, counter)


def txns(*zxids: int) -> list[Txn]:
    return [Txn(x, b"t%x" % x) for x in zxids]


def config(n: int = 3, observers: Sequence[int] = (), **kwargs: Any) -> ZabConfig:
    servers = {sid: Role.PARTICIPANT for sid in range(1, n + 1)}
    for sid in observers:
        servers[sid] = Role.OBSERVER
    kwargs.setdefault("tick_ms", 100)
    kwargs.setdefault("finalize_wait_ms", 50)
    return ZabConfig(servers=servers, **kwargs)


class FakeHost:
    """A host whose disk holds ``log`` and a snapshot ``snapshot`` of ``size`` bytes."""

    def __init__(
        self,
        log: Sequence[Txn] = (),
        snapshot: Snapshot | None = None,
        size: int = 0,
    ) -> None:
        self.log = list(log)
        self.snapshot = snapshot or Snapshot(0, b"state@0")
        self.size = size
        self.reads: list[tuple[int, int | None]] = []

    def read_log(self, start: int, limit_bytes: int | None) -> list[Txn] | None:
        self.reads.append((start, limit_bytes))
        before = [i for i, t in enumerate(self.log) if t.zxid <= start]
        if not before:
            return None
        found = self.log[before[-1] :]
        if limit_bytes is not None and sum(len(t.payload) for t in found) > limit_bytes:
            return None
        return found

    def snapshot_size(self) -> int:
        return self.size

    def snapshot_for_sync(self) -> Snapshot:
        return self.snapshot


class Driver:
    """Feeds one peer, completes its disk ops at once, and keeps what it did."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.now = 0
        self.sent: list[Envelope] = []
        self.disk: list[Any] = []
        self.committed: list[Txn] = []
        self.events: list[Event] = []
        self.snapshots: list[Snapshot] = []
        self.hold_disk = False
        self._held: list[int] = []

    def drain(self) -> Ready:
        """Collect the peer's effects; complete disk ops unless ``hold_disk``."""
        total = Ready()
        while True:
            ready = self.peer.ready()
            if not ready:
                return total
            self.sent.extend(ready.messages)
            self.disk.extend(ready.disk)
            self.committed.extend(ready.committed)
            self.events.extend(ready.events)
            if ready.snapshot is not None:
                self.snapshots.append(ready.snapshot)
            total.messages.extend(ready.messages)
            total.disk.extend(ready.disk)
            total.committed.extend(ready.committed)
            total.events.extend(ready.events)
            total.touches.extend(ready.touches)
            tokens = [op.token for op in ready.disk]
            if self.hold_disk:
                self._held.extend(tokens)
            elif tokens:
                self.peer.disk_done(max(tokens), self.now)

    def release_disk(self) -> Ready:
        self.hold_disk = False
        if self._held:
            self.peer.disk_done(max(self._held), self.now)
            self._held.clear()
        return self.drain()

    def step(self, message: Any, sender: int) -> Ready:
        self.peer.step(message, sender, self.now)
        return self.drain()

    def tick(self, now: int) -> Ready:
        self.now = now
        self.peer.tick(now)
        return self.drain()

    def to(self, sid: int) -> list[QuorumPacket]:
        """Quorum packets sent to ``sid`` so far."""
        return [e.message for e in self.sent if e.to == sid and isinstance(e.message, QuorumPacket)]


def vote(
    leader: int, zxid: int, peer_epoch: int, election_epoch: int = 1, **kw: Any
) -> Notification:
    return Notification(
        leader=leader,
        zxid=zxid,
        peer_epoch=peer_epoch,
        election_epoch=election_epoch,
        state=kw.pop("state", ServerState.LOOKING),
        **kw,
    )


def elected_leader(
    cfg: ZabConfig,
    *,
    log_tail: Sequence[Txn] = (),
    applied_zxid: int = 0,
    epoch: int = 1,
    host: FakeHost | None = None,
) -> Driver:
    """Server 1, which a second voter helps elect, in discovery."""
    state = PersistedState(
        accepted_epoch=epoch, current_epoch=epoch, applied_zxid=applied_zxid, log_tail=log_tail
    )
    peer = Peer(1, cfg, state, host or FakeHost(log_tail), rng_seed=1, now_ms=0)
    driver = Driver(peer)
    driver.drain()
    last = peer.status.last_zxid
    driver.step(vote(1, last, epoch), 2)
    driver.tick(cfg.finalize_wait_ms)
    assert peer.status.state is ServerState.LEADING
    return driver


def sync_learner(
    leader: Driver,
    sid: int,
    last_zxid: int,
    current_epoch: int,
    *,
    needs_snap: bool = False,
    observer: bool = False,
    session: int | None = None,
) -> list[QuorumPacket]:
    """Connect learner ``sid`` and return every packet the leader sends it afterwards."""
    from herder.ensemble.zab.messages import AckEpoch, FollowerInfo, ObserverInfo

    session = session if session is not None else 1000 + sid
    before = len(leader.to(sid))
    info = ObserverInfo if observer else FollowerInfo
    leader.step(
        info(session=session, seq=0, accepted_epoch=current_epoch, needs_snap=needs_snap), sid
    )
    leader.step(
        AckEpoch(
            session=session,
            seq=1,
            current_epoch=current_epoch,
            last_zxid=last_zxid,
            needs_snap=needs_snap,
        ),
        sid,
    )
    return leader.to(sid)[before:]


def kinds(packets: Sequence[QuorumPacket]) -> list[str]:
    """A readable trace: ``["LeaderInfo(2)", "Diff(0x100000003)", "Committed(0x…)", …]``."""
    out = []
    for p in packets:
        name = type(p).__name__
        if isinstance(p, Committed):
            # a batch of the sync stream, one entry per txn whatever the batching
            out += [f"{name}({t.zxid:#x})" for t in p.txns]
        elif hasattr(p, "txn"):
            out.append(f"{name}({p.txn.zxid:#x})")
        elif hasattr(p, "zxid"):
            out.append(f"{name}({p.zxid:#x})")
        elif hasattr(p, "epoch"):
            out.append(f"{name}({p.epoch})")
        else:
            out.append(name)
    return out


class MiniCluster:
    """Peers wired together with instant, reliable delivery and instant disks.

    Time moves only when ``advance`` is called, so a test decides exactly which timers
    fire; ``down`` servers neither receive nor send.
    """

    def __init__(self, cfg: ZabConfig, states: dict[int, PersistedState] | None = None) -> None:
        self.cfg = cfg
        self.now = 0
        self.down: set[int] = set()
        self.hosts = {sid: FakeHost() for sid in cfg.servers}
        self.drivers: dict[int, Driver] = {}
        self.applied: dict[int, list[Txn]] = {sid: [] for sid in cfg.servers}
        self._sent_upto: dict[int, int] = {}
        self._applied_upto: dict[int, int] = {}
        states = states or {}
        for sid in cfg.servers:
            self._boot(sid, states.get(sid, PersistedState()))
        self.settle()

    def _boot(self, sid: int, state: PersistedState) -> None:
        self.down.discard(sid)
        peer = Peer(sid, self.cfg, state, self.hosts[sid], rng_seed=sid, now_ms=self.now)
        self.drivers[sid] = Driver(peer)
        self.drivers[sid].now = self.now
        self.applied[sid] = []
        self._sent_upto[sid] = 0
        self._applied_upto[sid] = 0

    def start(self, sid: int, state: PersistedState) -> None:
        self._boot(sid, state)
        self.settle()

    def peer(self, sid: int) -> Peer:
        return self.drivers[sid].peer

    def settle(self) -> None:
        """Deliver messages until none is left."""
        for _ in range(100_000):
            moved = False
            for sid, driver in self.drivers.items():
                if sid in self.down:
                    continue
                driver.now = self.now
                driver.drain()
                # the host's state machine is wherever the peer told it to apply up to
                status = driver.peer.status
                self.hosts[sid].snapshot = Snapshot(status.committed_zxid, b"state")
                self.applied[sid].extend(driver.committed[self._applied_upto[sid] :])
                self._applied_upto[sid] = len(driver.committed)
                start = self._sent_upto[sid]
                self._sent_upto[sid] = len(driver.sent)
                for envelope in driver.sent[start:]:
                    if envelope.to in self.down or envelope.to not in self.drivers:
                        continue
                    target = self.drivers[envelope.to]
                    target.now = self.now
                    target.peer.step(envelope.message, sid, self.now)
                    moved = True
            if not moved:
                return
        raise AssertionError("the cluster never went quiet")

    def advance(self, ms: int, step: int = 10) -> None:
        end = self.now + ms
        while self.now < end:
            self.now = min(end, self.now + step)
            for sid, driver in self.drivers.items():
                if sid not in self.down and driver.peer.next_deadline() <= self.now:
                    driver.tick(self.now)
            self.settle()

    def leader(self) -> int | None:
        leaders = [
            sid
            for sid, d in self.drivers.items()
            if sid not in self.down
            and d.peer.status.state is ServerState.LEADING
            and d.peer.status.serving
        ]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def crash(self, sid: int) -> None:
        self.down.add(sid)
