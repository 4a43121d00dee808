"""Standalone mode's pure parts: connector files, and splitting one worker config three ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.errors import ConfigError
from herder.runtime.standalone import (
    load_connector_file,
    parse_connector_text,
    standalone_data_dir,
    standalone_settings,
)

pytestmark = pytest.mark.unit

OFFSETS = "offset.storage.file.filename"


def test_properties_json_and_flat_json_read_the_same() -> None:
    props = "name=src\nconnector.class=FileStreamSource\ntasks.max=1\n"
    connect = '{"name": "src", "config": {"connector.class": "FileStreamSource", "tasks.max": 1}}'
    flat = '{"name": "src", "connector.class": "FileStreamSource", "tasks.max": "1"}'
    expected = {"name": "src", "connector.class": "FileStreamSource", "tasks.max": "1"}
    assert parse_connector_text(props, "a")[1] == expected
    assert parse_connector_text(flat, "c") == ("src", expected)
    name, config = parse_connector_text(connect, "b")
    assert name == "src" and {**config, "name": name} == expected


def test_json_values_become_the_strings_connect_sees() -> None:
    _, config = parse_connector_text(
        '{"a": true, "b": 1.5, "c": ["x", "y"], "d": "s", "e": 7}', "f.json"
    )
    assert config == {"a": "true", "b": "1.5", "c": "x,y", "d": "s", "e": "7"}
    with pytest.raises(ConfigError, match=r"f\.json: the value of 'a' must be"):
        parse_connector_text('{"a": {"nested": 1}}', "f.json")
    with pytest.raises(ConfigError, match="differ"):
        parse_connector_text('{"name": "x", "config": {"name": "y"}}', "f.json")


def test_a_connector_file_must_name_its_connector(tmp_path: Path) -> None:
    path = tmp_path / "c.properties"
    path.write_text("connector.class=FileStreamSource\n")
    with pytest.raises(ConfigError, match="has no name"):
        load_connector_file(path)
    with pytest.raises(ConfigError, match="cannot read connector config"):
        load_connector_file(tmp_path / "missing.properties")
    path.write_text("name=c\nconnector.class=FileStreamSource\n")
    loaded = load_connector_file(path)
    assert (loaded.name, loaded.config["name"], loaded.source) == ("c", "c", str(path))


def test_the_data_directory() -> None:
    assert standalone_data_dir({"data.dir": "/d", OFFSETS: "/o/x.offsets"}) == Path("/d")
    assert standalone_data_dir({OFFSETS: "/o/x.offsets"}) == Path("/o/x.offsets.d")
    with pytest.raises(ConfigError, match=r"data\.dir"):
        standalone_data_dir({})


def test_one_config_split_for_the_ensemble_the_coordinator_and_the_worker() -> None:
    settings = standalone_settings(
        {
            "data.dir": "/d",
            "bootstrap.servers": "kafka:9092",
            "rest.port": "8084",
            "ensemble.clientPort": "2191",
            "ensemble.tickTime": "500",
            "group.min.session.timeout.ms": "2000",
        }
    )
    assert settings.ensemble == {
        "dataDir": "/d/ensemble",
        "clientPort": "2191",
        "clientPortAddress": "127.0.0.1",
        "tickTime": "500",
    }
    assert settings.coordinator.group_min_session_timeout_ms == 2000
    assert settings.worker == {
        "group.id": "connect-standalone",
        "data.dir": "/d",
        "storage.root": "/d/topics",
        "rest.port": "8084",
        "group.min.session.timeout.ms": "2000",
    }
    assert standalone_settings({"data.dir": "/d"}).coordinator.group_min_session_timeout_ms == 1000
    with pytest.raises(ConfigError, match="single server"):
        standalone_settings({"data.dir": "/d", "ensemble.server.2": "h:1:2"})
