"""Durable storage for an ensemble server: transaction log, snapshots, epochs.

Storage knows nothing of what a transaction means: it keeps ``(zxid, payload)`` records
and snapshot payloads that the state machine serialises itself. See DESIGN.md,
"Durability", for the guarantees, and :mod:`.store` for the entry point.
"""

from herder.ensemble.storage.committer import GroupCommitter
from herder.ensemble.storage.epochs import Epochs
from herder.ensemble.storage.files import FileHandle, FileLock, FileSystem, OsFileSystem
from herder.ensemble.storage.frames import Txn
from herder.ensemble.storage.policy import DEFAULT_SNAP_COUNT, SnapshotPolicy
from herder.ensemble.storage.simfs import SimulatedFileSystem
from herder.ensemble.storage.snapshots import Snapshot
from herder.ensemble.storage.store import (
    Recovery,
    SnapshotSyncRequired,
    Storage,
    StorageStats,
)
from herder.ensemble.storage.txnlog import DEFAULT_FILE_SIZE, TxnLog

__all__ = [
    "DEFAULT_FILE_SIZE",
    "DEFAULT_SNAP_COUNT",
    "Epochs",
    "FileHandle",
    "FileLock",
    "FileSystem",
    "GroupCommitter",
    "OsFileSystem",
    "Recovery",
    "SimulatedFileSystem",
    "Snapshot",
    "SnapshotPolicy",
    "SnapshotSyncRequired",
    "Storage",
    "StorageStats",
    "Txn",
    "TxnLog",
]
