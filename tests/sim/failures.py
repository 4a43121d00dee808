"""How a simulator run fails, for every simulator under ``tests/sim``."""

from __future__ import annotations


class SimulationFailure(AssertionError):
    """A seed failed; the message says how, where, and how to replay it."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class LivenessFailure(AssertionError):
    """Once the faults stopped, the system did not settle within its bound."""
