"""Property: whatever the crashes, recovery yields a prefix of the log holding all it synced.

Random histories of appends, syncs, snapshots, truncations, clean restarts and crashes
(with torn writes) on the simulated disk. After every reopen the recovered history
(snapshot, then replayed transactions) must be exactly the first ``m`` transactions
appended, for some ``m`` no smaller than the number synced.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from herder.ensemble.storage import SimulatedFileSystem, SnapshotSyncRequired, Storage, Txn

from .support import open_sim

pytestmark = pytest.mark.unit


class CrashingStorage(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fs = SimulatedFileSystem()
        self.storage: Storage = open_sim(self.fs, log_file_size=256)
        #: every transaction of the current history, in order
        self.history: list[Txn] = []
        #: how many of them a sync (or snapshot, or truncation) made durable
        self.synced = 0
        #: history lengths at which snapshots were taken (the newest is never purged)
        self.snapshots: set[int] = set()
        self.epoch = 1

    def _next_zxid(self) -> int:
        last = self.storage.last_zxid
        return max(last + 1, self.epoch << 32 | 1)

    @rule(sizes=st.lists(st.integers(0, 90), min_size=1, max_size=8))
    def append(self, sizes: list[int]) -> None:
        for size in sizes:
            zxid = self._next_zxid()
            txn = Txn(zxid, random.Random(zxid).randbytes(size))
            self.storage.append(*txn)
            self.history.append(txn)

    @rule()
    def sync(self) -> None:
        durable = self.storage.sync()
        self.synced = len(self.history)
        assert durable == (self.history[-1].zxid if self.history else durable)

    @precondition(lambda self: max(self.snapshots, default=1) <= len(self.history))
    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        newest = max(self.snapshots, default=1)
        upto = data.draw(st.integers(newest, len(self.history)), label="snapshot covers")
        self.storage.write_snapshot(self.history[upto - 1].zxid, str(upto).encode())
        self.snapshots.add(upto)
        self.synced = len(self.history)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        keep = data.draw(st.integers(1, len(self.history)), label="truncate keeps")
        try:
            self.storage.truncate_to(self.history[keep - 1].zxid)
        except SnapshotSyncRequired:
            return
        del self.history[keep:]
        self.snapshots = {n for n in self.snapshots if n <= keep}
        self.synced = len(self.history)

    @rule()
    def new_epoch(self) -> None:
        self.epoch += 1

    @rule()
    def restart(self) -> None:
        self.storage.close()
        self.synced = len(self.history)
        self._reopen()

    @rule(seed=st.integers(0, 2**32), tear=st.booleans())
    def crash(self, seed: int, tear: bool) -> None:
        self.fs.crash(random.Random(seed), tear=tear)
        self._reopen()

    def _reopen(self) -> None:
        self.storage = open_sim(self.fs, log_file_size=256)
        recovery = self.storage.recovery
        prefix = 0 if recovery.snapshot is None else int(recovery.snapshot.payload)
        if recovery.snapshot is not None:
            assert recovery.snapshot.zxid == self.history[prefix - 1].zxid
        recovered = self.history[:prefix] + recovery.transactions
        assert len(recovered) >= self.synced, "a synced transaction was lost"
        assert recovered == self.history[: len(recovered)], "recovery is not a prefix"
        self.history = recovered
        self.synced = len(recovered)

    @invariant()
    def durable_never_ahead_of_appended(self) -> None:
        assert self.storage.durable_zxid <= self.storage.last_zxid


CrashingStorage.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCrashingStorage = CrashingStorage.TestCase
