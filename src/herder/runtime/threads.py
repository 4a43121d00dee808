"""Threads for connector code that may never return.

A connector's ``poll`` stuck on a dead network read, or a ``stop`` that hangs, must not
keep a worker alive after it was told to stop, nor hold a thread other work needs.
Python's :class:`~concurrent.futures.ThreadPoolExecutor` joins its threads when the
interpreter exits, so one stuck call there keeps a stopped worker running forever. The
pool here runs its calls on daemon threads instead, grows with the calls in flight (as
Java's cached thread pools do, which Connect runs connector code on) and lets an idle
thread go after ``keep_alive_s``: a stuck call costs its own thread and nothing else.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _run(job: _Job) -> None:
    """Carry out one submitted call, its outcome going to its future."""
    future, fn, args, kwargs = job
    if future.set_running_or_notify_cancel():
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)


class DaemonThreadPool(Executor):
    """An executor of daemon threads, one per call in flight, kept a while when idle."""

    def __init__(self, name: str, keep_alive_s: float = 60.0, max_threads: int = 0) -> None:
        self.name = name
        self.keep_alive_s = keep_alive_s
        #: at most this many threads (0: no limit); calls beyond wait their turn
        self.max_threads = max_threads
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # one permit per idle thread: a submit that takes one reuses that thread
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._count = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"thread pool {self.name} is shut down")
            self._jobs.put((future, fn, args, kwargs))
            full = self.max_threads and len(self._threads) >= self.max_threads
            if not self._idle.acquire(blocking=False) and not full:
                self._count += 1
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{self._count}", daemon=True
                )
                self._threads.add(thread)
                thread.start()
        return future

    def _work(self) -> None:
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self.keep_alive_s)
                except queue.Empty:
                    # leave only if no submit has counted on this thread meanwhile
                    if self._idle.acquire(blocking=False):
                        return
                    continue
                if job is None:
                    return
                _run(job)
                del job  # its result is its caller's: hold nothing while idle
                self._idle.release()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and let the threads go once their calls are done. Never
        waits, whatever ``wait`` says: a stuck call is left to its daemon thread."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in threads:
            self._jobs.put(None)


class SharedExecutor(ThreadPoolExecutor):
    """Lends ``pool`` to an event loop as its default executor without letting the
    loop's teardown (``asyncio.run`` shuts its default executor down) shut it for all.

    A ThreadPoolExecutor only in name, because asyncio accepts no other kind as a
    default executor: it starts no thread of its own, every call goes to ``pool``.
    """

    def __init__(self, pool: Executor) -> None:
        super().__init__(max_workers=1)
        self._pool = pool

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None


_blocking: DaemonThreadPool | None = None
_blocking_lock = threading.Lock()


def blocking_calls() -> DaemonThreadPool:
    """The process's pool for blocking calls made from a worker's event loop
    (``asyncio.to_thread``: the data plane's file listings and deletes, fsyncs): daemon
    threads, at most 32, so no stuck call keeps the process alive."""
    global _blocking
    with _blocking_lock:
        if _blocking is None:
            _blocking = DaemonThreadPool("herder-blocking", max_threads=32)
        return _blocking


class TaskThread:
    """The one thread a running task's connector code runs on, created and ended with
    the task (Connect's ``WorkerTask`` thread). Calls run one at a time, in order; the
    thread is a daemon, so a call that never returns cannot keep the process alive."""

    def __init__(self, name: str, on_exit: Callable[[], None] = lambda: None) -> None:
        self.name = name
        #: called once the thread has ended after :meth:`close` (on that thread, or on
        #: the caller's if the thread never started)
        self.on_exit = on_exit
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} has ended")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._jobs.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run(job)
            del job  # its result is its caller's: hold nothing while idle
        self.on_exit()

    def close(self) -> None:
        """End the thread once the calls already submitted are done."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._thread is not None
            self._jobs.put(None)
        if not started:
            self.on_exit()
