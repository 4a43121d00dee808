"""Real herder processes for integration tests.

``processes`` starts ``herder …`` (or any command) as a child process bound to
127.0.0.1, waits until a readiness check passes (polling, never sleeping blindly),
and at the end of the test stops every process it started by PID — SIGTERM, then
SIGKILL — even when the test failed. If the test failed, each process's output is
printed so the reason is in the report.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERDER = [sys.executable, "-m", "herder"]


@functools.cache
def _ephemeral_low() -> int:
    """The first port of the range the kernel gives outgoing connections (Linux's)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago, below the range the kernel takes
    outgoing connections' local ports from (a port in it can be taken by any process's
    connection between this pick and the server's bind), and not handed out before."""
    low = _ephemeral_low()
    if low > 11_000:
        for _ in range(1_000):
            port = random.randrange(10_000, low)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> object:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:  # the thing polled may not be up yet
            last_exc = exc
        else:
            if value:
                return value
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or condition}"
        + (f" (last error: {last_exc!r})" if last_exc else "")
    )


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


class Proc:
    """One child process with its output captured to a file."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.env = env
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def dump_stacks(self, timeout: float = 5.0) -> None:
        """Have a running herder process write every thread's stack to its output
        (``SIGUSR1``), and wait until it has."""
        if not self.alive() or self.args[: len(HERDER)] != HERDER:
            return
        before = self.log_path.stat().st_size
        self.signal(signal.SIGCONT)  # a frozen process handles signals once resumed
        self.signal(signal.SIGUSR1)
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: b"(most recent call first)" in self.log_path.read_bytes()[before:],
                timeout=timeout,
                what=f"{self.name}'s stacks",
            )

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(timeout=10)
        self._log.close()
        return self.popen.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Processes:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Proc] = []

    def start(
        self,
        args: list[str],
        *,
        name: str = "herder",
        ready: Callable[[], object] | None = None,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Start ``args`` (prefix with :data:`HERDER` for the CLI) and wait until ready."""
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        index = sum(1 for p in self.started if p.name == name)
        log_path = self.tmp_path / f"{name}-{index}.log"
        proc = Proc(name, args, log_path, full_env)
        self.started.append(proc)
        if ready is not None:

            def check() -> object:
                if not proc.alive():
                    raise AssertionError(
                        f"{name} exited with {proc.popen.returncode}:\n{proc.output()}"
                    )
                return ready()

            wait_until(check, timeout=timeout, what=f"{name} to be ready")
        return proc

    def restart(self, proc: Proc, ready: Callable[[], object] | None = None) -> Proc:
        proc.stop()
        return self.start(proc.args, name=proc.name, ready=ready, env=proc.env)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        failed = any(
            getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
            for when in ("setup", "call")
        )
        if failed:  # what each herder process was doing when the test gave up on it
            for proc in procs.started:
                proc.dump_stacks()
        procs.stop_all()
        if failed:
            for proc in procs.started:
                sys.stderr.write(f"\n----- output of {proc.name} (pid {proc.pid}) -----\n")
                sys.stderr.write(proc.output()[-40000:])
