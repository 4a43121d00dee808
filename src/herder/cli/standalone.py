"""``herder standalone``: one worker with its own embedded ensemble, like connect-standalone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click


@click.command()
@click.argument(
    "worker_config", metavar="WORKER_PROPERTIES", type=click.Path(dir_okay=False, path_type=Path)
)
@click.argument(
    "connector_configs",
    metavar="[CONNECTOR_CONFIG]...",
    nargs=-1,
    type=click.Path(dir_okay=False, path_type=Path),
)
def standalone(worker_config: Path, connector_configs: tuple[Path, ...]) -> None:
    """Run one worker and an embedded single-server ensemble until SIGTERM.

    WORKER_PROPERTIES uses Kafka Connect's names; the data (configs, offsets, status,
    topics) goes under data.dir, or next to offset.storage.file.filename in a
    directory named after it with ".d" appended. Properties starting with "ensemble."
    configure the embedded ensemble under ZooKeeper's names (ensemble.clientPort=2191
    makes it reachable at a fixed port for "herder topics ...").

    Each CONNECTOR_CONFIG is a properties file with name=... and the connector's
    config, or JSON: {"name": ..., "config": {...}} or a flat config object. Connectors
    are created at start-up; one that already exists is kept if its config is the
    same and updated otherwise. The REST API is the distributed worker's.
    """
    from herder.cli.worker import apply_log_format
    from herder.config import load_properties, resolve
    from herder.dataplane.execution import TaskExecutions
    from herder.runtime.standalone import run_standalone

    props = resolve(load_properties(worker_config))
    apply_log_format(props, worker_config)
    asyncio.run(run_standalone(props, [str(path) for path in connector_configs], TaskExecutions))
