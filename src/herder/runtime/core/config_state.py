"""The ``_configs`` log read into memory: which connectors exist, with what configs and tasks.

Every worker reads the same compacted log in the same order and so reaches the same
:class:`ClusterConfigSnapshot`; the leader assigns work from it, and members compare
snapshots to decide between bouncing a connector in place and rebalancing
(:class:`ConfigDiff`). The leader is the only writer, and it writes with the record
builders below so both sides share one format.

Record kinds (key → JSON value), as Kafka Connect's config topic has them:

``connector-<name>``
    ``{"properties": {...}}``, the connector's config; a null value deletes the connector.
``task-<name>-<n>``
    ``{"properties": {...}}``, one task's config. Not visible on its own: task configs
    are staged until the commit record that follows them.
``commit-<name>``
    ``{"tasks": N}``: tasks 0..N-1 staged since the previous commit become the
    connector's task set. If any of them is missing (a half-written set, or one whose
    records compaction dropped) the connector is *inconsistent*: it shows no tasks, and
    none are started, until a later complete commit.
``target-state-<name>``
    ``{"state": "STARTED" | "PAUSED" | "STOPPED"}``; a connector without one is STARTED.
``restart-connector-<name>``
    ``{"include-tasks": bool, "only-failed": bool}``: a command, not state. It never
    shows in a snapshot; :meth:`ConfigState.apply` hands it back to the caller.
``logger-cluster-<namespace>``
    ``{"level": "DEBUG"}``: set a logger's level on every worker (``PUT
    /admin/loggers/<namespace>?scope=cluster``). Also a command handed back by ``apply``.
``session-key``
    ``{"key": "<base64>", "algorithm": "HmacSHA256", "creation-timestamp": ms}``: the key
    internal requests are signed with under ``connect.protocol=sessioned``
    (:mod:`herder.runtime.core.session_key`); the latest one counts.

A malformed record is logged and skipped rather than raised: it is already in the log,
and a reader that stopped on it would never get past it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.session_key import SESSION_KEY_RECORD, SessionKey, decode_session_key

__all__ = [
    "ClusterConfigSnapshot",
    "ClusterLoggerLevel",
    "ConfigCommand",
    "ConfigDiff",
    "ConfigRecord",
    "ConfigState",
    "RestartRequest",
    "TargetState",
    "connector_config_record",
    "connector_removal_record",
    "connector_removal_records",
    "logger_level_record",
    "restart_request_record",
    "target_state_record",
    "task_commit_record",
    "task_config_record",
    "task_config_records",
]

log = logging.getLogger(__name__)

#: (key, value) as appended to ``_configs``; a ``None`` value is a tombstone.
ConfigRecord = tuple[str, bytes | None]

_CONNECTOR = "connector-"
_TASK = "task-"
_COMMIT = "commit-"
_TARGET_STATE = "target-state-"
_RESTART = "restart-connector-"
_LOGGER = "logger-cluster-"


class TargetState(StrEnum):
    """What the user asked a connector to do; the runtime steers toward it."""

    STARTED = "STARTED"
    #: connector and tasks stay assigned and alive but do no work
    PAUSED = "PAUSED"
    #: the connector stays assigned but has no tasks (Connect 3.5, KIP-875)
    STOPPED = "STOPPED"


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """A user's request to restart a connector (and possibly its tasks), from the REST API."""

    connector: str
    include_tasks: bool = False
    only_failed: bool = False


@dataclass(frozen=True, slots=True)
class ClusterLoggerLevel:
    """A user's request to set logger ``namespace`` to ``level`` on every worker."""

    namespace: str
    level: str


#: what the config log asks workers to do, rather than to be
ConfigCommand = RestartRequest | ClusterLoggerLevel


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def connector_config_record(name: str, config: Mapping[str, str]) -> ConfigRecord:
    """Create or replace connector ``name``'s config."""
    return f"{_CONNECTOR}{name}", _encode({"properties": dict(config)})


def connector_removal_record(name: str) -> ConfigRecord:
    """Delete connector ``name``, its task configs and its target state."""
    return f"{_CONNECTOR}{name}", None


def connector_removal_records(name: str, task_count: int) -> list[ConfigRecord]:
    """Every record that deletes connector ``name`` (of ``task_count`` tasks): its config,
    then a tombstone for each other key it wrote.

    A worker following the log forgets everything of the connector at the first record.
    A worker that reads the log later reads it compacted: without the tombstones it would
    find the deleted connector's target state, task configs and commit still there and
    give them to a new connector of the same name (say, start it PAUSED), while the
    workers that saw the deletion run it STARTED.
    """
    return [
        connector_removal_record(name),
        (f"{_TARGET_STATE}{name}", None),
        *((f"{_TASK}{name}-{index}", None) for index in range(task_count)),
        (f"{_COMMIT}{name}", None),
    ]


def task_config_record(task: ConnectorTaskId, config: Mapping[str, str]) -> ConfigRecord:
    """Stage one task's config; it takes effect only with the following commit record."""
    return f"{_TASK}{task.connector}-{task.task}", _encode({"properties": dict(config)})


def task_commit_record(name: str, task_count: int) -> ConfigRecord:
    """Make the ``task_count`` task configs staged for ``name`` its task set."""
    return f"{_COMMIT}{name}", _encode({"tasks": task_count})


def task_config_records(name: str, configs: Sequence[Mapping[str, str]]) -> list[ConfigRecord]:
    """Every record that replaces ``name``'s task set: each task's config, then the commit.

    Append them in one transaction; readers ignore the task records until the commit.
    """
    records = [task_config_record(ConnectorTaskId(name, i), c) for i, c in enumerate(configs)]
    records.append(task_commit_record(name, len(configs)))
    return records


def target_state_record(name: str, state: TargetState) -> ConfigRecord:
    """Ask connector ``name`` to be started, paused or stopped."""
    return f"{_TARGET_STATE}{name}", _encode({"state": state.value})


def restart_request_record(request: RestartRequest) -> ConfigRecord:
    """Ask whichever worker runs the connector (and its tasks) to restart them."""
    value = {"include-tasks": request.include_tasks, "only-failed": request.only_failed}
    return f"{_RESTART}{request.connector}", _encode(value)


def logger_level_record(request: ClusterLoggerLevel) -> ConfigRecord:
    """Ask every worker to set a logger's level."""
    return f"{_LOGGER}{request.namespace}", _encode({"level": request.level})


@dataclass(frozen=True)
class ClusterConfigSnapshot:
    """An immutable view of the config log up to :attr:`offset`.

    ``offset`` is the position after the last record applied (Connect's convention,
    -1 before any), the number workers exchange in :class:`~.protocol.WorkerMetadata`.
    Only committed, consistent task sets are visible: for an inconsistent connector
    :meth:`task_configs`, :meth:`tasks` and :meth:`task_count` are empty, so it gets no
    tasks until its task set is rewritten.
    """

    EMPTY: ClassVar[ClusterConfigSnapshot]

    offset: int = -1
    _connector_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    _task_configs: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    _target_states: Mapping[str, TargetState] = field(default_factory=dict)
    inconsistent: frozenset[str] = frozenset()
    #: where each connector's current task set was committed
    _task_commits: Mapping[str, int] = field(default_factory=dict)
    #: the latest session key the leader distributed (``sessioned``), None before any
    session_key: SessionKey | None = None

    @property
    def connectors(self) -> frozenset[str]:
        """Names of every connector that has a config."""
        return frozenset(self._connector_configs)

    def __contains__(self, name: object) -> bool:
        return name in self._connector_configs

    def connector_config(self, name: str) -> dict[str, str] | None:
        """A copy of the connector's config, or None if there is no such connector."""
        config = self._connector_configs.get(name)
        return None if config is None else dict(config)

    def target_state(self, name: str) -> TargetState | None:
        """The connector's target state (STARTED unless one was written), None if unknown."""
        if name not in self._connector_configs:
            return None
        return self._target_states.get(name, TargetState.STARTED)

    def task_configs(self, name: str) -> list[dict[str, str]]:
        """Copies of the connector's committed task configs, in task order."""
        if name not in self._connector_configs or name in self.inconsistent:
            return []
        return [dict(c) for c in self._task_configs.get(name, ())]

    def task_config(self, task: ConnectorTaskId) -> dict[str, str] | None:
        """One task's committed config, None if the task is not part of a visible task set."""
        configs = self.task_configs(task.connector)
        return configs[task.task] if 0 <= task.task < len(configs) else None

    def task_commit(self, name: str) -> int | None:
        """The log position of the commit that made the connector's current task set: a
        set written again, even unchanged, is a new one (its tasks restart)."""
        return self._task_commits.get(name) if name in self._connector_configs else None

    def task_count(self, name: str) -> int:
        """How many tasks the connector's visible task set has."""
        return len(self.task_configs(name))

    def tasks(self, name: str) -> list[ConnectorTaskId]:
        """The ids of the connector's visible tasks, in order."""
        return [ConnectorTaskId(name, i) for i in range(self.task_count(name))]


ClusterConfigSnapshot.EMPTY = ClusterConfigSnapshot()


class ConfigState:
    """Applies ``_configs`` records in log order and hands out snapshots of the result."""

    def __init__(self) -> None:
        self._offset = -1
        self._connector_configs: dict[str, dict[str, str]] = {}
        self._target_states: dict[str, TargetState] = {}
        # committed task sets, and task configs staged since each connector's last commit
        self._task_configs: dict[str, tuple[dict[str, str], ...]] = {}
        self._staged: dict[str, dict[int, dict[str, str]]] = {}
        self._inconsistent: set[str] = set()
        self._task_commits: dict[str, int] = {}
        self._session_key: SessionKey | None = None

    @property
    def offset(self) -> int:
        """The position after the last record applied, -1 before any."""
        return self._offset

    def apply(self, offset: int, key: str, value: bytes | None) -> ConfigCommand | None:
        """Apply the record at ``offset``; returns it if it was a command (restart, logger).

        Offsets must grow: re-reading the log from the start takes a fresh ConfigState.
        """
        if offset < self._offset:
            raise ValueError(f"config record at offset {offset} is behind {self._offset}")
        self._offset = offset + 1
        try:
            return self._apply(key, value)
        except (ValueError, TypeError, KeyError) as exc:
            log.error("Skipping malformed config record %r at offset %d: %s", key, offset, exc)
            return None

    def _apply(self, key: str, value: bytes | None) -> ConfigCommand | None:
        # target-state- and restart-connector- are tested before prefixes they could shadow
        if key.startswith(_TARGET_STATE):
            self._apply_target_state(key.removeprefix(_TARGET_STATE), value)
        elif key.startswith(_RESTART):
            return _restart_request(key.removeprefix(_RESTART), value)
        elif key.startswith(_LOGGER):
            return _logger_level(key.removeprefix(_LOGGER), value)
        elif key.startswith(_CONNECTOR):
            self._apply_connector_config(key.removeprefix(_CONNECTOR), value)
        elif key.startswith(_TASK):
            self._stage_task_config(key.removeprefix(_TASK), value)
        elif key.startswith(_COMMIT):
            self._commit_tasks(key.removeprefix(_COMMIT), value)
        elif key == SESSION_KEY_RECORD:
            if value is not None:
                self._session_key = decode_session_key(value)
        else:
            log.debug("Ignoring config record with unknown key %r", key)
        return None

    def _apply_connector_config(self, name: str, value: bytes | None) -> None:
        if value is None:
            log.info("Connector %s deleted", name)
            self._connector_configs.pop(name, None)
            self._target_states.pop(name, None)
            self._task_configs.pop(name, None)
            self._task_commits.pop(name, None)
            self._staged.pop(name, None)
            self._inconsistent.discard(name)
            return
        self._connector_configs[name] = _properties(value)

    def _apply_target_state(self, name: str, value: bytes | None) -> None:
        if value is None:
            self._target_states.pop(name, None)
            return
        self._target_states[name] = TargetState(_object(value)["state"])

    def _stage_task_config(self, task: str, value: bytes | None) -> None:
        name, sep, index = task.rpartition("-")
        if not sep or not name or not (index.isascii() and index.isdigit()):
            raise ValueError("expected task-<connector>-<index>")
        if value is None:  # a deleted connector's (connector_removal_records)
            self._staged.get(name, {}).pop(int(index), None)
            return
        self._staged.setdefault(name, {})[int(index)] = _properties(value)

    def _commit_tasks(self, name: str, value: bytes | None) -> None:
        if value is None:
            # a deleted connector's task set: a worker that read the log past the
            # deletion's first record after compaction removed it learns it here
            self._task_configs.pop(name, None)
            self._task_commits.pop(name, None)
            self._inconsistent.discard(name)
            return
        count = _object(value)["tasks"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"task count must be a non-negative integer, not {count!r}")
        # Staged configs never outlive a commit: if this set is incomplete, only a
        # complete rewrite after it may fix the connector, never a mix with older records.
        staged = self._staged.pop(name, {})
        # Indices at or past the count are tolerated, as in Connect: compaction can leave
        # a higher task's record from before the connector scaled down.
        if any(i not in staged for i in range(count)):
            log.warning(
                "Connector %s: commit of %d tasks but only tasks %s were written since the "
                "last commit; its task set is inconsistent and no tasks will run until it "
                "is rewritten",
                name,
                count,
                sorted(staged),
            )
            self._inconsistent.add(name)
            return
        self._task_configs[name] = tuple(staged[i] for i in range(count))
        self._task_commits[name] = self._offset - 1
        self._inconsistent.discard(name)

    def snapshot(self) -> ClusterConfigSnapshot:
        """An immutable view of everything applied so far."""
        # Inner config dicts are replaced, never mutated, so sharing them is safe.
        return ClusterConfigSnapshot(
            offset=self._offset,
            _connector_configs=dict(self._connector_configs),
            _task_configs=dict(self._task_configs),
            _target_states=dict(self._target_states),
            inconsistent=frozenset(self._inconsistent & self._connector_configs.keys()),
            _task_commits=dict(self._task_commits),
            session_key=self._session_key,
        )


def _object(value: bytes) -> dict[str, Any]:
    decoded = json.loads(value)
    if not isinstance(decoded, dict):
        raise ValueError("expected a JSON object")
    return decoded


def _properties(value: bytes) -> dict[str, str]:
    props = _object(value)["properties"]
    if not isinstance(props, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in props.items()
    ):
        raise ValueError("properties must map strings to strings")
    return props


def _restart_request(name: str, value: bytes | None) -> RestartRequest | None:
    if value is None:
        return None
    body = _object(value)
    return RestartRequest(
        name,
        include_tasks=bool(body.get("include-tasks", False)),
        only_failed=bool(body.get("only-failed", False)),
    )


def _logger_level(namespace: str, value: bytes | None) -> ClusterLoggerLevel | None:
    if value is None:
        return None
    level = _object(value)["level"]
    if not isinstance(level, str) or not namespace:
        raise ValueError(f"a logger level record needs a namespace and a level, not {level!r}")
    return ClusterLoggerLevel(namespace, level)


@dataclass(frozen=True)
class ConfigDiff:
    """What changed between two snapshots, sorted by what the herder must do about it.

    Connectors added or removed, and connectors whose task set changed, need a
    rebalance (task sets move between workers and offsets must be committed first); a
    task set committed again counts as changed even when its configs are equal. A
    changed connector config only bounces the connector where it runs, which then
    regenerates its task configs; a target state change is carried out in place.
    The ``*_changed`` sets only name connectors present in both snapshots.
    """

    added: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    connector_configs_changed: frozenset[str] = frozenset()
    task_configs_changed: frozenset[str] = frozenset()
    target_states_changed: frozenset[str] = frozenset()

    @property
    def needs_rebalance(self) -> bool:
        """Whether work moves between workers, so the group must rejoin."""
        return bool(self.added or self.removed or self.task_configs_changed)

    @property
    def empty(self) -> bool:
        """Whether the herder has nothing to do."""
        return not (
            self.needs_rebalance or self.connector_configs_changed or self.target_states_changed
        )

    @classmethod
    def between(cls, old: ClusterConfigSnapshot, new: ClusterConfigSnapshot) -> ConfigDiff:
        """What it takes to go from ``old`` (the herder's current view) to ``new``."""
        both = old.connectors & new.connectors

        def changed(view: Callable[[ClusterConfigSnapshot, str], object]) -> frozenset[str]:
            return frozenset(n for n in both if view(old, n) != view(new, n))

        return cls(
            added=new.connectors - old.connectors,
            removed=old.connectors - new.connectors,
            connector_configs_changed=changed(ClusterConfigSnapshot.connector_config),
            task_configs_changed=changed(ClusterConfigSnapshot.task_configs)
            | changed(ClusterConfigSnapshot.task_commit),
            target_states_changed=changed(ClusterConfigSnapshot.target_state),
        )
