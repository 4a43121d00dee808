"""The OpenAPI document a worker serves says what its operations answer and what they
need: clients made from it, and schemathesis, read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from herder.runtime.plugins import Plugins
from herder.runtime.rest import build_app
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.worker_config import WorkerConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"


def _document(props: dict[str, Any]) -> dict[str, Any]:
    config = WorkerConfig.from_properties(
        {"group.id": "g", "bootstrap.servers": "127.0.0.1:1", **props}
    )
    herder = DistributedHerder(config, Plugins.discover(), None, worker_id="127.0.0.1:8083")  # type: ignore[arg-type]
    document: dict[str, Any] = build_app(herder).openapi()
    return document


def test_operations_that_answer_without_a_body_document_none() -> None:
    paths = _document({})["paths"]
    for path in ("/connectors/{name}/pause", "/connectors/{name}/resume",
                 "/connectors/{name}/topics/reset"):  # fmt: skip
        assert paths[path]["put"]["responses"]["202"].get("content") is None, path
    assert paths["/connectors/{name}/stop"]["put"]["responses"]["204"].get("content") is None


def test_the_document_asks_for_basic_credentials_when_the_worker_does(tmp_path: Path) -> None:
    assert "security" not in _document({})
    users = tmp_path / "users.properties"
    users.write_text("admin: pw,admin\n")
    document = _document(
        {
            "rest.extension.classes": BASIC_AUTH,
            "rest.basic.auth.credentials.file": str(users),
            "rest.basic.auth.internal.user": "admin",
            "rest.basic.auth.internal.password": "pw",
        }
    )
    assert document["components"]["securitySchemes"]["basic"]["scheme"] == "basic"
    assert document["security"] == [{"basic": []}]
    # the health check stays open, as the worker leaves it
    assert document["paths"]["/health"]["get"]["security"] == []
    assert "security" not in document["paths"]["/connectors"]["get"]
