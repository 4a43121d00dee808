"""Validators for config values, with Kafka's names and Kafka's error wording.

A validator is any callable ``(name, value) -> None`` that raises a ConfigError (best
made with ``invalid_value``) when the value is unacceptable. It receives the *parsed*
value, so ``Range`` compares numbers and ``ValidList`` sees a list. The classes here
cover what Kafka's ConfigDef offers; ``Check`` turns a lambda into one, for the rule
that only one key has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from herder.config.parsing import invalid_value

__all__ = [
    "CaseInsensitiveValidString",
    "Check",
    "NonEmptyString",
    "NonEmptyStringWithoutControlChars",
    "Range",
    "ValidList",
    "ValidString",
    "Validator",
]


class Validator(Protocol):
    """Raises ConfigError when ``value`` is not acceptable for the key ``name``.

    Parameters are positional-only so any function or lambda of two arguments fits.
    """

    def __call__(self, name: str, value: Any, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Range:
    """A number within ``[min, max]``; either bound may be open (``None``)."""

    min: float | None = None
    max: float | None = None

    @classmethod
    def at_least(cls, min: float) -> Range:
        return cls(min=min)

    @classmethod
    def between(cls, min: float, max: float) -> Range:
        return cls(min=min, max=max)

    def __call__(self, name: str, value: Any, /) -> None:
        if value is None:
            raise invalid_value(name, value, "Value must be non-null")
        if self.min is not None and value < self.min:
            raise invalid_value(name, value, f"Value must be at least {self.min}")
        if self.max is not None and value > self.max:
            raise invalid_value(name, value, f"Value must be no more than {self.max}")


@dataclass(frozen=True, slots=True)
class ValidString:
    """One of a fixed set of strings (``errors.tolerance`` is ``none`` or ``all``)."""

    valid: tuple[str, ...]
    case_sensitive: bool = True

    @classmethod
    def in_(cls, *values: str, case_sensitive: bool = True) -> ValidString:
        return cls(tuple(values), case_sensitive)

    def __call__(self, name: str, value: Any, /) -> None:
        if self.accepts(value):
            return
        qualifier = "" if self.case_sensitive else " (case insensitive)"
        reason = f"String must be one of{qualifier}: {', '.join(self.valid)}"
        raise invalid_value(name, value, reason)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is one of the valid strings (without raising)."""
        if not isinstance(value, str):
            return False
        if self.case_sensitive:
            return value in self.valid
        return value.lower() in {v.lower() for v in self.valid}


@dataclass(frozen=True, slots=True)
class CaseInsensitiveValidString:
    """One of a fixed set of strings, in any case (``"NONE"`` is as good as ``"none"``)."""

    valid: tuple[str, ...]

    @classmethod
    def in_(cls, *values: str) -> CaseInsensitiveValidString:
        return cls(tuple(values))

    def __call__(self, name: str, value: Any, /) -> None:
        ValidString(self.valid, case_sensitive=False)(name, value)


@dataclass(frozen=True, slots=True)
class ValidList:
    """A list whose every element is one of a fixed set of strings.

    The error names the offending element rather than the whole list, so a user with
    ``a,b,typo`` sees which one to fix.
    """

    valid: ValidString

    @classmethod
    def in_(cls, *values: str, case_sensitive: bool = True) -> ValidList:
        return cls(ValidString(tuple(values), case_sensitive))

    def __call__(self, name: str, value: Any, /) -> None:
        for element in _as_list(value):
            self.valid(name, element)


@dataclass(frozen=True, slots=True)
class NonEmptyString:
    """A string that is not empty (values are already trimmed, so not blank either)."""

    def __call__(self, name: str, value: Any, /) -> None:
        if isinstance(value, str) and not value:
            raise invalid_value(name, value, "String must be non-empty")


@dataclass(frozen=True, slots=True)
class NonEmptyStringWithoutControlChars:
    """A string that is not empty and holds no control character (a connector's name)."""

    def __call__(self, name: str, value: Any, /) -> None:
        if not isinstance(value, str):
            return
        if not value:
            raise invalid_value(name, value, "String may not be empty")
        controls = [str(ord(c)) for c in value if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F]
        if controls:
            raise invalid_value(
                name,
                value,
                "String may not contain control sequences but had the following ASCII "
                f"chars: {', '.join(controls)}",
            )


@dataclass(frozen=True, slots=True)
class Check:
    """A validator from a predicate and the reason shown when it is false.

    ``Check(lambda v: v % 2 == 0, "Value must be even")`` gives the same
    ``Invalid value 3 for configuration KEY: Value must be even`` as the built-ins.
    """

    predicate: Callable[[Any], bool]
    reason: str

    def __call__(self, name: str, value: Any, /) -> None:
        if not self.predicate(value):
            raise invalid_value(name, value, self.reason)


def _as_list(value: Any) -> Iterable[Any]:
    return value if isinstance(value, list | tuple) else [value]
