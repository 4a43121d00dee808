"""An ensemble server with the group coordinator: the server every herder process runs.

The ensemble knows nothing of groups; the coordinator is a service its leader hosts.
Whoever runs a server (``herder ensemble start``, standalone mode, the quickstart) puts
the two together here, so all of them serve the same APIs.
"""

from __future__ import annotations

from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.service import CoordinatorService
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.server import EnsembleServer

__all__ = ["ensemble_server"]


def ensemble_server(
    config: EnsembleConfig, coordinator: CoordinatorConfig | None = None
) -> EnsembleServer:
    """A server of ``config`` whose leader hosts a group coordinator with ``coordinator``'s
    settings (Kafka's defaults if None); not started yet."""
    return EnsembleServer(config, services=[CoordinatorService(coordinator)])
