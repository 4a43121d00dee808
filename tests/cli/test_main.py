import subprocess

import pytest

from herder import __version__
from tests.harness import HERDER

pytestmark = pytest.mark.integration


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HERDER, *args], capture_output=True, text=True, timeout=60)


def test_version_and_help() -> None:
    out = run("--version")
    assert out.returncode == 0 and __version__ in out.stdout
    helped = run("--help")
    assert helped.returncode == 0 and "Usage: herder" in helped.stdout


def test_a_user_mistake_is_one_line_without_a_traceback() -> None:
    out = run("no-such-command")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "No such command" in out.stderr
