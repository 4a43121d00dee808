"""``herder worker``: run a distributed worker."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
    asyncio.run(run_worker(props, TaskExecutions))
