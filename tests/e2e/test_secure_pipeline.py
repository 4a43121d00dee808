"""TLS and authentication everywhere, end to end, on real processes.

Three ensemble servers with ``sslQuorum``, TLS-only client ports and authentication
enforced (users with roles, certificate principals); two workers that reach the ensemble
with ``ensemble.security.protocol=SASL_SSL`` and a client certificate, and serve REST
over HTTPS with HTTP Basic users; FileStreamSource → topic → FileStreamSink with lines
appended while it runs, and the ensemble leader killed once under it: the sink holds
every line exactly once. The CLI reads ``herder status`` and a connector's status with
credentials, and the ensemble with a ``read`` user; every way in without the right
credentials is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from herder.ensemble.client import EnsembleClient
from herder.errors import AuthenticationFailed, NotAuthorized
from herder.wire.auth import ClientSecurity
from herder.wire.tls import PemStores
from tests.e2e.test_pipeline import (
    HEARTBEAT_MS,
    SESSION_MS,
    TASK_SHUTDOWN_MS,
    Cluster,
    assert_exactly_once,
    count_lines,
    numbers_pipeline,
)
from tests.fixtures.pki import Pki
from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import Ensemble, ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ENSEMBLE_USERS = "worker: worker-secret, write\noperator: operator-secret, read\n"
REST_USERS = "admin: admin-secret, admin\nviewer: viewer-secret, read\n"


def secure_ensemble(processes: Processes, tmp_path: Path, pki: Pki) -> Ensemble:
    users = tmp_path / "ensemble-users.properties"
    users.write_text(ENSEMBLE_USERS)
    ports = {sid: (free_port(), free_port(), free_port()) for sid in (1, 2, 3)}
    lines = {
        f"server.{sid}": f"127.0.0.1:{q}:{e};127.0.0.1:{c}" for sid, (q, e, c) in ports.items()
    }
    servers = {}
    for sid in (1, 2, 3):
        data_dir = tmp_path / f"server{sid}"
        data_dir.mkdir()
        cert = pki.issue(f"ensemble-server{sid}")
        config = {
            "dataDir": data_dir,
            "server.id": sid,
            "secureClientPort": ports[sid][2],
            "secureClientPortAddress": "127.0.0.1",
            "ssl.keyStore.location": cert,
            "ssl.trustStore.location": pki.ca.path,
            "ssl.clientAuth": "need",
            "sslQuorum": "true",
            "ssl.quorum.keyStore.location": cert,
            "ssl.quorum.trustStore.location": pki.ca.path,
            "enforce.auth.enabled": "true",
            "enforce.auth.schemes": "sasl,x509",
            "sasl.users.file": users,
            "tickTime": 200,
            "preAllocSize": 1024,
            "maxSessionTimeout": 60_000,
            "group.min.session.timeout.ms": 1000,
            **lines,
        }
        path = tmp_path / f"server{sid}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        servers[sid] = ServerHandle(processes, path, data_dir, ports[sid][2])
    return Ensemble(servers).start()


class SecureCluster(Cluster):
    """:class:`Cluster` with everything on TLS and every client authenticated."""

    def __init__(self, processes: Processes, tmp_path: Path, pki: Pki) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.pki = pki
        self.storage = tmp_path / "topics"
        self.ensemble = secure_ensemble(processes, tmp_path, pki)
        self.server = self.ensemble  # type: ignore[assignment]  # what workers bootstrap from
        self.workers = []
        self.frozen = set()
        self.rest_users = tmp_path / "rest-users.properties"
        self.rest_users.write_text(REST_USERS)
        self.http = httpx.Client(
            timeout=60,
            verify=pki.client_context(),
            auth=("admin", "admin-secret"),
        )

    def secure_worker(self) -> None:
        port = free_port()
        props = {
            "group.id": "secure-pipeline",
            "bootstrap.servers": self.ensemble.bootstrap,
            "ensemble.security.protocol": "SASL_SSL",
            "ensemble.ssl.truststore.location": self.pki.ca.path,
            "ensemble.ssl.keystore.location": self.pki.worker,
            "ensemble.ssl.key.password": "keypass",
            "ensemble.sasl.username": "worker",
            "ensemble.sasl.password": "worker-secret",
            "listeners": f"https://127.0.0.1:{port}",
            "listeners.https.ssl.keystore.location": self.pki.worker,
            "listeners.https.ssl.key.password": "keypass",
            "ssl.truststore.location": self.pki.ca.path,
            "rest.extension.classes": "org.apache.kafka.connect.rest.basic.auth.extension."
            "BasicAuthSecurityRestExtension",
            "rest.basic.auth.credentials.file": self.rest_users,
            "rest.basic.auth.internal.user": "admin",
            "rest.basic.auth.internal.password": "admin-secret",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "rebalance.timeout.ms": 20_000,
            "worker.unsync.backoff.ms": 1000,
            "scheduled.rebalance.max.delay.ms": 0,
            "task.shutdown.graceful.timeout.ms": TASK_SHUTDOWN_MS,
            "storage.root": str(self.storage),
            "spark.master": "local[1]",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        }
        config = self.tmp_path / f"worker-{port}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.start_worker(config)


def leader(ensemble: Ensemble, security: ClientSecurity) -> int:
    import asyncio

    from herder.ensemble.client import server_status

    async def roles() -> dict[int, str]:
        out = {}
        for sid, server in ensemble.servers.items():
            try:
                out[sid] = (await server_status(server.bootstrap, security=security)).role
            except Exception:
                out[sid] = "down"
        return out

    def agreed() -> int | None:
        seen = asyncio.run(roles())
        leaders = [sid for sid, role in seen.items() if role == "leader"]
        followers = [sid for sid, role in seen.items() if role == "follower"]
        return leaders[0] if len(leaders) == 1 and len(followers) == 2 else None

    return int(wait_until(agreed, timeout=60, what="a leader over TLS"))  # type: ignore[arg-type]


async def _refusals(bootstrap: str, pki: Pki) -> None:
    def sec(cert: Path | None, user: str | None, password: str | None) -> ClientSecurity:
        stores = PemStores(
            keystore_location=str(cert) if cert else None, truststore_location=str(pki.ca.path)
        )
        return ClientSecurity(stores.client_context(), user, password)

    async def write(security: ClientSecurity) -> None:
        async with EnsembleClient(bootstrap, security=security, give_up_after=5) as client:
            await client.append("_configs", b"forged")

    # a read-only user, a wrong password, and a certificate principal with no write role
    with pytest.raises(NotAuthorized):
        await write(sec(pki.client, "operator", "operator-secret"))
    with pytest.raises(AuthenticationFailed):
        await write(sec(pki.client, "worker", "not-the-password"))
    with pytest.raises(NotAuthorized):
        await write(sec(pki.client, None, None))


@pytest.mark.timeout(600)
def test_secure_everywhere_pipeline_exactly_once(
    processes: Processes, tmp_path: Path, pki: Pki
) -> None:
    cluster = SecureCluster(processes, tmp_path, pki)
    operator = ClientSecurity(
        PemStores(
            keystore_location=str(pki.client), truststore_location=str(pki.ca.path)
        ).client_context(),
        "operator",
        "operator-secret",
    )
    try:
        leader(cluster.ensemble, operator)
        cluster.secure_worker()
        cluster.secure_worker()
        output, writer = numbers_pipeline(cluster, tmp_path)
        try:
            wait_until(
                lambda: count_lines(output) > 500,
                timeout=240,
                interval=0.2,
                what="lines reaching the sink over TLS",
            )
            # the ensemble leader dies: workers, tasks and groups fail over, over TLS
            victim = leader(cluster.ensemble, operator)
            cluster.ensemble[victim].kill9()
            cluster.ensemble[victim].start()
            leader(cluster.ensemble, operator)
            after = count_lines(output)
            wait_until(
                lambda: count_lines(output) > after + 500,
                timeout=180,
                interval=0.2,
                what="lines reaching the sink after the failover",
            )
        finally:
            total = writer.stop()
        wait_until(
            lambda: count_lines(output) >= total,
            timeout=180,
            interval=0.2,
            what=f"all {total} lines at the sink",
        )
        assert_exactly_once(output, total)

        # the CLI, with credentials: herder status and a connector's status over HTTPS
        url = cluster.workers[0].url
        env = {
            **os.environ,
            "HERDER_CACERT": str(pki.ca.path),
            "HERDER_USER": "viewer",
            "HERDER_PASSWORD": "viewer-secret",
        }
        status = subprocess.run(
            [*HERDER, "status", "--url", url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert "numbers-sink" in json.dumps(shown)
        # the worker reached every ensemble server over TLS, as its own principal
        servers = shown["ensemble"]
        assert sorted(s.get("role") for s in servers) == ["follower", "follower", "leader"], shown
        connector = subprocess.run(
            [*HERDER, "connectors", "--cacert", str(pki.ca.path), "--user", "viewer",
             "--password", "viewer-secret", "status", "numbers-source", "--url", url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert connector.returncode == 0 and "RUNNING" in connector.stdout, connector.stderr
        denied = subprocess.run(
            [*HERDER, "connectors", "--cacert", str(pki.ca.path), "--user", "viewer",
             "--password", "viewer-secret", "delete", "numbers-source", "--url", url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert denied.returncode != 0
        logs = subprocess.run(
            [*HERDER, "logs", "list", "--bootstrap", cluster.ensemble.bootstrap, "--cacert",
             str(pki.ca.path), "--cert", str(pki.client), "--user", "operator", "--password",
             "operator-secret"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert logs.returncode == 0 and "_configs" in logs.stdout, logs.stderr

        # and nobody without the right credentials writes to the ensemble
        import asyncio

        asyncio.run(_refusals(cluster.ensemble.bootstrap, pki))
        for server in cluster.ensemble.servers.values():
            assert server.proc is not None
            assert "Traceback" not in server.proc.output()
    finally:
        cluster.http.close()
