"""Signed internal requests (Connect's KIP-507): the session key and request signatures.

Under ``connect.protocol=sessioned`` the leader writes a random *session key* to the
config log, and writes a new one whenever the current one is older than
``inter.worker.key.ttl.ms``. Every worker reads it from there like any other config
record, so all of them hold the same key soon after it is written. A worker that sends
another an internal request (a connector's new task configs, handed to the leader) signs
the request's body with the key: an HMAC under ``inter.worker.signature.algorithm``,
base64 in the ``X-Connect-Authorization`` header, the algorithm's name in
``X-Connect-Request-Signature-Algorithm``. The receiver refuses what is not signed (400),
signed under an algorithm it does not accept (400), or signed with another key (403);
a worker that has no key yet answers 503. The messages are Connect's.

Algorithm names are Java's (``HmacSHA256``), so a worker config written for Connect
works unchanged. Under ``eager`` and ``compatible`` nothing is signed or checked, as in
Connect.

The config record (key ``session-key``) holds what Connect's does::

    {"key": "<base64>", "algorithm": "HmacSHA256", "creation-timestamp": 1700000000000}
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from herder.errors import ConfigError, ErrorCode, HerderError

__all__ = [
    "DEFAULT_ALGORITHM",
    "DEFAULT_KEY_TTL_MS",
    "SESSION_KEY_RECORD",
    "SIGNATURE_ALGORITHM_HEADER",
    "SIGNATURE_HEADER",
    "InternalRequestRefused",
    "KeyPolicy",
    "SessionKey",
    "check_algorithm",
    "check_signature",
    "decode_session_key",
    "session_key_record",
    "sign",
    "signature_headers",
]

SESSION_KEY_RECORD: Final = "session-key"
SIGNATURE_HEADER: Final = "X-Connect-Authorization"
SIGNATURE_ALGORITHM_HEADER: Final = "X-Connect-Request-Signature-Algorithm"
DEFAULT_ALGORITHM: Final = "HmacSHA256"
#: Connect's ``inter.worker.key.ttl.ms``: one hour
DEFAULT_KEY_TTL_MS: Final = 3_600_000

#: Java's Mac names → (hashlib's name, the key size in bytes Java's KeyGenerator picks)
_ALGORITHMS: Final[Mapping[str, tuple[str, int]]] = {
    "HmacSHA1": ("sha1", 64),
    "HmacSHA224": ("sha224", 28),
    "HmacSHA256": ("sha256", 32),
    "HmacSHA384": ("sha384", 48),
    "HmacSHA512": ("sha512", 64),
    "HmacSHA3-224": ("sha3_224", 28),
    "HmacSHA3-256": ("sha3_256", 32),
    "HmacSHA3-384": ("sha3_384", 48),
    "HmacSHA3-512": ("sha3_512", 64),
}


def _digest(algorithm: str) -> str:
    try:
        return _ALGORITHMS[algorithm][0]
    except KeyError:
        raise ConfigError(
            f"Unsupported signature algorithm {algorithm!r}; use one of {', '.join(_ALGORITHMS)}"
        ) from None


def check_algorithm(algorithm: str, setting: str) -> str:
    """``algorithm`` if it names an HMAC herder can compute; ConfigError naming
    ``setting`` otherwise."""
    if algorithm not in _ALGORITHMS:
        raise ConfigError(
            f"Invalid value {algorithm!r} for configuration {setting}: must be one of "
            f"{', '.join(_ALGORITHMS)} (Java's Mac algorithm names)"
        )
    return algorithm


@dataclass(frozen=True, slots=True)
class SessionKey:
    """The key the leader distributed, under the algorithm it was made for, and when."""

    key: bytes
    algorithm: str
    created_ms: int

    def __repr__(self) -> str:  # never the key itself, in a log or a traceback
        return f"SessionKey(algorithm={self.algorithm!r}, created_ms={self.created_ms})"


def session_key_record(key: SessionKey) -> tuple[str, bytes]:
    """The ``_configs`` record that distributes ``key``."""
    value = {
        "key": base64.b64encode(key.key).decode("ascii"),
        "algorithm": key.algorithm,
        "creation-timestamp": key.created_ms,
    }
    return SESSION_KEY_RECORD, json.dumps(value, separators=(",", ":")).encode()


def decode_session_key(value: bytes) -> SessionKey:
    """The key a ``session-key`` record holds; ValueError if it holds none."""
    raw = json.loads(value)
    if not isinstance(raw, dict):
        raise ValueError("a session-key record must be a JSON object")
    try:
        key = base64.b64decode(raw["key"], validate=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"a session-key record's key is not base64: {exc}") from None
    algorithm = raw["algorithm"]
    created = raw["creation-timestamp"]
    if not isinstance(algorithm, str) or not isinstance(created, int) or not key:
        raise ValueError("a session-key record needs a key, an algorithm and a timestamp")
    return SessionKey(key, algorithm, created)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """How the leader makes keys (``inter.worker.key.*``) and how workers sign and check."""

    #: ``inter.worker.key.generation.algorithm``
    key_algorithm: str = DEFAULT_ALGORITHM
    #: ``inter.worker.key.size`` in bits; None: the algorithm's own
    key_size_bits: int | None = None
    #: ``inter.worker.key.ttl.ms``; 0: a key, once written, is never rotated
    ttl_ms: int = DEFAULT_KEY_TTL_MS
    #: ``inter.worker.signature.algorithm``
    signature_algorithm: str = DEFAULT_ALGORITHM
    #: ``inter.worker.verification.algorithms``
    verification_algorithms: tuple[str, ...] = (DEFAULT_ALGORITHM,)

    @property
    def key_bytes(self) -> int:
        """How many random bytes a new key takes."""
        if self.key_size_bits is not None:
            return max(1, self.key_size_bits // 8)
        return _ALGORITHMS[self.key_algorithm][1]

    def expires_ms(self, key: SessionKey) -> int | None:
        """When ``key`` is due to be replaced, None if never."""
        return key.created_ms + self.ttl_ms if self.ttl_ms > 0 else None

    def needs_new_key(self, key: SessionKey | None, now_ms: int) -> bool:
        """Leader: whether to distribute a new key now — there is none yet, it has
        expired, or it was made under another algorithm or size than this worker's."""
        if key is None:
            return True
        expires = self.expires_ms(key)
        if expires is not None and expires <= now_ms:
            return True
        return key.algorithm != self.key_algorithm or len(key.key) != self.key_bytes


def sign(key: bytes, algorithm: str, body: bytes) -> str:
    """The base64 HMAC of ``body`` under ``key``, as ``X-Connect-Authorization`` carries it."""
    mac = hmac.new(key, body, _digest(algorithm))
    return base64.b64encode(mac.digest()).decode("ascii")


def signature_headers(key: SessionKey | None, algorithm: str, body: bytes) -> dict[str, str]:
    """The headers that sign ``body`` with ``key``; none without a key (as Connect,
    which signs only once it has read one)."""
    if key is None:
        return {}
    return {
        SIGNATURE_HEADER: sign(key.key, algorithm, body),
        SIGNATURE_ALGORITHM_HEADER: algorithm,
    }


class InternalRequestRefused(HerderError):
    """An internal request whose signature is missing, of the wrong kind, or wrong."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, message: str, http_status: int) -> None:
        super().__init__(message)
        self.http_status = http_status


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # HTTP header names are case-blind; a plain dict from a test is not
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def check_signature(
    headers: Mapping[str, str],
    body: bytes,
    key: SessionKey | None,
    accepted: Sequence[str],
) -> None:
    """Refuse an internal request that is not signed with ``key`` under one of the
    ``accepted`` algorithms, in Connect's words and with Connect's statuses."""
    algorithm = _header(headers, SIGNATURE_ALGORITHM_HEADER)
    encoded = _header(headers, SIGNATURE_HEADER)
    if algorithm is None or encoded is None:
        raise InternalRequestRefused("Internal request missing required signature", 400)
    if algorithm not in _ALGORITHMS:
        raise InternalRequestRefused(f"Algorithm {algorithm} not available", 400)
    try:
        signature = base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise InternalRequestRefused(str(exc), 400) from None
    if algorithm not in accepted:
        raise InternalRequestRefused(
            f"This worker does not support the '{algorithm}' key signing algorithm used by "
            f"other workers. This worker is currently configured to use: "
            f"[{', '.join(accepted)}]. Check that all workers' configuration files permit "
            "the same set of signature algorithms, and correct any misconfigured worker and "
            "restart it.",
            400,
        )
    if key is None:
        raise InternalRequestRefused(
            "This worker is still starting up and has not been able to read a session key "
            "from the config topic yet",
            503,
        )
    expected = hmac.new(key.key, body, _digest(algorithm)).digest()
    if not hmac.compare_digest(expected, signature):
        raise InternalRequestRefused("Internal request contained invalid signature.", 403)
