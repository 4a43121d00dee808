"""``kill -USR1 <pid>`` makes a herder process write every thread's stack to its output
and carry on: how a hung test's processes show what they were doing (the test harness
sends it to each of them when a test fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import Processes
from tests.integration.conftest import make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_sigusr1_dumps_every_threads_stack_and_the_process_carries_on(
    processes: Processes, tmp_path: Path
) -> None:
    server = make_server(processes, tmp_path).start()
    assert server.proc is not None
    server.proc.dump_stacks()
    output = server.proc.output()
    assert "(most recent call first)" in output
    assert "Current thread" in output or "Thread 0x" in output
    assert server.proc.alive()
