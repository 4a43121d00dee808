"""Real ensemble servers for integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import HERDER, Proc, Processes, free_port, port_open


@dataclass
class ServerHandle:
    """One ensemble server process with a data directory that outlives restarts."""

    processes: Processes
    config_path: Path
    data_dir: Path
    port: int
    proc: Proc | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServerHandle:
        self.proc = self.processes.start(
            [
                *HERDER,
                "--log-level",
                "INFO",
                "ensemble",
                "start",
                "--config",
                str(self.config_path),
            ],
            name=f"ensemble-{self.port}",
            ready=lambda: port_open(self.port),
        )
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()

    def stop(self) -> int | None:
        assert self.proc is not None
        return self.proc.stop()


def make_server(
    processes: Processes, tmp_path: Path, name: str = "ens", **props: object
) -> ServerHandle:
    port = free_port()
    data_dir = tmp_path / name
    data_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "dataDir": str(data_dir),
        "clientPort": port,
        "clientPortAddress": "127.0.0.1",
        "tickTime": 200,
        "preAllocSize": 1024,
        **props,
    }
    config_path = tmp_path / f"{name}.properties"
    config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    return ServerHandle(processes, config_path, data_dir, port)


@pytest.fixture
def ensemble_server(processes: Processes, tmp_path: Path) -> Iterator[ServerHandle]:
    yield make_server(processes, tmp_path).start()
