"""Connector plugin discovery: entry points, dotted names, Connect's aliases."""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import pytest

from herder.config import ConfigDef, ConfigValue, Importance, Type
from herder.connect import ConnectorType, SinkConnector, SinkTask, SourceConnector, SourceTask
from herder.connect.transforms import Outcome, Record, Transformation
from herder.errors import ConfigError, HerderError
from herder.runtime.plugins import ENTRY_POINT_GROUP, PluginInfo, Plugins, class_name

pytestmark = pytest.mark.unit

HERE = __name__


class _Source(SourceConnector):
    def start(self, config: dict[str, str]) -> None:
        pass

    def task_class(self) -> type[SourceTask]:
        return SourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return []

    def stop(self) -> None:
        pass


class _Sink(SinkConnector):
    def start(self, config: dict[str, str]) -> None:
        pass

    def task_class(self) -> type[SinkTask]:
        return SinkTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return []

    def stop(self) -> None:
        pass


class FileStreamSourceConnector(_Source):
    def version(self) -> str:
        return "1.2.3"


class FileStreamSinkConnector(_Sink):
    pass


class Echo(_Source):
    pass


class EchoConnector(_Sink):
    pass


class UnlistedSourceConnector(_Source):
    pass


class EntryPointSinkConnector(_Sink):
    def version(self) -> str:
        return "0.9"


class Unfinished(SourceConnector):
    pass


class Unconstructible(_Source):
    def __init__(self, required: str) -> None:
        super().__init__()


class NotAConnector:
    pass


@pytest.fixture
def plugins() -> Plugins:
    return Plugins([FileStreamSourceConnector, FileStreamSinkConnector, Echo, EchoConnector])


def test_full_class_names_resolve(plugins: Plugins) -> None:
    name = f"{HERE}.FileStreamSourceConnector"
    assert class_name(FileStreamSourceConnector) == name
    assert plugins.connector_class(name) is FileStreamSourceConnector


def test_connects_aliases_resolve(plugins: Plugins) -> None:
    assert plugins.connector_class("FileStreamSourceConnector") is FileStreamSourceConnector
    assert plugins.connector_class("FileStreamSource") is FileStreamSourceConnector
    assert plugins.connector_class("FileStreamSink") is FileStreamSinkConnector
    assert plugins.connector_class("EchoConnector") is EchoConnector


def test_an_ambiguous_alias_is_refused_with_the_candidates(plugins: Plugins) -> None:
    # "Echo" is the class Echo and the class EchoConnector without its suffix
    with pytest.raises(ConfigError, match="More than one connector matches alias Echo") as err:
        plugins.connector_class("Echo")
    assert f"{HERE}.Echo, {HERE}.EchoConnector" in str(err.value)


def test_a_dotted_name_outside_the_plugins_is_imported(plugins: Plugins) -> None:
    name = f"{HERE}.UnlistedSourceConnector"
    assert plugins.connector_class(name) is UnlistedSourceConnector
    assert isinstance(plugins.new_connector(name), UnlistedSourceConnector)


def test_an_unknown_class_fails_like_connect(plugins: Plugins) -> None:
    for name in ("Nope", "no.such.module.NopeConnector", f"{HERE}.Missing"):
        with pytest.raises(ConfigError) as err:
            plugins.connector_class(name)
        message = str(err.value)
        assert message.startswith(
            f"Failed to find any class that implements Connector and which name matches {name}"
        )
        assert f"{HERE}.FileStreamSinkConnector" in message


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (f"{HERE}.NotAConnector", "is not a connector"),
        ("collections.OrderedDict", "is not a connector"),
        ("herder.connect.Connector", "not Connector directly"),
        ("herder.connect.SourceConnector", "is abstract"),
        (f"{HERE}.Unfinished", "does not implement start, stop, task_class, task_configs"),
    ],
)
def test_a_dotted_name_that_is_no_usable_connector_is_refused(
    plugins: Plugins, name: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=why):
        plugins.connector_class(name)


def test_a_plugin_module_that_fails_to_import_says_why(
    plugins: Plugins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_plugin_mod.py").write_text("import dependency_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="dependency_nobody_installed"):
        plugins.connector_class("broken_plugin_mod.BrokenConnector")


def test_the_listing_is_sorted_with_types_and_versions(plugins: Plugins) -> None:
    listing = plugins.connector_plugins()
    assert [p.class_name for p in listing] == sorted(p.class_name for p in listing)
    by_name = {p.class_name: p for p in listing}
    assert by_name[f"{HERE}.FileStreamSourceConnector"] == PluginInfo(
        f"{HERE}.FileStreamSourceConnector", ConnectorType.SOURCE, "1.2.3"
    )
    assert by_name[f"{HERE}.FileStreamSinkConnector"].type is ConnectorType.SINK
    assert by_name[f"{HERE}.FileStreamSinkConnector"].version == "undefined"
    assert by_name[f"{HERE}.Echo"].to_json() == {
        "class": f"{HERE}.Echo",
        "type": "source",
        "version": "undefined",
    }


def test_a_plugin_that_cannot_be_constructed_is_listed_without_a_version() -> None:
    assert Plugins([Unconstructible]).connector_plugins()[0].version == "undefined"
    with pytest.raises(HerderError, match="Failed to create an instance"):
        Plugins([Unconstructible]).new_connector("Unconstructible")


def test_entry_points_are_discovered_and_broken_ones_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
        return importlib.metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)

    installed = [
        entry_point("echo-sink", f"{HERE}:EntryPointSinkConnector"),
        entry_point("gone", "package_that_was_uninstalled:GoneConnector"),
        entry_point("not-one", f"{HERE}:NotAConnector"),
    ]

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return installed if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with caplog.at_level(logging.WARNING, logger="herder.runtime.plugins"):
        plugins = Plugins.discover(extra=[FileStreamSourceConnector])

    assert plugins.connector_plugins() == [
        PluginInfo(f"{HERE}.EntryPointSinkConnector", ConnectorType.SINK, "0.9"),
        PluginInfo(f"{HERE}.FileStreamSourceConnector", ConnectorType.SOURCE, "1.2.3"),
    ]
    assert plugins.connector_class("EntryPointSink") is EntryPointSinkConnector
    skipped = " ".join(r.getMessage() for r in caplog.records)
    assert "gone" in skipped
    assert "not-one" in skipped


def test_an_entry_point_named_by_another_full_class_name_answers_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as Debezium's io.debezium.connector.postgresql.PostgresConnector names herder's
    # PostgresCdcSource: configs written for the other implementation work unchanged
    installed = [
        importlib.metadata.EntryPoint(name=name, value=f"{HERE}:EntryPointSinkConnector",
                                      group=ENTRY_POINT_GROUP)
        for name in ("EntryPointSink", "org.example.sink.EchoSinkConnector")
    ]  # fmt: skip
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda *, group: installed if group == ENTRY_POINT_GROUP else [],
    )
    plugins = Plugins.discover()
    assert plugins.connector_class("org.example.sink.EchoSinkConnector") is EntryPointSinkConnector
    # listed once, under its own name
    assert [p.class_name for p in plugins.connector_plugins()] == [
        f"{HERE}.EntryPointSinkConnector"
    ]


class UnlistedTransform(Transformation):
    """A transform installed under no entry point, found by its dotted name."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return ConfigDef().define(
            "factor", Type.INT, importance=Importance.HIGH, documentation="A number."
        )

    def apply(self, record: Record) -> Outcome:
        return Outcome()


def test_a_transform_outside_the_plugins_validates_by_its_dotted_name(plugins: Plugins) -> None:
    config = {
        "transforms": "t,u",
        "transforms.t.type": f"{HERE}.UnlistedTransform",
        "transforms.u.type": f"{HERE}.NoSuchTransform",
    }
    values = {"transforms": ConfigValue("transforms", ["t", "u"])}
    plugins.enrich(ConfigDef(), config, values)
    assert values["transforms.t.type"].errors == []
    assert values["transforms.t.factor"].errors  # its own keys are checked
    assert "could not be found" in values["transforms.u.type"].errors[0]
