"""Every API herder defines, gathered for codec properties, plus test-only APIs."""

from __future__ import annotations

import msgspec

from herder.wire.envelope import API_VERSIONS, Api


class EchoRequest(msgspec.Struct, kw_only=True):
    payload: bytes = b""
    delay_ms: int = 0


class EchoResponse(msgspec.Struct, kw_only=True):
    payload: bytes = b""


ECHO: Api[EchoRequest, EchoResponse] = Api(900, "Echo", EchoRequest, EchoResponse, 0, 1)


def _project_apis() -> list[Api]:  # type: ignore[type-arg]
    """Each layer's API catalogue, so new messages are covered without editing this file."""
    import importlib
    import pkgutil

    import herder

    found: dict[int, Api] = {API_VERSIONS.key: API_VERSIONS}  # type: ignore[type-arg]
    for mod in pkgutil.walk_packages(herder.__path__, "herder."):
        if not mod.name.endswith(".apis"):
            continue
        module = importlib.import_module(mod.name)
        for value in vars(module).values():
            if isinstance(value, Api):
                found[value.key] = value
    return sorted(found.values(), key=lambda a: a.key)


ALL_APIS = [*_project_apis(), ECHO]
