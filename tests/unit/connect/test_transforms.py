"""The transform API: names, versions, and finding plugins through entry points."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from herder.connect import UNDEFINED_VERSION, Outcome, Predicate, Record, Transformation
from herder.connect import transforms as api
from herder.connect.transforms import (
    PREDICATES_GROUP,
    TRANSFORMS_GROUP,
    installed_predicates,
    installed_transformations,
    predicate_class,
    transformation_class,
)
from herder.runtime.plugins import Plugins

pytestmark = pytest.mark.unit

HERE = __name__


class Upper(Transformation):
    def apply(self, record: Record) -> Outcome:
        return Outcome()


class Named(Transformation):
    class_name = "com.example.transforms.Named$Value"

    @classmethod
    def version(cls) -> str:
        return "2.0"

    def apply(self, record: Record) -> Outcome:
        return Outcome()


class Unlisted(Transformation):
    def apply(self, record: Record) -> Outcome:
        return Outcome()


class Always(Predicate):
    def test(self, record: Record) -> Any:
        return None


class Unfinished(Transformation):
    pass


class NotATransform:
    pass


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[tuple[str, str]]]]:
    """Entry points by group, as (name, value), in place of the installed ones."""
    groups: dict[str, list[tuple[str, str]]] = {TRANSFORMS_GROUP: [], PREDICATES_GROUP: []}

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [
            importlib.metadata.EntryPoint(name=name, value=value, group=group)
            for name, value in groups.get(group, [])
        ]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    api._installed.cache_clear()
    yield groups
    api._installed.cache_clear()


def test_a_plugin_is_known_by_its_dotted_name_unless_it_names_itself() -> None:
    assert Upper.class_name == f"{HERE}.Upper"
    assert Named.class_name == "com.example.transforms.Named$Value"
    assert Upper.version() == UNDEFINED_VERSION


def test_entry_points_are_found_sorted_and_broken_ones_skipped(
    installed: dict[str, list[tuple[str, str]]], caplog: pytest.LogCaptureFixture
) -> None:
    installed[TRANSFORMS_GROUP] += [
        ("upper", f"{HERE}:Upper"),
        ("named", f"{HERE}:Named"),
        ("gone", "package_that_was_uninstalled:Gone"),
        ("abstract", f"{HERE}:Unfinished"),
        ("not-one", f"{HERE}:NotATransform"),
        ("a-predicate", f"{HERE}:Always"),
    ]
    installed[PREDICATES_GROUP] += [("always", f"{HERE}:Always")]

    with caplog.at_level(logging.WARNING, logger="herder.connect.transforms"):
        assert installed_transformations() == (Named, Upper)
        assert installed_predicates() == (Always,)

    skipped = " ".join(r.getMessage() for r in caplog.records)
    for name in ("gone", "abstract", "not-one", "a-predicate"):
        assert name in skipped


def test_names_resolve_in_full_by_their_last_part_or_by_import(
    installed: dict[str, list[tuple[str, str]]],
) -> None:
    installed[TRANSFORMS_GROUP] += [("upper", f"{HERE}:Upper"), ("named", f"{HERE}:Named")]
    installed[PREDICATES_GROUP] += [("always", f"{HERE}:Always")]

    assert transformation_class(f"{HERE}.Upper") is Upper
    assert transformation_class("Upper") is Upper
    assert transformation_class("Named$Value") is Named
    # importable but not installed: by its dotted name only
    assert transformation_class(f"{HERE}.Unlisted") is Unlisted
    assert transformation_class("Unlisted") is None
    assert transformation_class(f"{HERE}.NotATransform") is None
    assert transformation_class(f"{HERE}.Unfinished") is None
    assert transformation_class("no_such_module.Upper") is None
    assert predicate_class("Always") is Always
    assert predicate_class("Upper") is None


def test_the_worker_lists_installed_transforms_and_predicates(
    installed: dict[str, list[tuple[str, str]]],
) -> None:
    installed[TRANSFORMS_GROUP] += [("upper", f"{HERE}:Upper"), ("named", f"{HERE}:Named")]
    installed[PREDICATES_GROUP] += [("always", f"{HERE}:Always")]

    listed = Plugins().all_plugins(connectors_only=False)

    assert listed == [
        {"class": "com.example.transforms.Named$Value", "type": "transformation", "version": "2.0"},
        {"class": f"{HERE}.Always", "type": "predicate", "version": UNDEFINED_VERSION},
        {"class": f"{HERE}.Upper", "type": "transformation", "version": UNDEFINED_VERSION},
    ]
