"""``/`` and ``/health`` (Connect's RootResource)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from herder import __version__
from herder.runtime.rest.responses import JsonReply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["root_routes"]


def root_routes(herder: DistributedHerder) -> APIRouter:
    api = APIRouter(tags=["worker"])

    @api.get("/")
    async def root() -> dict[str, Any]:
        return {"version": __version__, "commit": "", "kafka_cluster_id": herder.config.group_id}

    @api.get("/health")
    async def health() -> JsonReply:
        """200 once the worker is in its group with an assignment; else 503 saying why.

        As Connect's: ``starting`` before the worker ever joined, ``unhealthy`` after.
        """
        ok, message = herder.health()
        if ok:
            return JsonReply({"status": "healthy", "message": message})
        starting = herder.failure is None and herder.generation is None
        return JsonReply(
            status_code=503,
            content={"status": "starting" if starting else "unhealthy", "message": message},
        )

    return api
