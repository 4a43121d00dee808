"""Group commit for asyncio: many appends, one fsync, no fsync on the event loop.

A Zab peer may ACK a proposal only once it is on disk, and an fsync takes milliseconds.
Syncing each proposal on its own would cap the ensemble at a few hundred writes a second
and block the loop. Instead :class:`GroupCommitter` keeps at most one fsync running, in
a worker thread; every record appended while it runs waits for the next one, which then
covers them all. Under load the batches grow by themselves, and an idle log syncs a
lone record at once.

If an fsync fails, the durable state of the log is unknown (after a failed fsync the
kernel may have dropped the dirty pages), so the committer fails every waiter and every
later call with that error: the server must stop and recover from disk, as PostgreSQL
and etcd do.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


class SyncableLog(Protocol):
    """What the committer needs: :class:`~herder.ensemble.storage.store.Storage` fits."""

    @property
    def last_zxid(self) -> int: ...

    @property
    def durable_zxid(self) -> int: ...

    def append(self, zxid: int, payload: bytes) -> None: ...

    def sync(self) -> int: ...


class GroupCommitter:
    """Appends to a log from the event loop and resolves futures as fsyncs complete."""

    def __init__(self, log: SyncableLog) -> None:
        self._log = log
        self._waiters: list[tuple[int, int, asyncio.Future[int]]] = []
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._exclusive: asyncio.Lock | None = None
        #: fsync rounds run so far (each covers every record appended before it started)
        self.syncs = 0
        #: an fsync slower than this is logged and counted (ZooKeeper's
        #: ``fsync.warningthresholdms``)
        self.fsync_warning_ms = 1000
        #: fsyncs that took longer than ``fsync_warning_ms``
        self.fsync_threshold_exceeded = 0

    def append(self, zxid: int, payload: bytes) -> asyncio.Future[int]:
        """Append now; the returned future resolves (to the durable zxid) once synced.

        The append itself is synchronous, so records reach the log in call order even if
        the caller awaits the future later, or never.
        """
        if self._failure is not None:
            raise self._failure
        self._log.append(zxid, payload)
        return self.durable(zxid)

    def durable(self, zxid: int) -> asyncio.Future[int]:
        """A future resolving once ``zxid`` (appended now or later) is durable.

        Each caller gets its own future, so cancelling one wait cancels nothing else.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._failure is not None:
            future.set_exception(self._failure)
        elif zxid <= self._log.durable_zxid:
            future.set_result(self._log.durable_zxid)
        else:
            heapq.heappush(self._waiters, (zxid, next(self._order), future))
            self._start()
        return future

    async def flush(self) -> int:
        """Wait until everything appended so far is durable; return the durable zxid."""
        return await self.durable(self._log.last_zxid)

    def _start(self) -> None:
        if self._exclusive is not None and self._exclusive.locked():
            return  # the maintenance in progress restarts syncing when it is done
        if self._task is None and self._log.last_zxid > self._log.durable_zxid:
            self._task = asyncio.get_running_loop().create_task(self._sync_until_idle())

    async def _sync_until_idle(self) -> None:
        try:
            while True:
                # another thread's sync (a snapshot's, say) may have covered waiters too
                self._wake(self._log.durable_zxid)
                # checked and left without an await in between: no append is stranded
                if self._log.last_zxid <= self._log.durable_zxid:
                    break
                began = time.monotonic()
                await asyncio.to_thread(self._log.sync)
                self.syncs += 1
                took_ms = (time.monotonic() - began) * 1000
                if took_ms > self.fsync_warning_ms:
                    self.fsync_threshold_exceeded += 1
                    logger.warning(
                        "fsync of the transaction log took %.0f ms, more than "
                        "fsync.warningthresholdms=%d: writes wait that long to be acknowledged;"
                        " put the log (dataLogDir) on a disk of its own",
                        took_ms,
                        self.fsync_warning_ms,
                    )
        except asyncio.CancelledError:
            for _, _, future in self._waiters:
                future.cancel()
            self._waiters.clear()
            raise
        except Exception as exc:
            logger.error(
                "fsync of the transaction log failed; no more writes are accepted: %s", exc
            )
            self._failure = exc
            for _, _, future in self._waiters:
                if not future.done():
                    future.set_exception(exc)
            self._waiters.clear()
        finally:
            self._task = None
            # a sync made by someone else (a snapshot) may have covered late waiters
            self._wake(self._log.durable_zxid)

    def _wake(self, durable: int) -> None:
        while self._waiters and self._waiters[0][0] <= durable:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(durable)

    async def exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a thread while no fsync of ours runs (snapshots, purges).

        Appends go on meanwhile; they are synced when ``fn`` returns. Waiters that
        ``fn`` itself made durable (a snapshot syncs the log first) are woken too.
        """
        if self._exclusive is None:
            self._exclusive = asyncio.Lock()
        async with self._exclusive:
            if self._task is not None:
                await asyncio.shield(self._task)
            try:
                return await asyncio.to_thread(fn, *args)
            finally:
                self._wake(self._log.durable_zxid)
                self._start_after_exclusive()

    def _start_after_exclusive(self) -> None:
        if self._task is None and self._log.last_zxid > self._log.durable_zxid:
            self._task = asyncio.get_running_loop().create_task(self._sync_until_idle())

    async def close(self) -> None:
        """Wait for the fsync in flight (and any it leads to) to finish."""
        if self._task is not None:
            await asyncio.shield(self._task)
