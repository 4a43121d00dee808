"""The one place an ensemble server gets its group coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.server import ensemble_server
from herder.coordinator.service import CoordinatorService
from herder.ensemble.config import EnsembleConfig

pytestmark = pytest.mark.unit


def test_the_server_hosts_one_coordinator_with_the_settings_given(tmp_path: Path) -> None:
    config = EnsembleConfig.from_properties({"dataDir": str(tmp_path)})
    settings = CoordinatorConfig(group_min_session_timeout_ms=1000)

    server = ensemble_server(config, settings)

    assert server.config is config
    [service] = server.services
    assert isinstance(service, CoordinatorService)
    assert service.config is settings


def test_without_settings_the_coordinator_takes_kafkas_defaults(tmp_path: Path) -> None:
    server = ensemble_server(EnsembleConfig.from_properties({"dataDir": str(tmp_path)}))

    [service] = server.services
    assert isinstance(service, CoordinatorService)
    assert service.config == CoordinatorConfig()
