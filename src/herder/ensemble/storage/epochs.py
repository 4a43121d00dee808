"""ZooKeeper's two persisted epochs, ``acceptedEpoch`` and ``currentEpoch``.

Zab's safety rests on them surviving a crash: a peer that ACKed a new epoch must never
ACK an older leader again (``acceptedEpoch``, written before ACKEPOCH), and a peer that
joined an epoch must remember having done so (``currentEpoch``, written before the
NEWLEADER ACK). Each lives in its own small file in the data directory, holding the
number in decimal as ZooKeeper writes it, replaced atomically (temp file, fsync, rename,
directory fsync) so a crash leaves the old value or the new one, never a torn one.
"""

from __future__ import annotations

import os

from herder.ensemble.storage.files import FileSystem, read_all
from herder.errors import CorruptStorage

ACCEPTED_EPOCH = "acceptedEpoch"
CURRENT_EPOCH = "currentEpoch"
_MAX_EPOCH = (1 << 32) - 1


class Epochs:
    """The persisted epochs of one server, read once at start and cached."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self._dir = directory
        self._accepted = accepted = self._read(ACCEPTED_EPOCH)
        self._current = current = self._read(CURRENT_EPOCH)
        if accepted is not None and current is not None and accepted < current:
            raise CorruptStorage(
                f"{directory}: acceptedEpoch {accepted} is below currentEpoch {current}, "
                "which no correct run writes; restore the directory or wipe it and let the "
                "server resync from the leader"
            )

    def accepted_epoch(self, default: int = 0) -> int:
        """The last epoch this server accepted, ``default`` if it never wrote one.

        A caller upgrading from a directory without the file may pass the epoch of its
        last zxid, as ZooKeeper does.
        """
        return default if self._accepted is None else self._accepted

    def current_epoch(self, default: int = 0) -> int:
        """The epoch this server last joined, ``default`` if it never wrote one."""
        return default if self._current is None else self._current

    def set_accepted_epoch(self, epoch: int) -> None:
        """Durably record ``epoch`` as accepted; an epoch never goes back."""
        self._check(epoch, self._accepted, ACCEPTED_EPOCH)
        self._write(ACCEPTED_EPOCH, epoch)
        self._accepted = epoch

    def set_current_epoch(self, epoch: int) -> None:
        """Durably record ``epoch`` as current; an epoch never goes back."""
        self._check(epoch, self._current, CURRENT_EPOCH)
        self._write(CURRENT_EPOCH, epoch)
        self._current = epoch

    @staticmethod
    def _check(epoch: int, previous: int | None, name: str) -> None:
        if not 0 <= epoch <= _MAX_EPOCH:
            raise ValueError(f"{name} {epoch} is outside 0..2**32-1")
        if previous is not None and epoch < previous:
            raise ValueError(f"{name} cannot go back from {previous} to {epoch}")

    def _read(self, name: str) -> int | None:
        path = os.path.join(self._dir, name)
        if not self._fs.exists(path):
            return None
        text = read_all(self._fs, path).decode("ascii", "replace").strip()
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value <= _MAX_EPOCH:
            raise CorruptStorage(f"{path}: {text!r} is not an epoch; restore or remove the file")
        return value

    def _write(self, name: str, epoch: int) -> None:
        path = os.path.join(self._dir, name)
        temporary = path + ".tmp"
        handle = self._fs.open(temporary, create=True)
        try:
            handle.truncate(0)
            handle.pwrite(f"{epoch}\n".encode("ascii"), 0)
            handle.fsync()
        finally:
            handle.close()
        self._fs.rename(temporary, path)
        self._fs.fsync_dir(self._dir)
