"""What :class:`~herder.runtime.core.herder.HerderCore` asks its shell to carry out.

Each effect is plain data. The shell (a worker process, the standalone herder, the
simulator) does the IO and reports back through the core's completion methods named
on each effect, so the core always knows what is under way.
"""

from __future__ import annotations

from dataclasses import dataclass

from herder.runtime.core.config_state import TargetState
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectorTaskId


@dataclass(frozen=True)
class StopAll:
    """Stop every connector and task (a revocation); then ``work_stopped()``."""


@dataclass(frozen=True)
class FinishRevocation:
    """The revoked work has stopped: let the group member rejoin."""


@dataclass(frozen=True)
class ReadToEnd:
    """Read the config log to its end, at least to ``at_least``; then ``caught_up(ok)``."""

    at_least: int


@dataclass(frozen=True)
class LeaveAndBackOff:
    """Leave the group, wait ``backoff_ms``, then ``backed_off()`` (Connect's
    ``worker.unsync.backoff.ms``: the others rebalance without this worker meanwhile)."""

    backoff_ms: int


@dataclass(frozen=True)
class Rejoin:
    """Have the group member rejoin."""


@dataclass(frozen=True)
class TakeLeaderEpoch:
    """Take the leader's fencing epoch for ``generation``; then ``leader_epoch_taken``
    or ``leader_epoch_failed``."""

    generation: Generation


@dataclass(frozen=True)
class BeginGeneration:
    """Work of ``generation`` may start from now on (and of no other)."""

    generation: Generation


@dataclass(frozen=True)
class StartConnector:
    """Start connector ``name`` as ``instance`` in ``generation``; then
    ``connector_started(name, instance, ok)``."""

    name: str
    instance: int
    config: dict[str, str]
    target: TargetState
    generation: Generation


@dataclass(frozen=True)
class StartTask:
    task_id: ConnectorTaskId
    task_config: dict[str, str]
    connector_config: dict[str, str]
    target: TargetState
    generation: Generation


@dataclass(frozen=True)
class StopConnector:
    name: str
    destroyed: bool = False


@dataclass(frozen=True)
class StopTasks:
    task_ids: tuple[ConnectorTaskId, ...]
    destroyed: bool = False


@dataclass(frozen=True)
class Destroy:
    """A deleted connector: stop it and every task of it here (held-back starts too)
    and tombstone their statuses."""

    name: str


@dataclass(frozen=True)
class SetConnectorTarget:
    """Pause, resume or stop connector ``name`` in place (instance ``instance``); then
    ``connector_retargeted(name, instance)``."""

    name: str
    instance: int
    target: TargetState


@dataclass(frozen=True)
class SetTaskTarget:
    task_id: ConnectorTaskId
    target: TargetState


@dataclass(frozen=True)
class PublishRestarting:
    """Report RESTARTING for a connector (a name) or a task about to be restarted."""

    instance: str | ConnectorTaskId


@dataclass(frozen=True)
class Ticket:
    """What a task-config generation speaks for: its results count only while the
    same generation, connector instance and connector config are current."""

    name: str
    generation: Generation | None
    instance: int
    config: dict[str, str]
    max_tasks: int


@dataclass(frozen=True)
class GenerateTaskConfigs:
    """Ask connector ``ticket.name`` for its task configs (connector code, off the
    herder's loop); then ``task_configs_generated`` or ``task_configs_failed``."""

    ticket: Ticket


@dataclass(frozen=True)
class WriteTaskConfigs:
    """Leader: fence the connector's old tasks and write its new task set, if
    ``still_current(ticket)`` when the write begins; then ``task_configs_done``."""

    ticket: Ticket
    configs: tuple[dict[str, str], ...]


@dataclass(frozen=True)
class ForwardTaskConfigs:
    """Not the leader: send the task set to the leader at ``leader_url``, if
    ``still_current(ticket)`` when it is sent; then ``task_configs_done``."""

    ticket: Ticket
    configs: tuple[dict[str, str], ...]
    leader_url: str | None


@dataclass(frozen=True)
class DistributeSessionKey:
    """Leader under ``sessioned``: write a new random session key, made at ``created_ms``
    (wall clock), to the config log under the leader's fencing; then
    ``session_key_written(ok)``."""

    generation: Generation
    created_ms: int


@dataclass(frozen=True)
class PublishUnassigned:
    """Cooperative leader: publish UNASSIGNED for the work of departed workers it holds
    back, each naming the worker it waits for (``(work, worker id)`` pairs), under
    ``generation`` — so its status no longer says RUNNING on a worker that is gone."""

    work: tuple[tuple[str | ConnectorTaskId, str], ...]
    generation: Generation


Effect = (
    StopAll
    | FinishRevocation
    | ReadToEnd
    | LeaveAndBackOff
    | Rejoin
    | TakeLeaderEpoch
    | BeginGeneration
    | StartConnector
    | StartTask
    | StopConnector
    | StopTasks
    | Destroy
    | SetConnectorTarget
    | SetTaskTarget
    | PublishRestarting
    | GenerateTaskConfigs
    | WriteTaskConfigs
    | ForwardTaskConfigs
    | DistributeSessionKey
    | PublishUnassigned
)
