"""DirectorySink's join of Spark's part files into the one output file of a delivery."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from herder.connectors import directory
from herder.connectors.directory import _concatenate
from herder.ensemble.storage import files

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


def _parts(tmp_path: Path, contents: list[bytes]) -> list[str]:
    parts = []
    for i, data in enumerate(contents):
        part = tmp_path / f"part-{i:05d}"
        part.write_bytes(data)
        parts.append(str(part))
    return parts


def test_the_output_is_sent_to_disk_while_it_is_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write-back of the first part starts at once, and of each copied chunk as it lands,
    so that the fsync before the commit has little left to write."""
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(files, "start_writeback", lambda fd, at=0, n=0: asked.append((at, n)))
    monkeypatch.setattr(directory, "_JOIN_CHUNK", 4)
    parts = _parts(tmp_path, [b"0123456\n", b"abcdefghij\n", b"", b"XYZ\n"])
    _concatenate(parts, str(tmp_path / "lines"))
    assert (tmp_path / "lines").read_bytes() == b"0123456\nabcdefghij\nXYZ\n"
    assert asked == [(0, 0), (8, 4), (12, 4), (16, 3), (19, 4)]


def test_parts_are_joined_where_the_kernel_cannot_copy_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refused)
    monkeypatch.setattr(directory, "_JOIN_CHUNK", 5)
    parts = _parts(tmp_path, [b"one\n", b"two\nthree\n", b"four\n"])
    _concatenate(parts, str(tmp_path / "lines"))
    assert (tmp_path / "lines").read_bytes() == b"one\ntwo\nthree\nfour\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines"]
