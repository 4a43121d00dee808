"""Fixtures of the connector tests: one throwaway PostgreSQL server per test session,
a fresh database per test, and the data plane's SparkSession."""

from __future__ import annotations

from tests.dataplane.conftest import spark
from tests.fixtures.postgres import database, postgres

__all__ = ["database", "postgres", "spark"]
