"""Kafka Connect's REST response shapes (``connect/*.json``) and a checker for real replies.

Each golden file names a Connect REST entity, the endpoints that answer with it, and its
``shape``: ``"string"``, ``"integer"``, ``"boolean"``, ``"null"``, ``"any"`` or a union
such as ``"string|null"``; ``{"object": {key: shape}, "optional": [keys]}`` (exactly those
keys, the optional ones may be absent); ``{"array": shape}``; ``{"map": shape}`` (any
keys, every value of that shape); ``{"anyOf": [shape, ...]}``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).parent / "connect"

_SCALARS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "number": (int, float),
}


@cache
def golden(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    return document


def names() -> list[str]:
    return sorted(p.stem for p in GOLDEN_DIR.glob("*.json"))


def problems(shape: Any, value: Any, path: str = "$") -> list[str]:
    """Every way ``value`` departs from ``shape`` (empty if it conforms)."""
    if isinstance(shape, str):
        return (
            []
            if any(_scalar(s, value) for s in shape.split("|"))
            else [f"{path}: expected {shape}, got {type(value).__name__} {value!r:.80}"]
        )
    if "anyOf" in shape:
        options = [problems(option, value, path) for option in shape["anyOf"]]
        return [] if any(not found for found in options) else min(options, key=len)
    if "array" in shape:
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {value!r:.80}"]
        return [
            p
            for i, item in enumerate(value)
            for p in problems(shape["array"], item, f"{path}[{i}]")
        ]
    if "map" in shape:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {value!r:.80}"]
        return [p for k, item in value.items() for p in problems(shape["map"], item, f"{path}.{k}")]
    if not isinstance(value, dict):
        return [f"{path}: expected an object, got {value!r:.80}"]
    keys: dict[str, Any] = shape["object"]
    optional = set(shape.get("optional", ()))
    found = [f"{path}: unexpected key {k!r}" for k in value if k not in keys]
    found += [f"{path}: missing key {k!r}" for k in keys if k not in value and k not in optional]
    for key, sub in keys.items():
        if key in value:
            found += problems(sub, value[key], f"{path}.{key}")
    return found


def _scalar(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "null":
        return value is None
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _SCALARS[kind])


def assert_conforms(name: str, value: Any) -> None:
    """Fail, listing the differences, unless ``value`` has golden ``name``'s shape."""
    found = problems(golden(name)["shape"], value)
    assert not found, f"response does not match Connect's {golden(name)['entity']}:\n" + "\n".join(
        found[:20]
    )
