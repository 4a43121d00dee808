"""``herder quickstart``: everything in one process, a pipeline, a verified result.

A one-server ensemble in a temporary directory, one worker with local Spark, an input
file of generated lines, FileStreamSource → topic → FileStreamSink with a live progress
bar; then the output is compared with the input and a summary printed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import click
import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from herder.cli.output import console
from herder.errors import HerderError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


@click.command()
@click.option("--records", default=200_000, show_default=True, help="Lines to generate.")
@click.option("--keep-running", is_flag=True, help="Stay up afterwards for exploring.")
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Working directory (default: a new temporary one, removed at the end).",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the result.")
def quickstart(records: int, keep_running: bool, workdir: Path | None, timeout: float) -> None:
    """Run a file → topic → file pipeline on an embedded ensemble and local Spark."""
    created = workdir is None
    root = workdir or Path(tempfile.mkdtemp(prefix="herder-quickstart-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        ok = asyncio.run(_run(root, records, keep_running, timeout))
    finally:
        if created and not keep_running:
            shutil.rmtree(root, ignore_errors=True)
    if not ok:
        raise HerderError("the output file does not match the input")


async def _run(root: Path, records: int, keep_running: bool, timeout: float) -> bool:
    from herder.coordinator.config import CoordinatorConfig
    from herder.coordinator.server import ensemble_server
    from herder.dataplane.execution import TaskExecutions
    from herder.ensemble.config import EnsembleConfig
    from herder.runtime.process import WorkerProcess

    out = console()
    input_file, output_file = root / "input.txt", root / "output.txt"
    with open(input_file, "w") as f:
        for i in range(records):
            f.write(f"line {i:09d} " + "x" * 80 + "\n")
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", ""))
    ensemble = ensemble_server(
        EnsembleConfig.from_properties(
            {"dataDir": str(root / "ensemble"), "clientPort": "0", "clientPortAddress": "127.0.0.1"}
        ),
        CoordinatorConfig(group_min_session_timeout_ms=1000),
    )
    await ensemble.start()
    bootstrap = f"127.0.0.1:{ensemble.port}"
    worker = WorkerProcess(
        {
            "group.id": "quickstart",
            "bootstrap.servers": bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": str(_free_port()),
            "storage.root": str(root / "topics"),
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "spark.master": "local[*]",
            "spark.driver.memory": "1g",
        },
        TaskExecutions,
    )
    started = time.monotonic()
    try:
        await worker.start()
        out.print(
            f"[bold]herder quickstart[/bold]: ensemble at {bootstrap}, REST API at {worker.url}"
        )
        async with httpx.AsyncClient(base_url=worker.url, timeout=60) as http:
            source = {"connector.class": "FileStreamSource", "file": str(input_file)}
            sink = {"connector.class": "FileStreamSink", "file": str(output_file)}
            for name, config in (
                ("quickstart-source", {**source, "topic": "quickstart", "tasks.max": "1"}),
                ("quickstart-sink", {**sink, "topics": "quickstart", "tasks.max": "1"}),
            ):
                reply = await http.post("/connectors", json={"name": name, "config": config})
                if reply.status_code != 201:
                    raise HerderError(f"creating {name} failed: {reply.text}")
            done = await _progress(out, output_file, records, timeout, http)
        seconds = time.monotonic() - started
        same = done and _count_lines(output_file) == records and _same(input_file, output_file)
        rate = records / seconds if seconds else 0.0
        out.print(
            f"{'[green]verified[/green]' if same else '[red]MISMATCH[/red]'}: {records:,} records"
            f" in {seconds:.1f} s ({rate:,.0f} records/s)\n"
            f"  input  {input_file}\n  output {output_file}\n  topics {root / 'topics'}\n"
            f"  REST   {worker.url}  (try {worker.url}/connectors?expand=status)"
            f"\n  UI     {worker.url}/ui   (and: herder status --url {worker.url})"
        )
        if keep_running:
            out.print("running until Ctrl-C ...")
            await asyncio.Event().wait()
        return bool(same)
    finally:
        await worker.stop()
        await ensemble.stop()
        from herder.dataplane.spark import stop_spark

        await asyncio.to_thread(stop_spark)


async def _progress(
    out: object, output: Path, records: int, timeout: float, http: httpx.AsyncClient
) -> bool:
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,  # type: ignore[arg-type]
        transient=False,
    ) as progress:
        bar = progress.add_task("records delivered", total=records)
        while time.monotonic() < deadline:
            count = await asyncio.to_thread(_count_lines, output)
            progress.update(bar, completed=count)
            if count >= records:
                return True
            status = (await http.get("/connectors?expand=status")).json()
            for name, entry in status.items():
                for t in entry["status"]["tasks"]:
                    if t["state"] == "FAILED":
                        raise HerderError(f"{name} task {t['id']} failed:\n{t.get('trace', '')}")
            await asyncio.sleep(0.25)
    return False


def _same(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True
