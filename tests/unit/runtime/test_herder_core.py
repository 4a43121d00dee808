"""HerderCore: what the herder decides, fed events and read back as effects."""

from __future__ import annotations

import msgspec
import pytest

from herder.errors import InvalidSessionTimeout
from herder.runtime.core import effects as fx
from herder.runtime.core.admission import NotFound, NotLeaderWorker, NotOwner
from herder.runtime.core.config_state import (
    ConfigState,
    RestartRequest,
    TargetState,
    connector_config_record,
    connector_removal_record,
    target_state_record,
    task_config_records,
)
from herder.runtime.core.herder import HerderCore
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import (
    Assignment,
    ConnectorTaskId,
    ConnectProtocol,
    WorkerMetadata,
    decode_metadata,
)
from herder.runtime.core.status import State, StatusView, TaskStatus

pytestmark = pytest.mark.unit

ME = "http://me:8083"
T0 = ConnectorTaskId("c", 0)


class Log:
    """A config log folded the way the ConfigStore folds it."""

    def __init__(self) -> None:
        self.state = ConfigState()
        self.offset = 0

    def write(self, *records: tuple[str, bytes | None]) -> None:
        for key, value in records:
            self.state.apply(self.offset, key, value)
            self.offset += 1

    def connector(self, name: str = "c", tasks: int = 1, **extra: str) -> None:
        config = {"name": name, "connector.class": "X", "tasks.max": str(tasks), **extra}
        self.write(connector_config_record(name, config))
        self.write(*task_config_records(name, [{"task": str(i)} for i in range(tasks)]))


def generation(gen_id: int = 1, *, leader: bool = True) -> Generation:
    return Generation(gen_id, "me", "me" if leader else "other", "eager", ("me", "other"))


def assignment(log: Log, *, connectors: tuple[str, ...] = ("c",), tasks=(T0,), offset=None,
               error: int = 0) -> Assignment:  # fmt: skip
    return Assignment(
        leader="me",
        leader_url=ME,
        config_offset=log.state.snapshot().offset if offset is None else offset,
        connectors=connectors,
        tasks=tuple(tasks),
        error=error,
    )


def kinds(effects: list[fx.Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


@pytest.fixture
def log() -> Log:
    log = Log()
    log.connector()
    return log


def core_at(log: Log, statuses: StatusView | None = None) -> HerderCore:
    core = HerderCore("me", ME, statuses=statuses or StatusView(), unsync_backoff_ms=500)
    core.configs_read(log.state.snapshot())
    return core


def started(log: Log, gen: Generation | None = None) -> HerderCore:
    """A core that has started the work of generation 1 as its leader."""
    core = core_at(log)
    gen = gen or generation()
    core.assigned(gen, assignment(log))
    if gen.is_leader:
        core.ready()
        core.leader_epoch_taken(gen, 7)
    core.ready()
    return core


def test_a_follower_starts_its_assignment_at_once(log: Log) -> None:
    core = core_at(log)
    gen = generation(leader=False)
    core.assigned(gen, assignment(log))
    effects = core.ready()
    assert kinds(effects) == ["BeginGeneration", "StartConnector", "StartTask"]
    start = effects[1]
    assert isinstance(start, fx.StartConnector) and start.generation is gen
    assert start.target is TargetState.STARTED


def test_the_leader_takes_its_fencing_epoch_before_any_work_starts(log: Log) -> None:
    core = core_at(log)
    gen = generation()
    core.assigned(gen, assignment(log))
    assert kinds(core.ready()) == ["TakeLeaderEpoch"]
    core.leader_epoch_taken(gen, 3)
    assert kinds(core.ready()) == ["BeginGeneration", "StartConnector", "StartTask"]
    assert core.is_leader and core.leader_fence_epoch() == 3


def test_a_leader_without_its_epoch_rejoins_instead_of_starting(log: Log) -> None:
    core = core_at(log)
    gen = generation()
    core.assigned(gen, assignment(log))
    core.ready()
    core.leader_epoch_failed(gen, RuntimeError("coordinator moved"))
    assert kinds(core.ready()) == ["Rejoin"]
    assert core.assignment is None


def test_a_worker_behind_the_assignment_reads_the_log_first(log: Log) -> None:
    core = core_at(log)
    behind = log.state.snapshot()
    log.connector("d")
    core.configs_read(behind)
    core.assigned(generation(leader=False), assignment(log))
    (read,) = core.ready()
    assert isinstance(read, fx.ReadToEnd) and read.at_least == log.state.snapshot().offset
    core.configs_read(log.state.snapshot())
    core.caught_up(True)
    assert kinds(core.ready()) == ["BeginGeneration", "StartConnector", "StartTask"]
    assert core.applied.offset == log.state.snapshot().offset


def test_a_worker_that_cannot_catch_up_leaves_backs_off_and_rejoins(log: Log) -> None:
    core = core_at(log)
    core.configs_read(ConfigState().snapshot())
    core.assigned(generation(leader=False), assignment(log))
    core.ready()
    core.caught_up(False)
    (leave,) = core.ready()
    assert isinstance(leave, fx.LeaveAndBackOff) and leave.backoff_ms == 500
    core.backed_off()
    assert kinds(core.ready()) == ["Rejoin"]


def test_a_failed_assignment_reads_to_the_end_and_rejoins(log: Log) -> None:
    core = core_at(log)
    core.assigned(generation(leader=False), assignment(log, error=1))
    assert kinds(core.ready()) == ["ReadToEnd"]
    core.caught_up(True)
    assert kinds(core.ready()) == ["Rejoin"]


def test_a_worker_ahead_of_the_assignment_rejoins(log: Log) -> None:
    core = core_at(log)
    core.assigned(generation(leader=False), assignment(log, offset=0))
    assert kinds(core.ready()) == ["Rejoin"]


def test_a_revocation_while_catching_up_drops_the_generation(log: Log) -> None:
    core = core_at(log)
    core.configs_read(ConfigState().snapshot())
    core.assigned(generation(leader=False), assignment(log))
    core.ready()
    core.revoking()
    core.configs_read(log.state.snapshot())
    core.caught_up(True)
    assert kinds(core.ready()) == ["StopAll"]


def test_a_revocation_drops_starts_not_yet_carried_out(log: Log) -> None:
    core = core_at(log)
    core.assigned(generation(leader=False), assignment(log))
    core.revoking()
    assert kinds(core.ready()) == ["StopAll"]
    core.work_stopped()
    assert kinds(core.ready()) == ["FinishRevocation"]
    assert core.assignment is None


def test_a_late_epoch_of_a_revoked_generation_starts_nothing(log: Log) -> None:
    core = core_at(log)
    gen = generation()
    core.assigned(gen, assignment(log))
    core.ready()
    core.revoking()
    core.ready()
    core.leader_epoch_taken(gen, 3)
    assert core.ready() == []


def test_new_or_removed_connectors_rebalance(log: Log) -> None:
    core = started(log)
    log.connector("d")
    core.configs_read(log.state.snapshot())
    core.tick(0)
    assert kinds(core.ready()) == ["Rejoin"]
    core = started(log)
    log.write(connector_removal_record("c"))
    core.configs_read(log.state.snapshot())
    core.tick(0)
    assert kinds(core.ready()) == ["Destroy", "Rejoin"]


def test_a_changed_connector_config_restarts_it_in_place(log: Log) -> None:
    core = started(log)
    log.write(connector_config_record("c", {"name": "c", "connector.class": "X", "v": "2"}))
    core.configs_read(log.state.snapshot())
    core.tick(0)
    effects = core.ready()
    assert kinds(effects) == ["StopConnector", "StartConnector"]
    assert isinstance(effects[1], fx.StartConnector) and effects[1].config["v"] == "2"


def test_a_target_state_is_carried_out_in_place(log: Log) -> None:
    core = started(log)
    log.write(target_state_record("c", TargetState.PAUSED))
    core.configs_read(log.state.snapshot())
    core.tick(0)
    effects = core.ready()
    assert kinds(effects) == ["SetConnectorTarget", "SetTaskTarget"]
    assert all(e.target is TargetState.PAUSED for e in effects)  # type: ignore[union-attr]


def _start_connector(core: HerderCore) -> fx.Ticket:
    core.connector_started("c", core._instances["c"], True, 0)
    core.tick(0)
    (generate,) = core.ready()
    assert isinstance(generate, fx.GenerateTaskConfigs)
    return generate.ticket


def test_a_started_connector_generates_task_configs_and_the_leader_writes_changes(
    log: Log,
) -> None:
    core = started(log)
    ticket = _start_connector(core)
    core.task_configs_generated(ticket, [{"task": "0"}, {"task": "1"}], 0)
    (write,) = core.ready()
    assert isinstance(write, fx.WriteTaskConfigs) and len(write.configs) == 2
    core.task_configs_done(ticket)
    assert core.next_due_ms() is None


def test_equal_task_configs_are_not_written_again(log: Log) -> None:
    core = started(log)
    ticket = _start_connector(core)
    core.task_configs_generated(ticket, [{"task": "0"}], 0)
    assert core.ready() == []


def test_a_follower_forwards_task_configs_to_the_leader(log: Log) -> None:
    core = started(log, generation(leader=False))
    ticket = _start_connector(core)
    core.task_configs_generated(ticket, [{"task": "x"}], 0)
    (forward,) = core.ready()
    assert isinstance(forward, fx.ForwardTaskConfigs) and forward.leader_url == ME


def test_task_configs_of_a_superseded_instance_are_dropped(log: Log) -> None:
    core = started(log)
    ticket = _start_connector(core)
    log.write(connector_config_record("c", {"name": "c", "connector.class": "X", "v": "2"}))
    core.configs_read(log.state.snapshot())
    core.tick(0)
    core.ready()
    assert not core.still_current(ticket)
    core.task_configs_generated(ticket, [{"task": "other"}], 0)
    assert core.ready() == []


def test_a_failed_generation_is_retried_with_doubling_backoff(log: Log) -> None:
    core = started(log)
    ticket = _start_connector(core)
    core.task_configs_failed(ticket, RuntimeError("boom"), 1_000)
    assert core.next_due_ms() == 1_250
    core.tick(1_100)
    assert core.ready() == []
    core.tick(1_250)
    assert kinds(core.ready()) == ["GenerateTaskConfigs"]


def test_a_stuck_connector_is_not_retried(log: Log) -> None:
    core = started(log)
    ticket = _start_connector(core)
    core.task_configs_failed(ticket, RuntimeError("stuck"), 0, retry=False)
    assert core.next_due_ms() is None


def test_writes_are_admitted_only_on_the_leader(log: Log) -> None:
    follower = started(log, generation(leader=False))
    with pytest.raises(NotLeaderWorker) as refused:
        follower.require_leader()
    assert refused.value.leader_url == ME
    assert started(log).leader_fence_epoch() == 7
    with pytest.raises(NotLeaderWorker, match="rebalance is under way"):
        core_at(log).require_leader()


def test_a_fenced_write_makes_the_leader_rejoin(log: Log) -> None:
    core = started(log)
    error = core.write_refused()
    assert isinstance(error, NotLeaderWorker)
    assert kinds(core.ready()) == ["Rejoin"]
    with pytest.raises(NotLeaderWorker):
        core.leader_fence_epoch()


def test_a_fatal_group_error_refuses_every_request_and_names_the_cause(log: Log) -> None:
    core = core_at(log)
    core.member_failed(InvalidSessionTimeout("session timeout 1 ms is below the minimum"))
    assert core.failure is not None and core.member_generation is None
    with pytest.raises(NotLeaderWorker, match="session timeout 1 ms"):
        core.require_leader()


def test_restart_requests_restart_what_runs_here(log: Log) -> None:
    statuses = StatusView()
    core = HerderCore("me", ME, statuses=statuses, unsync_backoff_ms=500)
    core.configs_read(log.state.snapshot())
    core.assigned(generation(leader=False), assignment(log))
    core.ready()
    statuses.apply(*_status(TaskStatus(T0, State.FAILED, "me", 1)))
    core.restart_recorded(RestartRequest("c", include_tasks=True, only_failed=True))
    core.tick(0)
    assert kinds(core.ready()) == ["PublishRestarting", "StopTasks", "StartTask"]


def test_restarting_work_that_runs_elsewhere_names_its_worker(log: Log) -> None:
    core = started(log)
    core.owners = {ConnectorTaskId("c", 1): "http://other:8083"}
    log.connector("c", tasks=2)
    core.configs_read(log.state.snapshot())
    with pytest.raises(NotOwner, match="other:8083"):
        core.restart_task(ConnectorTaskId("c", 1))
    with pytest.raises(NotFound):
        core.restart_connector("nope")
    assert kinds(core.restart_connector("c")) == ["StopConnector", "StartConnector"]


def _status(status: TaskStatus) -> tuple[str, bytes | None]:
    from herder.runtime.core.status import status_record

    return status_record(status)


def test_a_leader_that_computed_no_assignment_finds_the_owner_in_the_statuses(log: Log) -> None:
    """A static leader back from a restart got its assignment without computing one."""
    statuses = StatusView()
    core = HerderCore("me:8083", ME, statuses=statuses, unsync_backoff_ms=500)
    core.configs_read(log.state.snapshot())
    gen = generation()
    core.assigned(gen, assignment(log, connectors=(), tasks=()))
    core.ready()
    core.leader_epoch_taken(gen, 1)
    core.ready()
    with pytest.raises(NotOwner, match="nor, yet, to any other"):
        core.restart_task(T0)
    statuses.apply(*_status(TaskStatus(T0, State.RUNNING, "other:8083", 1)))
    with pytest.raises(NotOwner) as refused:
        core.restart_task(T0)
    assert refused.value.target_url == "http://other:8083"


# -- cooperative protocols (KIP-415) --------------------------------------------------------


def coop_generation(gen_id: int = 1) -> Generation:
    return Generation(gen_id, "me", "other", "sessioned", ())


def coop_core(log: Log) -> HerderCore:
    core = HerderCore(
        "me",
        ME,
        statuses=StatusView(),
        unsync_backoff_ms=500,
        protocol=ConnectProtocol.SESSIONED,
    )
    core.configs_read(log.state.snapshot())
    return core


def test_a_cooperative_worker_offers_every_protocol_with_what_it_holds(log: Log) -> None:
    core = coop_core(log)
    assert [name for name, _ in core.protocols()] == ["sessioned", "compatible", "eager"]
    core.assigned(coop_generation(), assignment(log))
    metadata = decode_metadata(core.protocols()[0][1])
    assert metadata.version == 2
    assert metadata.connectors == ("c",) and metadata.tasks == (T0,)


def test_a_cooperative_assignment_keeps_what_runs_and_starts_only_what_is_new(log: Log) -> None:
    log.connector("d", tasks=2)
    core = coop_core(log)
    core.assigned(coop_generation(1), assignment(log))
    assert kinds(core.ready()) == [
        "FinishRevocation",
        "BeginGeneration",
        "StartConnector",
        "StartTask",
    ]
    more = assignment(log, connectors=("c", "d"), tasks=(T0, ConnectorTaskId("d", 1)))
    core.assigned(coop_generation(2), more)
    effects = core.ready()
    assert kinds(effects) == ["FinishRevocation", "BeginGeneration", "StartConnector", "StartTask"]
    assert effects[2].name == "d"  # type: ignore[union-attr]
    assert effects[3].task_id == ConnectorTaskId("d", 1)  # type: ignore[union-attr]


def test_a_cooperative_revocation_stops_only_the_revoked_work_then_rejoins(log: Log) -> None:
    log.connector("d", tasks=2)
    core = coop_core(log)
    d0, d1 = ConnectorTaskId("d", 0), ConnectorTaskId("d", 1)
    core.assigned(coop_generation(1), assignment(log, connectors=("c", "d"), tasks=(T0, d0, d1)))
    core.ready()
    fewer = msgspec.structs.replace(
        assignment(log, connectors=("c",), tasks=(T0, d0)),
        revoked_connectors=("d",),
        revoked_tasks=(d1,),
    )
    core.assigned(coop_generation(2), fewer)
    effects = core.ready()
    assert effects[:4] == [
        fx.StopConnector("d"),
        fx.StopTasks((d1,)),
        fx.FinishRevocation(),
        fx.Rejoin(),
    ]
    assert kinds(effects[4:]) == ["BeginGeneration"]  # nothing else starts or stops
    assert decode_metadata(core.protocols()[0][1]).tasks == (T0, d0)


def test_a_cooperative_assignment_with_a_delay_rejoins_when_it_has_passed(log: Log) -> None:
    core = coop_core(log)
    core.assigned(coop_generation(), msgspec.structs.replace(assignment(log), delay=5_000))
    core.ready()
    core.tick(1_000)
    assert core.next_due_ms() == 6_000
    core.tick(5_999)
    assert "Rejoin" not in kinds(core.ready())
    core.tick(6_000)
    assert kinds(core.ready()) == ["Rejoin"]
    assert core.next_due_ms() is None


def test_kept_work_catches_up_with_a_config_change_it_missed(log: Log) -> None:
    core = coop_core(log)
    core.assigned(coop_generation(1), assignment(log))
    core.ready()
    # the connector's tasks are rewritten while the group rebalances
    log.write(*task_config_records("c", [{"task": "0", "v": "2"}]))
    core.configs_read(log.state.snapshot())
    core.assigned(coop_generation(2), assignment(log))
    effects = core.ready()
    assert kinds(effects) == ["FinishRevocation", "BeginGeneration", "StopTasks", "StartTask"]
    assert effects[3].generation.generation_id == 2  # type: ignore[union-attr]
    assert effects[3].task_config == {"task": "0", "v": "2"}  # type: ignore[union-attr]


def test_a_re_tasked_connector_restarts_its_tasks_here_and_rebalances(log: Log) -> None:
    core = coop_core(log)
    core.assigned(coop_generation(1), assignment(log))
    core.ready()
    log.write(*task_config_records("c", [{"task": "0", "v": "2"}, {"task": "1"}]))
    core.configs_read(log.state.snapshot())
    core.tick(0)
    assert kinds(core.ready()) == ["StopTasks", "StartTask", "Rejoin"]


def test_an_eager_generation_after_a_cooperative_one_stops_what_it_revokes(log: Log) -> None:
    core = coop_core(log)
    core.assigned(coop_generation(1), assignment(log))
    core.ready()
    eager = Generation(2, "me", "other", "eager", ())
    revoking = msgspec.structs.replace(
        assignment(log, connectors=(), tasks=()), revoked_connectors=("c",), revoked_tasks=(T0,)
    )
    core.assigned(eager, revoking)
    assert kinds(core.ready()) == ["StopConnector", "StopTasks", "Rejoin", "BeginGeneration"]
    assert decode_metadata(core.protocols()[-1][1]).tasks == ()


def test_the_cooperative_leader_remembers_its_last_round(log: Log) -> None:
    core = coop_core(log)
    members = {
        "a": WorkerMetadata(version=2, config_offset=log.offset, url="http://a:8083"),
        "me": WorkerMetadata(version=2, config_offset=log.offset, url=ME),
    }
    first = core.assign("me", members, "sessioned", 0)
    assert first["a"].tasks == (T0,) and first["a"].version == 2
    assert core.owners[T0] == "http://a:8083"
    # its holder leaves: the task is held back for it rather than moved at once
    second = core.assign("me", {"me": members["me"]}, "sessioned", 1_000)
    assert second["me"].tasks == () and second["me"].delay == core.max_delay_ms
    # and an eager round forgets it all
    eager = core.assign("me", {"me": members["me"]}, "eager", 2_000)
    assert eager["me"].tasks == (T0,)


def test_a_revocation_between_two_effects_drops_the_starts_still_queued(log: Log) -> None:
    """The shell takes effects one at a time: what it has not taken yet can still go."""
    core = core_at(log)
    core.assigned(generation(leader=False), assignment(log))
    assert isinstance(core.take(), fx.BeginGeneration)
    core.revoking()  # while the shell carries out BeginGeneration
    assert isinstance(core.take(), fx.StopAll)
    assert core.take() is None


def test_task_starts_queued_in_a_row_are_taken_together(log: Log) -> None:
    log.connector("c", tasks=3)
    core = core_at(log)
    tasks = tuple(ConnectorTaskId("c", i) for i in range(3))
    core.assigned(generation(leader=False), assignment(log, tasks=tasks))
    assert kinds([core.take(), core.take()]) == ["BeginGeneration", "StartConnector"]  # type: ignore[list-item]
    first = core.take()
    assert isinstance(first, fx.StartTask)
    assert [s.task_id for s in core.take_task_starts()] == list(tasks[1:])
    assert core.take() is None


def test_the_leader_publishes_held_back_work_as_unassigned_on_the_departed_worker(
    log: Log,
) -> None:
    core = coop_core(log)
    members = {
        "a": WorkerMetadata(version=2, config_offset=log.offset, url="http://a:8083"),
        "me": WorkerMetadata(version=2, config_offset=log.offset, url=ME),
    }
    core.assign("me", members, "sessioned", 0)
    held_back = core.assign("me", {"me": members["me"]}, "sessioned", 1_000)
    gen = Generation(2, "me", "me", "sessioned", ("me",))
    core.assigned(gen, held_back["me"])
    core.ready()
    core.leader_epoch_taken(gen, 1)
    published = [e for e in core.ready() if isinstance(e, fx.PublishUnassigned)]
    assert published == [fx.PublishUnassigned((("c", "a:8083"), (T0, "a:8083")), gen)]


@pytest.mark.parametrize("protocol", ["eager", "sessioned"])
def test_configs_read_while_the_leader_takes_its_epoch_make_it_rejoin(
    log: Log, protocol: str
) -> None:
    """A connector created while the leader takes its fencing epoch is not in the
    assignment it is about to start: starting it would leave the new connector to no one."""
    core = coop_core(log) if protocol == "sessioned" else core_at(log)
    gen = Generation(1, "me", "me", protocol, ("me",))
    core.assigned(gen, assignment(log))
    assert kinds(core.ready())[-1] == "TakeLeaderEpoch"
    log.connector("new")
    core.configs_read(log.state.snapshot())
    core.leader_epoch_taken(gen, 3)
    effects = core.ready()
    assert "Rejoin" in kinds(effects)
    assert "StartConnector" not in kinds(effects)
