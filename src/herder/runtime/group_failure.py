"""What a worker tells its user when its group refuses it for good.

A group error the member cannot retry (the coordinator refusing its session timeout,
its protocol, its group id, or a full group) ends the worker, as it ends Connect's herder
thread. The error names the protocol code; this adds which setting to change, so the
one line the process exits with says what to do next.
"""

from __future__ import annotations

from herder.errors import ErrorCode, HerderError
from herder.runtime.worker_config import WorkerConfig

__all__ = ["out_of_group"]

_ADVICE: dict[ErrorCode, str] = {
    ErrorCode.INVALID_SESSION_TIMEOUT: (
        "the ensemble refuses session.timeout.ms={session_timeout_ms}: set it within the "
        "ensemble's group.min.session.timeout.ms and group.max.session.timeout.ms "
        "(6000 and 1800000 unless its config says otherwise), then start the worker again"
    ),
    ErrorCode.GROUP_MAX_SIZE_REACHED: (
        "group {group_id} already has as many members as the ensemble's group.max.size "
        "allows: raise it, or give this worker another group.id"
    ),
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "group {group_id} is in use by members of another kind: give the workers a "
        "group.id of their own"
    ),
    ErrorCode.INVALID_GROUP_ID: "set group.id to a valid group name",
}

_OTHERWISE = "see the worker's log for why, fix that and start the worker again"


def out_of_group(cause: HerderError, config: WorkerConfig) -> HerderError:
    """``cause`` (of the same class), its message ending with what to do about it."""
    advice = _ADVICE.get(cause.code, _OTHERWISE).format(
        session_timeout_ms=config.session_timeout_ms, group_id=config.group_id
    )
    message = f"{cause}; {advice}"
    try:
        explained = type(cause)(message)
    except TypeError:  # a class that takes more than a message
        explained = HerderError(message)
    explained.__cause__ = cause
    return explained
