"""Typed value parsing: strings (properties files, REST) and JSON values, Kafka's rules."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest

from herder.config import Password, Type, convert_to_string, parse_type
from herder.errors import ConfigError

pytestmark = pytest.mark.unit


def parse(value: Any, type_: Type) -> Any:
    return parse_type("some.key", value, type_)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("FALSE", False), (" True ", True), (True, True), (False, False)],
)
def test_boolean(raw: Any, expected: bool) -> None:
    assert parse(raw, Type.BOOLEAN) is expected


@pytest.mark.parametrize("raw", ["yes", "1", "", 1, 0, 1.0])
def test_boolean_rejects_anything_but_true_or_false(raw: Any) -> None:
    with pytest.raises(
        ConfigError, match=r"for configuration some\.key: Expected value to be either"
    ):
        parse(raw, Type.BOOLEAN)


def test_string_is_trimmed() -> None:
    assert parse("  hello world \t", Type.STRING) == "hello world"
    with pytest.raises(ConfigError, match="Expected value to be a string, but it was a int"):
        parse(5, Type.STRING)


@pytest.mark.parametrize(
    ("type_", "low", "high"),
    [
        (Type.SHORT, -(2**15), 2**15 - 1),
        (Type.INT, -(2**31), 2**31 - 1),
        (Type.LONG, -(2**63), 2**63 - 1),
    ],
)
def test_integers_accept_their_whole_range_and_nothing_more(
    type_: Type, low: int, high: int
) -> None:
    assert parse(str(low), type_) == low
    assert parse(f" +{high} ", type_) == high
    assert parse(high, type_) == high
    for outside in (low - 1, high + 1, str(low - 1), str(high + 1)):
        with pytest.raises(ConfigError, match=f"Value out of range .*\\({type_.value}\\)"):
            parse(outside, type_)


@pytest.mark.parametrize("raw", ["1_000", "1.0", "0x10", "", "12abc", "١٢"])
def test_integer_strings_follow_java_syntax(raw: str) -> None:
    with pytest.raises(ConfigError, match="Not a number of type INT"):
        parse(raw, Type.INT)


@pytest.mark.parametrize("raw", [True, 1.0, [1]])
def test_integers_reject_other_json_types(raw: Any) -> None:
    with pytest.raises(ConfigError, match="Expected value to be a 32-bit integer, but it was a"):
        parse(raw, Type.INT)


def test_double() -> None:
    assert parse("1.5", Type.DOUBLE) == 1.5
    assert parse("-2e3", Type.DOUBLE) == -2000.0
    assert parse(".5", Type.DOUBLE) == 0.5
    assert parse("3d", Type.DOUBLE) == 3.0
    assert parse(3, Type.DOUBLE) == 3.0
    assert isinstance(parse(3, Type.DOUBLE), float)
    assert parse("Infinity", Type.DOUBLE) == math.inf
    assert math.isnan(parse("NaN", Type.DOUBLE))
    for bad in ("inf", "1_0", "abc", ""):
        with pytest.raises(ConfigError, match="Not a number of type DOUBLE"):
            parse(bad, Type.DOUBLE)
    with pytest.raises(ConfigError, match="Expected value to be a double"):
        parse(True, Type.DOUBLE)


def test_list_splits_on_commas_and_trims() -> None:
    assert parse("a, b ,c", Type.LIST) == ["a", "b", "c"]
    assert parse("  single  ", Type.LIST) == ["single"]
    assert parse("", Type.LIST) == []
    assert parse("   ", Type.LIST) == []
    assert parse("a,,b,", Type.LIST) == ["a", "", "b", ""]
    assert parse(["x", "y"], Type.LIST) == ["x", "y"]
    with pytest.raises(ConfigError, match=r"Expected a comma separated list\."):
        parse(5, Type.LIST)
    with pytest.raises(ConfigError, match=r"Expected a comma separated list\."):
        parse([1, 2], Type.LIST)


def test_class_by_dotted_name_or_object() -> None:
    assert parse("collections.OrderedDict", Type.CLASS) is collections.OrderedDict
    assert parse(" collections:OrderedDict ", Type.CLASS) is collections.OrderedDict
    assert parse("herder.config.Type", Type.CLASS) is Type
    assert parse(dict, Type.CLASS) is dict


@pytest.mark.parametrize(
    "raw", ["no.such.module.Thing", "collections.NoSuchClass", "collections.namedtuple", "nomodule"]
)
def test_class_not_found(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"Class {raw} could not be found."):
        parse(raw, Type.CLASS)


def test_password_is_hidden_everywhere_but_its_value() -> None:
    secret = parse(" hunter2 ", Type.PASSWORD)
    assert isinstance(secret, Password)
    assert secret.value == "hunter2"
    assert repr(secret) == str(secret) == f"{secret}" == "[hidden]"
    assert "hunter2" not in repr({"password": secret})
    assert secret == Password("hunter2")
    assert secret != Password("other")
    assert len({secret, Password("hunter2")}) == 1
    assert parse(secret, Type.PASSWORD) is secret


def test_none_stays_none() -> None:
    for type_ in Type:
        assert parse(None, type_) is None


def test_convert_to_string_is_what_rest_shows() -> None:
    assert convert_to_string(["a", "b"], Type.LIST) == "a,b"
    assert convert_to_string(True, Type.BOOLEAN) == "true"
    assert convert_to_string(Password("s"), Type.PASSWORD) == "[hidden]"
    assert convert_to_string(collections.OrderedDict, Type.CLASS) == "collections.OrderedDict"
    assert convert_to_string(5, Type.INT) == "5"
    assert convert_to_string(None, Type.STRING) is None
