"""One server per data directory: the second one is turned away, even from another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from herder.ensemble.storage import SimulatedFileSystem, Storage
from herder.errors import StorageLocked

from .support import DATA, open_sim

pytestmark = pytest.mark.unit


def test_a_second_open_of_a_simulated_directory_is_refused_until_the_first_closes() -> None:
    fs = SimulatedFileSystem()
    first = open_sim(fs)
    with pytest.raises(StorageLocked, match=DATA):
        open_sim(fs)
    first.close()
    open_sim(fs).close()


def test_a_crash_releases_the_lock() -> None:
    fs = SimulatedFileSystem()
    open_sim(fs)
    fs.crash()
    open_sim(fs).close()


def test_two_opens_of_a_real_directory_in_one_process(tmp_path: Path) -> None:
    with Storage.open(str(tmp_path), log_file_size=4096) as storage:
        storage.append(1, b"x")
        with pytest.raises(StorageLocked) as caught:
            Storage.open(str(tmp_path), log_file_size=4096)
        assert str(tmp_path) in str(caught.value)
        assert "dataDir" in str(caught.value)
    with Storage.open(str(tmp_path), log_file_size=4096) as again:
        assert [t.zxid for t in again.recovery.transactions] == [1]


def test_a_separate_log_directory_is_locked_too(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with (
        Storage.open(str(tmp_path / "a"), str(logs), log_file_size=4096),
        pytest.raises(StorageLocked, match="logs"),
    ):
        Storage.open(str(tmp_path / "b"), str(logs), log_file_size=4096)


_HOLDER = textwrap.dedent(
    """
    import sys
    from herder.ensemble.storage import Storage
    storage = Storage.open(sys.argv[1], log_file_size=4096)
    print("locked", flush=True)
    sys.stdin.read()
    storage.close()
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def test_another_process_holding_the_directory_is_detected(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "locked"

    with pytest.raises(
        StorageLocked, match=rf"in use by another herder server \(pid {holder.pid}\)"
    ):
        Storage.open(str(tmp_path), log_file_size=4096)

    holder.stdin.close()
    assert holder.wait(timeout=30) == 0
    Storage.open(str(tmp_path), log_file_size=4096).close()
