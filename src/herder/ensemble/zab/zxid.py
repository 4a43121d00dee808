"""Zxids: a transaction's place in the replicated history.

A zxid is ``epoch << 32 | counter``: the epoch of the leader that proposed it and that
leader's running count. Comparing two zxids as integers therefore orders them first by
epoch, then by position within the epoch, which is the order Zab commits them in.
"""

from __future__ import annotations

from typing import TypeAlias

Zxid: TypeAlias = int
Epoch: TypeAlias = int

COUNTER_BITS = 32
COUNTER_MASK = (1 << COUNTER_BITS) - 1

#: "no zxid at all": a vote for nobody (observers, servers that must be re-synced)
NO_ZXID: Zxid = -1


def make_zxid(epoch: Epoch, counter: int) -> Zxid:
    return (epoch << COUNTER_BITS) | counter


def epoch_of(zxid: Zxid) -> Epoch:
    return zxid >> COUNTER_BITS


def counter_of(zxid: Zxid) -> int:
    return zxid & COUNTER_MASK


def is_epoch_start(zxid: Zxid) -> bool:
    """Whether ``zxid`` is the first zxid of an epoch, ``epoch << 32`` (no txn has it)."""
    return counter_of(zxid) == 0


def hex_zxid(zxid: Zxid) -> str:
    """The form ZooKeeper's logs use, so the two are easy to compare side by side."""
    return f"0x{zxid:x}" if zxid >= 0 else str(zxid)
