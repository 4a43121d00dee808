"""The ensemble's security, on real server processes: TLS on the client port, users with
read and write roles, certificate principals, and a quorum that only servers with a
trusted certificate can join.

Every refusal is checked three ways: the client gets the error class that names what to
do, the server logs it once with the peer's address and no traceback, and the server
keeps serving the clients that are allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from herder.ensemble.client import EnsembleClient, server_status
from herder.errors import (
    AuthenticationFailed,
    HerderError,
    NetworkError,
    NotAuthorized,
    TlsHandshakeFailed,
    TlsRequired,
)
from herder.wire.auth import ClientSecurity
from herder.wire.tls import PemStores
from tests.fixtures.pki import Pki
from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

USERS = "writer: write-secret, write\nreader: read-secret, read\nnobody: none-secret\n"


def secure_server(
    processes: Processes,
    tmp_path: Path,
    pki: Pki,
    *,
    name: str = "ens",
    plaintext_port: int | None = None,
    **props: object,
) -> ServerHandle:
    """A standalone server with a TLS client port (its ``port``) and auth enforced."""
    secure_port = free_port()
    data_dir = tmp_path / name
    data_dir.mkdir(parents=True, exist_ok=True)
    users = tmp_path / f"{name}-users.properties"
    users.write_text(USERS)
    config: dict[str, object] = {
        "dataDir": data_dir,
        "clientPortAddress": "127.0.0.1",
        "secureClientPort": secure_port,
        "ssl.keyStore.location": pki.issue(f"{name}-server"),
        "ssl.trustStore.location": pki.ca.path,
        "ssl.clientAuth": "want",
        "enforce.auth.enabled": "true",
        "enforce.auth.schemes": "sasl,x509",
        "sasl.users.file": users,
        "x509.writers": "client",
        "tickTime": 200,
        "preAllocSize": 1024,
        **props,
    }
    if plaintext_port is not None:
        config["clientPort"] = plaintext_port
    path = tmp_path / f"{name}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    return ServerHandle(processes, path, data_dir, secure_port).start()


def tls(pki: Pki, cert: Path | None = None, ca: Path | None = None) -> PemStores:
    return PemStores(
        keystore_location=str(cert) if cert else None,
        truststore_location=str(ca or pki.ca.path),
    )


def security(
    pki: Pki, user: str | None = None, password: str | None = None, cert: Path | None = None
) -> ClientSecurity:
    return ClientSecurity(tls(pki, cert).client_context(), user, password)


async def _write_and_read(bootstrap: str, sec: ClientSecurity | None, log: str) -> list[bytes]:
    async with EnsembleClient(bootstrap, security=sec, give_up_after=10) as client:
        await client.create_log(log, if_absent=True)
        await client.append(log, b"hello")
        reply = await client.read(log)
        return [r.value for r in reply.records if r.value is not None]


async def _refused(
    bootstrap: str, sec: ClientSecurity | None, give_up_after: float = 10
) -> HerderError:
    try:
        async with EnsembleClient(bootstrap, security=sec, give_up_after=give_up_after) as client:
            await client.append("t", b"not allowed")
    except HerderError as exc:
        return exc
    raise AssertionError(f"a write through {sec} was not refused")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HERDER, "logs", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _logged_once(log_text: str, pattern: str) -> None:
    lines = [line for line in log_text.splitlines() if re.search(pattern, line)]
    assert len(lines) == 1, (pattern, lines)
    assert re.search(r"from 127\.0\.0\.1:\d+", lines[0]), lines[0]


async def test_tls_client_port_users_roles_and_certificates(
    processes: Processes, tmp_path: Path, pki: Pki
) -> None:
    plain = free_port()
    server = secure_server(processes, tmp_path, pki, plaintext_port=plain)
    bootstrap = server.bootstrap
    assert server.proc is not None

    # a writer by password, and a certificate principal named in x509.writers
    assert await _write_and_read(bootstrap, security(pki, "writer", "write-secret"), "t") == [
        b"hello"
    ]
    by_cert = await _write_and_read(bootstrap, security(pki, cert=pki.client), "t")
    assert by_cert == [b"hello", b"hello"]

    # a reader reads, but may not write; neither may a user without a role
    async with EnsembleClient(
        bootstrap, security=security(pki, "reader", "read-secret"), give_up_after=10
    ) as client:
        assert len((await client.read("t")).records) == 2
        with pytest.raises(NotAuthorized, match="may only read"):
            await client.append("t", b"no")
        # refused, not dropped: the connection serves the reader's reads still
        assert (await client.end_offsets(["t"]))["t"] == 2
    assert isinstance(
        await _refused(bootstrap, security(pki, "nobody", "none-secret")), NotAuthorized
    )
    # a certificate principal not in x509.writers reads only
    reader_cert = pki.issue("some-reader")
    assert isinstance(await _refused(bootstrap, security(pki, cert=reader_cert)), NotAuthorized)

    # wrong password, no credentials at all, anonymous on the plaintext port
    wrong = await _refused(bootstrap, security(pki, "writer", "guess"))
    assert isinstance(wrong, AuthenticationFailed), wrong
    assert "wrong user or password" in str(wrong)
    anonymous = await _refused(bootstrap, security(pki))
    assert isinstance(anonymous, AuthenticationFailed) and "requires authentication" in str(
        anonymous
    )
    assert isinstance(await _refused(f"127.0.0.1:{plain}", None), AuthenticationFailed)

    # a plaintext client on the TLS port, TLS on the plaintext port
    plaintext = await _refused(bootstrap, ClientSecurity(None, "writer", "write-secret"))
    assert isinstance(plaintext, TlsRequired) and "TLS only" in str(plaintext)
    garbage = await _refused(f"127.0.0.1:{plain}", security(pki, "writer", "write-secret"))
    assert isinstance(garbage, TlsHandshakeFailed), garbage

    # certificates: unknown CA, expired, and a server certificate the client does not trust
    for cert in (pki.untrusted_client, pki.issue("expired-client", expired=True)):
        refused = await _refused(
            bootstrap, security(pki, "writer", "write-secret", cert=cert), give_up_after=2
        )
        assert isinstance(refused, NetworkError) and "refused our certificate" in str(refused)
    distrust = ClientSecurity(tls(pki, ca=pki.stranger.path).client_context(), "writer", "x")
    refused = await _refused(bootstrap, distrust)
    assert isinstance(refused, TlsHandshakeFailed) and "verification" in str(refused)

    # and the server serves everyone allowed, as before
    assert len(await _write_and_read(bootstrap, security(pki, "writer", "write-secret"), "t")) == 3
    st = await server_status(bootstrap, security=security(pki, "reader", "read-secret"))
    assert st.role == "standalone"

    log = server.proc.output()
    assert "Traceback" not in log
    _logged_once(log, r"refusing a request .*Transact refused: sasl principal reader")
    _logged_once(log, r"refusing authentication .*wrong user or password for user 'writer'")
    _logged_once(log, r"refusing connection .*plaintext client on a port that takes TLS only")
    _logged_once(log, r"refusing connection .*a TLS handshake on a plaintext port")
    _logged_once(log, r"refusing connection .*verification \(certificate has expired\)")
    _logged_once(log, r"refusing connection .*verification \(unable to get local issuer")
    _logged_once(log, r"refusing connection .*closed the connection during the TLS handshake")


def test_cli_with_credentials_and_one_line_refusals(
    processes: Processes, tmp_path: Path, pki: Pki
) -> None:
    server = secure_server(processes, tmp_path, pki)
    tls_args = ["--bootstrap", server.bootstrap, "--cacert", str(pki.ca.path)]
    writer = [*tls_args, "--user", "writer", "--password", "write-secret"]
    assert _cli("create", "events", *writer).returncode == 0
    appended = subprocess.run(
        [*HERDER, "logs", "append", "events", "--stdin", *writer],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert appended.returncode == 0, appended.stderr
    read = _cli("read", "events", *tls_args, "--user", "reader", "--password", "read-secret")
    assert read.returncode == 0, read.stderr
    assert [line for line in read.stdout.splitlines() if line][-1].count("two") == 1

    for args, says in (
        ([*tls_args, "--user", "reader", "--password", "read-secret"], "may only read"),
        ([*tls_args, "--user", "writer", "--password", "nope"], "wrong user or password"),
        (["--bootstrap", server.bootstrap, "--user", "writer", "--password", "x"], "TLS only"),
    ):
        refused = _cli("create", "other", *args)
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], refused.stderr
        assert lines[0].startswith("error: ")

    # the coordinator's commands refuse the same way, at once rather than after --timeout
    groups = subprocess.run(
        [*HERDER, "groups", "list", *tls_args, "--user", "writer", "--password", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert groups.returncode == 1 and "wrong user or password" in groups.stderr, groups.stderr
    assert len(groups.stderr.strip().splitlines()) == 1
    assert "no coordinator" not in groups.stderr  # not retried as if the coordinator moved

    # the same through the environment, as the REST options take theirs
    env_run = subprocess.run(
        [*HERDER, "ensemble", "status", "--bootstrap", server.bootstrap, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **__import__("os").environ,
            "HERDER_ENSEMBLE_CACERT": str(pki.ca.path),
            "HERDER_ENSEMBLE_USER": "reader",
            "HERDER_ENSEMBLE_PASSWORD": "read-secret",
        },
    )
    assert env_run.returncode == 0, env_run.stderr
    assert '"role": "standalone"' in env_run.stdout


# -- the quorum ------------------------------------------------------------------------------


def quorum_configs(
    processes: Processes, tmp_path: Path, pki: Pki, certs: dict[int, Path]
) -> dict[int, ServerHandle]:
    """Three servers with sslQuorum and TLS client ports (not started)."""
    ports = {sid: (free_port(), free_port(), free_port()) for sid in (1, 2, 3)}
    lines = {
        f"server.{sid}": f"127.0.0.1:{q}:{e};127.0.0.1:{c}" for sid, (q, e, c) in ports.items()
    }
    handles = {}
    for sid in (1, 2, 3):
        data_dir = tmp_path / f"server{sid}"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "dataDir": data_dir,
            "server.id": sid,
            "secureClientPort": ports[sid][2],
            "secureClientPortAddress": "127.0.0.1",
            "ssl.keyStore.location": pki.issue(f"server{sid}-client-port"),
            "ssl.trustStore.location": pki.ca.path,
            "sslQuorum": "true",
            "ssl.quorum.keyStore.location": certs[sid],
            "ssl.quorum.trustStore.location": pki.ca.path,
            "tickTime": 200,
            "preAllocSize": 1024,
            **lines,
        }
        path = tmp_path / f"server{sid}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        handles[sid] = ServerHandle(processes, path, data_dir, ports[sid][2])
    return handles


def test_a_server_without_a_trusted_certificate_cannot_join_the_quorum(
    processes: Processes, tmp_path: Path, pki: Pki
) -> None:
    good = {sid: pki.issue(f"server{sid}") for sid in (1, 2, 3)}
    impostor = pki.issue("server3-impostor", stranger=True)
    servers = quorum_configs(processes, tmp_path, pki, {**good, 3: impostor})
    for server in servers.values():
        server.start()
    client = ClientSecurity(
        tls(pki, cert=pki.client).client_context()
    )  # ssl.clientAuth=need (the default): a certificate, no user

    def roles() -> dict[int, str]:
        import asyncio

        async def ask() -> dict[int, str]:
            out = {}
            for sid, server in servers.items():
                try:
                    out[sid] = (await server_status(server.bootstrap, security=client)).role
                except HerderError:
                    out[sid] = "?"
            return out

        return asyncio.run(ask())

    # 1 and 2 make a quorum over TLS; 3 is refused on every link and stays looking
    wait_until(
        lambda: sorted(roles()[sid] for sid in (1, 2)) == ["follower", "leader"],
        timeout=60,
        what="servers 1 and 2 electing a leader over TLS",
    )
    for sid in (1, 2):
        proc = servers[sid].proc
        assert proc is not None
        wait_until(
            lambda proc=proc: re.search(
                r"refusing an? (election|quorum) link \(sslQuorum\) from 127\.0\.0\.1:\d+: its "
                r"certificate failed verification",
                proc.output(),
            ),
            timeout=30,
            what=f"server {sid} logging the impostor's refusal",
        )
    assert roles()[3] == "looking"
    impostor_proc = servers[3].proc
    assert impostor_proc is not None
    impostor_proc.stop()

    # the real server 3, with the ensemble's certificate, joins
    config = servers[3].config_path
    config.write_text(config.read_text().replace(str(impostor), str(good[3])))
    servers[3].start()
    wait_until(
        lambda: sorted(roles().values()) == ["follower", "follower", "leader"],
        timeout=60,
        what="server 3 joining with a trusted certificate",
    )
    for sid in (1, 2):
        proc = servers[sid].proc
        assert proc is not None
        assert "Traceback" not in proc.output()
