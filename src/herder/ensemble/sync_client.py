"""A blocking facade over :class:`EnsembleClient` for code that is not async.

The client runs on an event loop in a background thread; each method submits a
coroutine to it and waits for the answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from herder.ensemble import apis
from herder.ensemble.client import EnsembleClient
from herder.ensemble.state import LogInfo
from herder.ensemble.txn import Op, TxnResult

T = TypeVar("T")


class SyncEnsembleClient:
    """``EnsembleClient`` with plain blocking methods; close it (or use ``with``)."""

    def __init__(self, bootstrap: str | Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="herder-ensemble-client", daemon=True
        )
        self._thread.start()
        self._client = EnsembleClient(bootstrap, **options)
        try:
            self._run(self._client.start())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def session_id(self) -> int:
        return self._client.session_id

    def transact(self, ops: Sequence[Op], *, check: bool = True) -> TxnResult:
        return self._run(self._client.transact(ops, check=check))

    def create_log(self, name: str, *, compacted: bool = False, if_absent: bool = False) -> int:
        return self._run(self._client.create_log(name, compacted=compacted, if_absent=if_absent))

    def append(self, log_name: str, value: bytes | None, key: bytes | None = None) -> int:
        return self._run(self._client.append(log_name, value, key))

    def read(self, log_name: str, from_offset: int = 0, **kw: Any) -> apis.ReadLogResponse:
        return self._run(self._client.read(log_name, from_offset, **kw))

    def list_logs(self) -> list[LogInfo]:
        return self._run(self._client.list_logs())

    def describe_log(self, name: str) -> LogInfo:
        return self._run(self._client.describe_log(name))

    def end_offsets(self, logs: Sequence[str]) -> dict[str, int]:
        return self._run(self._client.end_offsets(logs))

    def sync(self) -> int:
        return self._run(self._client.sync())

    def status(self) -> apis.StatusResponse:
        return self._run(self._client.status())

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> SyncEnsembleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
