"""``/connector-plugins``: the plugins this worker has, their config keys, and config
validation (Connect's ConnectorPluginsResource)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from herder.errors import ConfigError
from herder.runtime.plugins import class_name
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.validation import key_info

__all__ = ["connector_plugins_routes"]


def _normalized(plugin: str) -> str:
    """A plugin name without its package and ``Connector`` suffix, for comparing aliases."""
    simple = plugin.rpartition(".")[2]
    return simple.removesuffix("Connector").lower()


def connector_plugins_routes(herder: DistributedHerder) -> APIRouter:
    api = APIRouter(tags=["connector-plugins"])
    plugins = herder.plugins

    def class_name_of(name: str) -> str:
        try:
            return class_name(plugins.connector_class(name))
        except ConfigError:
            return name

    @api.get("/connector-plugins")
    async def list_plugins(
        connectors_only: bool = Query(default=True, alias="connectorsOnly"),
    ) -> list[dict[str, str]]:
        return plugins.all_plugins(connectors_only=connectors_only)

    @api.get("/connector-plugins/{plugin}/config")
    async def plugin_config(plugin: str) -> list[dict[str, Any]]:
        definition = plugins.plugin_config(plugin)
        return [key_info(key) for key in definition.keys.values()]

    @api.put("/connector-plugins/{plugin}/config/validate")
    async def validate(plugin: str, body: dict[str, str]) -> dict[str, Any]:
        included = body.get("connector.class")
        if included is None:
            raise ConfigError(
                f"Connector config {body} contains no connector type; add 'connector.class'"
            )
        if not _normalized(class_name_of(included)).endswith(_normalized(plugin)):
            raise ConfigError(
                f"Included connector type {included} does not match request type {plugin}; "
                "validate against the plugin the config names"
            )
        return (await herder.validate_config(body)).to_json()

    return api
