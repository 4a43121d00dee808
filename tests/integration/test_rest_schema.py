"""The REST API against its own OpenAPI document, with schemathesis: no request, however
odd, makes a worker answer 5xx, and what it answers fits the document.

The worker runs as an operator secures one: HTTPS with required client certificates
and HTTP Basic users, and schemathesis sends every request as the admin user with a
client certificate (the OpenAPI document says the API wants Basic credentials). It reads
the live worker's ``/openapi.json`` and, for every operation, sends requests that fit the
document (``positive``) and requests that do not (``negative``: bodies, paths and query
parameters of the wrong shape). Each operation on a connector is tried on made-up names,
on a running connector and on a stopped one (so offsets can be altered), both made again
before each operation. A request a worker cannot serve must be refused with a 4xx naming
why, never answered with a 500; a documented answer must have the documented content
type and fit its schema. The examples are derandomized, so a run is the same every time,
and few, so it takes about a minute; ``slow`` runs many more.

What schemathesis cannot send (JSON's lone surrogate escapes and Python's ``NaN``) and
what it did not happen on (offsets beyond Kafka's types) is tried by hand below.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from tests.fixtures.pki import make_pki
from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import make_server
from tests.integration.test_rest_security import BASIC_AUTH

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: examples per operation, connector name and generation mode (``slow``: SLOW_EXAMPLES)
EXAMPLES = 8
SLOW_EXAMPLES = 60
ADMIN = ("admin", "admin-pw")
SOURCE = "tests.fixtures.rest_connectors.CountingSourceConnector"
SINK = "tests.fixtures.rest_connectors.CountingSinkConnector"


class Worker:
    def __init__(self, url: str, marker_dir: str, ca: str, cert: str) -> None:
        self.url = url
        self.config = {"connector.class": SOURCE, "marker.dir": marker_dir}
        #: how requests reach the worker: its CA, a client certificate, the admin user
        self.transport: dict[str, Any] = {"verify": ca, "cert": cert, "auth": ADMIN}
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(cert)
        self.client = httpx.Client(verify=context, auth=ADMIN, timeout=60)

    def put(self, path: str, body: Any = None) -> None:
        reply = self.client.put(f"{self.url}{path}", json=body)
        assert reply.status_code < 300, f"PUT {path}: {reply.status_code} {reply.text}"

    def reset_connectors(self) -> None:
        """``running`` runs and ``stopped`` is stopped, with their usual configs, and the
        rebalance that may take is over."""
        self.put("/connectors/running/config", self.config)
        self.put("/connectors/running/resume")
        self.put("/connectors/stopped/config", self.config)
        self.put("/connectors/stopped/stop")
        wait_until(
            lambda: self.client.get(f"{self.url}/health").status_code == 200,
            30,
            what="the worker to be back in its group",
        )


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    root = tmp_path_factory.mktemp("schema")
    pki = make_pki(root / "pki")
    users = root / "users.properties"
    users.write_text(f"{ADMIN[0]}: {ADMIN[1]},admin\nworker: worker-pw,admin\n")
    processes = Processes(root)
    try:
        server = make_server(processes, root, **{"group.min.session.timeout.ms": 1000}).start()
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        props = {
            "group.id": "schema",
            "bootstrap.servers": server.bootstrap,
            "listeners": url,
            "ssl.keystore.location": pki.worker,
            "ssl.key.password": "keypass",
            "ssl.truststore.location": pki.ca.path,
            "ssl.client.authentication": "required",
            "rest.extension.classes": BASIC_AUTH,
            "rest.basic.auth.credentials.file": users,
            "rest.basic.auth.internal.user": "worker",
            "rest.basic.auth.internal.password": "worker-pw",
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 300,
            "task.execution.factory": "tests.fixtures.rest_connectors:PollingExecutions",
        }
        path = root / "worker.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        ready = Worker(url, str(root), str(pki.ca.path), str(pki.client))
        processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
            name="worker",
            ready=lambda: ready.client.get(f"{url}/health", timeout=1).status_code == 200,
        )
        yield ready
    finally:
        processes.stop_all()


@dataclass
class Run:
    cases: int = 0  #: requests schemathesis sent
    failures: list[str] = field(default_factory=list)  #: a line per failed operation


def fuzz(worker: Worker, mode: GenerationMode, examples: int) -> Run:
    """Every operation tried with ``examples`` requests of ``mode``; a 5xx, or an answer
    that contradicts the document, fails the operation (for that connector name)."""
    url = worker.url
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", **worker.transport)
    run = Run()
    for result in schema.get_all_operations():
        operation = result.ok()
        for name in (None, "running", "stopped"):
            if name is not None and "{name}" not in operation.path:
                continue
            fixed = {"name": name, "task": 0} if name is not None else {}
            path_parameters = {k: v for k, v in fixed.items() if f"{{{k}}}" in operation.path}
            worker.reset_connectors()

            @settings(
                max_examples=examples,
                derandomize=True,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(mode, path_parameters=path_parameters))
            def answers_below_500(case: schemathesis.Case) -> None:
                run.cases += 1
                response = case.call(base_url=url, timeout=60, **worker.transport)
                if case.operation.path == "/health" and response.status_code == 503:
                    return  # what it answers while the worker rebalances (a request may cause one)
                assert response.status_code < 500, (
                    f"{case.operation.label} ({mode}): {response.status_code} "
                    f"{response.text[:300]}\n  {case.as_curl_command(base_url=url)}"
                )
                case.validate_response(
                    response,
                    checks=[content_type_conformance, response_schema_conformance],
                    transport_kwargs=worker.transport,
                )

            try:
                answers_below_500()
            except Unsatisfiable:
                continue  # nothing about it can be wrong (a GET without parameters, negatively)
            except (AssertionError, FailureGroup) as failure:  # a check's Failure is one
                run.failures.append(f"{operation.label} ({mode}, {name}): {failure}")
    return run


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_makes_a_worker_answer_5xx(worker: Worker, mode: GenerationMode) -> None:
    run = fuzz(worker, mode, EXAMPLES)
    print(f"schemathesis ({mode}): {run.cases} cases")
    assert not run.failures, "\n".join(run.failures)
    # the worker is still in its group and serving after all of it
    assert worker.client.get(f"{worker.url}/health").status_code == 200


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_many_requests_make_no_5xx(worker: Worker, mode: GenerationMode) -> None:
    run = fuzz(worker, mode, SLOW_EXAMPLES)
    print(f"schemathesis ({mode}, slow): {run.cases} cases")
    assert not run.failures, "\n".join(run.failures)
    assert worker.client.get(f"{worker.url}/health").status_code == 200


def send(worker: Worker, method: str, path: str, raw: str) -> httpx.Response:
    return worker.client.request(
        method,
        f"{worker.url}{path}",
        content=raw.encode(),
        headers={"content-type": "application/json"},
    )


def assert_refused(reply: httpx.Response, *words: str) -> None:
    assert reply.status_code == 400, reply.text
    for word in words:
        assert word in reply.json()["message"], reply.json()["message"]


def raw_json(value: Any, **tokens: str) -> str:
    """``value`` as JSON, each ``tokens`` key put in as the raw text it maps to."""
    text = json.dumps(value)
    for placeholder, raw in tokens.items():
        text = text.replace(f'"{placeholder}"', raw)
    return text


def test_what_json_cannot_carry_is_refused_with_400(worker: Worker) -> None:
    worker.reset_connectors()
    config = {**worker.config, "x": "X"}
    # half a surrogate pair would be stored, then fail every reply that shows it
    lone = raw_json({"name": "lone", "config": config}, X='"\\ud800"')
    assert_refused(send(worker, "POST", "/connectors", lone), "surrogate")
    lone_config = raw_json(config, X='"\\udfff"')
    assert_refused(send(worker, "PUT", "/connectors/lone/config", lone_config), "surrogate")
    # Python reads NaN, Infinity and 1e999, which JSON has not; stored, they came back null
    for number in ("NaN", "Infinity", "1e999"):
        body = raw_json({"offsets": [{"partition": {"f": "a"}, "offset": {"p": "N"}}]}, N=number)
        assert_refused(send(worker, "PATCH", "/connectors/stopped/offsets", body), number)
    # a whole surrogate pair is one character, and fine
    pair = raw_json({"name": "pair", "config": config}, X='"\\ud83d\\ude00"')
    created = send(worker, "POST", "/connectors", pair)
    assert created.status_code == 201, created.text
    assert created.json()["config"]["x"] == "\N{GRINNING FACE}"
    # a name with a control character, as Connect refuses it
    control = {"name": "bell\u0007", "config": worker.config}
    assert_refused(
        worker.client.post(f"{worker.url}/connectors", json=control), "control sequences"
    )


def test_sink_offsets_beyond_kafkas_types_are_refused_with_400(worker: Worker) -> None:
    reply = worker.client.post(
        f"{worker.url}/connectors",
        json={
            "name": "sink-stopped",
            "config": {**worker.config, "connector.class": SINK, "topics": "t"},
            "initial_state": "STOPPED",
        },
        timeout=60,
    )
    assert reply.status_code in (201, 409), reply.text

    def alter(partition: int, offset: int) -> httpx.Response:
        entry = {
            "partition": {"kafka_topic": "t", "kafka_partition": partition},
            "offset": {"kafka_offset": offset},
        }
        return worker.client.patch(
            f"{worker.url}/connectors/sink-stopped/offsets", json={"offsets": [entry]}
        )

    assert_refused(alter(0, 2**63), "offset")
    assert_refused(alter(2**31, 0), "partition")
    assert alter(2**31 - 1, 2**63 - 1).status_code == 200
