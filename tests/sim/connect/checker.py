"""The connect simulation's invariants, checked after every step.

* At most one running owner of each connector and task per generation.
* At any moment, at most one live worker that is a member of the group runs each
  connector and task: under the cooperative protocols work keeps running through
  rebalances, so this holds between generations too, not only within one. (A worker
  the group has dropped may still run its work until it notices: that zombie is the
  data plane's fencing's to stop.)
* No work starts before the revocations it depends on have finished: a worker that is
  a member of the generation the work starts in no longer runs it.
* No config write commits under a stale leader epoch.
* A worker starts work only at or past its assignment's config offset.
* A status from an older generation never overwrites a newer one (in the view any
  worker folds from ``_status``).

And liveness: once the faults stop, every connector and task of the config log runs
exactly once, reported RUNNING (or PAUSED), within a bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herder.runtime.core.config_state import ConfigState, TargetState
from herder.runtime.core.protocol import COOPERATIVE_PROTOCOLS, Assignment, ConnectorTaskId
from herder.runtime.core.status import State, StatusView, decode_status

if TYPE_CHECKING:
    from tests.sim.connect.cluster import Simulation, SimWorker


class Violation(AssertionError):
    pass


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.history: list[str] = []
        self._configs = ConfigState()
        self._config_position = 0
        self._statuses = StatusView()
        self._status_position = 0
        #: status key -> the newest generation written since its last deletion
        self._newest: dict[str, int] = {}
        self.leaders: dict[int, str] = {}
        self.members: dict[int, tuple[str, ...]] = {}
        self._cooperative: set[int] = set()
        self._last_members: frozenset[str] = frozenset()

    # -- events the simulation reports --------------------------------------------------

    def generation(self, w: SimWorker, generation: Any, assignment: Assignment) -> None:
        """One member's view of a generation: all agree on its leader; the leader, who
        alone is told the members, records them."""
        gen_id = generation.generation_id
        leader = self.leaders.setdefault(gen_id, generation.leader_id)
        if leader != generation.leader_id:
            raise Violation(
                f"generation {gen_id}: worker {w.index} was told leader "
                f"{generation.leader_id}, another {leader}"
            )
        if generation.members:
            self.members[gen_id] = tuple(generation.members)
        self.sim.report.generations = len(self.leaders)
        if generation.protocol in COOPERATIVE_PROTOCOLS:
            self._cooperative.add(gen_id)
            self.sim.report.cooperative_generations = len(self._cooperative)
        if assignment.revoked_connectors or assignment.revoked_tasks:
            self.sim.report.revocations += 1

    def members_of(self, generation: int) -> tuple[str, ...]:
        """The member ids of ``generation``: as its leader was told them, or as the
        coordinator holds them while that generation is current."""
        if generation in self.members:
            return self.members[generation]
        core = self.sim.coordinator
        group = core.group("connect-sim") if core is not None else None
        if group is not None and group.generation_id == generation:
            return tuple(group.member_ids)
        return ()

    def starting(self, w: SimWorker, what: str | ConnectorTaskId, generation: int) -> None:
        members = self.members_of(generation)
        self.history.append(f"{self.sim.now} {w.index} starts {what} in {generation}")
        for execution in self.sim.running.get(what, []):
            other = self.sim.workers[execution.worker]
            if execution.worker == w.index or not other.alive:
                continue
            if execution.generation == generation:
                raise Violation(
                    f"{what} runs on workers {w.index} and {other.index} in generation {generation}"
                )
            # a worker that was a member of this generation must have stopped the work of
            # older ones before it joined (a zombie of an older generation starting work
            # while a newer one runs it is the data plane's fencing's to stop)
            if (
                execution.generation < generation
                and other.member.member_id
                and other.member.member_id in members
            ):
                raise Violation(
                    f"{what} starts on worker {w.index} in generation {generation} while worker "
                    f"{other.index}, a member of that generation, still runs it from generation "
                    f"{execution.generation} (its revocation had not finished)"
                )
        assignment = w.core.assignment
        if assignment is not None and w.core.applied.offset < assignment.config_offset:
            raise Violation(
                f"worker {w.index} starts {what} from configs at offset {w.core.applied.offset}, "
                f"behind its assignment's config offset {assignment.config_offset}"
            )

    def config_written(self, w: SimWorker, epoch: int) -> None:
        current = self.sim.ensemble.fencing_epoch("connect-leader-connect-sim")
        if current != epoch:
            raise Violation(
                f"worker {w.index} committed a config write under leader epoch {epoch}; "
                f"the current epoch is {current}"
            )

    # -- after every step ---------------------------------------------------------------

    def check(self) -> None:
        self._fold_statuses()
        self._one_member_runs_each()

    def _group_members(self) -> frozenset[str]:
        """The members of the group now: as the coordinator holds them, or, while there
        is none (a failover), as the last one held them."""
        core = self.sim.coordinator
        group = core.group("connect-sim") if core is not None else None
        if group is not None:
            self._last_members = frozenset(group.member_ids)
        return self._last_members

    def _one_member_runs_each(self) -> None:
        members = self._group_members()
        for what, executions in self.sim.running.items():
            runners = sorted(
                e.worker
                for e in executions
                if (w := self.sim.workers[e.worker]).alive
                and w.member.member_id
                and w.member.member_id in members
            )
            if len(runners) > 1:
                raise Violation(
                    f"{what} runs on workers {runners} at once, all members of the group "
                    f"(generations {sorted(e.generation for e in executions)})"
                )

    def _fold_statuses(self) -> None:
        for record in self.sim.ensemble.records("_status", self._status_position):
            self._status_position = record.offset + 1
            key = record.key.decode()
            self._statuses.apply(key, record.value)
            if record.value is None:
                self._newest.pop(key, None)
                continue
            status = decode_status(key, record.value)
            self._newest[key] = max(self._newest.get(key, -1), status.generation)
            held = self._statuses.get(status)
            if held is None or held.generation != self._newest[key]:
                raise Violation(
                    f"status {key}: the view holds generation "
                    f"{None if held is None else held.generation} after a record of generation "
                    f"{status.generation}; the newest written is {self._newest[key]}"
                )

    # -- liveness -----------------------------------------------------------------------

    def _snapshot(self) -> Any:
        for record in self.sim.ensemble.records("_configs", self._config_position):
            self._config_position = record.offset + 1
            self._configs.apply(record.offset, record.key.decode(), record.value)
        return self._configs.snapshot()

    def unsettled(self) -> list[str]:
        """What is not yet as it should be once the cluster has settled."""
        problems: list[str] = []
        sim = self.sim
        for w in sim.workers:
            if not w.alive or not w.started or w.core.assignment is None:
                problems.append(f"worker {w.index} holds no assignment")
        snapshot = self._snapshot()
        wanted: list[str | ConnectorTaskId] = []
        for name in sorted(snapshot.connectors):
            wanted.append(name)
            wanted.extend(snapshot.tasks(name))
            # a connector paused before it ever ran has no task set until it resumes
            paused = snapshot.target_state(name) is TargetState.PAUSED
            if name in snapshot.inconsistent or not (snapshot.tasks(name) or paused):
                problems.append(f"connector {name} has no task set yet")
        for what in wanted:
            live = [e for e in sim.running.get(what, []) if sim.workers[e.worker].alive]
            if len(live) != 1:
                problems.append(f"{what} runs {len(live)} times")
                continue
            connector = what if isinstance(what, str) else what.connector
            target = snapshot.target_state(connector) or TargetState.STARTED
            state = State.PAUSED if target is TargetState.PAUSED else State.RUNNING
            status = (
                self._statuses.connector(what)
                if isinstance(what, str)
                else self._statuses.task(what)
            )
            if status is None or status.state is not state:
                problems.append(f"{what} is {status and status.state}, not {state}")
        for what, executions in sim.running.items():
            if what not in wanted and any(sim.workers[e.worker].alive for e in executions):
                problems.append(f"{what} runs but is not configured")
        sessioned = any(
            w.alive and w.core.generation is not None and w.core.signs_requests for w in sim.workers
        )
        if sessioned and snapshot.session_key is None:
            problems.append("the group speaks sessioned but no session key was distributed")
        return problems

    def settled(self) -> bool:
        self._fold_statuses()
        return not self.unsettled()
