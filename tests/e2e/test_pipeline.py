"""Data plane I, end to end: real ensemble and worker processes, Spark in every worker.

* 200,000 lines go FileStreamSource → topic → FileStreamSink and arrive byte for byte;
  a second sink connector on the same topic gets them too (fan-out).
* Two workers, numbered lines appended while the pipeline runs, and ``kill -9`` of the
  worker running a task, restarted each time: the sink file holds every line exactly
  once, in order. Once in the default suite; three times, at different points, in
  the ``slow`` one. Lines arriving a few at a time, most batches are staged by the
  worker itself (the trickle path), a restarted source's backlog by Spark.
* A real zombie: the worker running the source task is stopped (SIGSTOP) until its
  task runs and commits on the other worker, then resumed (SIGCONT): its commit is
  refused as FENCED and none of its batch is visible. In the ``slow`` suite a stopped
  sink member's offset commit is refused likewise. The output is exactly once.

Each worker is a JVM (local[1], 512 MB): at most two run at once. Which worker runs a
task comes from the REST status (``worker_id``), and worker ids from the line each
worker prints when it has started (its REST API's ``host:port``, as Connect's; a
restarted worker gets a new port).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.harness import HERDER, Proc, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SESSION_MS = 3000
HEARTBEAT_MS = 300
#: A member sends no heartbeat while its rebalance callback runs, and a worker's
#: callback stops its tasks, waiting up to this long for each: it must stay well under
#: the session timeout, or the two workers expel each other in turn, forever.
TASK_SHUTDOWN_MS = 1000
#: the worker prints this once it has joined its group (see herder.runtime.process)
READY_LINE = re.compile(r"^worker (\S+) REST API at (\S+)$", re.MULTILINE)


@dataclass
class Worker:
    proc: Proc
    worker_id: str
    url: str
    config: Path


class Cluster:
    """One ensemble server and up to two workers sharing a storage root."""

    def __init__(self, processes: Processes, tmp_path: Path) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.storage = tmp_path / "topics"
        # task sessions ask for 30 s: a stopped worker's task must still hold its session
        # when it resumes, so what refuses its commit is its fencing epoch
        self.server: ServerHandle = make_server(
            processes,
            tmp_path,
            maxSessionTimeout=60_000,
            **{"group.min.session.timeout.ms": 1000},
        ).start()
        self.workers: list[Worker] = []
        #: workers stopped with SIGSTOP: they answer no REST request
        self.frozen: set[str] = set()
        self.http = httpx.Client(timeout=60)

    # -- workers ------------------------------------------------------------------------

    def start_worker(
        self, config: Path | None = None, spark: Mapping[str, str] | None = None
    ) -> Worker:
        """Start a worker from ``config``, or from this cluster's defaults with the
        ``spark.*`` settings in ``spark`` in place of local Spark's."""
        if config is None:
            port = free_port()
            props = {
                "group.id": "pipeline",
                "bootstrap.servers": self.server.bootstrap,
                "rest.host.name": "127.0.0.1",
                "rest.port": port,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "rebalance.timeout.ms": 20_000,
                "worker.unsync.backoff.ms": 1000,
                # a killed or frozen worker's task moves at once (the delay has tests
                # of its own)
                "scheduled.rebalance.max.delay.ms": 0,
                "task.shutdown.graceful.timeout.ms": TASK_SHUTDOWN_MS,
                "storage.root": str(self.storage),
                "spark.master": "local[1]",
                "spark.driver.memory": "512m",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
            }
            if spark is not None:
                props = {k: v for k, v in props.items() if not k.startswith("spark.")}
                props.update(spark)
            config = self.tmp_path / f"worker-{port}.properties"
            config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        name = config.stem
        # where Processes.start will put this process's output
        index = sum(1 for p in self.processes.started if p.name == name)
        log_path = self.tmp_path / f"{name}-{index}.log"
        proc = self.processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(config)],
            name=name,
            ready=lambda: READY_LINE.search(log_path.read_text(errors="replace")),
            timeout=120,
        )
        found = READY_LINE.search(proc.output())
        assert found is not None
        worker = Worker(proc, found.group(1), found.group(2), config)
        self.workers.append(worker)
        return worker

    def kill9(self, worker: Worker) -> None:
        worker.proc.kill9()
        self.workers.remove(worker)

    def restart(self, worker: Worker) -> Worker:
        """Start a killed worker again, on a new port: a worker's id is its host:port, so
        a status the killed one left behind is not taken for the new one's."""
        assert not worker.proc.alive()
        return self.start_worker()

    def freeze(self, worker: Worker) -> None:
        worker.proc.signal(signal.SIGSTOP)
        self.frozen.add(worker.worker_id)

    def thaw(self, worker: Worker) -> None:
        worker.proc.signal(signal.SIGCONT)
        self.frozen.discard(worker.worker_id)

    def by_id(self, worker_id: str) -> Worker | None:
        return next((w for w in self.workers if w.worker_id == worker_id), None)

    def answering(self) -> Worker:
        return next(w for w in self.workers if w.worker_id not in self.frozen)

    # -- REST -----------------------------------------------------------------------------

    def create(self, name: str, config: dict[str, str]) -> None:
        reply = self.http.post(
            f"{self.answering().url}/connectors", json={"name": name, "config": config}
        )
        assert reply.status_code == 201, reply.text

    def status(self, name: str) -> dict:  # type: ignore[type-arg]
        url = self.answering().url
        return self.http.get(f"{url}/connectors/{name}/status", timeout=10).json()

    def task_owner(self, name: str) -> Worker | None:
        """The live worker that task 0 of ``name`` is RUNNING on, if there is one."""
        tasks = self.status(name).get("tasks", [])
        if len(tasks) != 1 or tasks[0]["state"] != "RUNNING":
            if tasks and tasks[0]["state"] == "FAILED":
                raise AssertionError(f"task of {name} failed:\n{tasks[0].get('trace')}")
            return None
        return self.by_id(tasks[0]["worker_id"])

    def describe_topic(self, topic: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(
            [*HERDER, "topics", "describe", topic, "--bootstrap", self.server.bootstrap, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)


# -- files ---------------------------------------------------------------------------------


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def numbered(i: int) -> bytes:
    return b"%09d\n" % i


class LineWriter(threading.Thread):
    """Appends numbered lines to a file, ``per_tick`` every ``tick`` seconds, until stopped."""

    def __init__(self, path: Path, per_tick: int = 50, tick: float = 0.05) -> None:
        super().__init__(name="line-writer", daemon=True)
        self.path = path
        self.per_tick = per_tick
        self.tick = tick
        self.written = 0
        self._done = threading.Event()

    def run(self) -> None:
        with open(self.path, "ab") as f:
            while not self._done.wait(self.tick):
                f.write(b"".join(numbered(self.written + i) for i in range(self.per_tick)))
                f.flush()
                self.written += self.per_tick

    def stop(self) -> int:
        self._done.set()
        self.join(timeout=10)
        return self.written


def assert_exactly_once(path: Path, total: int) -> None:
    """``path`` holds lines 0 .. total-1, each once, in order."""
    data = path.read_bytes()
    if data == b"".join(numbered(i) for i in range(total)):
        return
    lines = data.split(b"\n")[:-1]
    seen: dict[int, int] = {}
    for line in lines:
        seen[int(line)] = seen.get(int(line), 0) + 1
    dups = sorted(n for n, c in seen.items() if c > 1)
    gaps = sorted(set(range(total)) - set(seen))
    first_bad = next(
        (i for i, line in enumerate(lines) if line != numbered(i)[:-1]), min(len(lines), total)
    )
    raise AssertionError(
        f"{path.name}: {len(lines)} lines for {total}; {len(dups)} duplicated "
        f"(first {dups[:5]}), {len(gaps)} missing (first {gaps[:5]}); "
        f"first line out of place at {first_bad}"
    )


def source_config(input_file: Path, topic: str) -> dict[str, str]:
    return {
        "connector.class": "FileStreamSource",
        "file": str(input_file),
        "topic": topic,
        "tasks.max": "1",
    }


def sink_config(output_file: Path, topic: str) -> dict[str, str]:
    return {
        "connector.class": "FileStreamSink",
        "file": str(output_file),
        "topics": topic,
        "tasks.max": "1",
    }


# -- 1. 200,000 lines, and fan-out ----------------------------------------------------------

RECORDS = 200_000


@pytest.mark.timeout(600)
def test_200k_lines_arrive_identical_at_two_sinks(cluster: Cluster, tmp_path: Path) -> None:
    input_file = tmp_path / "input.txt"
    with open(input_file, "w") as f:
        for i in range(RECORDS):
            f.write(f"line {i:09d} " + "x" * 80 + "\n")
    outputs = [tmp_path / "out-a.txt", tmp_path / "out-b.txt"]
    cluster.start_worker()
    started = time.monotonic()
    # sinks first: their tasks start no Spark job until there are records, so the
    # rebalances that creating the source causes stop them at once
    cluster.create("lines-sink-a", sink_config(outputs[0], "lines"))
    cluster.create("lines-sink-b", sink_config(outputs[1], "lines"))
    cluster.create("lines-source", source_config(input_file, "lines"))

    first: dict[Path, float] = {}
    failed: list[str] = []

    def delivered() -> bool:
        for out in outputs:
            if out not in first and out.exists() and out.stat().st_size:
                first[out] = time.monotonic()
        for name in ("lines-source", "lines-sink-a", "lines-sink-b"):
            failed.extend(
                f"{name}: {t.get('trace')}"
                for t in cluster.status(name).get("tasks", [])
                if t["state"] == "FAILED"
            )
        return bool(failed) or all(count_lines(out) >= RECORDS for out in outputs)

    wait_until(delivered, timeout=540, interval=0.5, what="200,000 lines at both sinks")
    assert not failed, failed[0]
    seconds = time.monotonic() - started
    expected = input_file.read_bytes()
    for out in outputs:
        assert out.read_bytes() == expected, f"{out.name} differs from the input"
    topic = cluster.describe_topic("lines")
    assert sum(p["end_offset"] for p in topic["partition_details"]) == RECORDS
    flowing = time.monotonic() - min(first.values())
    print(
        json.dumps(
            {
                "test": "200k",
                "records": RECORDS,
                "seconds": round(seconds, 1),
                "records_per_s": round(RECORDS / seconds),
                "seconds_after_first_output": round(flowing, 1),
                "records_per_s_after_first_output": round(RECORDS / flowing),
            }
        )
    )


# -- 2. kill -9 of the worker running the tasks ----------------------------------------------


def numbers_pipeline(
    cluster: Cluster, tmp_path: Path, source: Mapping[str, str] | None = None
) -> tuple[Path, LineWriter]:
    """numbers.txt → topic numbers → numbers-out.txt, with lines being appended
    (``source``: settings of the source connector's config to override)."""
    input_file, output = tmp_path / "numbers.txt", tmp_path / "numbers-out.txt"
    input_file.touch()
    # sink first: its task starts no Spark job until there are records, so the
    # rebalances that creating the source causes stop it at once
    cluster.create("numbers-sink", sink_config(output, "numbers"))
    cluster.create("numbers-source", source_config(input_file, "numbers") | dict(source or {}))
    writer = LineWriter(input_file)
    writer.start()
    return output, writer


def staged_by_pyarrow(storage: Path) -> int:
    """How many staged files under ``storage`` the worker wrote itself with pyarrow
    (the trickle path) rather than Spark: their footers say who wrote them."""
    return sum(
        pq.read_metadata(path).created_by.startswith("parquet-cpp-arrow")
        for path in (storage / "_staging").rglob("*.parquet")
    )


def wait_for_owner(cluster: Cluster, name: str, timeout: float = 120) -> Worker:
    owner = wait_until(
        lambda: cluster.task_owner(name), timeout=timeout, interval=0.2, what=f"{name} RUNNING"
    )
    assert isinstance(owner, Worker)
    return owner


def wait_for_lines(output: Path, at_least: int, timeout: float = 300) -> None:
    wait_until(
        lambda: count_lines(output) >= at_least,
        timeout=timeout,
        interval=0.2,
        what=f"{at_least} lines in {output.name}",
    )


def finish(cluster: Cluster, output: Path, total: int) -> None:
    """Wait for every line; check each is there once, in the file and in the topic."""
    wait_for_lines(output, total)
    assert_exactly_once(output, total)
    topic = cluster.describe_topic("numbers")
    assert sum(p["end_offset"] for p in topic["partition_details"]) == total, (
        "the topic holds a record twice (or lost one)"
    )


#: where each kill -9 lands: the task whose worker dies, and whether it waits for the
#: pipeline to be in full flow (2,000 more lines delivered) or strikes as soon as that
#: task runs again (during its recovery: a fresh Spark session, reaping, a first batch)
KILLS = [
    ("numbers-source", "in full flow"),
    ("numbers-source", "during recovery"),
    ("numbers-sink", "in full flow"),
]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "kills", [1, pytest.param(3, marks=pytest.mark.slow)], ids=["one kill", "three kills"]
)
def test_kill9_of_the_task_worker(cluster: Cluster, tmp_path: Path, kills: int) -> None:
    started = time.monotonic()
    cluster.start_worker()
    cluster.start_worker()
    output, writer = numbers_pipeline(cluster, tmp_path)
    try:
        for name, when in KILLS[:kills]:
            if when == "in full flow":
                wait_for_lines(output, count_lines(output) + 2_000)
            victim = wait_for_owner(cluster, name)
            cluster.kill9(victim)
            cluster.restart(victim)  # two workers again, one of them without a JVM yet
        wait_for_owner(cluster, "numbers-source")
        wait_for_owner(cluster, "numbers-sink")
        wait_for_lines(output, count_lines(output) + 2_000)
    finally:
        total = writer.stop()
    finish(cluster, output, total)
    # a line at a time, batches are small: the worker staged them itself (the trickle
    # path, on by default) where no kill left a backlog, and exactly once held for them
    assert staged_by_pyarrow(cluster.storage), "no batch took the trickle path"
    print(
        json.dumps(
            {
                "test": f"kill9 x{kills}",
                "lines": total,
                "seconds": round(time.monotonic() - started),
            }
        )
    )


# -- 3. zombies --------------------------------------------------------------------------------

#: what a sink task logs when the coordinator refuses its offset commit
SINK_COMMIT_REFUSED = re.compile(
    r"sink task numbers-sink-0: (offset )?commit.* refused.*"
    r"(ILLEGAL_GENERATION|UNKNOWN_MEMBER_ID|REBALANCE_IN_PROGRESS)"
)
SOURCE_FENCED = re.compile(
    r"source task numbers-source-0 \(epoch \d+\): commit .* refused \(FENCED"
)


def log_of(worker: Worker) -> str:
    return worker.proc.output()


#: the source's connector class in the zombie test: its task can be held with a batch in
#: hand (see the fixture), so the zombie resumes with a commit still to make
GATED_SOURCE = "tests.fixtures.connectors.GatedFileStreamSourceConnector"


def hold_a_batch(worker: Worker, gates: Path) -> None:
    """Have the task of the gated source on ``worker`` hold the next batch it polls
    until :func:`release_batch`; return once it does."""
    (gates / f"hold-{worker.proc.pid}").touch()
    wait_until(
        lambda: (gates / f"held-{worker.proc.pid}").exists(),
        timeout=60,
        interval=0.05,
        what="the source task to hold a batch it polled",
    )


def release_batch(worker: Worker, gates: Path) -> None:
    (gates / f"hold-{worker.proc.pid}").unlink()


def stop_until_moved(
    cluster: Cluster,
    name: str,
    output: Path,
    reach: Callable[[], int],
    before: Callable[[Worker], None] = lambda _: None,
) -> Worker:
    """SIGSTOP the worker running ``name``'s task (after ``before(worker)``) until that
    task is RUNNING on the other worker and ``output`` holds more lines than the
    stopped one could have got there (``reach()``, taken once it is stopped); return
    it, still stopped."""
    zombie = wait_for_owner(cluster, name)
    before(zombie)
    cluster.freeze(zombie)
    beyond = reach()
    other = cluster.answering()
    wait_until(
        lambda: cluster.task_owner(name) is other and count_lines(output) > beyond,
        timeout=120,
        interval=0.2,
        what=f"{name} to run and commit on the other worker",
    )
    return zombie


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "sink_too",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["source", "source and sink"],
)
def test_a_resumed_zombie_is_fenced(cluster: Cluster, tmp_path: Path, sink_too: bool) -> None:
    started = time.monotonic()
    cluster.start_worker()
    cluster.start_worker()
    gates = tmp_path / "gates"
    gates.mkdir()
    output, writer = numbers_pipeline(
        cluster, tmp_path, {"connector.class": GATED_SOURCE, "gate.dir": str(gates)}
    )
    try:
        wait_for_lines(output, 2_000)

        # Source: stopped with a batch polled and not committed (held for that, then
        # let go while it is stopped); its task runs on the other worker and commits
        # lines that were not in the file yet when it stopped. (the file may hold one
        # more tick of lines than ``written`` says yet)
        zombie = stop_until_moved(
            cluster,
            "numbers-source",
            output,
            lambda: writer.written + writer.per_tick,
            before=lambda worker: hold_a_batch(worker, gates),
        )
        release_batch(zombie, gates)
        cluster.thaw(zombie)
        wait_until(
            lambda: SOURCE_FENCED.search(log_of(zombie)),
            timeout=60,
            what="the resumed source task's commit to be refused as FENCED",
        )

        if sink_too:
            # The worker's ensemble session expired while it was stopped and a worker
            # never opens a new one, so it publishes no status any more: restart it.
            cluster.workers.remove(zombie)
            zombie.proc.stop()
            cluster.restart(zombie)
            # Sink: stopped; its task delivers from the other worker; resumed, its
            # member's offset commit is refused.
            wait_for_lines(output, count_lines(output) + 1_000)
            zombie = stop_until_moved(cluster, "numbers-sink", output, lambda: count_lines(output))
            cluster.thaw(zombie)
            wait_until(
                lambda: SINK_COMMIT_REFUSED.search(log_of(zombie)),
                timeout=60,
                what="the resumed sink member's offset commit to be refused",
            )
        wait_for_lines(output, count_lines(output) + 1_000)
    finally:
        total = writer.stop()
    finish(cluster, output, total)
    print(
        json.dumps(
            {
                "test": "zombie sink" if sink_too else "zombie",
                "lines": total,
                "seconds": round(time.monotonic() - started),
            }
        )
    )


# -- static workers: a restart rebalances no sink group either ------------------------------


@pytest.mark.timeout(600)
def test_a_static_workers_restart_keeps_its_sink_tasks_group_membership(
    processes: Processes, tmp_path: Path
) -> None:
    """A static worker (``group.instance.id``) restarted within its session timeout: its
    sink task's membership of ``connect-<sink>`` carries an instance id derived from the
    worker's, so the new process takes the place back — same generation, no rebalance of
    the sink group — and the output stays exactly once."""
    cluster = Cluster(processes, tmp_path)
    port = free_port()
    props = {
        "group.id": "static-pipeline",
        "group.instance.id": "w1",
        "bootstrap.servers": cluster.server.bootstrap,
        "rest.host.name": "127.0.0.1",
        "rest.port": port,
        # room for a process with a JVM to stop and start again
        "session.timeout.ms": 45_000,
        "heartbeat.interval.ms": 1000,
        "rebalance.timeout.ms": 20_000,
        "task.shutdown.graceful.timeout.ms": TASK_SHUTDOWN_MS,
        "storage.root": str(cluster.storage),
        "spark.master": "local[1]",
        "spark.driver.memory": "512m",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    config = tmp_path / "static-worker.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    worker = cluster.start_worker(config)
    input_file, output_file = tmp_path / "in.txt", tmp_path / "out.txt"
    input_file.write_bytes(b"".join(numbered(i) for i in range(1_000)))
    cluster.create("in", source_config(input_file, "numbers"))
    cluster.create("out", sink_config(output_file, "numbers"))
    wait_until(lambda: count_lines(output_file) >= 1_000, 180, what="the first lines")

    def describe() -> dict:  # type: ignore[type-arg]
        bootstrap = cluster.server.bootstrap
        out = subprocess.run(
            [*HERDER, "groups", "describe", "connect-out", "--bootstrap", bootstrap, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    before = describe()
    assert before["state"] == "Stable", before
    assert [m["group_instance_id"] for m in before["members"]] == ["w1-out-0"], before

    assert worker.proc.stop() == 0, worker.proc.output()[-3000:]
    cluster.workers.remove(worker)
    with open(input_file, "ab") as f:
        f.write(b"".join(numbered(i) for i in range(1_000, 2_000)))
    cluster.start_worker(config)
    wait_until(lambda: count_lines(output_file) >= 2_000, 180, what="the lines written meanwhile")
    after = describe()
    # the same place in the same generation: the sink group did not rebalance
    assert after["generation"] == before["generation"], (before, after)
    assert [m["group_instance_id"] for m in after["members"]] == ["w1-out-0"], after
    assert_exactly_once(output_file, 2_000)
