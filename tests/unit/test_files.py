"""herder.files on real files: searching a file for a byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder import files
from herder.files import holds_byte

pytestmark = pytest.mark.unit

CHUNK = 1024 * 1024
SIZE = 3 * CHUNK + 17  # several chunks, the last of them short


@pytest.fixture(params=["memchr", "bytearray.find"])
def search(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of searching: the C library's memchr, and Python's find where there is
    no C library to call."""
    if request.param == "memchr":
        assert files._memchr() is not None  # this platform has one: it is what runs
    else:
        monkeypatch.setattr(files, "_memchr", lambda: None)
    return str(request.param)


@pytest.mark.parametrize("where", [0, CHUNK - 1, CHUNK, SIZE // 2, 3 * CHUNK, SIZE - 1])
def test_a_byte_is_found_wherever_it_is(search: str, tmp_path: Path, where: int) -> None:
    data = bytearray(b"x" * SIZE)
    data[where] = ord("\r")
    path = tmp_path / "data"
    path.write_bytes(bytes(data))
    for chunk_bytes in (CHUNK, 4 << 20):  # chunks that end at it or after it; one chunk
        assert holds_byte(str(path), ord("\r"), chunk_bytes)
        assert not holds_byte(str(path), ord("\n"), chunk_bytes)


def test_an_empty_file_holds_no_byte(search: str, tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert not holds_byte(str(path), ord("\r"))


def test_a_file_without_the_byte_is_left_unchanged(search: str, tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"line\n" * 1000)
    assert not holds_byte(str(path), ord("\r"))
    assert path.read_bytes() == b"line\n" * 1000
