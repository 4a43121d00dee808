"""Fencing epochs: each new incarnation of a writer takes an epoch that fences the old one.

A source task, a connector's task set and the worker leader each take an epoch before
they write (Kafka's producer epochs, KIP-618's connector fencing). A write made under
an older epoch must not commit. The coordinator issues epochs and persists each in the
compacted ``_fencing`` log, one key per fenced id; the *check* happens in the
ensemble, inside the writer's own transaction, as "the key of this id in ``_fencing``
was last written at the zxid that wrote my epoch". If a newer epoch has been written
since, that key's zxid has moved on, the check fails, and the zombie's transaction
commits nothing. The ensemble never needs to import the coordinator for this: a
:class:`FencingCheck` is plain data.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from herder.coordinator.records import FENCING_LOG, FencingRecord, encode_record, fencing_key
from herder.errors import Fenced

#: the epoch of a fenced id's first incarnation
FIRST_EPOCH = 0


class FencingCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The ensemble check that ``fenced_id`` still holds ``epoch``.

    ``zxid`` is the version the key must still have (the ensemble's native check);
    ``expected_value`` states the same fact as the key's content, for a store that
    cannot report zxids.
    """

    log: str = FENCING_LOG
    key: bytes
    zxid: int | None = None
    expected_value: bytes


def fencing_check(fenced_id: str, epoch: int, zxid: int | None) -> FencingCheck:
    """Describe the check "the epoch of ``fenced_id`` is still ``epoch``" (pure)."""
    return FencingCheck(
        key=fencing_key(fenced_id),
        zxid=zxid,
        expected_value=encode_record(FencingRecord(fenced_id=fenced_id, epoch=epoch)),
    )


@dataclass(frozen=True, slots=True)
class FencingEpoch:
    """An epoch the store has confirmed, with the zxid that wrote it (if reported)."""

    epoch: int
    zxid: int | None


class FencingEpochs:
    """The current epoch of every fenced id, and the highest one already issued.

    An epoch is *issued* when its write is handed to the store and *current* once the
    store confirms it. Issuing always goes above both, so two bumps racing for one id
    get different epochs even before either is written, and a failed write leaves a
    gap rather than a reused epoch.
    """

    def __init__(self) -> None:
        self._current: dict[str, FencingEpoch] = {}
        self._issued: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._current)

    def current(self, fenced_id: str) -> FencingEpoch | None:
        return self._current.get(fenced_id)

    def load(self, fenced_id: str, epoch: int, zxid: int | None) -> None:
        """Take an epoch read back from ``_fencing``."""
        self.confirm(fenced_id, epoch, zxid)

    def issue(self, fenced_id: str) -> int:
        current = self._current.get(fenced_id)
        highest = max(self._issued.get(fenced_id, -1), current.epoch if current else -1)
        self._issued[fenced_id] = highest + 1
        return highest + 1

    def confirm(self, fenced_id: str, epoch: int, zxid: int | None) -> None:
        """The store wrote ``epoch``; a confirmation of an older epoch changes nothing."""
        current = self._current.get(fenced_id)
        if current is None or epoch > current.epoch:
            self._current[fenced_id] = FencingEpoch(epoch, zxid)

    def check(self, fenced_id: str, epoch: int) -> FencingCheck:
        """The ensemble check for a writer holding ``epoch``; Fenced if it is not current.

        Refusing here already saves a doomed transaction; the check still goes into the
        transaction because only the ensemble decides at commit time.
        """
        current = self._current.get(fenced_id)
        if current is None:
            raise Fenced(f"{fenced_id} has no fencing epoch; take one with InitFencing first")
        if current.epoch != epoch:
            raise Fenced(
                f"{fenced_id} epoch {epoch} is fenced: the current epoch is {current.epoch}"
            )
        return fencing_check(fenced_id, epoch, current.zxid)
