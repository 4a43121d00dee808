"""Why the herder refuses a request: the errors of request admission.

Each names where the request belongs (the leader, the worker that runs the work) when
that is known, so the REST layer can forward it or tell the user where to send it.
"""

from __future__ import annotations

from herder.errors import HerderError


class WrongWorker(HerderError):
    """The request belongs to another worker, at ``target_url`` (None: not known yet)."""

    def __init__(self, message: str, target_url: str | None) -> None:
        super().__init__(message)
        self.target_url = target_url


class NotLeaderWorker(WrongWorker):
    """This worker is not the group's leader; the request belongs at ``leader_url``."""

    def __init__(self, leader_url: str | None, *, cause: HerderError | None = None) -> None:
        if cause is not None:
            message = (
                f"this worker is out of its group for good ({cause}); fix the cause and "
                "restart it, or send the request to another worker"
            )
        elif leader_url:
            message = f"this worker is not the leader; the leader is at {leader_url}"
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
            + (f"; it runs at {owner_url}" if owner_url else " nor, yet, to any other"),
            owner_url,
        )


class NotFound(HerderError):
    """The connector or task does not exist (REST 404)."""


class AlreadyExists(HerderError):
    """A connector of that name already exists (REST 409)."""


class ConfigChanged(HerderError):
    """The connector's config changed under a request that depended on it (REST 409)."""
