"""The ensemble's client RPCs: what every other part of herder asks an ensemble server.

Any server answers reads; writes go to the leader (forwarded by learners once the
ensemble is replicated). Errors travel in the response envelope as codes (see
:mod:`herder.errors`), so a client raises the same exception class the server did.
"""

from __future__ import annotations

from typing import Any

import msgspec

from herder.ensemble.state import LogInfo
from herder.ensemble.txn import Op, Record, TxnResult
from herder.wire.envelope import Api


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of the client messages: keyword fields, defaults left off the wire."""


class ConnectSessionRequest(_Msg):
    """Open a session, or (``session_id`` ≠ 0) resume one after a reconnect."""

    timeout_ms: int = 30_000
    session_id: int = 0
    client_name: str = ""


class ConnectSessionResponse(_Msg):
    session_id: int
    timeout_ms: int
    server_id: int
    #: the highest zxid this server has applied, so a client can ask others for ≥ it
    last_zxid: int = 0
    #: last sequence number the ensemble applied for a resumed session, 0 for a new one
    last_seq: int = 0


class PingSessionRequest(_Msg):
    session_id: int


class PingSessionResponse(_Msg):
    last_zxid: int = 0


class CloseSessionRequest(_Msg):
    session_id: int


class CloseSessionResponse(_Msg):
    zxid: int = 0


class TransactRequest(_Msg):
    """Apply ``ops`` atomically. ``(session_id, seq)`` makes a retry safe."""

    session_id: int
    seq: int
    ops: list[Op]


class TransactResponse(_Msg):
    result: TxnResult


class ListLogsRequest(_Msg):
    """Every log of the ensemble (no arguments)."""


class ListLogsResponse(_Msg):
    logs: list[LogInfo] = []


class DescribeLogRequest(_Msg):
    name: str


class DescribeLogResponse(_Msg):
    log: LogInfo


class ReadLogRequest(_Msg):
    """Records of ``log`` from ``from_offset``; with ``wait_ms`` a long poll.

    With ``min_zxid`` the server first waits (up to ``wait_ms``) until it has applied
    that zxid, so a reader never sees state older than something it already saw.
    """

    log: str
    from_offset: int = 0
    max_records: int = 1000
    max_bytes: int = 4 * 1024 * 1024
    wait_ms: int = 0
    min_zxid: int = 0


class ReadLogResponse(_Msg):
    records: list[Record] = []
    #: the offset to ask for next (past the last record returned, or past compacted gaps)
    next_offset: int = 0
    end_offset: int = 0
    last_zxid: int = 0


class EndOffsetsRequest(_Msg):
    logs: list[str]
    min_zxid: int = 0
    wait_ms: int = 0


class EndOffsetsResponse(_Msg):
    end_offsets: dict[str, int] = {}
    last_zxid: int = 0


class SyncRequest(_Msg):
    """Make this server catch up with the leader's commit point before answering."""


class SyncResponse(_Msg):
    zxid: int = 0


class PeerInfo(_Msg):
    server_id: int
    role: str
    client_address: str


class StatusRequest(_Msg):
    """The answering server's own status (no arguments)."""


class StatusResponse(_Msg):
    server_id: int
    role: str
    epoch: int
    last_zxid: int
    committed_zxid: int
    sessions: int
    logs: int
    outstanding_requests: int
    client_address: str = ""
    peers: list[PeerInfo] = []
    fsyncs: int = 0
    snapshots: int = 0
    learners: list[int] = []
    #: the leader this server follows or is; -1 when none (standalone: itself)
    leader: int = -1
    #: Zab's phase: ELECTION, DISCOVERY, SYNCHRONIZATION or BROADCAST ("" standalone)
    phase: str = ""
    accepted_epoch: int = 0
    current_epoch: int = 0
    #: how this server last synchronised with a leader: DIFF, TRUNC or SNAP
    last_sync: str = ""
    #: how many syncs of each kind this server received since it started
    syncs: dict[str, int] = {}


CONNECT_SESSION = Api(100, "ConnectSession", ConnectSessionRequest, ConnectSessionResponse)
PING_SESSION = Api(101, "PingSession", PingSessionRequest, PingSessionResponse)
CLOSE_SESSION = Api(102, "CloseSession", CloseSessionRequest, CloseSessionResponse)
TRANSACT = Api(110, "Transact", TransactRequest, TransactResponse, writes=True)
LIST_LOGS = Api(111, "ListLogs", ListLogsRequest, ListLogsResponse)
DESCRIBE_LOG = Api(112, "DescribeLog", DescribeLogRequest, DescribeLogResponse)
READ_LOG = Api(113, "ReadLog", ReadLogRequest, ReadLogResponse)
END_OFFSETS = Api(114, "EndOffsets", EndOffsetsRequest, EndOffsetsResponse)
SYNC = Api(115, "Sync", SyncRequest, SyncResponse)
STATUS = Api(116, "Status", StatusRequest, StatusResponse)

CLIENT_APIS: list[Api[Any, Any]] = [
    CONNECT_SESSION,
    PING_SESSION,
    CLOSE_SESSION,
    TRANSACT,
    LIST_LOGS,
    DESCRIBE_LOG,
    READ_LOG,
    END_OFFSETS,
    SYNC,
    STATUS,
]
