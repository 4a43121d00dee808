"""Fixtures of the connector tests: throwaway PostgreSQL servers per test session (one
with ``wal_level=logical`` for change data capture), a fresh database per test, and the
data plane's SparkSession."""

from __future__ import annotations

from tests.dataplane.conftest import spark
from tests.fixtures.postgres import database, logical_database, logical_postgres, postgres

__all__ = ["database", "logical_database", "logical_postgres", "postgres", "spark"]
