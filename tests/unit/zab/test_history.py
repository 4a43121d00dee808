"""The in-memory log: the committed window and the uncommitted tail."""

from __future__ import annotations

import pytest

from herder.ensemble.zab import DivergedHistory
from herder.ensemble.zab.history import History
from herder.errors import ConfigError
from tests.unit.zab.harness import config, txns, z

pytestmark = pytest.mark.unit


def test_commit_hands_out_each_txn_once_and_keeps_only_the_last_n_committed() -> None:
    history = History(0, txns(*(z(1, i) for i in range(1, 11))), keep=3)
    assert [t.zxid for t in history.commit(z(1, 4))] == [z(1, i) for i in range(1, 5)]
    assert history.commit(z(1, 4)) == []
    assert [t.zxid for t in history.commit(z(1, 6))] == [z(1, 5), z(1, 6)]
    assert history.first == z(1, 4)  # (1,4)..(1,6) committed, the rest still pending
    assert len(history.uncommitted()) == 4


def test_truncation_never_reaches_committed_txns() -> None:
    history = History(0, txns(z(1, 1), z(1, 2), z(1, 3)), keep=10)
    history.commit(z(1, 1))
    history.truncate(z(1, 2))
    assert history.last == z(1, 2)
    with pytest.raises(DivergedHistory):
        history.truncate(0)


def test_appends_must_move_forward() -> None:
    history = History(z(1, 5), (), keep=10)
    assert history.last == z(1, 5)
    with pytest.raises(DivergedHistory):
        history.append(txns(z(1, 5))[0])


def test_a_config_names_the_setting_that_is_wrong() -> None:
    with pytest.raises(ConfigError, match="syncLimit"):
        config(sync_limit=0)
    with pytest.raises(ConfigError, match="participant"):
        config(0, observers=[1])
    assert config(5).quorum_size == 3
    assert config(4, observers=[5]).quorum_size == 3
