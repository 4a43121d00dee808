"""Refused REST clients: which refusals are logged, and what the line says."""

from __future__ import annotations

import base64
import logging
import ssl

import pytest

from herder.runtime.basic_auth import Users, _wrong
from herder.runtime.refusals import RefusalLimiter, RefusalLog, peer_of
from herder.runtime.rest_listener import HANDSHAKE_TIMEOUT_S, handshake_refusal

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_first_refusal_of_a_host_and_kind_is_logged_then_counted_for_a_window() -> None:
    limiter = RefusalLimiter(window_s=60)
    assert limiter.admit("10.0.0.1", "credentials", now=0) == 0
    assert limiter.admit("10.0.0.1", "credentials", now=1) is None
    assert limiter.admit("10.0.0.1", "credentials", now=59.9) is None
    # another host, another kind: each its own line
    assert limiter.admit("10.0.0.2", "credentials", now=2) == 0
    assert limiter.admit("10.0.0.1", "tls-http_request", now=3) == 0
    # the window over, the next line says how many went unlogged
    assert limiter.admit("10.0.0.1", "credentials", now=60) == 2
    assert limiter.admit("10.0.0.1", "credentials", now=61) is None
    assert limiter.admit("10.0.0.1", "credentials", now=200) == 1


def test_the_limiter_forgets_the_oldest_peers_first() -> None:
    limiter = RefusalLimiter(window_s=60, max_peers=2)
    for host in ("a", "b", "c"):
        assert limiter.admit(host, "k", now=0) == 0
    assert limiter.admit("c", "k", now=1) is None
    assert limiter.admit("a", "k", now=1) == 0  # forgotten, so logged again


def test_a_refusal_line_names_the_peer_and_what_went_unlogged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RefusalLog(RefusalLimiter(window_s=10), clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="herder.runtime.refusals")
    for _ in range(3):
        refusals.refuse(("127.0.0.1", 4000), "credentials", "refused: a wrong password")
    now[0] = 11
    refusals.refuse(("127.0.0.1", 4001), "credentials", "refused: a wrong password")
    refusals.refuse(("127.0.0.1", 4002), "anonymous", "refused: no credentials", logging.INFO)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "REST client 127.0.0.1:4000 refused: a wrong password"),
        (
            "WARNING",
            "REST client 127.0.0.1:4001 refused: a wrong password (2 more such refusals of "
            "127.0.0.1 were not logged)",
        ),
        ("INFO", "REST client 127.0.0.1:4002 refused: no credentials"),
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_peer_of_a_socket_address() -> None:
    assert peer_of(("127.0.0.1", 80)) == ("127.0.0.1", 80)
    assert peer_of(("::1", 80, 0, 0)) == ("::1", 80)
    assert peer_of(None) == ("?", 0)


def _ssl_error(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] ({reason.lower()})")
    error.reason = reason
    return error


def test_handshake_failures_say_what_the_client_did() -> None:
    assert handshake_refusal(_ssl_error("HTTP_REQUEST"))[1] == (
        "refused: it sent plain HTTP to this HTTPS listener; use https://"
    )
    kind, reason, level = handshake_refusal(_ssl_error("PEER_DID_NOT_RETURN_A_CERTIFICATE"))
    assert "no client certificate" in reason and level == logging.WARNING
    assert "alert 'unknown ca'" in handshake_refusal(_ssl_error("TLSV1_ALERT_UNKNOWN_CA"))[1]
    assert "no TLS handshake" in handshake_refusal(_ssl_error("WRONG_VERSION_NUMBER"))[1]
    assert "(NO_SHARED_CIPHER)" in handshake_refusal(_ssl_error("NO_SHARED_CIPHER"))[1]
    expired = ssl.SSLCertVerificationError(1, "certificate verify failed")
    expired.verify_code, expired.verify_message = 10, "certificate has expired"
    kind, reason, _ = handshake_refusal(expired)
    assert kind == "tls-certificate-10" and "(certificate has expired)" in reason
    timeout = ConnectionAbortedError("SSL handshake is taking longer than 30.0 seconds")
    assert f"within {HANDSHAKE_TIMEOUT_S:g} s" in handshake_refusal(timeout)[1]
    # a probe that connects and goes is no refusal worth a warning
    for closed in (ssl.SSLEOFError(8, "EOF"), ConnectionResetError()):
        assert handshake_refusal(closed)[2] == logging.DEBUG


def test_wrong_credentials_are_described_without_a_password() -> None:
    users = Users.parse("admin: admin-pw,admin\n", "users")

    def basic(token: str) -> str:
        return "Basic " + base64.b64encode(token.encode()).decode()

    assert _wrong(basic("admin:nope"), users) == "a wrong password for user admin"
    # an unknown name may be a password typed in the user field: never shown
    assert _wrong(basic("admin-pw:admin"), users) == "an unknown user"
    assert _wrong("Bearer abc", users) == "credentials that are not HTTP Basic"
    assert _wrong("Basic !!!", users) == "undecodable HTTP Basic credentials"
