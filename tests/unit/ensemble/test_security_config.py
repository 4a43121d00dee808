"""The ensemble's security settings, the access policy and the client settings, checked
without any server: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from herder.config.definition import InvalidConfiguration
from herder.coordinator import apis as coordinator_apis
from herder.ensemble import apis
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.security import client_security
from herder.errors import AuthenticationFailed, ConfigError, NotAuthorized
from herder.runtime.worker_config import WorkerConfig
from herder.wire.auth import (
    READ,
    WRITE,
    AccessPolicy,
    Principal,
    SaslAuthenticateRequest,
    Users,
    plain_auth_bytes,
)
from tests.fixtures.pki import Pki

pytestmark = pytest.mark.unit


def config(tmp_path: Path, **props: Any) -> EnsembleConfig:
    return EnsembleConfig.from_properties(
        {"dataDir": str(tmp_path), **{k: str(v) for k, v in props.items()}}
    )


def tls_props(pki: Pki, **more: Any) -> dict[str, Any]:
    return {
        "secureClientPort": 2291,
        "ssl.keyStore.location": pki.issue("server"),
        "ssl.trustStore.location": pki.ca.path,
        **more,
    }


def test_a_secure_port_alone_serves_no_plaintext(tmp_path: Path, pki: Pki) -> None:
    alone = config(tmp_path, **tls_props(pki))
    assert not alone.plaintext_client
    assert alone.security.secure_client_port == 2291
    context = alone.security.client_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED  # ZooKeeper's need
    both = config(tmp_path, clientPort=2191, **tls_props(pki, **{"ssl.clientAuth": "want"}))
    assert both.plaintext_client and both.client_port == 2191
    assert both.security.client_context().verify_mode == ssl.CERT_OPTIONAL  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="portUnification"):
        config(tmp_path, clientPort=2291, **tls_props(pki))
    assert config(
        tmp_path, **tls_props(pki, **{"client.portUnification": "true"})
    ).security.port_unification
    assert config(tmp_path).security.client_context() is None


def test_a_server_line_with_the_secure_port_is_not_a_plaintext_port(
    tmp_path: Path, pki: Pki
) -> None:
    lines = {
        f"server.{i}": f"127.0.0.1:{3000 + i}:{4000 + i};127.0.0.1:{5000 + i}" for i in (1, 2, 3)
    }
    secure = config(tmp_path, **{"server.id": 1, **lines}, **tls_props(pki, secureClientPort=5001))
    assert not secure.plaintext_client
    other = config(tmp_path, **{"server.id": 1, **lines}, **tls_props(pki, secureClientPort=6001))
    assert other.plaintext_client and other.client_port == 5001


@pytest.mark.parametrize(
    ("props", "says"),
    [
        ({"secureClientPort": 1}, "ssl.keyStore.location"),
        ({"sslQuorum": "true"}, "ssl.quorum.keyStore.location"),
        ({"ssl.keyStore.type": "JKS"}, "PEM files only"),
        ({"ssl.clientAuth": "maybe"}, "none, want, need"),
        ({"enforce.auth.enabled": "true"}, "sasl.users.file"),
        ({"enforce.auth.schemes": "kerberos"}, "sasl and x509"),
        ({"enforce.auth.schemes": "x509"}, "client certificates"),
        ({"anonymous.access": "all"}, "none, read, write"),
        ({"quorum.auth.enableSasl": "true"}, "not supported"),
        (
            {"secureClientPort": 1, "ssl.keyStore.location": "/none.pem", "ssl.clientAuth": "none"},
            "cannot load",
        ),
    ],
)
def test_refused_settings_name_the_key(tmp_path: Path, props: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        config(tmp_path, **props)


def test_need_without_a_truststore_is_refused(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"ssl\.trustStore\.location"):
        config(tmp_path, secureClientPort=1, **{"ssl.keyStore.location": pki.issue("s")})
    relaxed = {"ssl.keyStore.location": pki.issue("s"), "ssl.clientAuth": "none"}
    assert config(tmp_path, secureClientPort=1, **relaxed).security.client_stores is not None


def test_enforcing_with_anonymous_writes_is_a_contradiction(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("a: b, write\n")
    with pytest.raises(ConfigError, match="contradicts"):
        config(
            tmp_path,
            **{
                "enforce.auth.enabled": "true",
                "sasl.users.file": users,
                "anonymous.access": "write",
            },
        )
    policy = config(
        tmp_path,
        **{"enforce.auth.enabled": "true", "sasl.users.file": users, "anonymous.access": "read"},
    ).security.access
    assert policy is not None and policy.anonymous().role == READ


def test_quorum_contexts_check_certificates_both_ways(tmp_path: Path, pki: Pki) -> None:
    cert = pki.issue("server1")
    cfg = config(
        tmp_path,
        sslQuorum="true",
        **{"ssl.quorum.keyStore.location": cert, "ssl.quorum.trustStore.location": pki.ca.path},
    )
    contexts = cfg.security.quorum_contexts()
    assert contexts is not None
    listening, connecting = contexts
    assert listening.verify_mode == ssl.CERT_REQUIRED
    assert connecting.verify_mode == ssl.CERT_REQUIRED and connecting.check_hostname


# -- the policy ------------------------------------------------------------------------------

USERS = Users.parse("# users\nw: pw, write\nr = pr, read\nn: pn\n", "users")


def policy(**kw: Any) -> AccessPolicy:
    return AccessPolicy(
        **{
            "enforce": True,
            "schemes": frozenset({"sasl", "x509"}),
            "users": USERS,
            "anonymous_access": "none",
            **kw,
        }
    )


def test_roles_decide_what_a_principal_may_do() -> None:
    p = policy(x509_writers=frozenset({"worker-1"}))
    writer = p.authenticate(SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("w", "pw")))
    reader = p.authenticate(SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("r", "pr")))
    roleless = p.authenticate(SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("n", "pn")))
    assert (writer.role, reader.role, roleless.role) == (WRITE, READ, None)
    for write_api in (apis.TRANSACT, coordinator_apis.JOIN_GROUP, coordinator_apis.INIT_FENCING):
        p.authorize(writer, write_api)
        with pytest.raises(NotAuthorized, match="may only read"):
            p.authorize(reader, write_api)
    for read_api in (apis.READ_LOG, apis.CONNECT_SESSION, coordinator_apis.OFFSET_FETCH):
        p.authorize(reader, read_api)
    with pytest.raises(NotAuthorized, match="no role"):
        p.authorize(roleless, apis.READ_LOG)
    with pytest.raises(AuthenticationFailed, match="requires authentication"):
        p.authorize(p.anonymous(), apis.READ_LOG)
    assert p.certificate("worker-1") == Principal("worker-1", "x509", WRITE)
    assert p.certificate("someone") == Principal("someone", "x509", READ)
    assert policy(schemes=frozenset({"sasl"})).certificate("worker-1") is None
    # not enforcing: anonymous clients write, as before security existed
    AccessPolicy().authorize(AccessPolicy().anonymous(), apis.TRANSACT)


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("w", "wrong")), "wrong user"),
        (SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("ghost", "pw")), "wrong user"),
        (SaslAuthenticateRequest(auth_bytes=b"no separators"), "malformed"),
        (SaslAuthenticateRequest(auth_bytes=b"\0\xff\0\xfe"), "malformed"),
        (SaslAuthenticateRequest(mechanism="SCRAM-SHA-256"), "use PLAIN"),
    ],
)
def test_bad_authentication_is_refused(request_: SaslAuthenticateRequest, says: str) -> None:
    with pytest.raises(AuthenticationFailed, match=says):
        policy().authenticate(request_)
    with pytest.raises(AuthenticationFailed, match="authenticates no users"):
        AccessPolicy(users=None).authenticate(
            SaslAuthenticateRequest(auth_bytes=plain_auth_bytes("w", "pw"))
        )


def test_a_users_file_line_without_a_password_is_refused() -> None:
    with pytest.raises(ConfigError, match="line 2"):
        Users.parse("ok: pw, read\nbroken\n", "users")


# -- clients ---------------------------------------------------------------------------------


def test_client_security_follows_kafkas_protocols(pki: Pki) -> None:
    assert client_security("PLAINTEXT") is None
    tls = client_security("SSL", truststore=str(pki.ca.path))
    assert tls is not None and tls.ssl_context is not None and not tls.authenticates
    sasl = client_security("sasl_plaintext", username="w", password="pw")
    assert sasl is not None and sasl.ssl_context is None and sasl.user == "w"
    with pytest.raises(ConfigError, match=r"ensemble\.sasl\.username"):
        client_security("SASL_SSL", truststore=str(pki.ca.path))
    with pytest.raises(ConfigError, match="one of PLAINTEXT"):
        client_security("TLS")


def test_worker_ensemble_settings(pki: Pki) -> None:
    worker = WorkerConfig.from_properties(
        {
            "group.id": "g",
            "ensemble.security.protocol": "SASL_SSL",
            "ensemble.ssl.truststore.location": str(pki.ca.path),
            "ensemble.ssl.keystore.location": str(pki.worker),
            "ensemble.ssl.key.password": "keypass",
            "ensemble.sasl.username": "worker",
            "ensemble.sasl.password": "secret",
        }
    )
    security = worker.ensemble_security
    assert security is not None and security.user == "worker" and security.password == "secret"
    assert security.ssl_context is not None and "secret" not in repr(security)
    assert WorkerConfig.from_properties({"group.id": "g"}).ensemble_security is None
    with pytest.raises(ConfigError, match=r"ensemble\.ssl\.key\.password"):
        WorkerConfig.from_properties(
            {
                "group.id": "g",
                "ensemble.security.protocol": "SSL",
                "ensemble.ssl.keystore.location": str(pki.worker),
            }
        )
    with pytest.raises((ConfigError, InvalidConfiguration), match="PLAIN only"):
        WorkerConfig.from_properties({"group.id": "g", "ensemble.sasl.mechanism": "GSSAPI"})
