"""Finding connector classes: installed plugins, dotted names and Connect's short aliases.

Packages make connectors known to workers through the ``herder.connectors`` entry-point
group, the Python form of Connect's ``plugin.path``::

    [project.entry-points."herder.connectors"]
    file-source = "mypkg.file:FileStreamSourceConnector"

A connector config's ``connector.class`` then names one of them by its full dotted name
(``mypkg.file.FileStreamSourceConnector``), by its class name
(``FileStreamSourceConnector``) or by that name without the ``Connector`` suffix
(``FileStreamSource``), as Connect allows. Any other dotted name is imported, so a
connector can also live in a module that is merely importable.

Transformations and predicates are plugins too, installed under the ``herder.transforms``
and ``herder.predicates`` entry points (see :mod:`herder.connect.transforms`; the data
plane's own are installed there as well). ``GET /connector-plugins?connectorsOnly=false``
shows them, and validation checks the ``transforms.<alias>.*`` and
``predicates.<alias>.*`` keys against their ConfigDefs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from herder.config import ConfigDef, ConfigValue, Importance, Type
from herder.connect import UNDEFINED_VERSION, Connector, ConnectorType
from herder.connect.transforms import (
    installed_predicates,
    installed_transformations,
    predicate_class,
    transformation_class,
)
from herder.errors import ConfigError, ErrorCode, HerderError

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "Plugins",
    "TransformPlugin",
    "UnknownPlugin",
    "class_name",
]

#: the ``type`` Connect's PluginInfo gives each kind of transform plugin
TRANSFORMATION: Final = "transformation"
PREDICATE: Final = "predicate"

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = "herder.connectors"
_SUFFIX: Final = "Connector"


def class_name(klass: type) -> str:
    """The full dotted name of a class, as ``connector.class`` and the REST API spell it."""
    return f"{klass.__module__}.{klass.__qualname__}"


class UnknownPlugin(HerderError):
    """No plugin of that name."""

    code = ErrorCode.UNKNOWN_PLUGIN
    http_status = 404
    advice = "GET /connector-plugins lists the plugins this worker has"


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One connector plugin, as ``GET /connector-plugins`` lists it."""

    class_name: str
    type: ConnectorType
    version: str

    def to_json(self) -> dict[str, str]:
        """Connect's ``PluginInfo`` body: ``class``, ``type`` and ``version``."""
        return {"class": self.class_name, "type": self.type.value, "version": self.version}


@dataclass(frozen=True, slots=True)
class TransformPlugin:
    """An installed transformation or predicate."""

    class_name: str
    #: "transformation" or "predicate", as Connect's PluginInfo types them
    type: str
    version: str
    config_def: ConfigDef

    def to_json(self) -> dict[str, str]:
        return {"class": self.class_name, "type": self.type, "version": self.version}

    def matches(self, name: str) -> bool:
        simple = self.class_name.rpartition(".")[2]
        return name in (self.class_name, simple)


def _transform_plugins() -> list[TransformPlugin]:
    """Every installed transformation and predicate, sorted by class name.

    One whose version or ConfigDef cannot be had is logged and left out, so one broken
    plugin does not take the listing down."""
    found = []
    for kind, classes in (
        (TRANSFORMATION, installed_transformations()),
        (PREDICATE, installed_predicates()),
    ):
        for klass in classes:
            try:
                found.append(
                    TransformPlugin(klass.class_name, kind, klass.version(), klass.config_def())
                )
            except Exception as exc:
                log.warning("Skipping %s plugin %s: %s", kind, klass.class_name, exc)
    return sorted(found, key=lambda p: p.class_name)


def _importable(kind: str, name: str) -> TransformPlugin | None:
    """A transformation or predicate not installed, by its full dotted name: it is found
    by that name when the chain is built (see :mod:`herder.connect.transforms`), so it
    validates too."""
    lookup = transformation_class if kind == TRANSFORMATION else predicate_class
    klass = lookup(name)
    if klass is None:
        return None
    return TransformPlugin(klass.class_name, kind, klass.version(), klass.config_def())


class Plugins:
    """The connector classes a worker knows, and how names in configs resolve to them."""

    def __init__(
        self,
        connectors: Iterable[type[Connector]] = (),
        aliases: Mapping[str, type[Connector]] | None = None,
    ) -> None:
        self._by_name: dict[str, type[Connector]] = {}
        for klass in connectors:
            self._by_name[class_name(klass)] = _as_connector(klass, class_name(klass))
        #: other full class names a connector answers to (Debezium's, say), besides its own
        self._aliases: dict[str, type[Connector]] = dict(aliases or {})

    @classmethod
    def discover(cls, extra: Iterable[type[Connector]] = ()) -> Plugins:
        """Every connector installed under the ``herder.connectors`` entry points, plus ``extra``.

        An entry point that fails to load, or names something that is not a usable
        connector, is logged and skipped: one broken package must not keep a worker
        from running every other connector.
        """
        found: list[type[Connector]] = list(extra)
        aliases: dict[str, type[Connector]] = {}
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                klass = _as_connector(entry_point.load(), entry_point.value)
                found.append(klass)
                # an entry point named with a dotted name is a full class name of its own:
                # configs written for another implementation (Debezium's) work unchanged
                if "." in entry_point.name and entry_point.name != class_name(klass):
                    aliases[entry_point.name] = klass
            except Exception as exc:
                log.warning(
                    "Skipping connector plugin %s = %s: %s",
                    entry_point.name,
                    entry_point.value,
                    exc,
                )
        return cls(found, aliases)

    def connector_class(self, name: str) -> type[Connector]:
        """The connector class ``name`` refers to: a full name, an alias or a dotted path.

        Raises ConfigError when nothing matches, or when an alias matches more than one
        plugin (the message lists them, so the user can pick a full name).
        """
        known = self._by_name.get(name) or self._aliases.get(name)
        if known is not None:
            return known
        matches = [
            klass for klass in self._by_name.values() if klass.__name__ in (name, name + _SUFFIX)
        ]
        if len(matches) > 1:
            candidates = ", ".join(sorted(class_name(k) for k in matches))
            raise ConfigError(
                f"More than one connector matches alias {name}. Please use full package and "
                f"class name instead. Classes found: {candidates}"
            )
        if matches:
            return matches[0]
        imported = _import_class(name)
        if imported is None:
            available = ", ".join(sorted(self._by_name)) or "none"
            raise ConfigError(
                f"Failed to find any class that implements Connector and which name matches "
                f"{name}, available connectors are: {available}"
            )
        return _as_connector(imported, name)

    def type_of(self, name: str) -> ConnectorType:
        """Whether the connector class ``name`` refers to is a source or a sink (UNKNOWN
        when no such class is found: a connector's type is shown, never refused, here)."""
        try:
            return ConnectorType.of(self.connector_class(name))
        except HerderError:
            return ConnectorType.UNKNOWN

    def new_connector(self, name: str) -> Connector:
        """A fresh instance of the connector class ``name`` refers to."""
        klass = self.connector_class(name)
        try:
            return klass()
        except Exception as exc:
            raise HerderError(
                f"Failed to create an instance of connector {class_name(klass)}: {exc}"
            ) from exc

    def transform_plugins(self) -> list[TransformPlugin]:
        """The installed transformations and predicates, by class name."""
        return _transform_plugins()

    def all_plugins(self, *, connectors_only: bool) -> list[dict[str, str]]:
        """``GET /connector-plugins``: connectors, then (unless connectors only) the rest."""
        out = [p.to_json() for p in self.connector_plugins()]
        if not connectors_only:
            out += [p.to_json() for p in self.transform_plugins()]
        return out

    def plugin_config(self, name: str) -> ConfigDef:
        """The ConfigDef of the connector, transformation or predicate ``name`` names."""
        for plugin in self.transform_plugins():
            if plugin.matches(name):
                return plugin.config_def
        try:
            self.connector_class(name)
        except ConfigError:
            raise UnknownPlugin(f"Unknown plugin {name}.") from None
        return self.new_connector(name).config_def()

    def enrich(
        self, base: ConfigDef, config: Mapping[str, str], values: dict[str, ConfigValue]
    ) -> ConfigDef:
        """``base`` plus each transform's and predicate's keys; their values go in ``values``.

        As Connect's ``ConnectorConfig.enrich``: every alias listed in ``transforms`` (or
        ``predicates``) gets a ``<prefix><alias>.type`` naming its class and that class's
        keys under ``<prefix><alias>.``, in a group of its own.
        """
        enriched = ConfigDef(base.keys.values())
        available = self.transform_plugins()
        for list_key, prefix, kind, title in (
            ("transforms", "transforms.", "transformation", "Transforms"),
            ("predicates", "predicates.", "predicate", "Predicates"),
        ):
            listed = values.get(list_key)
            aliases = (listed.value or []) if listed is not None else []
            for alias in aliases:
                group = f"{title}: {alias}"
                alias_prefix = f"{prefix}{alias}."
                type_key = f"{alias_prefix}type"
                enriched.define(
                    type_key,
                    Type.STRING,
                    importance=Importance.HIGH,
                    documentation=f"Class for the '{alias}' {kind}.",
                    group=group,
                    order_in_group=0,
                    display_name=f"{kind.capitalize()} type for {alias}",
                )
                class_name_ = config.get(type_key, "")
                type_value = ConfigValue(type_key, class_name_ or None)
                values[type_key] = type_value
                if not class_name_:
                    type_value.errors.append(
                        f'Missing required configuration "{type_key}" which has no default value.'
                    )
                    continue
                plugin = next(
                    (p for p in available if p.type == kind and p.matches(class_name_)), None
                ) or _importable(kind, class_name_)
                if plugin is None:
                    type_value.errors.append(
                        f"Invalid value {class_name_} for configuration {type_key}: "
                        f"Class {class_name_} could not be found."
                    )
                    continue
                child = {
                    k.removeprefix(alias_prefix): v
                    for k, v in config.items()
                    if k.startswith(alias_prefix)
                }
                enriched.embed(alias_prefix, group, 1, plugin.config_def)
                for name, value in plugin.config_def.validate(child).items():
                    value.name = alias_prefix + name
                    values[value.name] = value
        return enriched

    def connector_plugins(self) -> list[PluginInfo]:
        """Every known connector, sorted by class name, with its type and version."""
        return [
            PluginInfo(name, ConnectorType.of(klass), _version(klass))
            for name, klass in sorted(self._by_name.items())
        ]


def _as_connector(obj: object, name: str) -> type[Connector]:
    """``obj`` if it is a concrete source or sink connector class, else ConfigError."""
    if not (isinstance(obj, type) and issubclass(obj, Connector)):
        raise ConfigError(
            f"{name} is not a connector: it must be a subclass of "
            "herder.connect.SourceConnector or herder.connect.SinkConnector"
        )
    if ConnectorType.of(obj) is ConnectorType.UNKNOWN:
        raise ConfigError(
            f"{name} must extend herder.connect.SourceConnector or "
            "herder.connect.SinkConnector, not Connector directly"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise ConfigError(f"{name} is abstract: it does not implement {missing}")
    return obj


def _import_class(name: str) -> object | None:
    """What the dotted ``name`` refers to, or None if it does not import."""
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module *on the path to* the class means "no such class"; a
        # module that exists but lacks one of its own dependencies is the user's problem
        # to see, not to have hidden behind "not found".
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            return None
        raise ConfigError(f"Failed to import {module_name} for connector {name}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"Failed to import {module_name} for connector {name}: {exc}") from exc
    return getattr(module, attribute, None)


def _version(klass: type[Connector]) -> str:
    # Connect instantiates plugins to ask their version too; a plugin that fails to
    # construct still gets listed, since that is where a user looks to debug it.
    try:
        return str(klass().version())
    except Exception as exc:
        log.warning("Connector %s failed to report its version: %s", class_name(klass), exc)
        return UNDEFINED_VERSION
