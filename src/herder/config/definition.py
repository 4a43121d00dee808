"""ConfigDef: the declared keys of a config, and parsing and validating values against them.

This is Kafka's ``ConfigDef`` in Python. Workers, connectors, tasks and transforms each
declare their keys once — type, default, validators, documentation, UI hints — and the
same declaration then serves three callers:

* ``parse`` at startup, which must refuse a bad config with *every* problem in one
  message (fixing errors one restart at a time is miserable);
* ``validate`` behind Connect's ``PUT /connector-plugins/{type}/config/validate``, which
  must never raise and instead attaches every error, recommended value and visibility
  flag to its key so a UI can render a form;
* ``to_dict`` for the REST API's ``ConfigKeyInfo`` (Connect's field names, so existing
  clients and UIs work unchanged).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol, Self

from herder.config.parsing import Type, convert_to_string, parse_type
from herder.config.validators import Validator
from herder.errors import ConfigError

__all__ = [
    "NO_DEFAULT",
    "ConfigDef",
    "ConfigKey",
    "ConfigValue",
    "Importance",
    "InvalidConfiguration",
    "Recommender",
    "Width",
]


class _NoDefault(enum.Enum):
    # an enum member rather than object(): mypy narrows `default is NO_DEFAULT`, and it
    # survives copying and pickling as the same singleton
    NO_DEFAULT = "NO_DEFAULT"

    def __repr__(self) -> str:
        return "NO_DEFAULT"


#: the default of a required key: parsing fails when the key is absent
NO_DEFAULT: Final = _NoDefault.NO_DEFAULT


class Importance(enum.Enum):
    """How much a user should care about a key; UIs show HIGH keys first."""

    HIGH = "HIGH"
    MEDIUM = "MEDIUM"
    LOW = "LOW"


class Width(enum.Enum):
    """A UI hint for the width of the input field of a key."""

    NONE = "NONE"
    SHORT = "SHORT"
    MEDIUM = "MEDIUM"
    LONG = "LONG"


class Recommender(Protocol):
    """Suggests values for a key, and says whether it applies, given the other values.

    A JDBC connector's ``table.whitelist`` might recommend the tables of the database
    named in ``connection.url``, and ``timestamp.column.name`` is only visible when
    ``mode`` uses timestamps. Raise ConfigError to report a problem on the key.
    """

    def valid_values(self, name: str, parsed_config: Mapping[str, Any]) -> list[Any]: ...

    def visible(self, name: str, parsed_config: Mapping[str, Any]) -> bool: ...


class InvalidConfiguration(ConfigError):
    """A config with one or more problems; ``problems`` holds each one's message.

    The message is a single line naming every problem, so the CLI can print it as is;
    callers that present problems one by one (a REST body, a table) use ``problems``.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} configuration problems: " + "; ".join(self.problems)
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One declared key. ``default`` is already parsed (and validated) to ``type``."""

    name: str
    type: Type
    default: Any = NO_DEFAULT
    validators: tuple[Validator, ...] = ()
    importance: Importance = Importance.MEDIUM
    documentation: str = ""
    group: str | None = None
    order_in_group: int = -1
    width: Width = Width.NONE
    display_name: str = ""
    dependents: tuple[str, ...] = ()
    recommender: Recommender | None = None

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def info(self, prefix: str = "") -> dict[str, Any]:
        """This key as Connect's ``ConfigKeyInfo`` JSON object (``prefix`` + name)."""
        return {
            "name": prefix + self.name,
            "type": self.type.value,
            "required": self.required,
            "default_value": None if self.required else convert_to_string(self.default, self.type),
            "importance": self.importance.value,
            "documentation": self.documentation,
            "group": self.group,
            "order_in_group": self.order_in_group,
            "width": self.width.value,
            "display_name": self.display_name,
            "dependents": list(self.dependents),
        }


@dataclass(slots=True)
class ConfigValue:
    """The outcome of validating one key: its value, what to suggest, what is wrong."""

    name: str
    value: Any = None
    recommended_values: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    visible: bool = True

    def to_dict(self, type: Type | None = None) -> dict[str, Any]:
        """This value as Connect's ``ConfigValueInfo`` JSON object, values as strings."""
        return {
            "name": self.name,
            "value": convert_to_string(self.value, type),
            "recommended_values": [convert_to_string(v, type) for v in self.recommended_values],
            "errors": list(self.errors),
            "visible": self.visible,
        }


class ConfigDef:
    """An ordered set of ConfigKeys, built fluently::

        ConfigDef().define("tasks.max", Type.INT, default=1, validator=Range.at_least(1),
                           importance=Importance.HIGH, documentation="Maximum tasks.")

    Unknown keys in the input are not errors (a worker config carries keys for many
    components); ``parse`` and ``validate`` look at the declared keys only.
    """

    def __init__(self, keys: Iterable[ConfigKey] = ()) -> None:
        self._keys: dict[str, ConfigKey] = {}
        for key in keys:
            self._add(key)

    @property
    def keys(self) -> Mapping[str, ConfigKey]:
        """The declared keys by name, in declaration order (read-only)."""
        return MappingProxyType(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def define(
        self,
        name: str,
        type: Type,
        *,
        default: Any = NO_DEFAULT,
        validator: Validator | Sequence[Validator] | None = None,
        importance: Importance = Importance.MEDIUM,
        documentation: str = "",
        group: str | None = None,
        order_in_group: int = -1,
        width: Width = Width.NONE,
        display_name: str | None = None,
        dependents: Iterable[str] = (),
        recommender: Recommender | None = None,
    ) -> Self:
        """Declare a key and return ``self``, so definitions chain.

        The default is parsed and validated now, so a bad default is a bug found when
        the definition is built rather than when some user relies on it. Several
        validators may be given; each failing one is reported.
        """
        if validator is None:
            validators: tuple[Validator, ...] = ()
        elif callable(validator):
            validators = (validator,)
        else:
            validators = tuple(validator)
        if default is not NO_DEFAULT:
            default = parse_type(name, default, type)
            if default is not None:
                for check in validators:
                    check(name, default)
        self._add(
            ConfigKey(
                name=name,
                type=type,
                default=default,
                validators=validators,
                importance=importance,
                documentation=documentation,
                group=group,
                order_in_group=order_in_group,
                width=width,
                display_name=display_name or name,
                dependents=tuple(dependents),
                recommender=recommender,
            )
        )
        return self

    def merge(self, other: ConfigDef) -> ConfigDef:
        """A new ConfigDef with this one's keys, then ``other``'s; a shared name raises.

        Connect validates a connector against its base definition combined with the
        plugin's own, and a plugin redefining a base key is a plugin bug worth refusing.
        """
        return ConfigDef([*self._keys.values(), *other._keys.values()])

    def embed(self, prefix: str, group: str, starting_order: int, child: ConfigDef) -> Self:
        """Add ``child``'s keys under ``prefix``, in ``group``, ordered from ``starting_order``.

        This is how Connect exposes a transform's keys as ``transforms.<alias>.<key>``:
        dependents are renamed along with the keys, and the child's recommenders see the
        child's own key names, as if they ran unembedded.
        """
        for order, key in enumerate(child._keys.values(), start=starting_order):
            recommender = key.recommender
            self._add(
                ConfigKey(
                    name=prefix + key.name,
                    type=key.type,
                    default=key.default,
                    validators=key.validators,
                    importance=key.importance,
                    documentation=key.documentation,
                    group=group if key.group is None else f"{group}: {key.group}",
                    order_in_group=order,
                    width=key.width,
                    display_name=key.display_name,
                    dependents=tuple(prefix + d for d in key.dependents),
                    recommender=None if recommender is None else _Embedded(prefix, recommender),
                )
            )
        return self

    def groups(self) -> list[str]:
        """Group names in order of first use (Connect's ``ConfigInfos.groups``)."""
        return list(dict.fromkeys(k.group for k in self._keys.values() if k.group is not None))

    def parse(self, props: Mapping[str, Any]) -> dict[str, Any]:
        """Typed values of every declared key (defaults filled in), or InvalidConfiguration.

        A ``None`` value counts as absent, as JSON's null does in Connect's REST bodies.
        """
        values: dict[str, Any] = {}
        problems: list[str] = []
        for key in self._keys.values():
            values[key.name], errors = self._parse_key(key, props.get(key.name))
            problems.extend(errors)
        if problems:
            raise InvalidConfiguration(problems)
        return values

    def parse_value(self, name: str, raw: Any) -> Any:
        """Parse and validate one raw value of the declared key ``name``."""
        value, errors = self._parse_key(self._key(name), raw)
        if errors:
            raise InvalidConfiguration(errors)
        return value

    def validate(self, props: Mapping[str, Any]) -> dict[str, ConfigValue]:
        """Validate without raising: every declared key gets a ConfigValue with all its errors.

        First every key is parsed (so recommenders see the whole config), then each
        recommender runs. A dependent that names no declared key is reported on an
        invisible entry of its own, as Kafka does, rather than silently ignored.
        """
        results: dict[str, ConfigValue] = {}
        parsed: dict[str, Any] = {}
        for key in self._keys.values():
            value, errors = self._parse_key(key, props.get(key.name))
            parsed[key.name] = value
            results[key.name] = ConfigValue(key.name, value, errors=errors)
        for key in self._keys.values():
            for dependent in key.dependents:
                if dependent not in self._keys and dependent not in results:
                    message = f"{dependent} is referred in the dependents, but not defined."
                    results[dependent] = ConfigValue(dependent, errors=[message], visible=False)
        view = MappingProxyType(parsed)
        for key in self._keys.values():
            if key.recommender is None:
                continue
            result = results[key.name]
            try:
                result.recommended_values = list(key.recommender.valid_values(key.name, view))
                result.visible = key.recommender.visible(key.name, view)
            except ConfigError as exc:
                result.errors.append(str(exc))
        return results

    def to_dict(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Every key's ``ConfigKeyInfo`` by (prefixed) name, in declaration order."""
        return {prefix + name: key.info(prefix) for name, key in self._keys.items()}

    def _key(self, name: str) -> ConfigKey:
        try:
            return self._keys[name]
        except KeyError:
            raise ConfigError(f"Unknown configuration '{name}'") from None

    def _add(self, key: ConfigKey) -> None:
        if key.name in self._keys:
            raise ConfigError(f"Configuration {key.name} is defined twice.")
        self._keys[key.name] = key

    @staticmethod
    def _parse_key(key: ConfigKey, raw: Any) -> tuple[Any, list[str]]:
        """The key's typed value and every problem with it (value is None if unusable)."""
        if raw is None:
            if key.required:
                message = f'Missing required configuration "{key.name}" which has no default value.'
                return None, [message]
            return key.default, []
        try:
            value = parse_type(key.name, raw, key.type)
        except ConfigError as exc:
            return None, [str(exc)]
        errors: list[str] = []
        if value is not None:
            for check in key.validators:
                try:
                    check(key.name, value)
                except ConfigError as exc:
                    errors.append(str(exc))
        return value, errors


@dataclass(frozen=True, slots=True)
class _Embedded:
    """A child's recommender seen through an ``embed`` prefix."""

    prefix: str
    inner: Recommender

    def valid_values(self, name: str, parsed_config: Mapping[str, Any]) -> list[Any]:
        return self.inner.valid_values(*self._unprefixed(name, parsed_config))

    def visible(self, name: str, parsed_config: Mapping[str, Any]) -> bool:
        return self.inner.visible(*self._unprefixed(name, parsed_config))

    def _unprefixed(
        self, name: str, parsed_config: Mapping[str, Any]
    ) -> tuple[str, Mapping[str, Any]]:
        cut = len(self.prefix)
        inner_config = {k[cut:]: v for k, v in parsed_config.items() if k.startswith(self.prefix)}
        return name[cut:], inner_config
