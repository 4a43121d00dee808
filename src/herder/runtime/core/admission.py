"""Why the herder refuses a request: the errors of request admission.

Each names where the request belongs (the leader, the worker that runs the work) when
that is known, so the REST layer can forward it or tell the user where to send it.
"""

from __future__ import annotations

from herder.errors import ErrorCode, HerderError


class WrongWorker(HerderError):
    """The request belongs to another worker, at ``target_url`` (None: not known yet)."""

    code = ErrorCode.WRONG_WORKER
    http_status = 409

    def __init__(self, message: str, target_url: str | None) -> None:
        super().__init__(message)
        self.target_url = target_url


class NotLeaderWorker(WrongWorker):
    """This worker is not the group's leader; the request belongs at ``leader_url``."""

    code = ErrorCode.NOT_LEADER

    def __init__(self, leader_url: str | None, *, cause: HerderError | None = None) -> None:
        if cause is not None:
            message = (
                f"this worker is out of its group for good ({cause}); fix the cause and "
                "restart it, or send the request to another worker"
            )
        elif leader_url:
            message = (
                f"this worker is not the leader; send the request to the leader at {leader_url}"
            )
        else:
            message = "no leader is known yet (a rebalance is under way); try again shortly"
        super().__init__(message, leader_url)
        self.leader_url = leader_url
        self.cause = cause


class NotOwner(WrongWorker):
    """The leader's answer for work that runs elsewhere: it belongs at ``owner_url``."""

    def __init__(self, what: str, owner_url: str | None) -> None:
        super().__init__(
            f"{what} is not assigned to this worker"
            + (
                f"; send the request to {owner_url}, where it runs"
                if owner_url
                else " nor, yet, to any other; try again once the rebalance is over"
            ),
            owner_url,
        )


class NotFound(HerderError):
    """The connector or task does not exist."""

    code = ErrorCode.NOT_FOUND
    http_status = 404
    advice = "GET /connectors lists the connectors, GET /connectors/<name>/tasks their tasks"


class AlreadyExists(HerderError):
    """A connector of that name already exists."""

    code = ErrorCode.ALREADY_EXISTS
    http_status = 409
    advice = "choose another name, or change its config with PUT /connectors/<name>/config"


class ConfigChanged(HerderError):
    """The connector's config changed under a request that depended on it."""

    code = ErrorCode.CONFIG_CHANGED
    http_status = 409
