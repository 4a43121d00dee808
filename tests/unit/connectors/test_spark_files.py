"""A sink's output on its way to disk: Spark's part files joined into the one output file
of a delivery, and their pages sent to disk while they are written."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from herder import files
from herder.connectors import spark_files
from herder.connectors.spark_files import is_data_file, is_first_part, join_parts
from herder.files import WriteBehind

pytestmark = pytest.mark.unit


def test_parts_are_joined_in_order_into_the_first_one(tmp_path: Path) -> None:
    parts = []
    for i, data in enumerate([b"one\ntwo\n", b"", b"three\n", b"four\nfive\n"]):
        part = tmp_path / f"part-{i:05d}"
        part.write_bytes(data)
        parts.append(str(part))
    first = os.stat(parts[0]).st_ino
    target = tmp_path / "lines"
    join_parts(parts, str(target))
    assert target.read_bytes() == b"one\ntwo\nthree\nfour\nfive\n"
    assert target.stat().st_ino == first  # the first part, grown and renamed: not copied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines"]


def test_no_parts_make_an_empty_file(tmp_path: Path) -> None:
    target = tmp_path / "lines"
    join_parts([], str(target))
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
    monkeypatch.setattr(spark_files, "JOIN_CHUNK", 4)
    parts = _parts(tmp_path, [b"0123456\n", b"abcdefghij\n", b"", b"XYZ\n"])
    join_parts(parts, str(tmp_path / "lines"))
    assert (tmp_path / "lines").read_bytes() == b"0123456\nabcdefghij\nXYZ\n"
    assert asked == [(0, 0), (8, 4), (12, 4), (16, 3), (19, 4)]


def test_parts_are_joined_where_the_kernel_cannot_copy_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refused)
    monkeypatch.setattr(spark_files, "JOIN_CHUNK", 5)
    parts = _parts(tmp_path, [b"one\n", b"two\nthree\n", b"four\n"])
    join_parts(parts, str(tmp_path / "lines"))
    assert (tmp_path / "lines").read_bytes() == b"one\ntwo\nthree\nfour\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines"]


def test_files_are_sent_to_disk_while_spark_writes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts that will be kept, wherever Spark's committer has them at the time, and not
    checksums, nor parts that will be copied into another."""
    asked: set[int] = set()
    monkeypatch.setattr(
        files, "start_writeback", lambda fd, at=0, n=0: asked.add(os.fstat(fd).st_ino)
    )
    attempt = tmp_path / "_temporary" / "0" / "_temporary" / "attempt_1"
    attempt.mkdir(parents=True)
    first, second = attempt / "part-00000-x-c000.txt", attempt / "part-00001-x-c000.txt"
    checksum = attempt / ".part-00000-x-c000.txt.crc"
    for path in (first, second, checksum):
        path.write_bytes(b"rows\n")
    inodes = {path.name: path.stat().st_ino for path in (first, second, checksum)}

    def seen(*names: str) -> bool:
        return all(inodes[name] in asked for name in names)

    with WriteBehind(str(tmp_path), is_first_part, interval=0.01):
        wait_for(lambda: seen(first.name))
        first.rename(tmp_path / first.name)  # committed: found where it is now
        asked.clear()
        wait_for(lambda: seen(first.name))
    assert not asked & {inodes[second.name], inodes[checksum.name]}
    asked.clear()
    with WriteBehind(str(tmp_path), is_data_file, interval=0.01):
        wait_for(lambda: seen(first.name, second.name))
    assert inodes[checksum.name] not in asked


def test_writing_behind_stops_with_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    monkeypatch.setattr(files, "start_writeback", lambda fd, at=0, n=0: calls.append(fd))
    (tmp_path / "part-00000").write_bytes(b"x")
    with WriteBehind(str(tmp_path), is_data_file, interval=0.01):
        wait_for(lambda: bool(calls))
    # joined on the way out: no write-back is asked for once the write is over
    assert not any(t.name == "herder-write-behind" for t in threading.enumerate())


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
