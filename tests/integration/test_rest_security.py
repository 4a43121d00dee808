"""The REST API's security: HTTPS with client certificates, HTTP Basic users with roles,
and config-provider references shown as written.

Two workers on a one-server ensemble per test; certificates made by the test in tmp_path.
Two connectors make the load-balanced group give one to each worker, so one of them runs
on a follower, whose task configs travel to the leader as an internal request: both
connectors' tasks running proves worker-to-worker requests work with the security on.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.pki import Pki
from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONNECTOR = "tests.fixtures.connectors.MarkerSourceConnector"
BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
SECRET = "s3cr3t-value-never-shown"


# -- workers -------------------------------------------------------------------------------


class Cluster:
    """Two workers of one group; ``client`` is an httpx.Client that may reach them."""

    def __init__(
        self,
        processes: Processes,
        tmp_path: Path,
        server: ServerHandle,
        props: dict[str, Any],
        scheme: str,
        client: httpx.Client,
        env: dict[str, str] | None = None,
    ) -> None:
        self.client = client
        self.urls: list[str] = []
        self.procs = []
        for _ in range(2):
            port = free_port()
            url = f"{scheme}://127.0.0.1:{port}"
            worker = {
                "group.id": "secure",
                "bootstrap.servers": server.bootstrap,
                "listeners": url,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 300,
                "rebalance.timeout.ms": 10_000,
                "scheduled.rebalance.max.delay.ms": 0,
                "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
                **props,
            }
            path = tmp_path / f"worker-{port}.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in worker.items()))
            self.procs.append(
                processes.start(
                    [*HERDER, "--log-level", "DEBUG", "worker", "start", "--config", str(path)],
                    name=f"worker-{port}",
                    ready=lambda url=url: client.get(f"{url}/health", timeout=2).status_code == 200,
                    env=env,
                )
            )
            self.urls.append(url)
        wait_until(self._one_leader, timeout=30, what="both workers in one generation")

    def _one_leader(self) -> bool:
        leaders = {
            self.client.get(f"{url}/admin/metrics/rebalance").json().get("leader-name")
            for url in self.urls
        }
        return len(leaders) == 1 and None not in leaders and "" not in leaders

    def follower(self) -> str:
        leader = self.client.get(f"{self.urls[0]}/admin/metrics/rebalance").json()["leader-name"]
        followers = [url for url in self.urls if url != leader]
        assert len(followers) == 1, (leader, self.urls)
        return followers[0]

    def create(self, url: str, name: str, tmp_path: Path, **extra: str) -> httpx.Response:
        markers = tmp_path / f"markers-{name}"
        markers.mkdir(exist_ok=True)
        config = {"connector.class": CONNECTOR, "tasks.max": "2", "marker.dir": str(markers)}
        return self.client.post(
            f"{url}/connectors", json={"name": name, "config": config | extra}, timeout=60
        )

    def running(self, url: str, name: str) -> bool:
        status = self.client.get(f"{url}/connectors/{name}/status").json()
        tasks = status.get("tasks", [])
        return status.get("connector", {}).get("state") == "RUNNING" and [
            t["state"] for t in tasks
        ] == ["RUNNING", "RUNNING"]

    def workers_of(self, url: str, names: list[str]) -> set[str]:
        return {
            self.client.get(f"{url}/connectors/{name}/status").json()["connector"]["worker_id"]
            for name in names
        }


@pytest.fixture
def server(processes: Processes, tmp_path: Path) -> ServerHandle:
    return make_server(processes, tmp_path).start()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HERDER, "connectors", *args], capture_output=True, text=True, timeout=60, env=env
    )


# -- HTTPS ---------------------------------------------------------------------------------


def test_https_cluster_with_required_client_certificates(
    processes: Processes, tmp_path: Path, server: ServerHandle, pki: Pki
) -> None:
    tls = {
        "listeners.https.ssl.keystore.type": "PEM",
        "listeners.https.ssl.keystore.location": pki.worker,
        "listeners.https.ssl.key.password": "keypass",
        "ssl.truststore.location": pki.ca.path,
        "ssl.client.authentication": "required",
    }
    client = httpx.Client(verify=pki.client_context(pki.client), timeout=10)
    cluster = Cluster(processes, tmp_path, server, tls, "https", client)
    follower = cluster.follower()  # the leader is known by its advertised https:// URL

    # a create sent to the follower is forwarded to the leader over HTTPS
    for name in ("first", "second"):
        reply = cluster.create(follower, name, tmp_path)
        assert reply.status_code == 201, reply.text
    for name in ("first", "second"):
        wait_until(lambda name=name: cluster.running(follower, name), timeout=30,
                   what=f"{name}'s tasks running")  # fmt: skip
    # one connector runs on each worker: the follower's task configs reached the leader
    assert len(cluster.workers_of(follower, ["first", "second"])) == 2

    port = follower.rpartition(":")[2]
    with pytest.raises(httpx.HTTPError):  # plaintext on the TLS port
        httpx.get(f"http://127.0.0.1:{port}/connectors", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(
            f"{follower}/connectors",
            verify=pki.client_context(pki.client, ca=pki.stranger.path),
            timeout=5,
        )
    with pytest.raises(httpx.HTTPError):  # no client certificate
        httpx.get(f"{follower}/connectors", verify=pki.client_context(), timeout=5)
    with pytest.raises(httpx.HTTPError):  # a client certificate no trusted CA signed
        httpx.get(
            f"{follower}/connectors",
            verify=pki.client_context(pki.untrusted_client),
            timeout=5,
        )
    # the worker still serves everyone else
    assert sorted(client.get(f"{follower}/connectors").json()) == ["first", "second"]

    listed = _cli("--cacert", str(pki.ca.path), "--cert", str(pki.client),
                  "list", "--url", follower, "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "first" in listed.stdout and "second" in listed.stdout
    refused = _cli("--cacert", str(pki.ca.path), "list", "--url", follower)
    assert refused.returncode == 1
    assert "could not agree on TLS" in refused.stderr and "--cert" in refused.stderr
    untrusted = _cli("--cert", str(pki.client), "list", "--url", follower)
    assert untrusted.returncode == 1 and "--cacert" in untrusted.stderr, untrusted.stderr
    plain = _cli("list", "--url", follower.replace("https://", "http://"))
    assert plain.returncode == 1

    # a worker stops cleanly even while a client keeps an idle TLS connection open
    assert client.get(f"{follower}/connectors").status_code == 200
    for proc in cluster.procs:
        assert proc.stop() == 0, proc.output()


def test_https_worker_refuses_to_start_without_its_key(
    processes: Processes, tmp_path: Path, server: ServerHandle
) -> None:
    path = tmp_path / "worker.properties"
    path.write_text(
        f"group.id=g\nbootstrap.servers={server.bootstrap}\n"
        f"listeners=https://127.0.0.1:{free_port()}\n"
    )
    done = subprocess.run([*HERDER, "worker", "start", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "ssl.keystore.location" in done.stderr


# -- basic authentication ------------------------------------------------------------------


def test_basic_auth_roles_and_internal_requests(
    processes: Processes, tmp_path: Path, server: ServerHandle
) -> None:
    credentials = tmp_path / "users.properties"
    credentials.write_text(
        "# user: password,role\n"
        "admin: admin-pw,admin\n"
        "reader: reader-pw,read\n"
        "worker: worker-pw,admin\n"
        "nobody: nobody-pw\n"
    )
    props = {
        "rest.extension.classes": BASIC_AUTH,
        "rest.basic.auth.credentials.file": credentials,
        "rest.basic.auth.internal.user": "worker",
        "rest.basic.auth.internal.password": "worker-pw",
    }
    admin = httpx.Client(auth=("admin", "admin-pw"), timeout=10)
    secret_dir = tmp_path / SECRET
    secret_dir.mkdir()
    env = {"HERDER_TEST_SECRET": SECRET, "HERDER_TEST_MARKERS": str(secret_dir)}
    cluster = Cluster(processes, tmp_path, server, props, "http", admin, env=env)
    follower = cluster.follower()
    leader = next(url for url in cluster.urls if url != follower)

    anonymous = httpx.get(f"{follower}/connectors", timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic realm=")
    wrong = httpx.get(f"{follower}/connectors", auth=("admin", "nope"), timeout=10)
    assert wrong.status_code == 401
    unknown = httpx.get(f"{follower}/connectors", auth=("ghost", "admin-pw"), timeout=10)
    assert unknown.status_code == 401
    reader = httpx.Client(auth=("reader", "reader-pw"), timeout=10)
    assert reader.get(f"{follower}/connectors").status_code == 200
    denied = reader.post(
        f"{follower}/connectors", json={"name": "x", "config": {"connector.class": CONNECTOR}}
    )
    assert denied.status_code == 403, denied.text
    assert "admin role" in denied.json()["message"]
    assert httpx.get(f"{follower}/connectors", auth=("nobody", "nobody-pw")).status_code == 403
    # /health stays open for probes
    assert httpx.get(f"{follower}/health", timeout=10).status_code == 200

    # admin writes through the follower (forwarded with the admin's credentials), and the
    # follower's task configs reach the leader as the worker's internal user
    # marker.dir refers to a secret: the connector copies it into its task configs
    references = {"secret": "${env:HERDER_TEST_SECRET}", "marker.dir": "${env:HERDER_TEST_MARKERS}"}
    reply = cluster.create(follower, "first", tmp_path, **references)
    assert reply.status_code == 201, reply.text
    reply = cluster.create(leader, "second", tmp_path)
    assert reply.status_code == 201, reply.text
    for name in ("first", "second"):
        wait_until(lambda name=name: cluster.running(follower, name), timeout=30,
                   what=f"{name}'s tasks running")  # fmt: skip
    assert len(cluster.workers_of(follower, ["first", "second"])) == 2

    # secrets: connectors and tasks run with the references resolved (the tasks' markers
    # are in the directory the reference names) ...
    wait_until(
        lambda: sorted(p.name for p in secret_dir.iterdir()) == ["first-0", "first-1"],
        timeout=10,
        what="the tasks' markers in the resolved directory",
    )
    # ... while the API shows the references, never their values
    placeholder = "${env:HERDER_TEST_SECRET}"
    for url in cluster.urls:
        tasks = admin.get(f"{url}/connectors/first/tasks").json()
        assert [t["config"]["marker.dir"] for t in tasks] == ["${env:HERDER_TEST_MARKERS}"] * 2
        shown = [
            admin.get(f"{url}/connectors/first/config").json(),
            admin.get(f"{url}/connectors/first").json()["config"],
            admin.get(f"{url}/connectors", params={"expand": "info"}).json()["first"]["info"][
                "config"
            ],
        ]
        for config in shown:
            assert config["secret"] == placeholder
        assert SECRET not in admin.get(f"{url}/connectors/first/tasks").text
        assert SECRET not in admin.get(f"{url}/connectors", params={"expand": "info"}).text
    for proc in cluster.procs:
        assert SECRET not in proc.output()

    listed = _cli("--user", "reader", "--password", "reader-pw", "list", "--url", follower,
                  "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "first" in listed.stdout
    refused = _cli("--user", "reader", "--password", "reader-pw", "delete", "first",
                   "--url", follower)  # fmt: skip
    assert refused.returncode == 1
    assert "(HTTP 403)" in refused.stderr
    anonymous_cli = _cli("list", "--url", follower)
    assert anonymous_cli.returncode == 1
    assert "(HTTP 401)" in anonymous_cli.stderr
