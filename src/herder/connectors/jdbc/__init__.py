"""JDBC connectors for PostgreSQL, with Confluent's config names: :mod:`.source`, :mod:`.sink`."""

from herder.connectors.jdbc.sink import JdbcSinkConnector, JdbcSinkTask
from herder.connectors.jdbc.source import JdbcSourceConnector, JdbcSourceTask

__all__ = ["JdbcSinkConnector", "JdbcSinkTask", "JdbcSourceConnector", "JdbcSourceTask"]
