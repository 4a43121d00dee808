"""The web console at ``/ui``, end to end in headless Chromium against a real worker.

A file pipeline is created from the console's form (after a config the validate
endpoint refuses shows its error inline), its records counter climbs to the input's
size and its lag to 0, and it is paused and resumed from the console's buttons; a task
that fails shows its trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_pipeline import Cluster, count_lines
from tests.harness import Processes
from tests.ops.browser import page, screenshot_dir

__all__ = ["page"]

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

N = 5_000
WAIT_MS = 120_000


@pytest.fixture
def cluster(processes: Processes, tmp_path: Path) -> Cluster:
    c = Cluster(processes, tmp_path)
    yield c
    c.http.close()


def create(page: Any, name: str, klass: str, config: str) -> None:
    page.get_by_test_id("create-name").fill(name)
    page.get_by_test_id("create-class").select_option(klass)
    page.get_by_test_id("create-config").fill(config)
    page.get_by_test_id("create").click()
    page.get_by_test_id("create-result").get_by_text(f"created {name}").wait_for(timeout=30_000)


def test_a_pipeline_made_watched_paused_and_resumed_from_the_console(
    cluster: Cluster, page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    shots = screenshot_dir(tmp_path)
    worker = cluster.start_worker()
    source_file = tmp_path / "in.txt"
    source_file.write_bytes(b"".join(b"line %d\n" % i for i in range(N)))
    out = tmp_path / "out.txt"

    page.goto(f"{worker.url}/ui")
    expect(page.get_by_test_id("worker-id")).to_have_text(f"worker {worker.worker_id}")
    expect(page.get_by_test_id("health")).to_have_text("healthy", timeout=30_000)
    expect(
        page.get_by_test_id("workers").locator(f"tr[data-worker='{worker.worker_id}']")
    ).to_have_count(1)
    expect(page.get_by_test_id("ensemble")).to_contain_text("standalone")
    plugins = {p["class"] for p in httpx.get(f"{worker.url}/connector-plugins").json()}
    source_class = next(
        c for c in plugins if c.endswith("FileStreamSourceConnector") or c == "FileStreamSource"
    )
    sink_class = next(
        c for c in plugins if c.endswith("FileStreamSinkConnector") or c == "FileStreamSink"
    )

    # a config the validate endpoint refuses: its error appears next to the form, inline
    page.get_by_test_id("create-name").fill("in")
    page.get_by_test_id("create-class").select_option(source_class)
    page.get_by_test_id("create-config").fill(f"file={source_file}\ntopic=lines\ntasks.max=many")
    page.get_by_test_id("create").click()
    error = page.get_by_test_id("error-tasks.max")
    expect(error).to_contain_text("tasks.max")
    page.screenshot(path=str(shots / "console-validation.png"), full_page=True)
    assert httpx.get(f"{worker.url}/connectors").json() == []

    # the sink first, then the source (each creation rebalances; the counters are the
    # last incarnation's)
    create(page, "out", sink_class, f"file={out}\ntopics=lines\ntasks.max=1")
    expect(page.get_by_test_id("task-state-out-0").locator(".pill")).to_have_text(
        "RUNNING", timeout=WAIT_MS
    )
    create(page, "in", source_class, f"file={source_file}\ntopic=lines\ntasks.max=1")
    expect(page.get_by_test_id("state-in").locator(".pill")).to_have_text(
        "RUNNING", timeout=WAIT_MS
    )
    expect(page.get_by_test_id("records-in-0")).to_have_text(str(N), timeout=WAIT_MS)
    expect(page.get_by_test_id("records-out-0")).to_have_text(str(N), timeout=WAIT_MS)
    expect(page.get_by_test_id("lag-out-0")).to_have_text("0", timeout=WAIT_MS)
    expect(page.get_by_test_id("dlq-out-0")).to_have_text("0")
    assert count_lines(out) == N
    expect(page.get_by_test_id(f"worker-tasks-{worker.worker_id}")).to_have_text("2")
    # the group's rebalances, with the coordinator's reason for each
    expect(page.get_by_test_id("timeline").locator("li").first).to_contain_text("generation")
    expect(page.get_by_test_id("timeline")).to_contain_text("joined")
    page.screenshot(path=str(shots / "console-running.png"), full_page=True)

    # pause and resume from the console
    page.get_by_test_id("pause-in").click()
    expect(page.get_by_test_id("state-in").locator(".pill")).to_have_text("PAUSED", timeout=WAIT_MS)
    expect(page.get_by_test_id("task-state-in-0").locator(".pill")).to_have_text(
        "PAUSED", timeout=WAIT_MS
    )
    page.screenshot(path=str(shots / "console-paused.png"), full_page=True)
    assert cluster.status("in")["connector"]["state"] == "PAUSED"
    page.get_by_test_id("resume-in").click()
    expect(page.get_by_test_id("state-in").locator(".pill")).to_have_text(
        "RUNNING", timeout=WAIT_MS
    )
    expect(page.get_by_test_id("task-state-in-0").locator(".pill")).to_have_text(
        "RUNNING", timeout=WAIT_MS
    )
    assert cluster.status("in")["connector"]["state"] == "RUNNING"

    # what is appended while it runs again gets through, and the console shows it
    with open(source_file, "ab") as f:
        f.write(b"".join(b"more %d\n" % i for i in range(100)))
    expect(page.get_by_test_id("records-out-0")).to_have_text(str(N + 100), timeout=WAIT_MS)
    expect(page.get_by_test_id("lag-out-0")).to_have_text("0", timeout=WAIT_MS)

    # a task that fails shows FAILED with its trace
    cluster.create(
        "broken",
        {
            "connector.class": sink_class,
            "file": str(tmp_path),  # a directory: the task cannot open it to write
            "topics": "lines",
        },
    )
    failed = page.get_by_test_id("task-state-broken-0")
    expect(failed.locator(".pill")).to_have_text("FAILED", timeout=WAIT_MS)
    failed.locator("summary").click()
    expect(failed.locator("pre")).to_contain_text("IsADirectoryError")
