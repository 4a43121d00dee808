"""The same storage on real files (durability itself is the simulator's to prove)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from herder.ensemble.storage import OsFileSystem, Storage
from herder.ensemble.storage.frames import encode
from herder.files import start_writeback

from .support import payload, zx

pytestmark = pytest.mark.unit

SIZE = 1024


def test_real_files_are_preallocated_and_recover_across_rolls(tmp_path: Path) -> None:
    with Storage.open(str(tmp_path), log_file_size=SIZE) as storage:
        for counter in range(1, 201):
            storage.append(zx(counter), payload(counter))
            if counter % 25 == 0:
                storage.sync()
        storage.write_snapshot(zx(150), b"state@150")
    logs = sorted(p for p in os.listdir(tmp_path) if p.startswith("log."))
    assert len(logs) > 3
    assert all(os.path.getsize(tmp_path / name) >= SIZE for name in logs)

    with Storage.open(str(tmp_path), log_file_size=SIZE) as storage:
        assert storage.recovery.snapshot == (zx(150), b"state@150")
        assert [t.zxid for t in storage.recovery.transactions] == [zx(c) for c in range(151, 201)]


def test_a_torn_tail_on_a_real_file_is_cut_and_overwritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Storage.open(str(tmp_path), log_file_size=SIZE) as storage:
        storage.append(zx(1), b"one")
    path = tmp_path / f"log.{zx(1):x}"
    with open(path, "r+b") as f:
        f.seek(len(encode(zx(1), b"one")))
        f.write(encode(zx(2), b"two")[:-2])

    with caplog.at_level(logging.WARNING):
        storage = Storage.open(str(tmp_path), log_file_size=SIZE)
    assert [t.zxid for t in storage.recovery.transactions] == [zx(1)]
    assert "torn record" in caplog.text
    storage.append(zx(2), b"deux")
    storage.close()

    with Storage.open(str(tmp_path), log_file_size=SIZE) as storage:
        assert storage.recovery.transactions[-1] == (zx(2), b"deux")


def test_os_file_handles_read_write_and_truncate(tmp_path: Path) -> None:
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.pwrite(b"hello world", 0)
    handle.allocate(100)
    handle.fsync()
    assert handle.size() == 100
    assert handle.read(6, 5) == b"world"
    assert handle.read(95, 50) == b"\0" * 5
    handle.truncate(5)
    assert handle.read(0, 100) == b"hello"
    handle.close()
    fs.rename(str(tmp_path / "f"), str(tmp_path / "g"))
    fs.fsync_dir(str(tmp_path))
    assert fs.listdir(str(tmp_path)) == ["g"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_write_back_is_started_for_a_file_and_refused_quietly_for_a_pipe(tmp_path: Path) -> None:
    path = tmp_path / "data"
    with open(path, "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        assert start_writeback(f.fileno())
        assert start_writeback(f.fileno(), 4096, 8192)
    assert path.read_bytes() == b"x" * 100_000
    read, write = os.pipe()
    try:
        assert not start_writeback(write)  # ESPIPE: a hint, not an error
    finally:
        os.close(read)
        os.close(write)
