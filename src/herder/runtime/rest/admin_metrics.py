"""``/admin/metrics``: this worker's metrics, read-only.

``GET /admin/metrics/rebalance`` is Connect's ``connect-worker-rebalance-metrics`` group
under its names (Connect has them on JMX only): how many rebalances this worker
completed, whether one is under way, the generation and leader of the last, and how
long they took.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from herder.runtime.shell.herder import DistributedHerder

__all__ = ["admin_metrics_routes"]


def admin_metrics_routes(herder: DistributedHerder) -> APIRouter:
    api = APIRouter(tags=["admin/metrics"])

    @api.get("/admin/metrics/rebalance")
    async def rebalance_metrics() -> dict[str, Any]:
        return herder.rebalance_metrics_now()

    return api
