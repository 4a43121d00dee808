"""What every benchmark needs around the thing it measures.

Servers run as child processes bound to 127.0.0.1, started with their output in a log
file and stopped by PID (SIGTERM, then SIGKILL) in ``finally`` blocks, so neither a
failure nor Ctrl-C leaves one behind. CPU time is read from ``/proc/<pid>/stat`` so a
benchmark can say how much CPU a server spent on the work it did, whatever language the
server is written in. Load comes from client processes (``multiprocessing``, spawn) that
report over a queue and count what they complete inside one shared measured
:class:`Window`. Figures go to stdout as one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import platform
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench import provenance

T = TypeVar("T")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1
# Looked up now, not in the forked child, where loading a library is not safe.
_prctl: Callable[..., int] | None = None
with contextlib.suppress(OSError, AttributeError):
    _prctl = ctypes.CDLL(None, use_errno=True).prctl


def progress(message: str) -> None:
    """One line of human progress on stderr (stdout is kept for the JSON figures)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit_json(figures: dict[str, Any], *, pretty: bool = False) -> None:
    """Print the benchmark's figures as one JSON object on stdout."""
    print(json.dumps(figures, indent=2 if pretty else None), flush=True)


def check_counts(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    positive: Sequence[str] = (),
    non_negative: Sequence[str] = (),
) -> None:
    """Refuse (through ``parser``) an option among ``positive`` that is not above zero,
    or among ``non_negative`` that is below it."""
    for name in positive:
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    for name in non_negative:
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")


def run_and_emit(run: Callable[[], dict[str, Any]], *, pretty: bool = False) -> int:
    """Run a benchmark and print its figures; Ctrl-C or SIGTERM stops it (and, through
    its ``finally`` blocks, every process it started) with status 130."""
    return run_and_report(lambda: (run(), 0), pretty=pretty)


def run_and_report(run: Callable[[], tuple[dict[str, Any], int]], *, pretty: bool = False) -> int:
    """:func:`run_and_emit` for a benchmark that also says how it went: its exit status
    (non-zero when a run went wrong, with the figures printed all the same).

    Every benchmark's figures go out through here, stamped with the commit measured and
    the machine's load before and after (see :mod:`bench.provenance`)."""
    started = provenance.Provenance()
    with sigterm_as_interrupt():
        try:
            figures, status = run()
        except KeyboardInterrupt:
            progress("interrupted: every process the benchmark started was stopped")
            return 130
    emit_json(started.stamp(figures), pretty=pretty)
    return status


# -- ports and polling -------------------------------------------------------------------


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_until(
    condition: Callable[[], object], *, timeout: float, what: str, interval: float = 0.1
) -> object:
    """Poll ``condition`` until it returns something truthy; raise after ``timeout`` s.

    Exceptions from ``condition`` count as "not yet" (the thing polled may still be
    starting); the last one is named in the error if time runs out.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:
            last_exc = exc
        else:
            if value:
                return value
        time.sleep(interval)
    detail = f" (last error: {last_exc})" if last_exc else ""
    raise TimeoutError(f"{what} did not happen within {timeout:.0f}s{detail}")


# -- processes ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM us if the benchmark is killed -9."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Service:
    """One server process with its output captured in a log file; stop it by PID."""

    def __init__(self, name: str, args: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Its own process group keeps the terminal's Ctrl-C away from it: the benchmark
        # stops it in order instead of racing its exit. It stays in the benchmark's
        # session, so the scheduler treats server and clients as one group (autogroup).
        self.popen = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            process_group=0,
            preexec_fn=_die_with_parent if _prctl is not None else None,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        """Raise, quoting the end of its log, if the process has exited."""
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with status {self.popen.returncode}; "
                f"the end of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_size(self) -> int:
        """How many bytes its log has now: where the next run of the same service starts."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """What its log gained after ``offset`` (from :meth:`log_size`)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> int | None:
        """SIGKILL at once (a crash, not a shutdown) and reap it; return the exit status."""
        try:
            if self.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        finally:
            self._log.close()
        return self.popen.returncode

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; return the exit status."""
        try:
            if self.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGTERM)
                try:
                    self.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    self.popen.wait(timeout=10)
        finally:
            self._log.close()
        return self.popen.returncode


class Services:
    """Every service a benchmark started; :meth:`stop_all` stops them newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Service] = []

    def start(self, name: str, args: Sequence[str], *, cwd: Path | None = None) -> Service:
        service = Service(name, args, self.log_dir / f"{name}.log", cwd or self.log_dir)
        self.started.append(service)
        return service

    def stop_all(self) -> None:
        while self.started:
            service = self.started.pop()
            try:
                service.stop()
            except Exception as exc:
                progress(f"could not stop {service.name} (pid {service.pid}): {exc}")

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt, so ``finally`` blocks run as on Ctrl-C."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Start child processes in this block so they ignore Ctrl-C from their first moment.

    The terminal sends Ctrl-C to the whole foreground process group; the benchmark
    handles it and stops its children itself, which would otherwise die mid-import with
    tracebacks. An ignored signal stays ignored across exec, and Python then installs no
    handler of its own. Keep the block short: the parent ignores Ctrl-C while in it.
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# -- client processes -------------------------------------------------------------------


@dataclass
class Tally:
    """Operations a client process completed inside the measured window (thread-safe)."""

    ops: int = 0
    errors: int = 0
    first_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def completed(self, start: float, stop: float) -> None:
        now = time.monotonic()
        if start <= now < stop:
            with self._lock:
                self.ops += 1

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if not self.first_error:
                self.first_error = f"{type(exc).__name__}: {exc}"

    def report(self) -> dict[str, Any]:
        return {"ops": self.ops, "errors": self.errors, "first_error": self.first_error}


class Window:
    """The measured interval, set by the benchmark once every client process is ready.

    Clients start their load when ``go`` is set and count what completes between
    ``start`` and ``stop`` (``time.monotonic``, one clock for every process on Linux);
    the time before ``start`` is the warm-up.
    """

    def __init__(self, ctx: multiprocessing.context.SpawnContext, timeout: float) -> None:
        self._bounds = ctx.Array("d", 2, lock=False)
        self._go = ctx.Event()
        self._timeout = timeout

    def open(self, start: float, stop: float) -> None:
        self._bounds[0], self._bounds[1] = start, stop
        self._go.set()

    def wait(self) -> tuple[float, float]:
        if not self._go.wait(self._timeout):
            raise TimeoutError("the benchmark never started the measurement")
        return self._bounds[0], self._bounds[1]


def collect(
    results: Any, procs: Sequence[multiprocessing.process.BaseProcess], kind: str, timeout: float
) -> dict[int, Any]:
    """Wait for a ``kind`` message from every client process; raise if one fails or dies.

    Client processes put ``(kind, worker, payload)`` tuples on ``results``: ``"ready"``
    once connected, ``"done"`` with their outcome, or ``"failed"`` with the error.
    """
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        try:
            message, worker, payload = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(
                    f"client process {dead[0].name} died with status {dead[0].exitcode}"
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(procs) - len(got)} client process(es) not {kind} after {timeout:.0f}s"
                ) from None
            continue
        if message == "failed":
            raise RuntimeError(f"client process {worker} failed: {payload}")
        if message == kind:
            got[worker] = payload
    return got


def stop_processes(procs: Sequence[multiprocessing.process.BaseProcess], grace: float) -> None:
    """Give client processes ``grace`` seconds to exit by themselves, then stop them."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


# -- CPU accounting ----------------------------------------------------------------------


def child_json(command: Sequence[str], timeout: float, what: str) -> dict[str, Any]:
    """Run ``command`` (``what``: a benchmark's own child, e.g. its plain Spark side) to
    its end and return the JSON object of its last line of output."""
    with children_ignore_sigint():
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"{what} exited with status {child.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


class JsonChild:
    """A benchmark's own child (``what``: e.g. its plain Spark side) kept alive and asked
    for one step at a time: a line to its stdin, a JSON object on one line of its
    stdout in answer. A benchmark interleaves the child's steps with its own, so that a
    machine that speeds up or slows down in the meantime weighs on both sides alike.
    Its stderr goes to ``log_path``; :meth:`close` (EOF, then SIGTERM, then SIGKILL)
    ends it, and it is asked to die with the benchmark."""

    def __init__(self, command: Sequence[str], what: str, log_path: Path) -> None:
        self.what = what
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self._pending = b""
        try:
            with children_ignore_sigint():
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._log,
                    preexec_fn=_die_with_parent,
                )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, request: str, timeout: float) -> dict[str, Any]:
        """Send ``request`` and wait up to ``timeout`` s for the child's answer: the next
        line of its stdout that is a JSON object (its JVM shares that stdout, and any
        other line it writes there is passed over)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(request.encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                line, newline, rest = self._pending.partition(b"\n")
                if newline:
                    self._pending = rest
                    if line.startswith(b"{"):
                        return json.loads(line)  # type: ignore[no-any-return]
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise TimeoutError(
                        f"{self.what} did not answer {request!r} within {timeout:.0f}s"
                    )
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"{self.what} exited with status {self.proc.wait()}")
                self._pending += chunk

    def close(self, timeout: float = 30.0) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, by parent pid (read from ``/proc`` now)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds ``pid`` has used so far, all its threads included."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _CLOCK_TICKS


@dataclass(frozen=True)
class MachineCpu:
    """A reading of ``/proc/stat``: busy and total jiffies over all cores."""

    busy: int
    total: int

    @classmethod
    def read(cls) -> MachineCpu:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # guest time is already counted in user
        return cls(total - idle, total)

    def busy_fraction_since(self, earlier: MachineCpu) -> float:
        """The share of all cores' time that was busy between ``earlier`` and this."""
        elapsed = self.total - earlier.total
        return (self.busy - earlier.busy) / elapsed if elapsed else 0.0


def in_turn(index: int, plain: Callable[[], object], herder: Callable[[], T]) -> T:
    """Run ``index``'s turn of both sides: plain Spark first on even turns, herder first on
    odd ones, so that a machine slowing down (or speeding up) throughout favours neither;
    herder's result."""
    if index % 2 == 0:
        plain()
    result = herder()
    if index % 2:
        plain()
    return result


def wait_quiet(max_pct: float = 10.0, window: float = 0.5, timeout: float = 15.0) -> float:
    """Wait until the whole machine used less than ``max_pct`` % of one core over a
    ``window`` of seconds (what the step before left running, such as a worker stopping
    a connector's tasks, is done), or ``timeout`` s passed; return the last window's %."""
    deadline = time.monotonic() + timeout
    while True:
        before = MachineCpu.read()
        time.sleep(window)
        pct = 100 * MachineCpu.read().busy_fraction_since(before) * (os.cpu_count() or 1)
        if pct < max_pct or time.monotonic() > deadline:
            return round(pct, 1)


# -- figures -----------------------------------------------------------------------------


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float | int]:
    """Min, median and max of a few repeated measurements (e.g. five failovers)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "count": len(ordered),
        "min": round(ordered[0], digits),
        "median": round(median, digits),
        "max": round(ordered[-1], digits),
    }


def percentile(sorted_samples: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (nearest rank) of samples sorted ascending."""
    if not sorted_samples:
        raise ValueError("no samples")
    rank = max(1, math.ceil(pct / 100 * len(sorted_samples)))
    return sorted_samples[rank - 1]


def latency_summary_ms(samples_ns: Sequence[int]) -> dict[str, float | int]:
    """Median, p99, mean and max of latencies given in nanoseconds, in milliseconds."""
    ordered = sorted(samples_ns)
    return {
        "count": len(ordered),
        "p50_ms": round(percentile(ordered, 50) / 1e6, 3),
        "p99_ms": round(percentile(ordered, 99) / 1e6, 3),
        "mean_ms": round(sum(ordered) / len(ordered) / 1e6, 3),
        "max_ms": round(ordered[-1] / 1e6, 3),
    }


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """``numerator / denominator`` rounded, or None when either side is missing or zero."""
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, digits)


def fdatasync_latency_ms(directory: Path, samples: int = 200) -> dict[str, float | int]:
    """How long the disk under ``directory`` takes to make a small append durable.

    Both an ensemble server's synchronous write and ZooKeeper's wait for one such sync,
    so this is the floor under their latency, measured where their data lives.
    """
    path = directory / ".fdatasync-probe"
    sync = getattr(os, "fdatasync", os.fsync)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        timings = []
        for _ in range(samples):
            os.write(fd, b"x" * 100)
            began = time.perf_counter_ns()
            sync(fd)
            timings.append(time.perf_counter_ns() - began)
    finally:
        os.close(fd)
        path.unlink()
    return latency_summary_ms(timings)


def machine_info() -> dict[str, Any]:
    """What a reader needs to compare figures from two machines."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        # a reniced machine explains odd figures (the load is in ``load``: see provenance)
        "nice": os.nice(0),
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        # "/autogroup-28 nice 0": the scheduler weighs the session's processes as one
        info["autogroup_nice"] = int(Path("/proc/self/autogroup").read_text().split()[-1])
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
                break
    return info
