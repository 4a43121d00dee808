"""A worker outside its group answers at once, naming why, instead of hanging.

* The ensemble refuses its ``session.timeout.ms`` (INVALID_SESSION_TIMEOUT): the worker
  is out of its group for good. While it stops, ``/health`` answers 503 and a write 409,
  both naming the cause; then the process exits non-zero with one line saying what to
  change, as Connect's worker exits when its herder thread dies.
* No ensemble answers, so the worker never gets to join: ``/health`` answers 503
  ``starting`` saying what it is doing, and a write 409 at once.

"At once" is within :data:`AT_ONCE_S`, well under the 30 s a worker waits for a leader
during a rebalance and the 90 s request timeout, which is what it used to take.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.harness import HERDER, Proc, Processes, free_port
from tests.integration.conftest import make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SOURCE = "tests.fixtures.rest_connectors.CountingSourceConnector"
AT_ONCE_S = 10.0


def start_worker(
    processes: Processes, tmp_path: Path, bootstrap: str, ready: str, **extra: object
) -> tuple[Proc, str]:
    """A worker process, ready once its ``/health`` message contains ``ready``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    props = {
        "group.id": "outside",
        "bootstrap.servers": bootstrap,
        "rest.host.name": "127.0.0.1",
        "rest.port": port,
        "heartbeat.interval.ms": 300,
        "task.execution.factory": "tests.fixtures.rest_connectors:PollingExecutions",
        **extra,
    }
    path = tmp_path / f"worker-{port}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    proc = processes.start(
        [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
        name=f"worker-{port}",
        ready=lambda: ready in httpx.get(f"{url}/health", timeout=2).json()["message"],
        timeout=60,
    )
    return proc, url


def create(url: str) -> httpx.Response:
    body = {"name": "c", "config": {"connector.class": SOURCE}}
    return httpx.post(f"{url}/connectors", json=body, timeout=AT_ONCE_S)


def test_a_worker_its_group_refuses_answers_at_once_and_exits_with_the_cause(
    processes: Processes, tmp_path: Path
) -> None:
    server = make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 6000}).start()
    # the execution factory's close() takes 8 s: the worker answers while it stops
    proc, url = start_worker(
        processes,
        tmp_path,
        server.bootstrap,
        ready="INVALID_SESSION_TIMEOUT",
        **{"session.timeout.ms": 3000, "test.close.delay.ms": 8000},
    )
    health = httpx.get(f"{url}/health", timeout=AT_ONCE_S)
    assert health.status_code == 503
    assert health.json()["status"] == "unhealthy"
    assert "session.timeout.ms=3000" in health.json()["message"]
    assert "group.min.session.timeout.ms" in health.json()["message"]

    refused = create(url)
    assert refused.status_code == 409, refused.text
    message = refused.json()["message"]
    assert refused.json()["error_code"] == 409
    assert "no known leader" in message and "INVALID_SESSION_TIMEOUT" in message
    assert "another worker" in message

    assert proc.popen.wait(timeout=60) == 1
    output = proc.output()
    assert "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"error: worker 127.0.0.1:{url.rsplit(':', 1)[1]} stopped: "), last
    assert "INVALID_SESSION_TIMEOUT" in last and "set it within" in last, last


def test_a_worker_that_has_not_joined_answers_at_once(processes: Processes, tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"  # no ensemble server listens there
    _, url = start_worker(processes, tmp_path, nobody, ready="connecting to the ensemble")
    health = httpx.get(f"{url}/health", timeout=AT_ONCE_S)
    assert health.status_code == 503
    assert health.json()["status"] == "starting"
    assert health.json()["message"].startswith(
        f"Worker is still starting up: it is connecting to the ensemble at {nobody}, which began"
    )
    refused = create(url)
    assert refused.status_code == 409, refused.text
    assert "no known leader" in refused.json()["message"]
    assert "has not joined its group outside yet" in refused.json()["message"]
    # reads need no group: they answer from what the worker has (nothing yet)
    assert httpx.get(f"{url}/connectors", timeout=AT_ONCE_S).json() == []
