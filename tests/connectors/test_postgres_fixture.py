"""The throwaway PostgreSQL server the JDBC tests use answers, refuses a wrong
password, and is gone (process and directory) once stopped."""

from __future__ import annotations

import psycopg
import pytest

from tests.fixtures.postgres import PostgresServer, alive, postgres_bindir

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_throwaway_server_starts_answers_and_stops_by_pid() -> None:
    bindir = postgres_bindir()
    assert bindir is not None
    server = PostgresServer(bindir).start()
    try:
        assert server.pid is not None
        pid = server.pid
        assert server.execute("SELECT 40 + 2") == [(42,)]
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(server.dsn(password="wrong")).close()
    finally:
        server.stop()
    assert not alive(pid)
    assert not server.dir.exists()
