"""How the REST API answers an error: Connect's ``{"error_code", "message"}`` body, with
the HTTP status the error's class declares (:attr:`HerderError.http_status`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from herder.errors import ErrorCode, HerderError, with_advice
from herder.runtime.rest.responses import JsonReply

__all__ = ["Conflict", "Forbidden", "bad_request_body", "error_response", "herder_error"]


class Conflict(HerderError):
    """The request cannot be carried out now (a rebalance, or a lost race)."""

    code = ErrorCode.REBALANCE_IN_PROGRESS
    http_status = 409


class Forbidden(HerderError):
    """The worker is configured not to allow this."""

    code = ErrorCode.FORBIDDEN
    http_status = 403


def error_response(status: int, message: str) -> JsonReply:
    """Connect's ErrorMessage body."""
    return JsonReply(status_code=status, content={"error_code": status, "message": message})


async def herder_error(request: Request, exc: Exception) -> JsonReply:
    assert isinstance(exc, HerderError)
    return error_response(exc.http_status, with_advice(exc))


async def bad_request_body(request: Request, exc: Exception) -> JsonReply:
    """A body, path or query parameter of the wrong shape: 400 naming each problem."""
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
        for e in exc.errors()
    )
    return error_response(
        400, f"Invalid request: {problems}. See /docs for the shape each endpoint expects"
    )
