"""The group coordinator hosted by the ensemble leader.

Every server routes the coordinator's APIs; the core is active only while this server
leads. On becoming leader it reads every group, offset and fencing epoch from the
replicated ``_groups`` and ``_fencing`` logs (immigration); on losing leadership, which
the ensemble reports the moment the quorum is gone, it unloads everything at once
(emigration), answering what was waiting with NOT_COORDINATOR. Its store writes are
ensemble transactions, and a callback runs only after the write committed.

The core is pure; this shell gives it the wall clock (offset commit timestamps outlive
a leader change, so monotonic time would not do) and one timer for its deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from herder.coordinator import apis
from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.coordinator import GroupCoordinator
from herder.coordinator.group import GroupState
from herder.coordinator.messages import JoinGroupRequest
from herder.coordinator.offsets import TopicPartition
from herder.coordinator.records import (
    FENCING_LOG,
    GROUPS_LOG,
    FencingRecord,
    GroupRecord,
    OffsetRecord,
    collect_groups,
    decode_fencing_value,
    encode_record,
    fencing_key,
    group_key,
    offset_key,
)
from herder.coordinator.store import StoreCallback
from herder.ensemble.admin import MetricSample
from herder.ensemble.services import ServiceHost
from herder.ensemble.txn import Append, CreateLog, Op
from herder.errors import ErrorCode, HerderError, InvalidSessionTimeout
from herder.wire import RequestContext

log = logging.getLogger(__name__)

_READ_BATCH = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


class EnsembleGroupStore:
    """Writes the coordinator's records as ensemble transactions of the leader."""

    def __init__(self, host: ServiceHost, on_done: Any) -> None:
        self._host = host
        self._on_done = on_done
        self._tasks: set[asyncio.Task[None]] = set()

    def _commit(self, ops: Sequence[Op], callback: StoreCallback) -> None:
        async def run() -> None:
            try:
                result = await self._host.commit(ops)
            except HerderError as exc:
                callback(exc.code)
            except Exception:
                log.exception("coordinator store write failed")
                callback(ErrorCode.UNKNOWN_SERVER_ERROR)
            else:
                callback(ErrorCode(result.error_code), result.zxid if result.ok else None)
            self._on_done()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def store_group(self, group_id: str, record: GroupRecord, callback: StoreCallback) -> None:
        self._commit([Append(GROUPS_LOG, group_key(group_id), encode_record(record))], callback)

    def store_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetRecord | None],
        callback: StoreCallback,
    ) -> None:
        ops: list[Op] = [
            Append(
                GROUPS_LOG, offset_key(group_id, tp), None if rec is None else encode_record(rec)
            )
            for tp, rec in offsets.items()
        ]
        self._commit(ops, callback)

    def delete_group(
        self, group_id: str, partitions: Sequence[TopicPartition], callback: StoreCallback
    ) -> None:
        ops: list[Op] = [Append(GROUPS_LOG, group_key(group_id), None)]
        ops += [Append(GROUPS_LOG, offset_key(group_id, tp), None) for tp in partitions]
        self._commit(ops, callback)

    def store_fencing(self, record: FencingRecord, callback: StoreCallback) -> None:
        self._commit(
            [Append(FENCING_LOG, fencing_key(record.fenced_id), encode_record(record))], callback
        )


class CoordinatorService:
    """The :class:`~herder.ensemble.services.LeaderService` running the group coordinator."""

    def __init__(self, config: CoordinatorConfig | None = None) -> None:
        self.config = config or CoordinatorConfig()
        self.coordinator: GroupCoordinator | None = None
        self._host: ServiceHost | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: int | None = None

    # -- metrics --------------------------------------------------------------------

    def metric_samples(self) -> list[MetricSample]:
        """The groups this server coordinates, by state, and their rebalances (nothing
        while it does not lead: another server coordinates them).

        ``herder_coordinator_groups{state}`` counts groups in each of Kafka's group states
        (as Kafka's ``NumGroups<State>`` gauges); per group, its generation, members,
        rebalances completed since this server took it over, and the last and longest
        rebalance's time from PreparingRebalance to Stable, in ms."""
        core = self.coordinator
        if core is None or self._host is None or not self._host.is_leader:
            return []
        by_state = {state.value: 0 for state in GroupState if state is not GroupState.DEAD}
        samples: list[MetricSample] = []
        for group_id in core.group_ids:
            group = core.group(group_id)
            if group is None:
                continue
            by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
            labels = (("group", group_id),)
            samples += [
                MetricSample(
                    "herder_coordinator_group_generation",
                    group.generation_id,
                    labels,
                    "the group's generation",
                ),
                MetricSample(
                    "herder_coordinator_group_members", len(group.members), labels, "members"
                ),
                MetricSample(
                    "herder_coordinator_group_rebalances_total",
                    group.rebalances_completed,
                    labels,
                    "rebalances that ended Stable, since this server took the group over",
                ),
                MetricSample(
                    "herder_coordinator_group_max_rebalance_time_ms",
                    group.max_rebalance_ms,
                    labels,
                    "the longest rebalance, PreparingRebalance to Stable",
                ),
            ]
            if group.last_rebalance_ms is not None:
                samples.append(
                    MetricSample(
                        "herder_coordinator_group_last_rebalance_time_ms",
                        group.last_rebalance_ms,
                        labels,
                        "the last rebalance, PreparingRebalance to Stable",
                    )
                )
        return [
            MetricSample(
                "herder_coordinator_groups",
                count,
                (("state", state),),
                "groups this server coordinates, by Kafka's group state",
            )
            for state, count in by_state.items()
        ] + samples

    # -- LeaderService --------------------------------------------------------------

    def attach(self, host: ServiceHost) -> None:
        self._host = host
        store = EnsembleGroupStore(host, self._reschedule)
        self.coordinator = GroupCoordinator(store, random=random.Random(), config=self.config)
        host.wire.route(apis.FIND_COORDINATOR, self._find_coordinator)
        for api in apis.GROUP_APIS:
            host.wire.route(api, self._serve)

    async def became_leader(self, epoch: int) -> None:
        assert self._host is not None and self.coordinator is not None
        host = self._host
        await host.commit(
            [CreateLog(GROUPS_LOG, compacted=True, if_absent=True),
             CreateLog(FENCING_LOG, compacted=True, if_absent=True)]
        )  # fmt: skip
        core = self.coordinator
        now = _now_ms()
        core.begin_loading(now)
        groups = collect_groups((r.key or b"", r.value) for r in self._records(GROUPS_LOG))
        for group_id, stored in groups.items():
            core.load_group(group_id, stored.record, stored.offsets, now)
        for record in self._records(FENCING_LOG):
            if record.value is not None:
                fenced = decode_fencing_value(record.value)
                core.load_fencing(fenced.fenced_id, fenced.epoch, record.zxid)
        core.finish_loading(_now_ms())
        log.info("group coordinator active on server %d (epoch %d)", host.server_id, epoch)
        self._reschedule()

    def lost_leadership(self) -> None:
        if self.coordinator is not None:
            self.coordinator.unload_all()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_due = None

    # -- requests -------------------------------------------------------------------

    def _records(self, log_name: str) -> list[Any]:
        assert self._host is not None
        state = self._host.state
        out: list[Any] = []
        position = 0
        while position < state.end_offset(log_name):
            batch = state.read(log_name, position, _READ_BATCH)
            if not batch:
                break
            out += batch
            position = batch[-1].offset + 1
        return out

    async def _find_coordinator(
        self, req: apis.FindCoordinatorRequest, ctx: RequestContext
    ) -> apis.FindCoordinatorResponse:
        assert self._host is not None
        leader = self._host.leader_client_address()
        if leader is None:
            return apis.FindCoordinatorResponse(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                error_message="the ensemble has no leader right now",
            )
        node_id, address = leader
        host, _, port = address.rpartition(":")
        return apis.FindCoordinatorResponse(node_id=node_id, host=host, port=int(port))

    async def _serve(self, req: Any, ctx: RequestContext) -> Any:
        assert self.coordinator is not None and self._host is not None
        if isinstance(req, JoinGroupRequest):
            self._check_session_timeout(req.session_timeout_ms)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def respond(response: Any) -> None:
            if not future.done():
                future.set_result(response)

        self.coordinator.handle(req, _now_ms(), respond)
        self._reschedule()
        return await future

    def _check_session_timeout(self, timeout_ms: int) -> None:
        """A member's session must outlast a move of the coordinator to a new leader."""
        assert self._host is not None
        change = self._host.leader_change_ms
        if change and timeout_ms <= change:
            raise InvalidSessionTimeout(
                f"session timeout {timeout_ms} ms is not above the {change} ms a leader change"
                " of this ensemble can take (syncLimit x tickTime, plus the election): while"
                " the coordinator moves, members could not heartbeat and would be expired."
                f" Ask for more than {change} ms, or run the ensemble with a smaller"
                " syncLimit or tickTime"
            )

    # -- time -----------------------------------------------------------------------

    def _reschedule(self) -> None:
        core = self.coordinator
        if core is None:
            return
        due = core.next_deadline()
        if due is None or due == self._timer_due:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (due - _now_ms()) / 1000)
        self._timer_due = due
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_due = None
        if self.coordinator is not None:
            self.coordinator.tick(_now_ms())
            self._reschedule()
