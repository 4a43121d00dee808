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
    port = int(props.pop("clientPort", 0)) or free_port()  # type: ignore[call-overload]
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


@dataclass
class Ensemble:
    """Several servers of one replicated ensemble (``server.N`` lines, ids from 1)."""

    servers: dict[int, ServerHandle]

    @property
    def bootstrap(self) -> str:
        return ",".join(s.bootstrap for s in self.servers.values())

    def start(self) -> Ensemble:
        for server in self.servers.values():
            server.start()
        return self

    def __getitem__(self, server_id: int) -> ServerHandle:
        return self.servers[server_id]


def make_ensemble(
    processes: Processes,
    tmp_path: Path,
    participants: int = 3,
    observers: int = 0,
    **props: object,
) -> Ensemble:
    """A replicated ensemble on 127.0.0.1 with short ticks (not started)."""
    ids = range(1, participants + observers + 1)
    ports = {sid: (free_port(), free_port(), free_port()) for sid in ids}
    lines = {
        f"server.{sid}": f"127.0.0.1:{q}:{e}{':observer' if sid > participants else ''};"
        f"127.0.0.1:{c}"
        for sid, (q, e, c) in ports.items()
    }
    servers = {}
    for sid in ids:
        server = make_server(
            processes,
            tmp_path,
            name=f"server{sid}",
            **{"server.id": sid, "clientPort": ports[sid][2], **lines, **props},
        )
        servers[sid] = server
    return Ensemble(servers)
