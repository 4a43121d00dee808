"""What a replicated server's Zab peer reads of its on-disk log to sync a learner."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.ensemble.config import EnsembleConfig
from herder.ensemble.replica import ZabReplica
from herder.ensemble.storage import Storage
from herder.ensemble.storage.committer import GroupCommitter

pytestmark = pytest.mark.unit


def zx(counter: int) -> int:
    return 1 << 32 | counter


def test_read_log_starts_at_the_txn_at_or_before_the_learner_and_honours_the_limit(
    tmp_path: Path,
) -> None:
    config = EnsembleConfig.from_properties(
        {
            "dataDir": str(tmp_path),
            "server.id": "1",
            "preAllocSize": "1",
            **{f"server.{i}": f"127.0.0.1:{2880 + i}:{3880 + i}" for i in (1, 2, 3)},
        }
    )
    storage = Storage.open(str(tmp_path), log_file_size=512)
    try:
        for counter in (*range(1, 30, 2), *range(31, 61)):  # a gap: 29 → 31 via odd zxids
            storage.append(zx(counter), b"x" * 20)
        storage.sync()
        assert len([p for p in tmp_path.iterdir() if p.name.startswith("log.")]) > 2
        replica = ZabReplica(
            config,
            storage,
            GroupCommitter(storage),
            on_applied=lambda txn, result: None,
            on_event=lambda event: None,
            on_touches=lambda ids: None,
        )
        # a learner at zxid 40 (logged here): from 40 on
        txns = replica.read_log(zx(40), None)
        assert txns is not None and [t.zxid for t in txns] == [zx(c) for c in range(40, 61)]
        # a learner at zxid 4, which this log lacks: from the one before it (3), to TRUNC
        txns = replica.read_log(zx(4), None)
        assert txns is not None and txns[0].zxid == zx(3) and txns[-1].zxid == zx(60)
        # what the learner lacks is more than the limit: not from the log
        assert replica.read_log(zx(4), 100) is None
        # the bytes after a zxid, from the records' headers: 20-byte payloads, 16 more
        assert storage.log_bytes_after(zx(40)) == 20 * 36
        assert replica.read_log(zx(40), 20 * 36 + 36) is not None
        assert replica.read_log(zx(40), 20 * 36 - 1) is None
        # a learner before the log begins
        assert replica.read_log(0, None) is None
    finally:
        storage.close()
