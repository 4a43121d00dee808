"""Fixtures of the connector tests: one throwaway PostgreSQL server per test session,
a fresh database per test, and the data plane's SparkSession and ensemble server."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.dataplane.conftest import ensemble, spark, storage
from tests.fixtures.postgres import PostgresServer, postgres_bindir

__all__ = ["ensemble", "postgres", "spark", "storage"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.fail(
            "PostgreSQL's initdb was not found: install Debian's postgresql package"
            " (make test does)"
        )
    server = PostgresServer(bindir)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def database(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    """The JDBC URL of a new database named after the test."""
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:50]
    postgres.execute(f'DROP DATABASE IF EXISTS "{name}"')
    return postgres.create_database(name)
