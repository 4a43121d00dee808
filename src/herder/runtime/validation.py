"""Validating a connector config: Connect's ``ConfigInfos``, from ``ConfigDef``.

A config is checked against the keys every connector has (``name``,
``connector.class``, ``tasks.max``, ``transforms``, ``predicates``, and ``topics`` for a
sink), the keys of each transform and predicate it names (embedded under
``transforms.<alias>.`` and ``predicates.<alias>.``), and the connector's own
:meth:`~herder.connect.Connector.validate`. The result is the body of ``PUT
/connector-plugins/<plugin>/config/validate``: every key's definition and value with
its errors, the groups in order, and the error count. Creating or updating a connector
runs the same validation and refuses a config with errors, naming each bad key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herder.config import ConfigDef, ConfigKey, ConfigValue, Importance, Range, Type, Width
from herder.config.validators import NonEmptyStringWithoutControlChars
from herder.connect import Connector, ConnectorType
from herder.errors import ConfigError, HerderError
from herder.runtime.plugins import Plugins, class_name

__all__ = ["BASE_CONNECTOR_CONFIG", "SINK_CONNECTOR_CONFIG", "ConfigInfos", "key_info"]

COMMON_GROUP = "Common"
TRANSFORMS_GROUP = "Transforms"
PREDICATES_GROUP = "Predicates"

BASE_CONNECTOR_CONFIG = (
    ConfigDef()
    .define("name", Type.STRING, validator=NonEmptyStringWithoutControlChars(),
            importance=Importance.HIGH,
            documentation="Globally unique name to use for this connector.",
            group=COMMON_GROUP, order_in_group=1, width=Width.MEDIUM,
            display_name="Connector name")
    .define("connector.class", Type.STRING, importance=Importance.HIGH,
            documentation="Name or alias of the class for this connector.",
            group=COMMON_GROUP, order_in_group=2, width=Width.LONG,
            display_name="Connector class")
    .define("tasks.max", Type.INT, default=1, validator=Range.at_least(1),
            importance=Importance.HIGH,
            documentation="Maximum number of tasks to use for this connector.",
            group=COMMON_GROUP, order_in_group=3, width=Width.SHORT, display_name="Tasks max")
    .define("transforms", Type.LIST, default="", importance=Importance.LOW,
            documentation="Aliases for the transformations to be applied to records.",
            group=TRANSFORMS_GROUP, order_in_group=1, width=Width.LONG,
            display_name="Transforms")
    .define("predicates", Type.LIST, default="", importance=Importance.LOW,
            documentation="Aliases for the predicates used by transformations.",
            group=PREDICATES_GROUP, order_in_group=1, width=Width.LONG,
            display_name="Predicates")
)  # fmt: skip

SINK_CONNECTOR_CONFIG = BASE_CONNECTOR_CONFIG.merge(
    ConfigDef().define(
        "topics",
        Type.LIST,
        default="",
        importance=Importance.HIGH,
        documentation="List of topics to consume, separated by commas.",
        group=COMMON_GROUP,
        order_in_group=4,
        width=Width.LONG,
        display_name="Topics",
    )
)


def key_info(key: ConfigKey, prefix: str = "") -> dict[str, Any]:
    """Connect's ``ConfigKeyInfo`` JSON (its ``order_in_group`` is serialised as ``order``)."""
    info = key.info(prefix)
    info["order"] = info.pop("order_in_group")
    return info


class ConfigInfos:
    """The validation of one connector config, as Connect reports it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.groups: list[str] = []
        self.configs: list[dict[str, Any]] = []

    @property
    def error_count(self) -> int:
        return sum(len(c["value"]["errors"]) for c in self.configs)

    def errors(self) -> list[str]:
        """Each key's errors as ``key: message``, in order."""
        return [
            f"{c['value']['name']}: {error}" for c in self.configs for error in c["value"]["errors"]
        ]

    def add(self, definition: ConfigDef, values: Mapping[str, ConfigValue]) -> None:
        for group in definition.groups():
            if group not in self.groups:
                self.groups.append(group)
        keys = definition.keys
        for name, value in values.items():
            key = keys.get(name)
            self.configs.append(
                {
                    "definition": None if key is None else key_info(key),
                    "value": value.to_dict(None if key is None else key.type),
                }
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "error_count": self.error_count,
            "groups": list(self.groups),
            "configs": list(self.configs),
        }

    @classmethod
    def validate(cls, plugins: Plugins, config: Mapping[str, str]) -> ConfigInfos:
        """Validate ``config`` (which must name its ``connector.class``)."""
        connector_class = config.get("connector.class")
        if not connector_class:
            raise ConfigError(f"Connector config {dict(config)} contains no connector type")
        klass = plugins.connector_class(connector_class)
        try:
            connector: Connector = klass()
        except Exception as exc:
            raise HerderError(
                f"Failed to create an instance of connector {class_name(klass)}: {exc}"
            ) from exc
        infos = cls(connector_class)
        is_sink = ConnectorType.of(klass) is ConnectorType.SINK
        base = SINK_CONNECTOR_CONFIG if is_sink else BASE_CONNECTOR_CONFIG
        base_values = base.validate(config)
        if is_sink and not base_values["topics"].value:
            base_values["topics"].errors.append(
                "Must configure one of topics or topics.regex; this runtime supports topics"
            )
        enriched = plugins.enrich(base, config, base_values)
        infos.add(enriched, base_values)
        own = connector.config_def()
        try:
            own_values = connector.validate(dict(config))
        except Exception as exc:
            raise HerderError(f"connector {connector_class} failed to validate: {exc}") from exc
        infos.add(own, {k: v for k, v in own_values.items() if k not in base_values})
        return infos
