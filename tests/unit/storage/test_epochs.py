"""acceptedEpoch and currentEpoch: durable, atomic, never going back."""

from __future__ import annotations

import os

import pytest

from herder.ensemble.storage import Epochs, SimulatedFileSystem
from herder.errors import CorruptStorage

from .support import DATA, open_sim

pytestmark = pytest.mark.unit


def test_missing_epochs_read_as_the_callers_default() -> None:
    epochs = open_sim(SimulatedFileSystem()).epochs
    assert epochs.accepted_epoch() == 0
    assert epochs.current_epoch() == 0
    assert epochs.current_epoch(default=4) == 4


def test_epochs_survive_a_crash_right_after_they_are_set() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    storage.epochs.set_accepted_epoch(3)
    storage.epochs.set_current_epoch(2)
    fs.crash()

    epochs = open_sim(fs).epochs
    assert (epochs.accepted_epoch(), epochs.current_epoch()) == (3, 2)
    text = fs.file_bytes(os.path.join(DATA, "acceptedEpoch"))
    assert text == b"3\n"  # ZooKeeper's format: the number in decimal


def test_an_epoch_never_goes_back() -> None:
    epochs = Epochs(*_fresh())
    epochs.set_accepted_epoch(5)
    with pytest.raises(ValueError, match="cannot go back"):
        epochs.set_accepted_epoch(4)
    with pytest.raises(ValueError, match="outside"):
        epochs.set_current_epoch(1 << 32)
    assert epochs.accepted_epoch() == 5


def test_an_unreadable_epoch_file_is_corruption() -> None:
    fs, directory = _fresh()
    handle = fs.open(os.path.join(directory, "currentEpoch"), create=True)
    handle.pwrite(b"seven\n", 0)
    with pytest.raises(CorruptStorage, match="'seven' is not an epoch"):
        Epochs(fs, directory)


def test_an_accepted_epoch_below_the_current_one_is_corruption() -> None:
    fs, directory = _fresh()
    epochs = Epochs(fs, directory)
    epochs.set_current_epoch(6)
    handle = fs.open(os.path.join(directory, "acceptedEpoch"), create=True)
    handle.pwrite(b"5\n", 0)
    with pytest.raises(CorruptStorage, match="acceptedEpoch 5 is below currentEpoch 6"):
        Epochs(fs, directory)


def _fresh() -> tuple[SimulatedFileSystem, str]:
    fs = SimulatedFileSystem()
    fs.makedirs(DATA)
    return fs, DATA
