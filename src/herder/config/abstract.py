"""Config: a parsed config with typed accessors, in the spirit of Kafka's ``AbstractConfig``.

Components read their settings through a Config rather than a dict so that a typo'd
key name in *code* fails loudly (``get`` of an undeclared key raises), a key's type is
checked where it is read, and keys the user supplied but nothing read can be reported
(``unused``), which is how a user learns that ``tasks.maxx=4`` did nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from herder.config.definition import ConfigDef
from herder.config.parsing import Password, Type
from herder.errors import ConfigError

__all__ = ["Config"]

log = logging.getLogger(__name__)

_INTEGERS = (Type.SHORT, Type.INT, Type.LONG)


class Config:
    """A ConfigDef's parsed values plus the original properties they came from.

    Construction parses ``props`` and raises InvalidConfiguration naming every problem.
    Keys the definition does not declare are kept in ``originals()``, not rejected: a
    worker config legitimately carries keys meant for other components (``producer.*``,
    ``transforms.*``), which read them through ``originals_with_prefix``.
    """

    def __init__(self, definition: ConfigDef, props: Mapping[str, Any]) -> None:
        self._definition = definition
        self._originals = dict(props)
        self._values = definition.parse(props)
        self._used: set[str] = set()

    @property
    def definition(self) -> ConfigDef:
        return self._definition

    def get(self, name: str) -> Any:
        """The parsed value of a declared key (``None`` for an unset key without default)."""
        if name not in self._values:
            raise ConfigError(f"Unknown configuration '{name}'")
        self._used.add(name)
        return self._values[name]

    def get_boolean(self, name: str) -> bool:
        value: bool = self._typed(name, Type.BOOLEAN)
        return value

    def get_string(self, name: str) -> str:
        value: str = self._typed(name, Type.STRING)
        return value

    def get_short(self, name: str) -> int:
        value: int = self._typed(name, Type.SHORT)
        return value

    def get_int(self, name: str) -> int:
        """An INT (or SHORT, which always fits) key's value."""
        value: int = self._typed(name, Type.INT, Type.SHORT)
        return value

    def get_long(self, name: str) -> int:
        """A LONG (or narrower integer) key's value."""
        value: int = self._typed(name, *_INTEGERS)
        return value

    def get_double(self, name: str) -> float:
        value: float = self._typed(name, Type.DOUBLE)
        return value

    def get_list(self, name: str) -> list[str]:
        value: list[str] = self._typed(name, Type.LIST)
        return list(value)

    def get_class(self, name: str) -> type:
        value: type = self._typed(name, Type.CLASS)
        return value

    def get_password(self, name: str) -> Password:
        value: Password = self._typed(name, Type.PASSWORD)
        return value

    def values(self) -> dict[str, Any]:
        """Every declared key's parsed value (a copy)."""
        return dict(self._values)

    def originals(self) -> dict[str, Any]:
        """The properties as given, undeclared keys included (a copy)."""
        return dict(self._originals)

    def originals_with_prefix(self, prefix: str, strip: bool = True) -> dict[str, Any]:
        """The original properties whose names start with ``prefix``, prefix stripped.

        The keys returned count as used: they were handed to whatever reads them.
        """
        selected = {k: v for k, v in self._originals.items() if k.startswith(prefix)}
        self._used.update(selected)
        if not strip:
            return selected
        return {k[len(prefix) :]: v for k, v in selected.items()}

    def values_with_prefix_override(self, prefix: str) -> dict[str, Any]:
        """Parsed values, with ``<prefix><key>`` originals overriding declared ``<key>``s.

        Connect builds a connector's producer settings this way: the worker's values,
        except where ``producer.override.<key>`` says otherwise. An override is parsed and
        validated like any value, so a bad one raises.
        """
        result = dict(self._values)
        for name, raw in self._originals.items():
            if not name.startswith(prefix) or len(name) == len(prefix):
                continue
            key = name[len(prefix) :]
            if key in self._definition:
                result[key] = self._definition.parse_value(key, raw)
                self._used.add(name)
        return result

    def ignore(self, name: str) -> None:
        """Mark a key as used without reading it, so ``unused`` does not report it."""
        self._used.add(name)

    def unused(self) -> set[str]:
        """Original keys nothing has read: likely typos, or settings for nothing."""
        return set(self._originals) - self._used

    def log_unused(self) -> None:
        """Warn about each unused key, once the component has read everything it needs."""
        for name in sorted(self.unused()):
            log.warning("The configuration '%s' was supplied but isn't a known config.", name)

    def __repr__(self) -> str:
        # values, not originals: parsed passwords show as [hidden], raw strings would not
        return f"{type(self).__name__}({self._values!r})"

    def _typed(self, name: str, *allowed: Type) -> Any:
        """The value of ``name``, which the code reading it believes has one of ``allowed``.

        Reading a key with the wrong accessor is a bug in the reader, so it raises
        TypeError; an unset key without default is the user's to fix, so ConfigError.
        """
        key = self._definition.keys.get(name)
        if key is None:
            raise ConfigError(f"Unknown configuration '{name}'")
        if key.type not in allowed:
            wanted = " or ".join(t.value for t in allowed)
            raise TypeError(f"configuration {name} is {key.type.value}, not {wanted}")
        value = self.get(name)
        if value is None:
            raise ConfigError(f'Configuration "{name}" is not set and has no default value.')
        return value
