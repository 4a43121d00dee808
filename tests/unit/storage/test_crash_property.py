"""Property: whatever the crashes, recovery yields a prefix of the log holding all it synced.

Random histories of appends, syncs, snapshots, truncations, installed leader snapshots,
clean restarts and crashes (with torn writes) on the simulated disk. Any operation that
touches the disk may also lose power after a random number of changes, recovery itself
included. After every reopen the recovered history (the zxids a snapshot covers, then
the replayed transactions) must be a prefix of what the history was, at least as long as
what had been synced.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from herder.ensemble.storage import SimulatedFileSystem, SnapshotSyncRequired, Storage, Txn

from .support import CutsPower, PowerCut, open_sim, zx

pytestmark = pytest.mark.unit

#: after how many disk changes the power fails (None: it doesn't)
cuts = st.one_of(st.none(), st.integers(0, 30))
seeds = st.integers(0, 2**32)
#: (a history recovery may come back with, how much of it must come back)
Candidate = tuple[list[Txn], int]


def snapshot_payload(history: list[Txn]) -> bytes:
    """The "state" a snapshot holds: the zxids it covers, so recovery can be checked."""
    return ",".join(f"{t.zxid:x}" for t in history).encode()


class CrashingStorage(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fs = SimulatedFileSystem()
        self.disk = CutsPower(self.fs)
        self.storage: Storage = open_sim(self.disk, log_file_size=256)
        #: every transaction of the current history, in order
        self.history: list[Txn] = []
        #: how many of them are durable
        self.synced = 0
        #: history lengths covered by snapshots (a lower bound for the next one)
        self.snapshots: set[int] = set()
        self.epoch = 1

    def _attempt(self, action: Callable[[], None], cut: int | None, seed: int) -> bool:
        """Run ``action``, losing power after ``cut`` changes; True if it completed."""
        self.disk.budget = cut
        try:
            action()
        except PowerCut:
            self.disk.budget = None
            self.fs.crash(random.Random(seed), tear=True)
            return False
        self.disk.budget = None
        return True

    @rule(sizes=st.lists(st.integers(0, 90), min_size=1, max_size=8))
    def append(self, sizes: list[int]) -> None:
        for size in sizes:
            zxid = max(self.storage.last_zxid + 1, zx(1, self.epoch))
            txn = Txn(zxid, random.Random(zxid).randbytes(size))
            self.storage.append(*txn)
            self.history.append(txn)

    @rule(cut=cuts, seed=seeds)
    def sync(self, cut: int | None, seed: int) -> None:
        before = (self.history, self.synced)
        if self._attempt(self.storage.sync, cut, seed):
            self.synced = len(self.history)
        else:
            self._reopen([before])

    @precondition(lambda self: max({1} | self.snapshots) <= len(self.history))
    @rule(data=st.data(), cut=cuts, seed=seeds)
    def snapshot(self, data: st.DataObject, cut: int | None, seed: int) -> None:
        upto = data.draw(st.integers(max({1} | self.snapshots), len(self.history)))
        covered = self.history[:upto]
        before = (self.history, self.synced)
        write = lambda: self.storage.write_snapshot(covered[-1].zxid, snapshot_payload(covered))  # noqa: E731
        if self._attempt(write, cut, seed):
            self.snapshots.add(upto)
            self.synced = len(self.history)
        else:
            self._reopen([before])

    @precondition(lambda self: self.history)
    @rule(data=st.data(), cut=cuts, seed=seeds)
    def truncate(self, data: st.DataObject, cut: int | None, seed: int) -> None:
        keep = data.draw(st.integers(1, len(self.history)), label="truncate keeps")
        before = (self.history, min(self.synced, keep))
        try:
            done = self._attempt(
                lambda: self.storage.truncate_to(self.history[keep - 1].zxid), cut, seed
            )
        except SnapshotSyncRequired:
            return
        if done:
            self.history = self.history[:keep]
            self.snapshots = {n for n in self.snapshots if n <= keep}
            self.synced = keep
        else:
            self._reopen([before])

    @rule(length=st.integers(1, 5), cut=cuts, seed=seeds)
    def install_leader_snapshot(self, length: int, cut: int | None, seed: int) -> None:
        self.epoch += 1
        leader = [Txn(zx(c, self.epoch), b"leader") for c in range(1, length + 1)]
        before = (self.history, self.synced)
        install = lambda: self.storage.install_snapshot(leader[-1].zxid, snapshot_payload(leader))  # noqa: E731
        if self._attempt(install, cut, seed):
            self.history, self.synced, self.snapshots = leader, length, {length}
        else:
            self._reopen([before, (leader, length)])

    @rule()
    def new_epoch(self) -> None:
        self.epoch += 1

    @rule(cut=cuts, seed=seeds)
    def restart(self, cut: int | None, seed: int) -> None:
        before = (self.history, self.synced)
        if self._attempt(self.storage.close, cut, seed):
            self.synced = len(self.history)
            self._reopen([(self.history, self.synced)])
        else:
            self._reopen([before])

    @rule(seed=seeds, tear=st.booleans(), cut=cuts)
    def crash(self, seed: int, tear: bool, cut: int | None) -> None:
        self.fs.crash(random.Random(seed), tear=tear)
        self._reopen([(self.history, self.synced)], cut=cut, seed=seed)

    def _reopen(self, candidates: list[Candidate], cut: int | None = None, seed: int = 0) -> None:
        opened = self._attempt(
            lambda: setattr(self, "storage", open_sim(self.disk, log_file_size=256)), cut, seed
        )
        if not opened:  # power lost during recovery itself: recover again
            self.storage = open_sim(self.disk, log_file_size=256)
        recovery = self.storage.recovery
        covered = [] if recovery.snapshot is None else recovery.snapshot.payload.split(b",")
        if recovery.snapshot is not None:
            assert int(covered[-1], 16) == recovery.snapshot.zxid
        for history, must_keep in candidates:
            prefix = [f"{t.zxid:x}".encode() for t in history[: len(covered)]]
            length = len(covered) + len(recovery.transactions)
            if prefix == covered and history[len(covered) : length] == recovery.transactions:
                assert length >= must_keep, "a synced transaction was lost"
                self.history, self.synced = history[:length], length
                self.snapshots = {n for n in self.snapshots if n <= length} | {len(covered)}
                return
        raise AssertionError("the recovered history is not a prefix of what was written")

    @invariant()
    def durable_never_ahead_of_appended(self) -> None:
        assert self.storage.durable_zxid <= self.storage.last_zxid


CrashingStorage.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCrashingStorage = CrashingStorage.TestCase
