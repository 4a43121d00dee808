"""Following a log, as Connect's KafkaBasedLog follows its config, offset and status topics.

A :class:`LogTailer` long-polls a log from an offset and hands each record to a
callback, in offset order. :meth:`LogTailer.read_to_end` is linearizable: it first
syncs with the leader's commit point, asks for the log's end offset at or after that
zxid, then waits until the callback has seen every record before that end — so it
returns only once the reader has seen everything written before it was called.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

from herder.ensemble.client import EnsembleClient
from herder.ensemble.txn import Record
from herder.errors import HerderError, SessionExpired, UnknownSession

log = logging.getLogger(__name__)

RecordCallback = Callable[[Record], Awaitable[None] | None]


class LogTailer:
    """Calls ``callback`` for each record of ``log_name`` from ``from_offset`` on."""

    def __init__(
        self,
        client: EnsembleClient,
        log_name: str,
        callback: RecordCallback,
        *,
        from_offset: int = 0,
        poll_wait_ms: int = 5_000,
        max_records: int = 2_000,
    ) -> None:
        self.client = client
        self.log_name = log_name
        self.callback = callback
        #: the offset of the next record to read; everything before it was handed over
        self.position = from_offset
        self.poll_wait_ms = poll_wait_ms
        self.max_records = max_records
        self._task: asyncio.Task[None] | None = None
        self._progress = asyncio.Condition()
        self._failure: BaseException | None = None
        #: set by stop(): the loop ends even if a cancellation was lost on its way
        self._stopped = False

    async def start(self) -> LogTailer:
        if self._task is None:
            self._stopped = False
            self._task = asyncio.create_task(self._run(), name=f"tail-{self.log_name}")
        return self

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopped:
            try:
                reply = await self.client.read(
                    self.log_name,
                    self.position,
                    max_records=self.max_records,
                    wait_ms=self.poll_wait_ms,
                )
            except asyncio.CancelledError:
                raise
            except (SessionExpired, UnknownSession) as exc:
                # A read needs no session, and the client opens a new one in place of
                # the expired one: read on under it. Stopping here would leave whoever
                # follows this log (a worker's configs, statuses and offsets) on a view
                # that never moves again.
                log.warning(
                    "tailing %s: %s; reading on under the client's next session", self.log_name, exc
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except HerderError as exc:
                if not exc.retriable:
                    await self._fail(exc)
                    return
                log.warning("tailing %s: %s; retrying", self.log_name, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            for record in reply.records:
                outcome = self.callback(record)
                if inspect.isawaitable(outcome):
                    await outcome
                self.position = record.offset + 1
            self.position = max(self.position, reply.next_offset)
            async with self._progress:
                self._progress.notify_all()

    async def _fail(self, exc: BaseException) -> None:
        log.error("tailing %s stopped: %s", self.log_name, exc)
        self._failure = exc
        async with self._progress:
            self._progress.notify_all()

    async def read_to_end(self, timeout: float = 30.0) -> int:
        """Wait until every record committed before this call has been handed over.

        Returns the end offset reached. Raises the tailer's error if it stopped.
        """
        await self.start()
        zxid = await self.client.sync()
        end = (await self.client.end_offsets([self.log_name], min_zxid=zxid))[self.log_name]
        async with asyncio.timeout(timeout), self._progress:
            await self._progress.wait_for(lambda: self.position >= end or self._failure is not None)
        if self._failure is not None:
            raise self._failure
        return end
