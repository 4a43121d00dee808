"""ConfigDef: declaring keys, parsing with every problem reported, validating for REST."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from herder.config import (
    NO_DEFAULT,
    CaseInsensitiveValidString,
    Check,
    ConfigDef,
    ConfigValue,
    Importance,
    InvalidConfiguration,
    NonEmptyString,
    NonEmptyStringWithoutControlChars,
    Password,
    Range,
    Type,
    ValidList,
    ValidString,
    Width,
)
from herder.errors import ConfigError, ErrorCode

pytestmark = pytest.mark.unit


def connector_def() -> ConfigDef:
    return (
        ConfigDef()
        .define(
            "name",
            Type.STRING,
            validator=NonEmptyString(),
            importance=Importance.HIGH,
            documentation="Globally unique name.",
            group="Common",
            order_in_group=1,
            width=Width.MEDIUM,
            display_name="Connector name",
        )
        .define("tasks.max", Type.INT, default=1, validator=Range.at_least(1), group="Common")
        .define("batch.size", Type.LONG, default="100", validator=Range.between(1, 10_000))
        .define(
            "errors.tolerance",
            Type.STRING,
            default="none",
            validator=ValidString.in_("none", "all"),
        )
        .define("formats", Type.LIST, default="json", validator=ValidList.in_("json", "avro"))
        .define("db.password", Type.PASSWORD, default=None)
    )


def test_parse_fills_defaults_and_converts_types() -> None:
    values = connector_def().parse({"name": " demo ", "tasks.max": "4", "unknown.key": "kept out"})
    assert values == {
        "name": "demo",
        "tasks.max": 4,
        "batch.size": 100,
        "errors.tolerance": "none",
        "formats": ["json"],
        "db.password": None,
    }


def test_parse_reports_every_problem_at_once() -> None:
    props = {
        "tasks.max": "0",
        "batch.size": "lots",
        "errors.tolerance": "some",
        "formats": "json, xml",
    }
    with pytest.raises(InvalidConfiguration) as info:
        connector_def().parse(props)
    error = info.value
    assert isinstance(error, ConfigError)
    assert error.code is ErrorCode.INVALID_CONFIG
    assert error.problems == (
        'Missing required configuration "name" which has no default value.',
        "Invalid value 0 for configuration tasks.max: Value must be at least 1",
        "Invalid value lots for configuration batch.size: Not a number of type LONG",
        "Invalid value some for configuration errors.tolerance: String must be one of: none, all",
        "Invalid value xml for configuration formats: String must be one of: json, avro",
    )
    message = str(error)
    assert message.startswith("5 configuration problems: ")
    assert "\n" not in message
    for problem in error.problems:
        assert problem in message


def test_a_single_problem_is_the_whole_message() -> None:
    with pytest.raises(ConfigError) as info:
        connector_def().parse({})
    assert str(info.value) == 'Missing required configuration "name" which has no default value.'


def test_none_counts_as_absent() -> None:
    with pytest.raises(ConfigError, match="Missing required configuration"):
        connector_def().parse({"name": None})
    assert connector_def().parse({"name": "n", "tasks.max": None})["tasks.max"] == 1


def test_range_validator_bounds() -> None:
    at_least, between = Range.at_least(5), Range.between(1, 3)
    at_least("k", 5)
    between("k", 1)
    between("k", 3)
    with pytest.raises(
        ConfigError,
        match=r"^Invalid value 4 for configuration k: Value must be at least 5$",
    ):
        at_least("k", 4)
    with pytest.raises(ConfigError, match=r"Value must be no more than 3$"):
        between("k", 4)
    with pytest.raises(ConfigError, match=r"Value must be at least 1$"):
        between("k", 0)


def test_valid_string_case_sensitivity() -> None:
    ValidString.in_("none", "all")("k", "all")
    with pytest.raises(ConfigError, match=r"String must be one of: none, all$"):
        ValidString.in_("none", "all")("k", "ALL")
    ValidString.in_("none", "all", case_sensitive=False)("k", "ALL")
    CaseInsensitiveValidString.in_("none", "all")("k", "None")
    with pytest.raises(
        ConfigError, match=r"String must be one of \(case insensitive\): none, all$"
    ):
        CaseInsensitiveValidString.in_("none", "all")("k", "some")


def test_valid_list_names_the_bad_element() -> None:
    ValidList.in_("a", "b")("k", ["a", "b", "a"])
    ValidList.in_("a", "b")("k", [])
    with pytest.raises(
        ConfigError,
        match=r"^Invalid value c for configuration k: String must be one of: a, b$",
    ):
        ValidList.in_("a", "b")("k", ["a", "c"])


def test_non_empty_string() -> None:
    NonEmptyString()("k", "x")
    with pytest.raises(ConfigError, match="String must be non-empty"):
        NonEmptyString()("k", "")


def test_non_empty_string_without_control_chars_names_them_as_kafka_does() -> None:
    NonEmptyStringWithoutControlChars()("name", "a connector \N{GRINNING FACE}")
    with pytest.raises(ConfigError, match="String may not be empty"):
        NonEmptyStringWithoutControlChars()("name", "")
    with pytest.raises(
        ConfigError,
        match=r"String may not contain control sequences but had the following ASCII chars: "
        r"7, 127, 133$",
    ):
        NonEmptyStringWithoutControlChars()("name", "a\u0007b\u007fc\u0085")


def test_lambda_validators() -> None:
    def even(name: str, value: Any) -> None:
        if value % 2:
            raise ConfigError(f"{name} must be even")

    definition = (
        ConfigDef()
        .define("a", Type.INT, validator=even)
        .define("b", Type.INT, validator=Check(lambda v: v > 10, "Value must exceed 10"))
    )
    assert definition.parse({"a": "4", "b": "11"}) == {"a": 4, "b": 11}
    with pytest.raises(InvalidConfiguration) as info:
        definition.parse({"a": "3", "b": "10"})
    assert info.value.problems == (
        "a must be even",
        "Invalid value 10 for configuration b: Value must exceed 10",
    )


def test_several_validators_each_report() -> None:
    definition = ConfigDef().define(
        "port",
        Type.INT,
        validator=[Range.between(1, 65535), Check(lambda v: v % 2 == 0, "Value must be even")],
    )
    result = definition.validate({"port": "70001"})["port"]
    assert result.errors == [
        "Invalid value 70001 for configuration port: Value must be no more than 65535",
        "Invalid value 70001 for configuration port: Value must be even",
    ]
    with pytest.raises(InvalidConfiguration) as info:
        definition.parse({"port": "70001"})
    assert info.value.problems == tuple(result.errors)


def test_duplicate_definition_raises() -> None:
    definition = ConfigDef().define("a", Type.INT, default=1)
    with pytest.raises(ConfigError, match=r"Configuration a is defined twice\."):
        definition.define("a", Type.STRING, default="x")


def test_defaults_are_parsed_and_checked_when_defined() -> None:
    key = ConfigDef().define("l", Type.LIST, default="a, b").keys["l"]
    assert key.default == ["a", "b"]
    with pytest.raises(ConfigError, match="Value must be at least 1"):
        ConfigDef().define("t", Type.INT, default=0, validator=Range.at_least(1))
    with pytest.raises(ConfigError, match="Not a number of type INT"):
        ConfigDef().define("t", Type.INT, default="many")


def test_required_means_no_default() -> None:
    definition = ConfigDef().define("req", Type.STRING).define("opt", Type.STRING, default=None)
    assert definition.keys["req"].required
    assert definition.keys["req"].default is NO_DEFAULT
    assert not definition.keys["opt"].required
    assert definition.parse({"req": "x"}) == {"req": "x", "opt": None}


def test_validate_never_raises_and_attaches_errors_to_each_key() -> None:
    results = connector_def().validate({"tasks.max": "zero", "errors.tolerance": "ALL"})
    assert list(results) == [
        "name",
        "tasks.max",
        "batch.size",
        "errors.tolerance",
        "formats",
        "db.password",
    ]
    assert results["name"].errors == [
        'Missing required configuration "name" which has no default value.'
    ]
    assert results["tasks.max"].errors == [
        "Invalid value zero for configuration tasks.max: Not a number of type INT"
    ]
    assert results["tasks.max"].value is None
    assert results["errors.tolerance"].errors == [
        "Invalid value ALL for configuration errors.tolerance: String must be one of: none, all"
    ]
    assert results["batch.size"] == ConfigValue("batch.size", 100)
    assert all(not results[k].errors for k in ("batch.size", "formats", "db.password"))


def test_validate_of_a_good_config_has_no_errors() -> None:
    results = connector_def().validate({"name": "n", "db.password": "pw"})
    assert not any(v.errors for v in results.values())
    assert results["db.password"].value == Password("pw")


class TableRecommender:
    """Recommends tables of the chosen database; only visible once a database is set."""

    TABLES: Mapping[str, list[str]] = {"shop": ["orders", "customers"], "blog": ["posts"]}

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def valid_values(self, name: str, parsed_config: Mapping[str, Any]) -> list[Any]:
        self.seen.append((name, dict(parsed_config)))
        database = parsed_config.get("database")
        if database == "broken":
            raise ConfigError("Cannot list tables of database broken")
        return list(self.TABLES.get(database or "", []))

    def visible(self, name: str, parsed_config: Mapping[str, Any]) -> bool:
        return parsed_config.get("database") is not None


def recommended_def(recommender: TableRecommender) -> ConfigDef:
    return (
        ConfigDef()
        .define("database", Type.STRING, default=None, dependents=["table"])
        .define("table", Type.STRING, default=None, recommender=recommender)
    )


def test_recommenders_see_the_parsed_config_and_set_values_and_visibility() -> None:
    recommender = TableRecommender()
    results = recommended_def(recommender).validate({"database": "shop", "table": "orders"})
    assert results["table"].recommended_values == ["orders", "customers"]
    assert results["table"].visible is True
    assert recommender.seen == [("table", {"database": "shop", "table": "orders"})]

    hidden = recommended_def(TableRecommender()).validate({})
    assert hidden["table"].recommended_values == []
    assert hidden["table"].visible is False


def test_a_recommender_error_is_attached_to_its_key() -> None:
    results = recommended_def(TableRecommender()).validate({"database": "broken"})
    assert results["table"].errors == ["Cannot list tables of database broken"]
    assert results["database"].errors == []


def test_dependents_are_exported_and_undefined_ones_reported() -> None:
    definition = recommended_def(TableRecommender())
    assert definition.to_dict()["database"]["dependents"] == ["table"]
    definition.define("mode", Type.STRING, default="bulk", dependents=["timestamp.column"])
    results = definition.validate({})
    assert results["timestamp.column"].errors == [
        "timestamp.column is referred in the dependents, but not defined."
    ]
    assert results["timestamp.column"].visible is False


def test_config_key_info_uses_connect_field_names() -> None:
    info = connector_def().to_dict()
    assert info["name"] == {
        "name": "name",
        "type": "STRING",
        "required": True,
        "default_value": None,
        "importance": "HIGH",
        "documentation": "Globally unique name.",
        "group": "Common",
        "order_in_group": 1,
        "width": "MEDIUM",
        "display_name": "Connector name",
        "dependents": [],
    }
    assert info["tasks.max"]["default_value"] == "1"
    assert info["tasks.max"]["required"] is False
    assert info["tasks.max"]["display_name"] == "tasks.max"
    assert info["tasks.max"]["importance"] == "MEDIUM"
    assert info["formats"]["default_value"] == "json"
    assert info["formats"]["type"] == "LIST"
    assert connector_def().to_dict(prefix="p.")["p.name"]["name"] == "p.name"


def test_password_defaults_and_values_are_hidden_in_exports() -> None:
    definition = ConfigDef().define("secret", Type.PASSWORD, default="sesame")
    assert definition.to_dict()["secret"]["default_value"] == "[hidden]"
    value = definition.validate({"secret": "open"})["secret"]
    assert value.to_dict(Type.PASSWORD)["value"] == "[hidden]"
    assert "open" not in repr(value)


def test_config_value_info() -> None:
    value = ConfigValue("formats", ["json", "avro"], recommended_values=[["json"]], errors=["e"])
    assert value.to_dict(Type.LIST) == {
        "name": "formats",
        "value": "json,avro",
        "recommended_values": ["json"],
        "errors": ["e"],
        "visible": True,
    }


def test_groups_in_order_of_first_use() -> None:
    definition = (
        ConfigDef()
        .define("a", Type.INT, default=1, group="Common")
        .define("b", Type.INT, default=1, group="Transforms")
        .define("c", Type.INT, default=1)
        .define("d", Type.INT, default=1, group="Common")
    )
    assert definition.groups() == ["Common", "Transforms"]


def test_merge_combines_definitions_and_refuses_overlaps() -> None:
    base = ConfigDef().define("name", Type.STRING).define("tasks.max", Type.INT, default=1)
    plugin = ConfigDef().define("file", Type.STRING, default="/tmp/x")
    merged = base.merge(plugin)
    assert list(merged.keys) == ["name", "tasks.max", "file"]
    assert "file" not in base
    assert merged.parse({"name": "n"})["file"] == "/tmp/x"
    with pytest.raises(ConfigError, match=r"Configuration name is defined twice\."):
        base.merge(ConfigDef().define("name", Type.STRING))


def test_embed_prefixes_keys_dependents_and_recommenders() -> None:
    recommender = TableRecommender()
    child = recommended_def(recommender)
    parent = ConfigDef().define("transforms", Type.LIST, default="")
    parent.embed("transforms.t1.", "Transforms: t1", 0, child)
    info = parent.to_dict()
    assert info["transforms.t1.database"]["dependents"] == ["transforms.t1.table"]
    assert info["transforms.t1.database"]["group"] == "Transforms: t1"
    assert info["transforms.t1.table"]["order_in_group"] == 1
    results = parent.validate({"transforms": "t1", "transforms.t1.database": "blog"})
    assert results["transforms.t1.table"].recommended_values == ["posts"]
    assert recommender.seen[-1] == ("table", {"database": "blog", "table": None})
