"""The REST API's security settings: credentials files, roles and TLS config errors."""

from __future__ import annotations

import base64
import ssl
import tempfile
from pathlib import Path

import pytest

from herder.errors import ConfigError
from herder.runtime.basic_auth import Credentials, Users, authorization_header
from herder.runtime.tls import RestTls, listener_scheme
from herder.runtime.worker_config import WorkerConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials_file_in_jettys_format() -> None:
    users = Users.parse(
        "# comment\n\nalice: secret,admin\nbob=pw:with:colons, read\ncarol: pw\n", "users"
    )
    assert users.authenticate(_basic("alice", "secret")) == "alice"
    assert users.authenticate(_basic("bob", "pw:with:colons")) == "bob"
    assert users.authenticate(_basic("alice", "wrong")) is None
    assert users.authenticate(_basic("nobody", "secret")) is None
    assert users.authenticate("Bearer abc") is None
    assert users.authenticate("Basic !!!") is None
    assert users.authenticate(None) is None
    assert users.may("alice", "DELETE")
    assert users.may("bob", "GET") and users.may("bob", "HEAD")
    assert not users.may("bob", "POST")
    assert not users.may("carol", "GET")


def test_credentials_file_errors_name_the_line() -> None:
    with pytest.raises(ConfigError, match="users line 2"):
        Users.parse("alice: pw,admin\njust-a-name\n", "users")
    with pytest.raises(ConfigError, match="plain text"):
        Users.parse("alice: MD5:164c88b302622e17050af52c89945d44,admin\n", "users")


def test_authorization_header_round_trips() -> None:
    users = Users.parse("w: p,admin\n", "users")
    assert users.authenticate(authorization_header(Credentials("w", "p"))) == "w"


def test_listener_scheme() -> None:
    assert listener_scheme("https://0.0.0.0:8443") == "https"
    assert listener_scheme("HTTP://h:1") == "http"
    with pytest.raises(ConfigError, match="http or https"):
        listener_scheme("ftp://h:1")


def test_tls_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ssl.keystore.location"):
        RestTls.from_properties({})
    with pytest.raises(ConfigError, match="PEM"):
        RestTls.from_properties({"ssl.keystore.type": "JKS", "ssl.keystore.location": "x"})
    with pytest.raises(ConfigError, match=r"ssl.truststore.location"):
        RestTls.from_properties(
            {"ssl.keystore.location": "x", "ssl.client.authentication": "required"}
        )
    missing = tmp_path / "missing.pem"
    # listeners.https.ssl.* wins over ssl.*
    with pytest.raises(ConfigError, match=str(missing)):
        RestTls.from_properties(
            {
                "ssl.keystore.location": "elsewhere",
                "listeners.https.ssl.keystore.location": str(missing),
            }
        )


def test_basic_auth_needs_a_credentials_file_and_internal_credentials(tmp_path: Path) -> None:
    base = {"group.id": "g", "rest.extension.classes": BASIC_AUTH}
    with pytest.raises(ConfigError, match=r"rest.basic.auth.credentials.file"):
        WorkerConfig.from_properties(base)
    users = tmp_path / "users"
    users.write_text("w: p,admin\n")
    with_file = base | {"rest.basic.auth.credentials.file": str(users)}
    with pytest.raises(ConfigError, match=r"rest.basic.auth.internal.user"):
        WorkerConfig.from_properties(with_file)
    config = WorkerConfig.from_properties(
        with_file | {"rest.basic.auth.internal.user": "w", "rest.basic.auth.internal.password": "p"}
    )
    assert config.users is not None and config.internal_credentials == Credentials("w", "p")
    with pytest.raises(ConfigError, match="supports only"):
        WorkerConfig.from_properties({"group.id": "g", "rest.extension.classes": "com.Other"})
    assert WorkerConfig.from_properties({"group.id": "g"}).advertised_url(1).startswith("http:")


def test_inline_pem_keystore_and_requested_client_certificates(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from tests.fixtures.pki import authority, issue

    ca = authority(tmp_path, "ca")
    pem = issue(ca, tmp_path, "worker").read_text()
    split = pem.index("-----BEGIN PRIVATE KEY-----")
    # the inline key goes through a temporary file, removed at once
    temporary = Path(tempfile.gettempdir())
    before = set(temporary.glob("herder-keystore-*"))
    tls = RestTls.from_properties(
        {
            "listeners.https.ssl.keystore.certificate.chain": pem[:split],
            "listeners.https.ssl.keystore.key": pem[split:],
            "ssl.truststore.location": str(ca.path),
            "ssl.client.authentication": "requested",
        }
    )
    assert tls.server_context().verify_mode == ssl.CERT_OPTIONAL
    assert set(temporary.glob("herder-keystore-*")) == before

    encrypted = issue(ca, tmp_path, "locked", password=b"right")
    with pytest.raises(ConfigError, match=r"ssl.key.password"):
        RestTls.from_properties(
            {"ssl.keystore.location": str(encrypted), "ssl.key.password": "wrong"}
        )
    assert (
        RestTls.from_properties(
            {"ssl.keystore.location": str(encrypted), "ssl.key.password": "right"}
        ).client_authentication
        == "none"
    )
