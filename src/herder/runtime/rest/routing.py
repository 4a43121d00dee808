"""Where a REST request is carried out: here, at the leader, or at the worker running the work.

Connect's rules, kept so its clients and mixed clusters behave the same:

* A request the leader must handle (any change to ``_configs``) or the worker running a
  connector or task must handle (a plain restart) raises :class:`WrongWorker` elsewhere,
  naming the right worker's URL; the request is forwarded there with ``?forward=true``,
  which that worker may forward once more with ``?forward=false`` (the leader handing a
  restart on to the owner), and no further: at most two hops.
* While no leader or owner is known because the group is rebalancing, the worker waits
  and tries again instead of failing at once, so a user's write during a rebalance
  succeeds once it ends; only after ``LEADER_WAIT_S`` does it answer 409.
* A worker outside its group (still starting, or out of it for good after a fatal
  group error) waits for nothing: it answers 409 at once, naming why.
* A request that cannot finish within the request timeout (90 s, as Connect) answers 500
  naming what the worker was doing meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import Response

from herder.errors import HerderError, RebalanceInProgress
from herder.runtime.core.admission import WrongWorker
from herder.runtime.core.session_key import SIGNATURE_ALGORITHM_HEADER, SIGNATURE_HEADER
from herder.runtime.rest.errors import Conflict
from herder.runtime.rest.responses import JsonReply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["RequestRouter", "reply"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long a request waits for a leader (or owner) to be known before answering 409
LEADER_WAIT_S = 30.0
RETRY_INTERVAL_S = 0.25
FORWARD = "forward"
#: Connect's words for a request no leader is known for
NO_LEADER = "Cannot complete request momentarily due to no known leader URL"


def reply(result: Any, status: int, body: bool = True) -> Response:
    """``result`` as a response of ``status``, unless it is a forwarded reply already."""
    if isinstance(result, Response):
        return result
    if not body:
        return Response(status_code=status)
    return JsonReply(status_code=status, content=result)


def _forward_flag(request: Request) -> bool | None:
    raw = request.query_params.get(FORWARD)
    if raw is None:
        return None
    return raw.strip().lower() != "false"


def _forwarded_headers(request: Request) -> dict[str, str]:
    """What a forwarded request carries on: its body's type, its sender's credentials
    and, for an internal request, its signature (the next worker checks both again)."""
    headers = {"content-type": "application/json"}
    for name in ("authorization", SIGNATURE_HEADER, SIGNATURE_ALGORITHM_HEADER):
        value = request.headers.get(name)
        if value is not None:
            headers[name] = value
    return headers


class RequestRouter:
    """Runs requests on this worker or forwards them, with Connect's retries and limits."""

    def __init__(self, herder: DistributedHerder) -> None:
        self.herder = herder
        self.timeout_s = herder.config.rest_request_timeout_ms / 1000
        self.http = herder.config.http_client(self.timeout_s)

    async def close(self) -> None:
        await self.http.aclose()

    async def within_timeout(self, work: Awaitable[T]) -> T:
        """``work``, or a 500 naming what the worker is busy with if it takes too long."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await work
        except TimeoutError:
            activity = self.herder.current_activity()
            log.warning("a REST request timed out; the worker is %s", activity)
            raise HerderError(
                f"Request timed out. The worker is currently {activity}. Try again once it "
                "is done; its log says why that takes long"
            ) from None

    async def route(self, request: Request, action: Callable[[], Awaitable[T]]) -> T | Response:
        """Run ``action`` here, or forward ``request`` to the worker it belongs to."""
        self.refuse_outside_group()
        return await self.within_timeout(self._route(request, action))

    def refuse_outside_group(self) -> None:
        """Answer at once for a worker no rebalance will bring a leader to."""
        herder = self.herder
        group = herder.config.group_id
        if herder.failure is not None:
            raise Conflict(
                f"{NO_LEADER}: worker {herder.worker_id} is out of its group {group} for good "
                f"and is stopping ({herder.failure}). Send the request to another worker of "
                "the group"
            )
        if herder.member is None:
            raise Conflict(
                f"{NO_LEADER}: worker {herder.worker_id} has not joined its group {group} "
                "yet (it is still starting). Try again once GET /health answers 200"
            )

    async def _route(self, request: Request, action: Callable[[], Awaitable[T]]) -> T | Response:
        forward = _forward_flag(request)
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            try:
                return await action()
            except (WrongWorker, RebalanceInProgress) as exc:
                target = exc.target_url if isinstance(exc, WrongWorker) else None
                if target and target != self.herder.url:
                    if forward is False:
                        raise Conflict(
                            "Cannot complete request because of a conflicting operation "
                            "(e.g. worker rebalance). Try again once the rebalance is over"
                        ) from None
                    forwarded = await self._forward(request, target, again=forward is None)
                    if forwarded is not None:
                        return forwarded
                    # that worker is gone (the group will notice): as if none were known
                self.refuse_outside_group()
                if time.monotonic() >= deadline:
                    raise Conflict(
                        f"{NO_LEADER}, likely because a rebalance was underway. Try again "
                        "once it is over (GET /health answers 200)"
                    ) from None
                await asyncio.sleep(RETRY_INTERVAL_S)

    async def _forward(self, request: Request, target: str, *, again: bool) -> Response | None:
        """The target's reply; None if it could not be reached, so nothing was sent."""
        params: list[tuple[str, str | int | float | bool | None]] = [
            (k, v) for k, v in request.query_params.multi_items() if k != FORWARD
        ]
        params.append((FORWARD, "true" if again else "false"))
        url = f"{target.rstrip('/')}{request.url.path}"
        log.debug("forwarding %s %s to %s", request.method, request.url.path, target)
        try:
            answer = await self.http.request(
                request.method,
                url,
                params=params,
                content=await request.body(),
                headers=_forwarded_headers(request),
            )
        except httpx.ConnectError as exc:
            log.info("could not reach %s to forward a request (%s); retrying", target, exc)
            return None
        except httpx.HTTPError as exc:
            raise Conflict(
                f"could not forward the request to {target}: {exc!r}. Try again; if this "
                "persists, check that worker's log"
            ) from None
        return Response(
            content=answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
        )
