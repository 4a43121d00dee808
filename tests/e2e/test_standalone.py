"""``herder standalone``: one process, an embedded ensemble, connectors from files.

* A FileStreamSource (properties file) and a FileStreamSink (Connect's JSON form) come
  up from their files, the REST API answers, and the pipeline delivers; the process is
  stopped, lines are appended meanwhile, and after the restart the sink file holds
  every line exactly once: source offsets, sink offsets and the topic all survived.
* Without Spark: a changed connector file updates its connector at the next start, an
  unchanged one is kept as it is, a flat JSON file works, and the user's mistakes (no
  data directory, a connector file without a name, an invalid connector) are one line.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.harness import HERDER, Proc, Processes, free_port, port_open, wait_until

pytestmark = [pytest.mark.integration]

#: what the process prints once its connectors from files exist
READY_LINE = re.compile(r"^standalone worker (\S+) REST API at (\S+); ensemble at (\S+)", re.M)
MARKER = "tests.fixtures.connectors.MarkerSourceConnector"


def write_properties(path: Path, props: dict[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def start_standalone(processes: Processes, tmp_path: Path, args: list[str]) -> tuple[Proc, str]:
    """Start ``herder standalone ARGS…``; (process, REST URL) once it says it is ready."""
    name = "standalone"
    index = sum(1 for p in processes.started if p.name == name)
    log_path = tmp_path / f"{name}-{index}.log"
    proc = processes.start(
        [*HERDER, "--log-level", "INFO", "standalone", *args],
        name=name,
        ready=lambda: READY_LINE.search(log_path.read_text(errors="replace")),
        timeout=180,
    )
    found = READY_LINE.search(proc.output())
    assert found is not None
    return proc, found.group(2)


def numbered(i: int) -> bytes:
    return b"%09d\n" % i


def append_lines(path: Path, start: int, count: int) -> int:
    with open(path, "ab") as f:
        f.write(b"".join(numbered(i) for i in range(start, start + count)))
    return start + count


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def failed_tasks(url: str, names: list[str]) -> list[str]:
    failed = []
    for name in names:
        status = httpx.get(f"{url}/connectors/{name}/status", timeout=10).json()
        failed += [
            f"{name}-{t['id']}: {t.get('trace')}"
            for t in status.get("tasks", [])
            if t["state"] == "FAILED"
        ]
    return failed


def wait_for_lines(url: str, output: Path, total: int) -> None:
    names = ["file-source", "file-sink"]

    def arrived() -> bool:
        failed = failed_tasks(url, names)
        assert not failed, failed[0]
        return count_lines(output) >= total

    wait_until(arrived, timeout=240, interval=0.5, what=f"{total} lines in {output.name}")


@pytest.mark.spark
@pytest.mark.timeout(720)
def test_file_pipeline_from_files_keeps_offsets_across_a_restart(
    processes: Processes, tmp_path: Path
) -> None:
    input_file, output = tmp_path / "input.txt", tmp_path / "output.txt"
    written = append_lines(input_file, 0, 500)
    rest_port = free_port()
    worker = write_properties(
        tmp_path / "worker.properties",
        {
            # copied from a Kafka installation: these two are ignored, with a log line
            "bootstrap.servers": "localhost:9092",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.storage.file.filename": tmp_path / "connect.offsets",
            "rest.host.name": "127.0.0.1",
            "rest.port": rest_port,
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 300,
            "task.shutdown.graceful.timeout.ms": 1000,
            "spark.master": "local[1]",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    source = write_properties(
        tmp_path / "connect-file-source.properties",
        {
            "name": "file-source",
            "connector.class": "FileStreamSource",
            "tasks.max": 1,
            "file": input_file,
            "topic": "lines",
        },
    )
    sink = tmp_path / "connect-file-sink.json"
    sink.write_text(
        json.dumps(
            {
                "name": "file-sink",
                "config": {
                    "connector.class": "FileStreamSink",
                    "tasks.max": 1,
                    "file": str(output),
                    "topics": "lines",
                },
            }
        )
    )
    args = [str(worker), str(source), str(sink)]
    proc, url = start_standalone(processes, tmp_path, args)
    assert url == f"http://127.0.0.1:{rest_port}"
    assert sorted(httpx.get(f"{url}/connectors", timeout=10).json()) == ["file-sink", "file-source"]
    info = httpx.get(f"{url}/connectors/file-sink", timeout=10).json()
    assert info["type"] == "sink" and info["config"]["topics"] == "lines"
    assert info["config"]["name"] == "file-sink"
    assert (tmp_path / "connect.offsets.d" / "ensemble").is_dir()
    wait_for_lines(url, output, written)
    written = append_lines(input_file, written, 300)
    wait_for_lines(url, output, written)
    first_worker = READY_LINE.search(proc.output())

    # stopped: lines appended meanwhile must arrive after the restart, once each
    assert proc.stop() == 0
    written = append_lines(input_file, written, 700)
    proc, url = start_standalone(processes, tmp_path, args)
    second = proc.output()
    assert "connector file-source from" in second and "same config; kept" in second
    assert READY_LINE.search(second) != first_worker
    wait_for_lines(url, output, written)
    written = append_lines(input_file, written, 200)
    wait_for_lines(url, output, written)
    expected = b"".join(numbered(i) for i in range(written))
    assert output.read_bytes() == expected
    assert output.read_bytes() == input_file.read_bytes()


# -- without Spark --------------------------------------------------------------------------


def marker_worker(tmp_path: Path, **extra: object) -> tuple[Path, int]:
    port = free_port()
    path = write_properties(
        tmp_path / "worker.properties",
        {
            "data.dir": tmp_path / "data",
            "rest.host.name": "127.0.0.1",
            "rest.port": port,
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 300,
            "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
            **extra,
        },
    )
    return path, port


def connector_status(url: str, name: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{url}/connectors/{name}/status", timeout=10).json()


def running(url: str, name: str, tasks: int) -> bool:
    st = connector_status(url, name)
    return (
        st.get("connector", {}).get("state") == "RUNNING"
        and [t["state"] for t in st["tasks"]] == ["RUNNING"] * tasks
    )


@pytest.mark.timeout(180)
def test_connector_files_create_keep_and_update(processes: Processes, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    worker, port = marker_worker(tmp_path)
    first = write_properties(
        tmp_path / "first.properties",
        {"name": "first", "connector.class": MARKER, "tasks.max": 2, "marker.dir": markers},
    )
    # a flat JSON config map, with a number where Connect's JSON would have a string
    second = tmp_path / "second.json"
    second.write_text(
        json.dumps(
            {
                "name": "second",
                "connector.class": MARKER,
                "tasks.max": 1,
                "marker.dir": str(markers),
            }
        )
    )
    proc, url = start_standalone(processes, tmp_path, [str(worker), str(first), str(second)])
    assert url == f"http://127.0.0.1:{port}"
    wait_until(
        lambda: running(url, "first", 2) and running(url, "second", 1),
        timeout=60,
        what="both connectors RUNNING",
    )
    assert httpx.get(f"{url}/connectors/second/config", timeout=10).json() == {
        "name": "second",
        "connector.class": MARKER,
        "tasks.max": "1",
        "marker.dir": str(markers),
    }
    # a connector created over REST lives on across restarts too
    extra = {"connector.class": MARKER, "tasks.max": "1", "marker.dir": str(markers)}
    reply = httpx.post(f"{url}/connectors", json={"name": "by-rest", "config": extra}, timeout=60)
    assert reply.status_code == 201, reply.text
    assert proc.stop() == 0

    write_properties(
        first,
        {"name": "first", "connector.class": MARKER, "tasks.max": 3, "marker.dir": markers},
    )
    proc, url = start_standalone(processes, tmp_path, [str(worker), str(first), str(second)])
    log = proc.output()
    assert f"connector first from {first} updated" in log
    assert f"connector second from {second} exists with the same config; kept" in log
    wait_until(
        lambda: (
            running(url, "first", 3) and running(url, "second", 1) and running(url, "by-rest", 1)
        ),
        timeout=60,
        what="first with three tasks, the others as they were",
    )
    assert sorted(httpx.get(f"{url}/connectors", timeout=10).json()) == [
        "by-rest",
        "first",
        "second",
    ]
    wait_until(
        lambda: (
            sorted(p.name for p in markers.iterdir())
            == ["by-rest-0", "first-0", "first-1", "first-2", "second-0"]
        ),
        timeout=30,
        what="a marker per running task",
    )


@pytest.mark.timeout(180)
def test_back_after_kill_9(processes: Processes, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    worker, _ = marker_worker(tmp_path)
    connector = write_properties(
        tmp_path / "marker.properties",
        {"name": "m", "connector.class": MARKER, "tasks.max": 2, "marker.dir": markers},
    )
    proc, url = start_standalone(processes, tmp_path, [str(worker), str(connector)])
    wait_until(lambda: running(url, "m", 2), timeout=60, what="m RUNNING")
    proc.kill9()
    # the killed worker is still a member of the group stored in the ensemble: the new
    # one joins that group once the old member's session expires, and leads it
    proc, url = start_standalone(processes, tmp_path, [str(worker), str(connector)])
    assert "same config; kept" in proc.output()
    found = READY_LINE.search(proc.output())
    assert found is not None

    def on_the_new_worker() -> bool:
        # the new worker has the old one's id (its REST host:port), so which process
        # runs the tasks is told by their marker files, which hold its pid
        tasks = [markers / f"m-{i}" for i in range(2)]
        return (
            running(url, "m", 2)
            and connector_status(url, "m")["connector"]["worker_id"] == found.group(1)
            and all(t.exists() and t.read_text().strip() == str(proc.pid) for t in tasks)
        )

    wait_until(on_the_new_worker, timeout=60, what="m RUNNING on the new worker")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HERDER, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_mistakes_are_one_line(tmp_path: Path) -> None:
    no_dir = write_properties(tmp_path / "no-dir.properties", {"rest.port": free_port()})
    out = run_cli("standalone", str(no_dir))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "data.dir" in out.stderr and "offset.storage.file.filename" in out.stderr

    worker, port = marker_worker(tmp_path)
    nameless = write_properties(tmp_path / "nameless.properties", {"connector.class": MARKER})
    out = run_cli("standalone", str(worker), str(nameless))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "nameless.properties: the connector has no name" in out.stderr

    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x", ')
    out = run_cli("standalone", str(worker), str(broken))
    assert out.returncode == 1 and "broken.json: not valid JSON" in out.stderr

    invalid = write_properties(
        tmp_path / "invalid.properties", {"name": "bad", "connector.class": "NoSuchConnector"}
    )
    out = run_cli("standalone", str(worker), str(invalid))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "invalid.properties" in out.stderr and "NoSuchConnector" in out.stderr
    # it let go of what it had started: the REST port is free again
    assert not port_open(port)
