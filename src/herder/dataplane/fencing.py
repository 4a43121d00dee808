"""Reading fencing epochs back from the ensemble, for a task's own transactions."""

from __future__ import annotations

from herder.coordinator.records import FENCING_LOG, decode_fencing_value, fencing_key
from herder.ensemble.client import EnsembleClient


async def current_epoch(client: EnsembleClient, fenced_id: str) -> int | None:
    """The epoch ``fenced_id`` holds now, read linearizably from ``_fencing``."""
    await client.sync()
    key = fencing_key(fenced_id)
    epoch: int | None = None
    position = 0
    while True:
        reply = await client.read(FENCING_LOG, position, max_records=5_000)
        for record in reply.records:
            if record.key == key:
                epoch = None if record.value is None else decode_fencing_value(record.value).epoch
        position = reply.next_offset
        if position >= reply.end_offset:
            return epoch


def task_fence_id(connector: str, task: int) -> str:
    return f"task-{connector}-{task}"


def connector_fence_id(connector: str) -> str:
    return f"connector-{connector}"
