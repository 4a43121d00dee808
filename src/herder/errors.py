"""One exception tree for all of herder, each error with a stable code.

Codes travel on the wire as integers. Where Kafka has an error with the same meaning we
use Kafka's name *and* number, so people (and tools) that know Kafka read them at once;
herder's own errors are numbered from 1000.

Each class also says which HTTP status the REST API answers it with (``http_status``),
so the REST layer maps an error by reading it rather than by knowing every class, and
may say what the user can do about it (``advice``), which the CLI's and the REST API's
one line ends with (:func:`with_advice`).
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    CLUSTER_AUTHORIZATION_FAILED = 31  # the principal may not do this (a write)
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    SASL_AUTHENTICATION_FAILED = 58  # wrong or missing credentials
    NON_EMPTY_GROUP = 68
    INVALID_RECORD = 87  # a record failed conversion or a transform
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    FENCED = 90  # Kafka's PRODUCER_FENCED: a newer incarnation holds the epoch
    # herder's own
    CHECK_FAILED = 1000
    SESSION_EXPIRED = 1001
    UNKNOWN_SESSION = 1002
    UNKNOWN_LOG = 1003
    LOG_ALREADY_EXISTS = 1004
    NOT_LEADER = 1005
    CORRUPT_STORAGE = 1006
    STORAGE_LOCKED = 1007
    MALFORMED_FRAME = 1008
    FRAME_TOO_LARGE = 1009
    CONNECTION_CLOSED = 1010
    UNKNOWN_API = 1011
    NOT_SUPPORTED = 1012
    SERVER_STOPPING = 1013
    TOO_MANY_CONNECTIONS = 1014
    NOT_FOUND = 1015  # a connector, task or logger a request names does not exist
    ALREADY_EXISTS = 1016
    CONFIG_CHANGED = 1017  # a connector's config changed under a request that read it
    WRONG_WORKER = 1018  # the request belongs to another worker of the group
    UNKNOWN_PLUGIN = 1019
    FORBIDDEN = 1020  # the worker is configured not to allow the request
    TLS_REQUIRED = 1021  # a plaintext client on a port that takes TLS only


class HerderError(Exception):
    """Root of herder's errors. ``code`` is stable and goes over the wire."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR
    #: the REST API's status for it: a server's fault unless a subclass says otherwise
    http_status: int = 500
    #: what to do about it, where the class alone can say (messages may say more)
    advice: str = ""
    #: whether the same request may succeed if simply tried again later
    retriable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name)
        self.message = message or self.code.name

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # the first class declared for a code is the one a peer's code turns into
        _BY_CODE.setdefault(cls.code, cls)

    def __str__(self) -> str:
        return self.message


_BY_CODE: dict[ErrorCode, type[HerderError]] = {ErrorCode.UNKNOWN_SERVER_ERROR: HerderError}


class RetriableError(HerderError):
    """The same request may succeed later (after a rediscovery, a rebalance, a backoff)."""

    retriable = True
    http_status = 503


class ProtocolError(HerderError):
    """The peer broke the wire protocol (bad frame, unknown api, wrong version)."""

    code = ErrorCode.INVALID_REQUEST


class ConfigError(HerderError):
    """A configuration is invalid; the message names the key and why."""

    code = ErrorCode.INVALID_CONFIG
    http_status = 400


class CorruptMessage(ProtocolError):
    code = ErrorCode.CORRUPT_MESSAGE


class UnknownTopicOrPartition(HerderError):
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    http_status = 404
    advice = "`herder topics list` shows the topics there are"


class NotLeaderOrFollower(RetriableError):
    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class RequestTimedOut(RetriableError):
    code = ErrorCode.REQUEST_TIMED_OUT


class OffsetMetadataTooLarge(HerderError):
    code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class NetworkError(RetriableError):
    code = ErrorCode.NETWORK_EXCEPTION


class CoordinatorLoadInProgress(RetriableError):
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    advice = "the new group coordinator is loading its groups: try again shortly"


class CoordinatorNotAvailable(RetriableError):
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    advice = (
        "the group coordinator runs on the ensemble's leader: check with "
        "`herder ensemble status` that the ensemble runs and has one, then try again"
    )


class NotCoordinator(RetriableError):
    code = ErrorCode.NOT_COORDINATOR
    advice = "the group coordinator moved to another server: try again"


class IllegalGeneration(HerderError):
    code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocol(HerderError):
    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class InvalidGroupId(HerderError):
    code = ErrorCode.INVALID_GROUP_ID


class UnknownMemberId(HerderError):
    code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeout(HerderError):
    code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgress(HerderError):
    code = ErrorCode.REBALANCE_IN_PROGRESS
    http_status = 409
    advice = "try again once the rebalance is over"


class InvalidCommitOffsetSize(HerderError):
    code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


class UnsupportedVersion(ProtocolError):
    code = ErrorCode.UNSUPPORTED_VERSION


class TopicAlreadyExists(HerderError):
    code = ErrorCode.TOPIC_ALREADY_EXISTS
    http_status = 409


class InvalidPartitions(HerderError):
    code = ErrorCode.INVALID_PARTITIONS


class NonEmptyGroup(HerderError):
    code = ErrorCode.NON_EMPTY_GROUP
    http_status = 409
    advice = "stop the group's members first"


class GroupIdNotFound(HerderError):
    code = ErrorCode.GROUP_ID_NOT_FOUND
    http_status = 404
    advice = "`herder groups list` shows the groups there are"


class MemberIdRequired(HerderError):
    code = ErrorCode.MEMBER_ID_REQUIRED


class GroupMaxSizeReached(HerderError):
    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class FencedInstanceId(HerderError):
    """Another process joined with this member's ``group.instance.id`` and replaced it.

    Not retriable: two processes share one static identity, and the one told so must
    stop rather than fight over it (give each process its own instance id).
    """

    code = ErrorCode.FENCED_INSTANCE_ID


class Fenced(HerderError):
    code = ErrorCode.FENCED
    http_status = 409


class CheckFailed(HerderError):
    code = ErrorCode.CHECK_FAILED
    http_status = 409


class SessionExpired(HerderError):
    code = ErrorCode.SESSION_EXPIRED


class UnknownSession(HerderError):
    code = ErrorCode.UNKNOWN_SESSION


class UnknownLog(HerderError):
    code = ErrorCode.UNKNOWN_LOG
    http_status = 404
    advice = "`herder logs list` shows the logs there are"


class LogAlreadyExists(HerderError):
    code = ErrorCode.LOG_ALREADY_EXISTS
    http_status = 409


class NotLeader(RetriableError):
    code = ErrorCode.NOT_LEADER


class CorruptStorage(HerderError):
    code = ErrorCode.CORRUPT_STORAGE


class StorageLocked(HerderError):
    code = ErrorCode.STORAGE_LOCKED


class MalformedFrame(ProtocolError):
    code = ErrorCode.MALFORMED_FRAME


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class ConnectionClosed(RetriableError):
    code = ErrorCode.CONNECTION_CLOSED


class TooManyConnections(RetriableError):
    """A server refused a connection for its connection limit (``maxClientCnxns``)."""

    code = ErrorCode.TOO_MANY_CONNECTIONS


class UnknownApi(ProtocolError):
    code = ErrorCode.UNKNOWN_API


class NotSupported(HerderError):
    code = ErrorCode.NOT_SUPPORTED
    http_status = 400


class ServerStopping(RetriableError):
    code = ErrorCode.SERVER_STOPPING
    http_status = 503


class AuthenticationFailed(HerderError):
    """A server refused the credentials a client gave, or required some it did not."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED
    http_status = 401
    advice = (
        "give a user of the server's users file with --user/--password "
        "(ensemble.sasl.username/ensemble.sasl.password in a worker's config), or a client "
        "certificate the server trusts"
    )


class NotAuthorized(HerderError):
    """An authenticated principal asked for something its role does not allow."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    http_status = 403
    advice = "connect as a principal with the write role (the server's users file or x509.writers)"


class TlsRequired(HerderError):
    """A plaintext client reached a port that takes TLS only."""

    code = ErrorCode.TLS_REQUIRED
    advice = (
        "connect with TLS: --cacert (and --cert/--key if the server asks for a certificate), "
        "or ensemble.security.protocol=SSL in a worker's config"
    )


class TlsHandshakeFailed(HerderError):
    """A TLS handshake with a server failed: an untrusted certificate, or not a TLS port."""

    code = ErrorCode.NETWORK_EXCEPTION
    advice = (
        "pass --cacert with the CA that signed the server's certificate and --cert/--key if "
        "it requires one (ensemble.ssl.* in a worker's config), and connect to its TLS port"
    )


def with_advice(error: HerderError) -> str:
    """``error``'s message, ending with its class's advice unless it says it already."""
    message = str(error)
    if not error.advice or error.advice in message:
        return message
    return f"{message.rstrip('.')}; {error.advice}"


def error_from_code(code: int, message: str = "") -> HerderError:
    """The exception a peer meant by ``code`` (an unknown code stays a plain HerderError)."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return HerderError(message or f"error code {code}")
    return _BY_CODE.get(ec, HerderError)(message or ec.name)
