"""The write path of one server: accepted → durable (→ quorum) → applied → answered.

A write becomes a transaction with the next zxid and the leader's clock in its header;
it is appended to the transaction log and, once an fsync covers it, applied to the state
machine in zxid order and answered. Replication slots in between "durable" and "applied"
(a quorum of ACKs); the standalone pipeline here is the degenerate quorum of one.

Appliers wake the readers that wait on a log (long polls) or on a zxid (``min_zxid``
reads, sync), so tailers see a record as soon as it is applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from herder.ensemble.state import StateMachine
from herder.ensemble.storage.committer import GroupCommitter
from herder.ensemble.txn import (
    Append,
    Txn,
    TxnHeader,
    TxnResult,
    WriteTxn,
    encode_txn,
    make_zxid,
    zxid_counter,
)
from herder.errors import ServerStopping

log = logging.getLogger(__name__)


class _Pending:
    __slots__ = ("future", "txn", "zxid")

    def __init__(self, zxid: int, txn: Txn, future: asyncio.Future[TxnResult]) -> None:
        self.zxid = zxid
        self.txn = txn
        self.future = future


class AppliedWatch:
    """Readers waiting for a log to grow or for the server to apply a zxid."""

    def __init__(self) -> None:
        self._by_log: dict[str, list[asyncio.Future[None]]] = {}
        self._by_zxid: list[tuple[int, asyncio.Future[None]]] = []

    async def wait_for_log(self, name: str, timeout_s: float) -> None:
        """Return when ``name`` is appended to, or after ``timeout_s``."""
        future = asyncio.get_running_loop().create_future()
        self._by_log.setdefault(name, []).append(future)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout_s)
        finally:
            waiters = self._by_log.get(name)
            if waiters and future in waiters:
                waiters.remove(future)

    async def wait_for_zxid(self, zxid: int, applied: Callable[[], int], timeout_s: float) -> bool:
        """Wait until ``applied() >= zxid``; False if ``timeout_s`` passed first."""
        if applied() >= zxid:
            return True
        future = asyncio.get_running_loop().create_future()
        entry = (zxid, future)
        self._by_zxid.append(entry)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return applied() >= zxid
        finally:
            if entry in self._by_zxid:
                self._by_zxid.remove(entry)
        return True

    def applied(self, zxid: int, logs: set[str], *, every_log: bool = False) -> None:
        for name in list(self._by_log) if every_log else logs:
            for future in self._by_log.pop(name, ()):
                if not future.done():
                    future.set_result(None)
        if self._by_zxid:
            keep = []
            for wanted, future in self._by_zxid:
                if wanted <= zxid:
                    if not future.done():
                        future.set_result(None)
                else:
                    keep.append((wanted, future))
            self._by_zxid = keep

    def wake_all(self) -> None:
        for waiters in self._by_log.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._by_log.clear()
        for _, future in self._by_zxid:
            if not future.done():
                future.set_result(None)
        self._by_zxid.clear()


class StandalonePipeline:
    """Commits transactions on one server: its own fsync is the quorum."""

    def __init__(
        self,
        state: StateMachine,
        committer: GroupCommitter,
        epoch: int,
        clock_ms: Callable[[], int],
        on_applied: Callable[[Txn, TxnResult], None] | None = None,
    ) -> None:
        self.state = state
        self.watch = AppliedWatch()
        self.epoch = epoch
        self._committer = committer
        self._clock_ms = clock_ms
        self._on_applied = on_applied
        last = state.last_zxid
        self._counter = zxid_counter(last) if last >> 32 == epoch else 0
        self._pending: deque[_Pending] = deque()
        self._stopping = False

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def last_proposed_zxid(self) -> int:
        return make_zxid(self.epoch, self._counter)

    def header(self, session_id: int = 0, seq: int = 0) -> TxnHeader:
        """The header of the next transaction: its zxid, the time, whose it is."""
        self._counter += 1
        return TxnHeader(make_zxid(self.epoch, self._counter), self._clock_ms(), session_id, seq)

    async def submit(
        self, build: Callable[[TxnHeader], Txn], session_id: int = 0, seq: int = 0
    ) -> TxnResult:
        """Commit the transaction ``build`` makes from its header; return its result."""
        if self._stopping:
            raise ServerStopping("the server is shutting down; retry on another server")
        txn = build(self.header(session_id, seq))
        zxid = txn.header.zxid
        future: asyncio.Future[TxnResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(zxid, txn, future))
        durable = self._committer.append(zxid, encode_txn(txn))
        durable.add_done_callback(self._durable_done)
        return await asyncio.shield(future)

    def _durable_done(self, durable: asyncio.Future[int]) -> None:
        if durable.cancelled():
            self._fail_pending(ServerStopping("the write was abandoned while the server stopped"))
            return
        exc = durable.exception()
        if exc is not None:
            # A failed fsync leaves us unable to say what is on disk: stop serving
            # writes rather than answer anything we could later contradict.
            log.critical("transaction log write failed; refusing further writes", exc_info=exc)
            self._stopping = True
            self._fail_pending(exc)
            return
        self._apply_through(durable.result())

    def _apply_through(self, durable_zxid: int) -> None:
        touched: set[str] = set()
        every_log = False
        last = 0
        pending = self._pending
        while pending and pending[0].zxid <= durable_zxid:
            item = pending.popleft()
            result = self.state.apply(item.txn)
            last = item.zxid
            if isinstance(item.txn, WriteTxn):
                if result.ok:
                    touched.update(op.log for op in item.txn.ops if isinstance(op, Append))
            else:
                # a session's end writes tombstones into whichever logs it owned keys in
                every_log = True
            if self._on_applied is not None:
                self._on_applied(item.txn, result)
            if not item.future.done():
                item.future.set_result(result)
        if last:
            self.watch.applied(last, touched, every_log=every_log)

    def _fail_pending(self, exc: BaseException) -> None:
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(exc)

    def stop(self) -> None:
        self._stopping = True
        self.watch.wake_all()
