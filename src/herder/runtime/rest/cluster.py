"""``/admin/cluster`` and ``/admin/metrics/tasks``: the whole cluster on one page.

Connect's REST API answers about connectors; what an operator also asks — which workers
are in the group and who leads, how the last rebalance went and why it happened, what
each ensemble server is doing, how far behind each sink is — takes several tools to
piece together. ``GET /admin/cluster`` answers it in one JSON document, from any worker,
for the web console (``/ui``) and ``herder status``:

* ``worker``: this worker (id, URL, whether it leads, the leader's URL, generation,
  protocol) and its ``connect-worker-rebalance-metrics`` with a ``timeline`` of its
  latest rebalances;
* ``group``: the worker group as the coordinator describes it (state, generation,
  protocol, the reason of the current or last rebalance, how long the last took, and
  its latest ``rebalances``: generation, reason, start (wall clock, ms) and duration)
  and its ``workers``: id, URL, whether it leads, and the connectors and tasks the
  status log says run there;
* ``ensemble``: each server's status (role, leader, epoch, zxids, learners, last
  sync), or the error that kept it from answering;
* ``tasks``: each running task's metrics under Connect's names, from the worker running
  it (``GET /admin/metrics/tasks`` there), with ``herder``'s lag figures.

Whatever does not answer within a couple of seconds is reported as an ``error`` in its
place rather than holding the page up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import urlparse

import httpx
from fastapi import APIRouter

from herder.coordinator import apis as coordinator_apis
from herder.coordinator import messages as m
from herder.ensemble.client import server_status
from herder.errors import HerderError
from herder.runtime.core.protocol import decode_metadata
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.task_metrics import TaskMetrics
from herder.wire.auth import ClientSecurity

__all__ = ["cluster_routes"]

log = logging.getLogger(__name__)

#: how long the page waits for any one part (a worker, a server, the coordinator)
PART_TIMEOUT_S = 2.5


def task_metrics_json(metrics: TaskMetrics) -> dict[str, Any]:
    """One task's metrics under Connect's names (herder's own among them)."""
    figures: dict[str, Any] = {}
    for sample in metrics.samples():
        figures[sample.name] = sample.value
    return {
        "connector": metrics.task_id.connector,
        "task": metrics.task_id.task,
        "type": metrics.kind,
        "metrics": figures,
    }


def _worker_id(url: str) -> str:
    return urlparse(url).netloc or url


async def _group(herder: DistributedHerder) -> dict[str, Any]:
    reply = await herder.coordinator.request(
        coordinator_apis.DESCRIBE_GROUPS,
        m.DescribeGroupsRequest(group_ids=[herder.config.group_id]),
    )
    if reply.error_code or not reply.groups:
        raise HerderError(f"the coordinator could not describe the group ({reply.error_code})")
    group = reply.groups[0]
    view = herder.statuses.view
    running: dict[str, dict[str, list[Any]]] = {}
    for name in view.connectors():
        connector = view.connector(name)
        if connector is not None and connector.state.value not in ("UNASSIGNED", "DESTROYED"):
            running.setdefault(connector.worker_id, {"connectors": [], "tasks": []})
            running[connector.worker_id]["connectors"].append(name)
        for task in view.tasks(name):
            if task.state.value in ("UNASSIGNED", "DESTROYED"):
                continue
            running.setdefault(task.worker_id, {"connectors": [], "tasks": []})
            running[task.worker_id]["tasks"].append(f"{name}-{task.id.task}")
    workers: list[dict[str, Any]] = []
    for member in group.members:
        url = ""
        if member.metadata:
            try:
                url = decode_metadata(member.metadata).url
            except HerderError:
                url = ""
        worker_id = _worker_id(url) if url else member.client_id
        work = running.get(worker_id, {"connectors": [], "tasks": []})
        workers.append(
            {
                "id": worker_id,
                "url": url or None,
                "member_id": member.member_id,
                "instance_id": member.group_instance_id,
                "leader": member.member_id == group.leader,
                "connectors": sorted(work["connectors"]),
                "tasks": sorted(work["tasks"]),
            }
        )
    workers.sort(key=lambda w: str(w["id"]))
    return {
        "group_id": group.group_id,
        "state": group.state,
        "generation": group.generation_id,
        "protocol": group.protocol,
        "rebalance_reason": group.rebalance_reason or None,
        "last_rebalance_time_ms": (
            group.last_rebalance_time_ms if group.last_rebalance_time_ms >= 0 else None
        ),
        "state_since_ms": group.state_timestamp_ms or None,
        "rebalances": [
            {
                "generation": r.generation_id,
                "reason": r.reason,
                "started_ms": r.started_ms,
                "took_ms": r.time_ms,
            }
            for r in group.rebalances
        ],
        "workers": workers,
    }


async def _server(address: str, security: ClientSecurity | None) -> dict[str, Any]:
    try:
        status = await server_status(address, timeout=PART_TIMEOUT_S, security=security)
    except (HerderError, OSError) as exc:
        return {"address": address, "error": str(exc)}
    return {
        "address": address,
        "server_id": status.server_id,
        "role": status.role,
        "leader": status.leader,
        "epoch": status.epoch,
        "last_zxid": f"{status.last_zxid:#x}",
        "committed_zxid": f"{status.committed_zxid:#x}",
        "sessions": status.sessions,
        "outstanding_requests": status.outstanding_requests,
        "learners": list(status.learners),
        "phase": status.phase,
        "last_sync": status.last_sync or None,
        "peers": [[p.server_id, p.client_address] for p in status.peers],
    }


async def _ensemble(herder: DistributedHerder) -> list[dict[str, Any]]:
    """Every server: those the worker bootstraps from, and those their configs name."""
    security = herder.config.ensemble_security
    first = await asyncio.gather(*(_server(a, security) for a in herder.config.bootstrap))
    known = {s["server_id"] for s in first if "server_id" in s}
    more = {
        sid: address
        for s in first
        for sid, address in s.get("peers", [])
        if address and sid not in known
    }
    rest = await asyncio.gather(*(_server(a, security) for a in more.values()))
    for sid, server in zip(more, rest, strict=True):
        server.setdefault("server_id", sid)
    by_id: dict[Any, dict[str, Any]] = {}
    for server in [*first, *rest]:
        key = server.get("server_id", server["address"])
        if key not in by_id or "error" in by_id[key]:
            by_id[key] = server
    return sorted(by_id.values(), key=lambda s: (str(s.get("server_id", "")), s["address"]))


async def _tasks_of(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    reply = await http.get(f"{url.rstrip('/')}/admin/metrics/tasks", timeout=PART_TIMEOUT_S)
    reply.raise_for_status()
    tasks: list[dict[str, Any]] = reply.json()
    return tasks


async def _part(work: Any, what: str) -> Any:
    try:
        async with asyncio.timeout(PART_TIMEOUT_S * 2):
            return await work
    except Exception as exc:
        log.info("cluster view: %s left out: %s", what, exc)
        return {"error": f"{what}: {exc or type(exc).__name__}"}


def cluster_routes(herder: DistributedHerder, http: httpx.AsyncClient) -> APIRouter:
    """The routes; ``http`` asks the other workers for their tasks' metrics."""
    api = APIRouter(tags=["admin/cluster"])

    def this_worker() -> dict[str, Any]:
        generation = herder.generation
        now_ms = int(time.monotonic() * 1000)
        return {
            "id": herder.worker_id,
            "url": herder.url,
            "group_id": herder.config.group_id,
            "leader": herder.is_leader,
            "leader_url": herder.leader_url,
            "generation": generation.generation_id if generation is not None else None,
            "connect_protocol": herder.config.connect_protocol,
            "health": dict(zip(("ok", "message"), herder.health(), strict=True)),
            "rebalance": {
                **herder.rebalance_metrics_now(),
                "timeline": herder.rebalance_metrics.timeline(now_ms),
            },
        }

    @api.get("/admin/metrics/tasks")
    async def task_metrics() -> list[dict[str, Any]]:
        """This worker's tasks and their metrics under Connect's names."""
        return [task_metrics_json(t) for t in herder.worker.metrics.tasks()]

    @api.get("/admin/cluster")
    async def cluster() -> dict[str, Any]:
        """The cluster as this worker sees it (see the module docstring)."""
        group, ensemble = await asyncio.gather(
            _part(_group(herder), "the worker group"), _part(_ensemble(herder), "the ensemble")
        )
        tasks: list[dict[str, Any]] = []
        errors: list[str] = []
        if "workers" in group:
            urls = [w["url"] for w in group["workers"] if w["url"]]
            answers = await asyncio.gather(
                *(_part(_tasks_of(http, url), f"the tasks of {url}") for url in urls)
            )
            for url, answer in zip(urls, answers, strict=True):
                if isinstance(answer, dict):
                    errors.append(answer["error"])
                    continue
                for task in answer:
                    tasks.append({**task, "worker_id": _worker_id(url)})
        tasks.sort(key=lambda t: (t["connector"], t["task"]))
        return {
            "worker": this_worker(),
            "group": group,
            "ensemble": ensemble,
            "tasks": tasks,
            "errors": errors,
        }

    return api
