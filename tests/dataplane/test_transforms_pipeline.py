"""Transforms, predicates and dead letter queues on a real pipeline.

One ensemble server and one worker process (a JVM, ``local[1]``) run, for the whole
module, one source and four sink connectors that share its data:

* ``gen`` (the source below) polls five records into ``people-raw``; its chain routes
  them to ``people`` (RegexRouter), keys them by ``id`` (ValueToKey) and tags their
  values (InsertField); the one whose value is not JSON goes to the dead letter queue
  ``gen-dlq`` in the same committed batch as the others.
* ``chain`` casts, masks where a header says so, renames and drops fields, inserts the
  topic and offset and drops tombstones; the record whose ``age`` does not cast lands
  in ``chain-dlq`` with Connect's ``__connect.errors.*`` headers.
* ``strict`` has the same Cast with ``errors.tolerance=none``: its task fails, and its
  status trace says why.
* ``shape`` keeps only records with a header (Filter with a negated predicate),
  formats a timestamp field, routes by record timestamp and hoists the value.
* ``names`` drops tombstones and extracts one field.

Sinks are FileStreamSinks, so each record's value is checked line by line.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from herder.connect import SourceConnector, SourceRecord, SourceTask
from tests.e2e.test_pipeline import Cluster
from tests.harness import HERDER, Processes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(400)]

#: 2024-03-05T10:11:12Z
STAMP_MS = 1_709_633_472_000
DAY_MS = 86_400_000
SOURCE = f"{__name__}.JsonRecordsSourceConnector"
CAST = "org.apache.kafka.connect.transforms.Cast$Value"


class JsonRecordsSourceConnector(SourceConnector):
    """Emits the records listed in the JSON file ``records.file`` once, to ``topic``."""

    def start(self, config: dict[str, str]) -> None:
        self.config = config

    def task_class(self) -> type[SourceTask]:
        return JsonRecordsSourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [dict(self.config)]

    def stop(self) -> None:
        pass


class JsonRecordsSourceTask(SourceTask):
    PARTITION = {"records": "all"}

    def start(self, config: dict[str, str]) -> None:
        self.path = config["records.file"]
        self.topic = config["topic"]
        self.done = self.context.offset_reader.offset(self.PARTITION) is not None

    def poll(self) -> list[SourceRecord] | None:
        if self.done:
            time.sleep(0.2)
            return None
        self.done = True
        specs = json.loads(Path(self.path).read_text())
        return [
            SourceRecord(
                self.PARTITION,
                {"emitted": True},
                self.topic,
                spec["value"],
                key=spec.get("key"),
                headers=list(spec.get("headers", {}).items()),
                timestamp_ms=STAMP_MS,
            )
            for spec in specs
        ]

    def stop(self) -> None:
        pass


PEOPLE = [
    {"id": 1, "name": "alice", "age": "30", "ssn": "111", "born": 0},
    {"id": 2, "name": "bob", "age": "old", "ssn": "222", "born": DAY_MS},
    {"id": 3, "name": "carol", "age": 41, "ssn": "333", "born": 2 * DAY_MS},
]
RECORDS = [
    {"value": json.dumps(PEOPLE[0]), "headers": {"pii": "yes"}},
    {"value": json.dumps(PEOPLE[1])},
    {"value": json.dumps(PEOPLE[2]), "headers": {"pii": "yes"}},
    {"value": None},
    {"value": "garbage"},
]


def transforms(*steps: tuple[str, str, dict[str, str]]) -> dict[str, str]:
    config = {"transforms": ",".join(alias for alias, _, _ in steps)}
    for alias, kind, keys in steps:
        config[f"transforms.{alias}.type"] = kind
        config.update({f"transforms.{alias}.{k}": v for k, v in keys.items()})
    return config


PREDICATES = {
    "predicates": "pii,tomb",
    "predicates.pii.type": "org.apache.kafka.connect.transforms.predicates.HasHeaderKey",
    "predicates.pii.name": "pii",
    "predicates.tomb.type": "RecordIsTombstone",
}


def dead_letters(topic: str) -> dict[str, str]:
    return {
        "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": topic,
        "errors.deadletterqueue.context.headers.enable": "true",
        "errors.log.enable": "true",
    }


class Pipeline:
    def __init__(self, cluster: Cluster, path: Path) -> None:
        self.cluster = cluster
        self.path = path

    def sink(self, name: str, config: dict[str, str]) -> Path:
        out = self.path / f"{name}.txt"
        self.cluster.create(
            name,
            {
                "connector.class": "FileStreamSink",
                "file": str(out),
                "topics": "people",
                "tasks.max": "1",
                **config,
            },
        )
        return out

    def lines(self, name: str) -> list[Any]:
        path = self.path / f"{name}.txt"
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) if line else None for line in text.splitlines()]

    def consume(self, topic: str, count: int) -> list[dict[str, Any]]:
        c = self.cluster
        out = subprocess.run(
            [
                *HERDER, "topics", "consume", topic, "--from-beginning", "--max", str(count),
                "--timeout-ms", "30000", "--bootstrap", c.server.bootstrap,
                "--storage-root", str(c.storage),
            ],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return [json.loads(line) for line in out.stdout.splitlines()]

    def task_state(self, name: str) -> dict[str, Any]:
        tasks = self.cluster.status(name).get("tasks", [])
        return tasks[0] if tasks else {}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    path = tmp_path_factory.mktemp("transforms-pipeline")
    processes = Processes(path)
    try:
        cluster = Cluster(processes, path)
        cluster.start_worker()
        p = Pipeline(cluster, path)
        records_file = path / "records.json"
        records_file.write_text(json.dumps(RECORDS))
        cluster.create(
            "gen",
            {
                "connector.class": SOURCE,
                "records.file": str(records_file),
                "topic": "people-raw",
                **transforms(
                    ("route", "RegexRouter", {"regex": "(.*)-raw", "replacement": "$1"}),
                    ("key", "ValueToKey", {"fields": "id"}),
                    ("tag", "InsertField$Value", {"static.field": "src", "static.value": "gen"}),
                ),
                **dead_letters("gen-dlq"),
            },
        )
        wait_until(
            lambda: _topic_exists(cluster, "people"),
            timeout=120,
            what="the routed topic people",
        )
        p.sink(
            "chain",
            {
                **transforms(
                    ("cast", CAST, {"spec": "age:int32"}),
                    ("mask", "MaskField$Value", {"fields": "ssn", "predicate": "pii"}),
                    ("rename", "ReplaceField$Value", {"renames": "name:full_name",
                                                      "exclude": "src"}),
                    ("insert", "InsertField$Value", {"topic.field": "t", "offset.field": "o"}),
                    ("dropTomb", "Filter", {"predicate": "tomb"}),
                ),
                **PREDICATES,
                **dead_letters("chain-dlq"),
            },
        )  # fmt: skip
        p.sink("strict", transforms(("cast", CAST, {"spec": "age:int32"})))
        p.sink(
            "shape",
            {
                **transforms(
                    ("onlyPii", "Filter", {"predicate": "pii", "negate": "true"}),
                    ("ts", "TimestampConverter$Value",
                     {"field": "born", "target.type": "string", "format": "yyyy-MM-dd"}),
                    ("route", "TimestampRouter",
                     {"topic.format": "${topic}_${timestamp}", "timestamp.format": "yyyy"}),
                    ("ins", "InsertField$Value", {"topic.field": "t"}),
                    ("hoist", "HoistField$Value", {"field": "rec"}),
                ),
                **PREDICATES,
            },
        )  # fmt: skip
        p.sink(
            "names",
            {
                **transforms(
                    ("dropTomb", "Filter", {"predicate": "tomb"}),
                    ("ext", "ExtractField$Value", {"field": "name"}),
                ),
                **PREDICATES,
            },
        )
        for name, count in (("chain", 2), ("shape", 2), ("names", 3)):
            wait_until(
                lambda name=name, count=count: len(p.lines(name)) >= count or _failed(p, name),
                timeout=180,
                what=f"{count} lines from sink {name}",
            )
        yield p
    finally:
        processes.stop_all()


def _topic_exists(cluster: Cluster, topic: str) -> bool:
    out = subprocess.run(
        [*HERDER, "topics", "list", "--bootstrap", cluster.server.bootstrap, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode == 0 and topic in out.stdout


def _failed(p: Pipeline, name: str) -> bool:
    state = p.task_state(name)
    if state.get("state") == "FAILED":
        raise AssertionError(f"sink {name} failed:\n{state.get('trace')}")
    return False


def headers(record: dict[str, Any]) -> dict[str, str]:
    return dict(record.get("headers", []))


def test_source_chain_routes_keys_and_dead_letters(pipeline: Pipeline) -> None:
    people = pipeline.consume("people", 4)
    assert [json.loads(r["key"]) if r["key"] else None for r in people] == [
        {"id": 1},
        {"id": 2},
        {"id": 3},
        None,
    ]
    assert [json.loads(r["value"]) if r["value"] else None for r in people] == [
        {**person, "src": "gen"} for person in PEOPLE
    ] + [None]
    assert headers(people[0]) == {"pii": "yes"}
    [dead] = pipeline.consume("gen-dlq", 1)
    assert dead["value"] == "garbage"
    context = headers(dead)
    assert context["__connect.errors.stage"] == "VALUE_CONVERTER"
    assert context["__connect.errors.class.name"] == "org.apache.kafka.connect.json.JsonConverter"
    assert context["__connect.errors.topic"] == "people-raw"
    assert context["__connect.errors.connector.name"] == "gen"
    assert context["__connect.errors.task.id"] == "0"
    assert "people-raw" not in _topics(pipeline)  # records go straight to the routed topic


def _topics(pipeline: Pipeline) -> list[str]:
    c = pipeline.cluster
    out = subprocess.run(
        [*HERDER, "topics", "list", "--bootstrap", c.server.bootstrap, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [t["name"] for t in json.loads(out.stdout)]


def test_sink_chain_record_by_record_and_cast_failures_to_the_dlq(pipeline: Pipeline) -> None:
    assert pipeline.lines("chain") == [
        {"age": 30, "born": 0, "full_name": "alice", "id": 1, "o": 0, "ssn": "", "t": "people"},
        {"age": 41, "born": 2 * DAY_MS, "full_name": "carol", "id": 3, "o": 2, "ssn": "",
         "t": "people"},
    ]  # fmt: skip
    [dead] = pipeline.consume("chain-dlq", 1)
    assert json.loads(dead["value"]) == {**PEOPLE[1], "src": "gen"}  # as it was read
    assert json.loads(dead["key"]) == {"id": 2}
    assert headers(dead) == {
        "__connect.errors.topic": "people",
        "__connect.errors.partition": "0",
        "__connect.errors.offset": "1",
        "__connect.errors.connector.name": "chain",
        "__connect.errors.task.id": "0",
        "__connect.errors.stage": "TRANSFORMATION",
        "__connect.errors.class.name": CAST,
        "__connect.errors.exception.class.name": "herder.dataplane.errors.RecordError",
        "__connect.errors.exception.message": "cast: Cannot cast field 'age' \"old\" to int32",
    }


def test_tolerance_none_fails_the_task_with_the_cause(pipeline: Pipeline) -> None:
    state = wait_until(
        lambda: (s := pipeline.task_state("strict")).get("state") == "FAILED" and s,
        timeout=120,
        what="the strict sink's task to fail",
    )
    trace = state["trace"]
    assert "Tolerance exceeded in error handler" in trace
    assert CAST in trace and "Cannot cast field 'age'" in trace and "offset=1" in trace
    assert pipeline.lines("strict") == []


def test_filter_with_negated_predicate_timestamps_and_routing(pipeline: Pipeline) -> None:
    expected = [
        {**PEOPLE[0], "src": "gen", "born": "1970-01-01", "t": "people_2024"},
        {**PEOPLE[2], "src": "gen", "born": "1970-01-03", "t": "people_2024"},
    ]
    assert pipeline.lines("shape") == [{"rec": e} for e in expected]


def test_extract_field_after_dropping_tombstones(pipeline: Pipeline) -> None:
    assert pipeline.lines("names") == ["alice", "bob", "carol"]


def test_bad_transform_configs_are_refused_at_creation(pipeline: Pipeline) -> None:
    worker = pipeline.cluster.answering()
    config = {
        "connector.class": "FileStreamSink",
        "file": str(pipeline.path / "never.txt"),
        "topics": "people",
        **transforms(("ts", "TimestampConverter$Value", {"target.type": "string"})),
        "errors.tolerance": "some",
    }
    reply = httpx.post(f"{worker.url}/connectors", json={"name": "bad", "config": config})
    assert reply.status_code == 400, reply.text
    message = reply.json()["message"]
    assert "requires format option" in message and "errors.tolerance" in message
