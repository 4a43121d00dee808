"""Signed internal requests (KIP-507): session keys, signatures, and the leader's rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.errors import ConfigError
from herder.runtime.core import effects as fx
from herder.runtime.core.config_state import ConfigState
from herder.runtime.core.herder import HerderCore
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectProtocol
from herder.runtime.core.session_key import (
    SESSION_KEY_RECORD,
    SIGNATURE_ALGORITHM_HEADER,
    SIGNATURE_HEADER,
    InternalRequestRefused,
    KeyPolicy,
    SessionKey,
    check_signature,
    decode_session_key,
    session_key_record,
    sign,
    signature_headers,
)
from herder.runtime.core.status import StatusView
from herder.runtime.worker_config import WorkerConfig
from tests.unit.runtime.test_herder_core import ME, Log, assignment

pytestmark = pytest.mark.unit

KEY = SessionKey(b"k" * 32, "HmacSHA256", 1_000)
BODY = b'[{"task":"0"}]'


def test_a_signature_is_connects_base64_hmac_of_the_body() -> None:
    expected = base64.b64encode(hmac.new(KEY.key, BODY, hashlib.sha256).digest()).decode()
    assert sign(KEY.key, "HmacSHA256", BODY) == expected
    headers = signature_headers(KEY, "HmacSHA256", BODY)
    assert headers == {SIGNATURE_HEADER: expected, SIGNATURE_ALGORITHM_HEADER: "HmacSHA256"}


@given(st.binary(max_size=200), st.sampled_from(["HmacSHA256", "HmacSHA512", "HmacSHA1"]))
def test_a_signed_body_passes_and_any_other_body_does_not(body: bytes, algorithm: str) -> None:
    headers = signature_headers(KEY, algorithm, body)
    check_signature(headers, body, KEY, [algorithm])
    # header names are case-blind, as HTTP's are
    check_signature({k.lower(): v for k, v in headers.items()}, body, KEY, [algorithm])
    with pytest.raises(InternalRequestRefused) as refused:
        check_signature(headers, body + b"x", KEY, [algorithm])
    assert refused.value.http_status == 403


@pytest.mark.parametrize(
    ("headers", "key", "status", "words"),
    [
        ({}, KEY, 400, "Internal request missing required signature"),
        ({SIGNATURE_HEADER: "abc="}, KEY, 400, "missing required signature"),
        (
            {SIGNATURE_HEADER: "!!!", SIGNATURE_ALGORITHM_HEADER: "HmacSHA256"},
            KEY,
            400,
            "",
        ),
        (
            signature_headers(KEY, "HmacSHA512", BODY),
            KEY,
            400,
            "does not support the 'HmacSHA512' key signing algorithm",
        ),
        (
            signature_headers(KEY, "HmacSHA256", BODY),
            None,
            503,
            "has not been able to read a session key",
        ),
        (
            signature_headers(SessionKey(b"o" * 32, "HmacSHA256", 1), "HmacSHA256", BODY),
            KEY,
            403,
            "Internal request contained invalid signature.",
        ),
    ],
)
def test_refusals_have_connects_statuses_and_words(
    headers: dict[str, str], key: SessionKey | None, status: int, words: str
) -> None:
    with pytest.raises(InternalRequestRefused) as refused:
        check_signature(headers, BODY, key, ["HmacSHA256"])
    assert refused.value.http_status == status
    assert words in str(refused.value)


def test_the_record_round_trips_in_connects_shape_and_never_shows_the_key() -> None:
    name, value = session_key_record(KEY)
    assert name == SESSION_KEY_RECORD == "session-key"
    raw = json.loads(value)
    assert raw == {
        "key": base64.b64encode(KEY.key).decode(),
        "algorithm": "HmacSHA256",
        "creation-timestamp": 1_000,
    }
    assert decode_session_key(value) == KEY
    assert "kkkk" not in repr(KEY) and base64.b64encode(KEY.key).decode() not in repr(KEY)


def test_the_config_log_keeps_the_latest_key_and_skips_a_malformed_one() -> None:
    state = ConfigState()
    state.apply(0, *session_key_record(KEY))
    newer = SessionKey(b"n" * 32, "HmacSHA256", 2_000)
    state.apply(1, *session_key_record(newer))
    state.apply(2, SESSION_KEY_RECORD, b'{"key": "not base64!", "algorithm": "x"}')
    assert state.snapshot().session_key == newer
    assert state.snapshot().connectors == frozenset()


def test_the_policy_rotates_an_expired_key_or_one_of_another_kind() -> None:
    policy = KeyPolicy(ttl_ms=10_000)
    assert policy.needs_new_key(None, 0)
    assert not policy.needs_new_key(KEY, 10_999)
    assert policy.needs_new_key(KEY, 11_000)
    assert KeyPolicy(key_algorithm="HmacSHA512").needs_new_key(KEY, 1_000)
    assert KeyPolicy(key_size_bits=128).needs_new_key(KEY, 1_000)
    never = KeyPolicy(ttl_ms=0)
    assert never.expires_ms(KEY) is None and not never.needs_new_key(KEY, 10**12)


def test_worker_config_takes_connects_settings_and_refuses_what_cannot_work() -> None:
    base = {"group.id": "g", "bootstrap.servers": "127.0.0.1:1"}
    config = WorkerConfig.from_properties(base)
    assert config.connect_protocol == "sessioned"
    assert config.key_policy == KeyPolicy()
    custom = WorkerConfig.from_properties(
        base
        | {
            "inter.worker.key.ttl.ms": "60000",
            "inter.worker.key.generation.algorithm": "HmacSHA512",
            "inter.worker.key.size": "256",
            "inter.worker.signature.algorithm": "HmacSHA512",
            "inter.worker.verification.algorithms": "HmacSHA256,HmacSHA512",
        }
    )
    assert custom.key_policy == KeyPolicy(
        key_algorithm="HmacSHA512",
        key_size_bits=256,
        ttl_ms=60_000,
        signature_algorithm="HmacSHA512",
        verification_algorithms=("HmacSHA256", "HmacSHA512"),
    )
    assert custom.key_policy.key_bytes == 32
    for bad, words in [
        ({"inter.worker.signature.algorithm": "HmacSHA512"}, "must be present"),
        ({"inter.worker.key.generation.algorithm": "AES"}, "HmacSHA256"),
        ({"inter.worker.verification.algorithms": "MD5"}, "HmacSHA256"),
        ({"inter.worker.key.size": "12"}, "multiple of 8"),
        ({"connect.protocol": "roundrobin"}, "sessioned"),
    ]:
        with pytest.raises(ConfigError, match=words):
            WorkerConfig.from_properties(base | bad)


# -- the leader distributes keys ------------------------------------------------------------


def leader(log: Log, protocol: str = "sessioned", ttl_ms: int = 60_000) -> HerderCore:
    core = HerderCore(
        "me",
        ME,
        statuses=StatusView(),
        unsync_backoff_ms=500,
        protocol=ConnectProtocol(protocol),
        key_policy=KeyPolicy(ttl_ms=ttl_ms),
    )
    core.configs_read(log.state.snapshot())
    gen = Generation(1, "me", "me", protocol, ("me",))
    core.assigned(gen, assignment(log, connectors=(), tasks=()))
    core.ready()
    core.leader_epoch_taken(gen, 3)
    core.ready()
    return core


def key_writes(core: HerderCore) -> list[fx.DistributeSessionKey]:
    return [e for e in core.ready() if isinstance(e, fx.DistributeSessionKey)]


def test_a_sessioned_leader_distributes_a_key_once_until_it_reads_it_back() -> None:
    log = Log()
    core = leader(log)
    core.tick(0, wall_ms=50_000)
    (write,) = key_writes(core)
    assert write.created_ms == 50_000
    core.session_key_written(True, 10)
    core.tick(20, wall_ms=50_020)
    assert key_writes(core) == []  # written, not yet read back: no second key
    log.write(session_key_record(SessionKey(b"k" * 32, "HmacSHA256", write.created_ms)))
    core.configs_read(log.state.snapshot())
    core.tick(30, wall_ms=50_030)
    assert key_writes(core) == []
    # the next one falls due when the key expires, in the monotonic clock's terms
    assert core.next_due_ms() == 60_000
    core.tick(60_000, wall_ms=110_000)
    (rotation,) = key_writes(core)
    assert rotation.created_ms == 110_000


def test_a_failed_key_write_is_tried_again_a_second_later() -> None:
    core = leader(Log())
    core.tick(0, wall_ms=0)
    assert len(key_writes(core)) == 1
    core.session_key_written(False, 100)
    core.tick(500, wall_ms=500)
    assert key_writes(core) == []
    assert core.next_due_ms() == 1_100
    core.tick(1_100, wall_ms=1_100)
    assert len(key_writes(core)) == 1


@pytest.mark.parametrize("protocol", ["eager", "compatible"])
def test_no_keys_and_no_checks_under_the_other_protocols(protocol: str) -> None:
    core = leader(Log(), protocol)
    core.tick(0, wall_ms=0)
    assert key_writes(core) == []
    assert not core.signs_requests
    core.check_internal_request({}, BODY)  # Connect's unsigned behaviour


def test_a_follower_checks_signatures_with_the_key_it_read() -> None:
    log = Log()
    core = HerderCore(
        "me", ME, statuses=StatusView(), unsync_backoff_ms=500, protocol=ConnectProtocol.SESSIONED
    )
    # before it has joined, a sessioned worker already refuses what is unsigned
    with pytest.raises(InternalRequestRefused):
        core.check_internal_request({}, BODY)
    log.write(session_key_record(KEY))
    core.configs_read(log.state.snapshot())
    core.assigned(Generation(1, "me", "other", "sessioned", ()), assignment(log, tasks=()))
    core.check_internal_request(signature_headers(KEY, "HmacSHA256", BODY), BODY)
    with pytest.raises(InternalRequestRefused):
        core.check_internal_request({}, BODY)
    # a group that fell back to compatible (an older worker joined) stops checking
    core.assigned(Generation(2, "me", "other", "compatible", ()), assignment(log, tasks=()))
    core.check_internal_request({}, BODY)


def test_a_retry_made_needless_by_another_key_is_not_due_again() -> None:
    log = Log()
    core = leader(log)
    core.tick(0, wall_ms=0)
    assert len(key_writes(core)) == 1
    core.session_key_written(False, 0)
    # meanwhile a key arrives (another leader's): the retry is due, then needless
    log.write(session_key_record(SessionKey(b"k" * 32, "HmacSHA256", 0)))
    core.configs_read(log.state.snapshot())
    core.tick(1_000, wall_ms=1_000)
    assert key_writes(core) == []
    # what is due next is the key's expiry, not the retry's moment, now past
    assert core.next_due_ms() == 60_000
