from pathlib import Path

import pytest

from herder.ensemble.config import EnsembleConfig, parse_server_line
from herder.errors import ConfigError

pytestmark = pytest.mark.unit


def test_defaults_follow_zookeeper(tmp_path: Path) -> None:
    cfg = EnsembleConfig.from_properties({"dataDir": str(tmp_path)})
    assert cfg.standalone and cfg.server_id == 1
    assert cfg.data_log_dir == tmp_path
    assert (cfg.min_session_timeout_ms, cfg.max_session_timeout_ms) == (4000, 40000)
    assert cfg.prealloc_bytes == 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("h1:2888:3888", ("h1", 2888, 3888, False, "h1", 0)),
        ("h1:2888:3888:observer", ("h1", 2888, 3888, True, "h1", 0)),
        ("h1:2888:3888:participant;2191", ("h1", 2888, 3888, False, "h1", 2191)),
        ("h1:2888:3888;10.0.0.1:2191", ("h1", 2888, 3888, False, "10.0.0.1", 2191)),
        ("h1:2888:3888;0.0.0.0:2191", ("h1", 2888, 3888, False, "h1", 2191)),
    ],
)
def test_server_lines(line: str, expected: tuple[object, ...]) -> None:
    p = parse_server_line(3, line)
    assert (
        p.host,
        p.quorum_port,
        p.election_port,
        p.observer,
        p.client_host,
        p.client_port,
    ) == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("h1:2888", "expected host:quorumPort:electionPort"),
        ("h1:x:3888", "'x' is not a port number"),
        ("h1:2888:3888:witness", "role must be participant or observer"),
        ("h1:2888:70000", "port 70000 is out of range"),
    ],
)
def test_bad_server_lines_name_the_problem(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_server_line(1, line)


def test_ensemble_config_takes_id_from_myid_and_client_port_from_its_line(tmp_path: Path) -> None:
    (tmp_path / "myid").write_text("2\n")
    props = {
        "dataDir": str(tmp_path),
        "server.1": "127.0.0.1:2888:3888;127.0.0.1:2191",
        "server.2": "127.0.0.1:2889:3889;127.0.0.1:2192",
        "server.3": "127.0.0.1:2890:3890:observer;127.0.0.1:2193",
    }
    cfg = EnsembleConfig.from_properties(props)
    assert cfg.server_id == 2 and not cfg.standalone
    assert (cfg.client_address, cfg.client_port) == ("127.0.0.1", 2192)
    assert cfg.peers[3].observer


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        EnsembleConfig.from_properties({"clientPort": "99999", "tickTime": "soon"})
    message = str(info.value)
    assert "dataDir" in message and "clientPort" in message and "tickTime" in message


def test_missing_myid_and_unknown_id(tmp_path: Path) -> None:
    line = {"server.1": "h:1:2"}
    with pytest.raises(ConfigError, match="no myid file"):
        EnsembleConfig.from_properties({"dataDir": str(tmp_path), **line})
    with pytest.raises(ConfigError, match=r"server\.id 5 has no server\.5 line"):
        EnsembleConfig.from_properties({"dataDir": str(tmp_path), "server.id": "5", **line})
    with pytest.raises(ConfigError, match="minSessionTimeout 9000 is larger"):
        EnsembleConfig.from_properties(
            {"dataDir": str(tmp_path), "minSessionTimeout": "9000", "maxSessionTimeout": "10"}
        )
