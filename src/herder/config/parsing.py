"""Config value types, and turning raw values into typed ones the way Kafka's ConfigDef does.

Connector configs arrive as strings (properties files, Connect's REST bodies are string
maps) or as already-typed JSON values, so every type accepts both. The rules and the
error wording follow Kafka's ``ConfigDef.parseType``, because Connect's REST clients and
users' habits depend on them (``" 5 "`` is an INT, ``"TRUE"`` a BOOLEAN, ``"a, b,c"`` a
three-element LIST); where Python differs from Java (``int("1_000")``, ``float("inf")``,
``bool`` being an ``int``) the Java answer wins.
"""

from __future__ import annotations

import enum
import importlib
import re
from typing import Any, Final, final

from herder.errors import ConfigError

__all__ = [
    "Password",
    "Type",
    "convert_to_string",
    "format_value",
    "invalid_value",
    "parse_type",
]


class Type(enum.Enum):
    """The type of a config key; the names are Connect's ``ConfigKeyInfo.type`` strings."""

    BOOLEAN = "BOOLEAN"
    STRING = "STRING"
    INT = "INT"
    LONG = "LONG"
    SHORT = "SHORT"
    DOUBLE = "DOUBLE"
    LIST = "LIST"
    CLASS = "CLASS"
    PASSWORD = "PASSWORD"


@final
class Password:
    """A secret config value that never shows itself in a repr, a log line or an error.

    Compare and hash by the secret, so two configs with the same password are equal;
    read the secret only through ``value``, where the code that needs it says so.
    """

    __slots__ = ("_value",)

    HIDDEN: Final = "[hidden]"

    def __init__(self, value: str) -> None:
        self._value = value

    @property
    def value(self) -> str:
        """The secret itself."""
        return self._value

    def __repr__(self) -> str:
        return self.HIDDEN

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Password) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Password, self._value))


_INTEGER_RANGES: Final = {
    Type.SHORT: (-(2**15), 2**15 - 1, "a 16-bit integer (short)"),
    Type.INT: (-(2**31), 2**31 - 1, "a 32-bit integer"),
    Type.LONG: (-(2**63), 2**63 - 1, "a 64-bit integer (long)"),
}
# what Integer.parseInt / Long.parseLong accept: no underscores, no spaces, ASCII digits
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")
# what Double.parseDouble accepts, less hexadecimal floating point
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
_COMMA_WITH_WHITESPACE = re.compile(r"\s*,\s*")


def format_value(value: Any) -> str:
    """Show a value in an error message as Java's ``toString`` would (``null``, ``[a, b]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, type):
        return _class_name(value)
    return str(value)


def invalid_value(name: str, value: Any, reason: str) -> ConfigError:
    """The error for a bad value, worded as Kafka's ``ConfigException(name, value, reason)``.

    Users and Connect clients recognise ``Invalid value X for configuration KEY: reason``,
    and it names both the key and why, which is all a one-line error needs.
    """
    return ConfigError(f"Invalid value {format_value(value)} for configuration {name}: {reason}")


def parse_type(name: str, value: Any, type: Type) -> Any:
    """Convert a raw value (a string or an already-typed value) to ``type``.

    ``None`` stays ``None``: it is how a key with a null default says "unset". Raises a
    ConfigError naming ``name`` when the value does not fit.
    """
    if value is None:
        return None
    if type is Type.BOOLEAN:
        return _parse_boolean(name, value)
    if type is Type.STRING:
        if isinstance(value, str):
            return value.strip()
        raise _not_a_string(name, value)
    if type is Type.PASSWORD:
        if isinstance(value, Password):
            return value
        if isinstance(value, str):
            return Password(value.strip())
        raise _not_a_string(name, value)
    if type in _INTEGER_RANGES:
        return _parse_integer(name, value, type)
    if type is Type.DOUBLE:
        return _parse_double(name, value)
    if type is Type.LIST:
        return _parse_list(name, value)
    if type is Type.CLASS:
        return _parse_class(name, value)
    raise AssertionError(f"unhandled config type {type}")


def convert_to_string(value: Any, type: Type | None) -> str | None:
    """Render a typed value as Connect's REST API shows it (Kafka's ``convertToString``).

    Lists are comma-joined so the string parses back to the same list, classes are their
    dotted names, and passwords stay ``[hidden]``.
    """
    if value is None:
        return None
    if type is Type.LIST and isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if type is Type.PASSWORD or isinstance(value, Password):
        return Password.HIDDEN
    return format_value(value)


def _not_a_string(name: str, value: Any) -> ConfigError:
    return invalid_value(name, value, f"Expected value to be a string, but it was a {_kind(value)}")


def _parse_boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    raise invalid_value(name, value, "Expected value to be either true or false")


def _parse_integer(name: str, value: Any, kind: Type) -> int:
    low, high, described = _INTEGER_RANGES[kind]
    if isinstance(value, str):
        text = value.strip()
        if not _JAVA_INTEGER.fullmatch(text):
            raise invalid_value(name, value, f"Not a number of type {kind.value}")
        number = int(text)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        reason = f"Expected value to be {described}, but it was a {_kind(value)}"
        raise invalid_value(name, value, reason)
    if not low <= number <= high:
        reason = f"Value out of range for {described} ({kind.value}): must be in [{low}, {high}]"
        raise invalid_value(name, value, reason)
    return number


def _parse_double(name: str, value: Any) -> float:
    if isinstance(value, str):
        text = value.strip()
        if not _JAVA_DOUBLE.fullmatch(text):
            raise invalid_value(name, value, "Not a number of type DOUBLE")
        return float(text.rstrip("fFdD"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise invalid_value(name, value, f"Expected value to be a double, but it was a {_kind(value)}")


def _parse_list(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        # Kafka keeps empty elements ("a,,b" has three), so a typo shows up in validation
        return _COMMA_WITH_WHITESPACE.split(text) if text else []
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise invalid_value(name, value, "Expected a comma separated list.")


def _parse_class(name: str, value: Any) -> type:
    if isinstance(value, type):
        return value
    if not isinstance(value, str):
        raise invalid_value(name, value, "Expected a Class instance or class name.")
    dotted = value.strip()
    found = _import_class(name, dotted)
    if found is None:
        raise invalid_value(name, dotted, f"Class {dotted} could not be found.")
    return found


def _import_class(name: str, dotted: str) -> type | None:
    """Resolve ``pkg.module.Class`` (or ``pkg.module:Class``, nested classes allowed).

    The module part is the longest importable prefix, as Python has no class loader to
    tell a package from a class. A module that exists but fails while importing is not
    "not found", so that error is reported as it is.
    """
    if ":" in dotted:
        module_part, _, class_part = dotted.partition(":")
        candidates = [(module_part, class_part.split("."))]
    else:
        parts = dotted.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    for module_name, attrs in candidates:
        try:
            found: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                continue  # this prefix is not a module: try a shorter one
            raise invalid_value(name, dotted, f"Class {dotted} could not be loaded: {exc}") from exc
        except ImportError as exc:
            raise invalid_value(name, dotted, f"Class {dotted} could not be loaded: {exc}") from exc
        for attr in attrs:
            found = getattr(found, attr, None)
        if isinstance(found, type):
            return found
    return None


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _kind(value: Any) -> str:
    return type(value).__name__
