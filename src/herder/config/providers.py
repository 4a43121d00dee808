"""Config providers: ``${provider:[path:]key}`` references resolved when a config is used.

Secrets should not sit in a connector config, which is stored in the ``_configs`` log and
returned by the REST API. As in Kafka (KIP-297), a value may instead *refer* to a secret:
``${env:DB_PASSWORD}`` or ``${file:/etc/herder/secrets.properties:db.password}``. The
config is stored with the reference and resolved only where it is used.

The reference syntax is Kafka's, so configs move between the two unchanged: the provider
name, then an optional path ending at the first ``:``, then the key up to ``}``. A value
may hold several references and text around them; the result of a substitution is not
scanned again, so a secret containing ``${`` can never inject another lookup.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Protocol

from herder.config.properties import load_properties
from herder.errors import ConfigError

__all__ = [
    "DEFAULT_PROVIDERS",
    "ConfigProvider",
    "DirectoryConfigProvider",
    "EnvVarConfigProvider",
    "FileConfigProvider",
    "has_references",
    "resolve",
    "restore_references",
]

# Kafka's ConfigTransformer pattern: ${provider:path:key} or ${provider:key}
_REFERENCE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")


class ConfigProvider(Protocol):
    """Looks up ``key`` (under ``path``, for providers that have paths).

    Raise ConfigError with the reason when there is no such value; ``resolve`` adds the
    config key and the reference to the message.
    """

    def get(self, path: str | None, key: str) -> str: ...


class EnvVarConfigProvider:
    """``${env:NAME}``: an environment variable, read at resolve time.

    ``environ`` is injectable so tests (and embedders) need not touch ``os.environ``.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    def get(self, path: str | None, key: str) -> str:
        if path:
            raise ConfigError(f"the env provider takes no path, but was given '{path}'")
        environ = os.environ if self._environ is None else self._environ
        try:
            return environ[key]
        except KeyError:
            raise ConfigError(f"environment variable {key} is not set") from None


class FileConfigProvider:
    """``${file:/path/to/file.properties:key}``: a key of a properties file."""

    def get(self, path: str | None, key: str) -> str:
        if not path:
            raise ConfigError("the file provider needs a path: ${file:/path/file.properties:key}")
        values = load_properties(path)
        try:
            return values[key]
        except KeyError:
            raise ConfigError(f"key {key} is not in {path}") from None


class DirectoryConfigProvider:
    """``${directory:/run/secrets:db-password}``: the whole content of a file in a directory.

    This is how Kubernetes and Docker mount secrets: one file per secret. The key must
    name a file directly inside the directory, never a path out of it.
    """

    def get(self, path: str | None, key: str) -> str:
        if not path:
            raise ConfigError("the directory provider needs a path: ${directory:/dir:file}")
        if not key or key in (".", "..") or "/" in key or os.sep in key:
            raise ConfigError(f"'{key}' is not a file name inside {path}")
        file = os.path.join(path, key)
        try:
            with open(file, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            raise ConfigError(f"file {file} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {file}: {exc}") from None


#: the providers ``resolve`` uses unless told otherwise; register more by name here
DEFAULT_PROVIDERS: dict[str, ConfigProvider] = {
    "env": EnvVarConfigProvider(),
    "file": FileConfigProvider(),
    "directory": DirectoryConfigProvider(),
}


def resolve(
    props: Mapping[str, str],
    providers: Mapping[str, ConfigProvider] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A copy of ``props`` with every ``${provider:[path:]key}`` reference replaced.

    ``providers`` defaults to ``DEFAULT_PROVIDERS``; ``env``, when given, is the
    environment the ``env`` provider reads instead of ``os.environ``. Any reference that
    cannot be resolved raises a ConfigError naming the config key and the reference, and
    nothing is returned half-resolved.
    """
    registry = dict(DEFAULT_PROVIDERS if providers is None else providers)
    if env is not None:
        registry["env"] = EnvVarConfigProvider(env)
    return {name: _resolve_value(name, value, registry) for name, value in props.items()}


def _resolve_value(name: str, value: str, registry: Mapping[str, ConfigProvider]) -> str:
    def substitute(match: re.Match[str]) -> str:
        provider_name, path, key = match.groups()
        reference = match.group(0)
        provider = registry.get(provider_name)
        if provider is None:
            known = ", ".join(sorted(registry)) or "none"
            raise ConfigError(
                f"Cannot resolve {reference} in configuration {name}: "
                f"unknown config provider '{provider_name}' (known: {known})"
            )
        try:
            return provider.get(path, key)
        except ConfigError as exc:
            raise ConfigError(
                f"Cannot resolve {reference} in configuration {name}: {exc}"
            ) from None

    return _REFERENCE.sub(substitute, value)


def has_references(value: str) -> bool:
    """Whether ``value`` refers to a config provider (``${provider:[path:]key}``)."""
    return _REFERENCE.search(value) is not None


def restore_references(
    raw: Mapping[str, str], task_configs: list[dict[str, str]]
) -> list[dict[str, str]]:
    """``task_configs`` with each key whose value in the connector's ``raw`` config holds
    a reference set back to that reference, as Connect's herder does.

    A connector sees its config resolved and often copies values into its task configs,
    which are stored and shown by the REST API; a secret copied so would be stored in the
    clear. Tasks get their configs resolved again when they start.
    """
    referring = {key: value for key, value in raw.items() if has_references(value)}
    return [
        {key: referring.get(key, value) for key, value in config.items()} for config in task_configs
    ]
