"""Config: typed accessors over a definition, originals kept, unused keys reported."""

from __future__ import annotations

import collections
import logging

import pytest

from herder.config import Config, ConfigDef, InvalidConfiguration, Password, Range, Type
from herder.errors import ConfigError

pytestmark = pytest.mark.unit


def worker_def() -> ConfigDef:
    return (
        ConfigDef()
        .define("group.id", Type.STRING)
        .define("rest.port", Type.INT, default=8083, validator=Range.between(1, 65535))
        .define("offset.flush.interval.ms", Type.LONG, default=60_000)
        .define("retries", Type.SHORT, default=3)
        .define("exactly.once", Type.BOOLEAN, default=False)
        .define("backoff.multiplier", Type.DOUBLE, default=2)
        .define("plugin.path", Type.LIST, default="")
        .define("key.converter", Type.CLASS, default="collections.OrderedDict")
        .define("ssl.key.password", Type.PASSWORD, default=None)
        .define("rest.advertised.host.name", Type.STRING, default=None)
    )


def test_typed_accessors() -> None:
    config = Config(
        worker_def(),
        {
            "group.id": "cluster",
            "rest.port": "9000",
            "exactly.once": "TRUE",
            "plugin.path": "/a, /b",
            "ssl.key.password": "pw",
        },
    )
    assert config.get_string("group.id") == "cluster"
    assert config.get_int("rest.port") == 9000
    assert config.get_long("offset.flush.interval.ms") == 60_000
    assert config.get_short("retries") == 3
    assert config.get_int("retries") == 3
    assert config.get_long("rest.port") == 9000
    assert config.get_boolean("exactly.once") is True
    assert config.get_double("backoff.multiplier") == 2.0
    assert config.get_list("plugin.path") == ["/a", "/b"]
    assert config.get_class("key.converter") is collections.OrderedDict
    assert config.get_password("ssl.key.password") == Password("pw")
    assert config.get("rest.advertised.host.name") is None


def test_construction_reports_every_problem() -> None:
    with pytest.raises(InvalidConfiguration) as info:
        Config(worker_def(), {"rest.port": "0", "exactly.once": "maybe"})
    assert len(info.value.problems) == 3


def test_wrong_accessor_is_a_bug_and_unset_key_a_user_error() -> None:
    config = Config(worker_def(), {"group.id": "g"})
    with pytest.raises(TypeError, match=r"rest\.port is INT, not BOOLEAN"):
        config.get_boolean("rest.port")
    with pytest.raises(TypeError):
        config.get_int("offset.flush.interval.ms")
    with pytest.raises(ConfigError, match=r'"rest\.advertised\.host\.name" is not set'):
        config.get_string("rest.advertised.host.name")
    with pytest.raises(ConfigError, match=r"Unknown configuration 'no\.such\.key'"):
        config.get("no.such.key")
    with pytest.raises(ConfigError, match=r"Unknown configuration 'no\.such\.key'"):
        config.get_int("no.such.key")


def test_unknown_keys_are_kept_in_originals_and_reported_unused() -> None:
    props = {"group.id": "g", "tasks.maxx": "4", "producer.acks": "all"}
    config = Config(worker_def(), props)
    assert config.originals() == props
    assert config.unused() == {"group.id", "tasks.maxx", "producer.acks"}
    config.get_string("group.id")
    assert config.unused() == {"tasks.maxx", "producer.acks"}
    config.ignore("tasks.maxx")
    assert config.unused() == {"producer.acks"}


def test_log_unused_warns_about_each_key(caplog: pytest.LogCaptureFixture) -> None:
    config = Config(worker_def(), {"group.id": "g", "typo.key": "1"})
    config.get("group.id")
    with caplog.at_level(logging.WARNING, logger="herder.config.abstract"):
        config.log_unused()
    assert [r.getMessage() for r in caplog.records] == [
        "The configuration 'typo.key' was supplied but isn't a known config."
    ]


def test_originals_with_prefix() -> None:
    props = {"group.id": "g", "producer.acks": "all", "producer.linger.ms": "5", "producerx": "1"}
    config = Config(worker_def(), props)
    assert config.originals_with_prefix("producer.") == {"acks": "all", "linger.ms": "5"}
    assert config.originals_with_prefix("producer.", strip=False) == {
        "producer.acks": "all",
        "producer.linger.ms": "5",
    }
    assert "producer.acks" not in config.unused()
    assert "producerx" in config.unused()


def test_values_with_prefix_override() -> None:
    props = {"group.id": "g", "rest.port": "8083", "admin.rest.port": "9999", "admin.other": "x"}
    config = Config(worker_def(), props)
    values = config.values_with_prefix_override("admin.")
    assert values["rest.port"] == 9999
    assert values["group.id"] == "g"
    assert "other" not in values
    assert config.get_int("rest.port") == 8083
    bad = Config(worker_def(), {"group.id": "g", "admin.rest.port": "0"})
    with pytest.raises(ConfigError, match=r"Invalid value 0 for configuration rest\.port"):
        bad.values_with_prefix_override("admin.")


def test_repr_hides_passwords() -> None:
    config = Config(worker_def(), {"group.id": "g", "ssl.key.password": "topsecret"})
    assert "topsecret" not in repr(config)
    assert "[hidden]" in repr(config)
    assert config.values()["ssl.key.password"].value == "topsecret"
