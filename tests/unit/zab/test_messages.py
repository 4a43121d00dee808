"""Every message survives msgpack unchanged, so the network shell can send it as is."""

from __future__ import annotations

import msgspec
import pytest

from herder.ensemble.zab import ServerState, Txn, decode, encode
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    Committed,
    Diff,
    FollowerInfo,
    Inform,
    LeaderInfo,
    Message,
    NewLeader,
    Notification,
    ObserverInfo,
    Ping,
    Proposal,
    Request,
    Snap,
    Trunc,
    UpToDate,
)

pytestmark = pytest.mark.unit

T = Txn(0x1_0000_0001, b"payload")
ALL: list[Message] = [
    Notification(leader=3, zxid=7, peer_epoch=1, election_epoch=4, state=ServerState.LEADING),
    Notification(
        leader=-1, zxid=-1, peer_epoch=-1, election_epoch=1, state=ServerState.LOOKING, voter=False
    ),
    FollowerInfo(session=1, seq=0, accepted_epoch=3),
    ObserverInfo(session=1, seq=0, accepted_epoch=3, needs_snap=True),
    LeaderInfo(session=1, seq=0, epoch=4),
    AckEpoch(session=1, seq=1, current_epoch=-1, last_zxid=9, needs_snap=False),
    Diff(session=1, seq=1, zxid=9),
    Trunc(session=1, seq=1, zxid=9),
    Snap(session=1, seq=1, zxid=9, data=b"\x00state"),
    Proposal(session=1, seq=2, txn=T),
    Commit(session=1, seq=3, zxid=T.zxid),
    Committed(session=1, seq=3, txns=[T, Txn(0x1_0000_0002, b"")]),
    NewLeader(session=1, seq=4, zxid=4 << 32),
    Ack(session=1, seq=2, zxid=4 << 32),
    UpToDate(session=1, seq=5),
    Inform(session=1, seq=6, txn=T),
    Ping(session=1, seq=7, zxid=T.zxid, touches=[b"a", b"b"]),
    Request(session=1, seq=3, payload=b"write"),
]


@pytest.mark.parametrize("message", ALL, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Message) -> None:
    assert decode(encode(message)) == message


def test_a_frame_of_another_kind_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode(msgspec.msgpack.encode({"type": "no-such-packet"}))
