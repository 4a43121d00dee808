"""``herder worker``: run a distributed worker."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click


@click.group()
def worker() -> None:
    """Run Kafka Connect-style distributed workers."""


@worker.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="worker.properties with Kafka Connect's names (group.id, bootstrap.servers …).",
)
def start(config_path: Path) -> None:
    """Run one worker until SIGTERM."""
    from herder.config import load_properties, resolve
    from herder.dataplane.execution import TaskExecutions
    from herder.errors import ConfigError
    from herder.runtime.process import run_worker
    from herder.runtime.worker_config import WorkerConfig

    props = resolve(load_properties(config_path))
    try:
        WorkerConfig.from_properties(props)
    except ConfigError as exc:
        raise ConfigError(f"{config_path}: {exc}") from None
    apply_log_format(props, config_path)
    asyncio.run(run_worker(props, TaskExecutions))


def apply_log_format(props: Mapping[str, Any], where: Path) -> None:
    """A worker's ``log.format`` (text or json) switches the process's log lines to it."""
    from herder import logcontext
    from herder.errors import ConfigError

    fmt = str(props.get("log.format", "")).strip().lower()
    if not fmt:
        return
    if fmt not in logcontext.FORMATS:
        raise ConfigError(
            f"{where}: log.format={fmt!r} is not one of {', '.join(logcontext.FORMATS)}"
        )
    logcontext.set_format(fmt)
