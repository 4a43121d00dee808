"""DirectorySink's join of Spark's part files into the one output file of a delivery."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from herder.connectors.directory import _concatenate

pytestmark = pytest.mark.unit


def test_parts_are_joined_in_order_into_the_first_one(tmp_path: Path) -> None:
    parts = []
    for i, data in enumerate([b"one\ntwo\n", b"", b"three\n", b"four\nfive\n"]):
        part = tmp_path / f"part-{i:05d}"
        part.write_bytes(data)
        parts.append(str(part))
    first = os.stat(parts[0]).st_ino
    target = tmp_path / "lines"
    _concatenate(parts, str(target))
    assert target.read_bytes() == b"one\ntwo\nthree\nfour\nfive\n"
    assert target.stat().st_ino == first  # the first part, grown and renamed: not copied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines"]


def test_no_parts_make_an_empty_file(tmp_path: Path) -> None:
    target = tmp_path / "lines"
    _concatenate([], str(target))
    assert target.read_bytes() == b""
