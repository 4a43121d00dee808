"""Fencing epochs: issued, persisted with their zxid, and turned into ensemble checks."""

from __future__ import annotations

from random import Random

import pytest

from herder.coordinator import FENCING_LOG, GroupCoordinator, fencing_check
from herder.coordinator.messages import InitFencingRequest
from herder.coordinator.records import FencingRecord, decode_fencing_value, encode_record
from herder.errors import ErrorCode, Fenced, NotCoordinator

from .support import FakeStore, Harness

pytestmark = pytest.mark.unit


def test_each_init_bumps_the_epoch_and_persists_it() -> None:
    h = Harness()
    epochs = [h.init_fencing("task-0").value.epoch for _ in range(3)]
    assert epochs == [0, 1, 2]
    assert h.init_fencing("task-1").value.epoch == 0
    assert [
        decode_fencing_value(v).epoch for k, v in h.store.fencing_log if v and k == b"task-0"
    ] == [
        0,
        1,
        2,
    ]
    assert h.coordinator.fencing_epoch("task-0") == 2


def test_the_check_names_the_key_and_the_zxid_that_wrote_the_epoch() -> None:
    h = Harness()
    h.init_fencing("task-0")
    zxid_of_epoch = h.store.zxid
    h.init_fencing("other")
    check = h.coordinator.fencing_check("task-0", 0)
    assert (check.log, check.key, check.zxid) == (FENCING_LOG, b"task-0", zxid_of_epoch)
    assert check.expected_value == encode_record(FencingRecord(fenced_id="task-0", epoch=0))
    assert check == fencing_check("task-0", 0, zxid_of_epoch)


def test_an_older_epoch_is_fenced() -> None:
    h = Harness()
    h.init_fencing("task-0")
    h.init_fencing("task-0")
    with pytest.raises(Fenced, match="current epoch is 1"):
        h.coordinator.fencing_check("task-0", 0)
    with pytest.raises(Fenced, match="no fencing epoch"):
        h.coordinator.fencing_check("never-fenced", 0)


def test_racing_bumps_get_distinct_epochs_before_either_is_stored() -> None:
    h = Harness(deferred=True)
    first = h.init_fencing("task-0")
    second = h.init_fencing("task-0")
    assert not first.done
    h.store.complete_all()
    assert (first.value.epoch, second.value.epoch) == (0, 1)
    assert h.coordinator.fencing_check("task-0", 1).zxid == h.store.zxid


def test_a_failed_write_is_reported_and_leaves_the_current_epoch() -> None:
    h = Harness(deferred=True)
    h.init_fencing("task-0")
    h.store.complete_all()
    failed = h.init_fencing("task-0")
    h.store.complete_next(ErrorCode.NOT_LEADER)
    assert failed.error == ErrorCode.NOT_COORDINATOR and failed.value.epoch == -1
    assert h.coordinator.fencing_epoch("task-0") == 0
    # the failed epoch is never handed out again: it may have reached the log
    retry = h.init_fencing("task-0")
    h.store.complete_all()
    assert retry.value.epoch == 2


def test_an_empty_fenced_id_is_refused() -> None:
    assert Harness().init_fencing("").error == ErrorCode.INVALID_REQUEST


def test_loaded_epochs_continue_and_keep_their_zxid() -> None:
    coordinator = GroupCoordinator(FakeStore(), random=Random(0))
    coordinator.begin_loading(0)
    coordinator.load_fencing("task-0", 4, 0x5_0000_0007)
    coordinator.finish_loading(0)
    assert coordinator.fencing_check("task-0", 4).zxid == 0x5_0000_0007
    replies: list[int] = []
    coordinator.init_fencing(
        InitFencingRequest(fenced_id="task-0"), 0, lambda r: replies.append(r.epoch)
    )
    assert replies == [5]


def test_checks_need_an_active_coordinator_and_epochs_do_not_survive_unloading() -> None:
    h = Harness()
    h.init_fencing("task-0")
    h.coordinator.unload_all()
    with pytest.raises(NotCoordinator):
        h.coordinator.fencing_check("task-0", 0)
    assert h.coordinator.fencing_epoch("task-0") is None
