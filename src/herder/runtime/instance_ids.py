"""Group instance ids (KIP-345): a worker's, and the ones its sink tasks derive from it.

A static worker (``group.instance.id`` set) keeps its place in the worker group across a
restart within its session timeout. Its sink tasks are members of their connectors'
groups too; were they dynamic, every restart of the worker would still rebalance those
groups. So each sink task of a static worker takes an instance id of its own, derived
from the worker's and the task's, the same on every restart of the same worker and
distinct between tasks and between workers.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from herder.config.parsing import invalid_value

#: Kafka's rule for group instance ids (``JoinGroupRequest.validateGroupInstanceId``)
MAX_LENGTH = 249
_VALID = re.compile(r"[a-zA-Z0-9._-]+")
_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9._-]")
#: hex digits of the hash that keeps a derived id short and unique
_DIGEST_CHARS = 16


def invalid_reason(instance_id: str) -> str | None:
    """Why ``instance_id`` is no legal group instance id (None: it is one)."""
    if not instance_id:
        return "Group instance id must be non-empty."
    if len(instance_id) > MAX_LENGTH:
        return f"Group instance id must be at most {MAX_LENGTH} characters long."
    if not _VALID.fullmatch(instance_id):
        return "Group instance id may contain only ASCII letters, digits, '.', '_' and '-'."
    return None


def validate_group_instance_id(name: str, value: Any, /) -> None:
    """ConfigDef validator: an unset (None) id is a dynamic member, and legal."""
    if value is None:
        return
    reason = invalid_reason(value)
    if reason is not None:
        raise invalid_value(name, value, reason)


def sink_task_instance_id(worker_instance_id: str, connector: str, task: int) -> str:
    """The instance id of a static worker's sink task: ``<worker>-<connector>-<task>``.

    When that is not a legal id (a connector name with other characters, or too long),
    the illegal characters become ``_``, the result is cut short, and a hash of the
    whole ``<worker>-<connector>-<task>`` is appended, so that two tasks whose names
    differ only in what was replaced or cut still get different ids.
    """
    raw = f"{worker_instance_id}-{connector}-{task}"
    if invalid_reason(raw) is None:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:_DIGEST_CHARS]
    head = _INVALID_CHAR.sub("_", raw)[: MAX_LENGTH - _DIGEST_CHARS - 1]
    return f"{head}-{digest}"
