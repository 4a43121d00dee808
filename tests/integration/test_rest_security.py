"""The REST API's security: HTTPS with client certificates, HTTP Basic users with roles,
and config-provider references shown as written.

Two workers on a one-server ensemble per test; certificates made by the test in tmp_path.
Two connectors make the load-balanced group give one to each worker, so one of them runs
on a follower, whose task configs travel to the leader as an internal request: both
connectors' tasks running proves worker-to-worker requests work with the security on.
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.pki import Pki
from tests.harness import HERDER, Proc, Processes, free_port, wait_until
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
        workers: int = 2,
    ) -> None:
        self.client = client
        self.urls: list[str] = []
        self.procs = []
        for _ in range(workers):
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


# -- bad clients ---------------------------------------------------------------------------

USERS = "admin: admin-pw,admin\nreader: reader-pw,read\nworker: worker-pw,admin\n"


def _basic_auth(tmp_path: Path) -> dict[str, Any]:
    credentials = tmp_path / "users.properties"
    credentials.write_text(USERS)
    return {
        "rest.extension.classes": BASIC_AUTH,
        "rest.basic.auth.credentials.file": credentials,
        "rest.basic.auth.internal.user": "worker",
        "rest.basic.auth.internal.password": "worker-pw",
    }


def _request(method: str = "GET", path: str = "/connectors", auth: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if auth is not None:
        lines.append("Authorization: Basic " + base64.b64encode(auth.encode()).decode())
    if method != "GET":
        lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Attempt:
    port: int  #: the client's own port, by which the worker's log names it
    reply: bytes  #: what the worker sent back before it closed the connection


def _attempt(port: int, payload: bytes, context: ssl.SSLContext | None = None) -> Attempt:
    """Connect to the worker at ``port`` (over TLS with ``context``), send ``payload`` and
    read until the worker closes the connection, whatever goes wrong on the way."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    local = sock.getsockname()[1]
    received = b""
    try:
        stream = context.wrap_socket(sock, server_hostname="127.0.0.1") if context else sock
        with stream:
            stream.sendall(payload)
            while chunk := stream.recv(65536):
                received += chunk
    except OSError:  # ssl.SSLError among them: the worker refused the handshake
        pass
    finally:
        sock.close()
    return Attempt(local, received)


def _logged_once(proc: Proc, phrase: str, attempts: list[Attempt], level: str = "WARNING") -> None:
    """The worker logged ``phrase`` in one line at ``level``, naming the first attempt's
    address, however many attempts there were."""
    wait_until(lambda: phrase in proc.output(), timeout=10, what=f"a log line with {phrase!r}")
    lines = [line for line in proc.output().splitlines() if phrase in line]
    assert len(lines) == 1, lines
    assert f" {level} " in lines[0], lines[0]
    assert f"REST client 127.0.0.1:{attempts[0].port} " in lines[0], (lines[0], attempts)


def test_bad_clients_of_an_https_listener_are_refused_and_logged_once_with_their_address(
    processes: Processes, tmp_path: Path, server: ServerHandle, pki: Pki
) -> None:
    props = {
        "ssl.keystore.location": pki.worker,
        "ssl.key.password": "keypass",
        "ssl.truststore.location": pki.ca.path,
        "ssl.client.authentication": "required",
        **_basic_auth(tmp_path),
    }
    good = httpx.Client(
        verify=pki.client_context(pki.client), auth=("admin", "admin-pw"), timeout=10
    )
    cluster = Cluster(processes, tmp_path, server, props, "https", good, workers=1)
    url, proc = cluster.urls[0], cluster.procs[0]
    port = int(url.rpartition(":")[2])
    ok = _request(auth="admin:admin-pw")

    bad_clients = {
        "it sent plain HTTP to this HTTPS listener": (None, ok),
        "it sent bytes that open no TLS handshake": (None, b"\x00\x01garbage\r\n\r\n"),
        "it presented no client certificate": (pki.client_context(), ok),
        "failed verification (unable to get local issuer certificate)": (
            pki.client_context(pki.untrusted_client),
            ok,
        ),
        "failed verification (certificate has expired)": (
            pki.client_context(pki.issue("expired-client", expired=True)),
            ok,
        ),
        "with the alert 'unknown ca'": (pki.client_context(pki.client, ca=pki.stranger.path), ok),
        "a wrong password for user admin": (
            pki.client_context(pki.client),
            _request(auth="admin:wrong"),
        ),
    }
    tried: dict[str, list[Attempt]] = {}
    for phrase, (context, payload) in bad_clients.items():
        # a client retrying in a loop: refused each time, logged once
        tried[phrase] = [_attempt(port, payload, context) for _ in range(4)]
        for attempt in tried[phrase]:
            if "password" in phrase:
                assert attempt.reply.startswith(b"HTTP/1.1 401 "), attempt.reply[:100]
            else:
                assert b"HTTP/1.1 200" not in attempt.reply, attempt.reply[:100]
        # and the worker serves a good client right after
        assert good.get(f"{url}/connectors").status_code == 200

    for phrase, attempts in tried.items():
        _logged_once(proc, phrase, attempts)
    assert "Traceback" not in proc.output()
    served = _attempt(port, ok, pki.client_context(pki.client))
    assert served.reply.startswith(b"HTTP/1.1 200 "), served.reply[:100]


def test_bad_clients_of_a_plain_listener_are_refused_and_logged_once_with_their_address(
    processes: Processes, tmp_path: Path, server: ServerHandle
) -> None:
    good = httpx.Client(auth=("admin", "admin-pw"), timeout=10)
    cluster = Cluster(processes, tmp_path, server, _basic_auth(tmp_path), "http", good, workers=1)
    url, proc = cluster.urls[0], cluster.procs[0]
    port = int(url.rpartition(":")[2])

    def tls_client() -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    # (context, payload, status the worker answers or None for none, log level)
    bad_clients: dict[str, tuple[ssl.SSLContext | None, bytes, bytes | None, str]] = {
        "it opened a TLS handshake on this plain HTTP listener": (
            tls_client(), _request(), None, "WARNING"
        ),
        "sent a bad request: Invalid HTTP request received.": (
            None, b"\x00\x01garbage\r\n\r\n", b"400", "WARNING"
        ),
        # (an unknown user is the same kind of refusal: counted with these, not logged)
        "a wrong password for user admin": (
            None, _request(auth="admin:wrong"), b"401", "WARNING"
        ),
        "no credentials for GET /connectors": (None, _request(), b"401", "INFO"),
        "user reader may not DELETE /connectors/x": (
            None, _request("DELETE", "/connectors/x", auth="reader:reader-pw"), b"403", "WARNING"
        ),
    }  # fmt: skip
    tried: dict[str, list[Attempt]] = {}
    for phrase, (context, payload, status, _) in bad_clients.items():
        tried[phrase] = [_attempt(port, payload, context) for _ in range(4)]
        if "password" in phrase:
            tried[phrase].append(_attempt(port, _request(auth="admin-pw:admin")))
        for attempt in tried[phrase]:
            if status is None:
                assert b"HTTP/1.1" not in attempt.reply, attempt.reply[:100]
            else:
                assert attempt.reply.startswith(b"HTTP/1.1 " + status), attempt.reply[:100]
        assert good.get(f"{url}/connectors").status_code == 200

    for phrase, (_, _, _, level) in bad_clients.items():
        _logged_once(proc, phrase, tried[phrase], level)
    output = proc.output()
    assert "Traceback" not in output
    # the password never reaches the log, nor a name that may be one
    assert "wrong" not in output.replace("a wrong password", "")
    assert "admin-pw" not in output


# -- every path ----------------------------------------------------------------------------

#: what the worker serves besides the operations of its OpenAPI document
UNDOCUMENTED = ["/openapi.json", "/docs", "/ui", "/ui/console.js", "/no/such/path"]
PARAMETERS = {"{name}": "x", "{task}": "0", "{plugin}": "FileStreamSource"}


def _operations(client: httpx.Client, url: str) -> list[tuple[str, str]]:
    """(method, path) of every operation the worker's OpenAPI document lists, with its
    parameters filled in."""
    document = client.get(f"{url}/openapi.json").json()
    operations = []
    for path, methods in document["paths"].items():
        for parameter, value in PARAMETERS.items():
            path = path.replace(parameter, value)
        assert "{" not in path, path
        operations += [(method.upper(), path) for method in methods]
    return operations


def test_every_path_refuses_a_client_without_valid_credentials_and_a_reader_every_write(
    processes: Processes, tmp_path: Path, server: ServerHandle
) -> None:
    props = _basic_auth(tmp_path)
    credentials = Path(props["rest.basic.auth.credentials.file"])
    credentials.write_text(credentials.read_text() + "roleless: roleless-pw\n")
    admin = httpx.Client(auth=("admin", "admin-pw"), timeout=30)
    cluster = Cluster(processes, tmp_path, server, props, "http", admin, workers=1)
    url = cluster.urls[0]
    operations = _operations(admin, url)
    methods = {method for method, _ in operations}
    # Connect's routes, its internal endpoint and herder's own are all in the document
    assert {"GET", "POST", "PUT", "PATCH", "DELETE"} <= methods
    for expected in [("POST", "/connectors/x/tasks"), ("GET", "/metrics"),
                     ("PUT", "/connectors/x/stop"), ("PUT", "/admin/loggers/x")]:  # fmt: skip
        assert expected in operations, expected
    everything = operations + [("GET", path) for path in UNDOCUMENTED]
    everything.append(("PUT", "/connectors/x/tasks"))  # as Connect's workers once sent it

    def client(auth: tuple[str, str] | None) -> httpx.Client:
        return httpx.Client(base_url=url, auth=auth, timeout=30)

    strangers = {
        "anonymous": client(None),
        "a wrong password": client(("admin", "wrong")),
        "an unknown user": client(("ghost", "admin-pw")),
    }
    roleless, reader = client(("roleless", "roleless-pw")), client(("reader", "reader-pw"))
    for method, path in everything:
        if path == "/health":
            assert strangers["anonymous"].request(method, path).status_code == 200
            continue
        for who, stranger in strangers.items():
            reply = stranger.request(method, path)
            assert reply.status_code == 401, (who, method, path, reply.status_code)
            assert reply.headers["www-authenticate"] == 'Basic realm="herder"'
        refused = roleless.request(method, path)
        assert refused.status_code == 403, (method, path, refused.status_code)

        read = reader.request(method, path)
        if method == "GET":
            # past the door: whatever the route answers (404 for connector x), not a refusal
            assert read.status_code != 401, (path, read.text)
            assert "needs the admin role" not in read.text, (path, read.text)
        else:
            assert read.status_code == 403, (method, path, read.status_code)
            assert "needs the admin role" in read.json()["message"]

    # the console and the metrics are a reader's to see
    for path in ("/ui", "/ui/console.js", "/metrics"):
        assert reader.get(path).status_code == 200, path
    # the internal endpoint wants the session key's signature even from an admin
    unsigned = admin.post(f"{url}/connectors/x/tasks", json=[])
    assert unsigned.status_code == 400, unsigned.text
    assert "signature" in unsigned.json()["message"]
    assert admin.get(f"{url}/connectors").status_code == 200
