"""Config providers: ${env:NAME}, ${file:path:key} and ${directory:dir:file} references."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.config import (
    DEFAULT_PROVIDERS,
    ConfigProvider,
    DirectoryConfigProvider,
    EnvVarConfigProvider,
    has_references,
    resolve,
    restore_references,
)
from herder.errors import ConfigError, ErrorCode

pytestmark = pytest.mark.unit


@pytest.fixture
def secrets_file(tmp_path: Path) -> Path:
    path = tmp_path / "secrets.properties"
    path.write_text("db.user=admin\ndb.password=s3cr:t=\n", encoding="utf-8")
    return path


def test_env_reference() -> None:
    resolved = resolve({"password": "${env:DB_PASSWORD}"}, env={"DB_PASSWORD": "hunter2"})
    assert resolved == {"password": "hunter2"}


def test_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERDER_TEST_SECRET", "from-os")
    assert resolve({"k": "${env:HERDER_TEST_SECRET}"}) == {"k": "from-os"}


def test_file_reference(secrets_file: Path) -> None:
    resolved = resolve({"password": f"${{file:{secrets_file}:db.password}}"})
    assert resolved == {"password": "s3cr:t="}


def test_several_references_and_surrounding_text(secrets_file: Path) -> None:
    url = f"jdbc:pg://${{env:HOST}}:5432/db?user=${{file:{secrets_file}:db.user}}&x=${{env:HOST}}"
    resolved = resolve({"url": url}, env={"HOST": "db1"})
    assert resolved == {"url": "jdbc:pg://db1:5432/db?user=admin&x=db1"}


def test_values_without_references_are_untouched() -> None:
    props = {"a": "plain", "b": "$notref", "c": "${no-colon}", "d": "", "e": "{env:X}"}
    assert resolve(props, env={}) == props


def test_a_substituted_value_is_not_resolved_again() -> None:
    resolved = resolve({"k": "${env:A}"}, env={"A": "${env:B}", "B": "leak"})
    assert resolved == {"k": "${env:B}"}


def test_unknown_provider_names_the_key_and_the_reference() -> None:
    with pytest.raises(ConfigError) as info:
        resolve({"db.password": "${vault:secret/db:password}"})
    message = str(info.value)
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert "db.password" in message
    assert "${vault:secret/db:password}" in message
    assert "unknown config provider 'vault'" in message


def test_missing_env_var_names_the_key_and_the_reference() -> None:
    with pytest.raises(ConfigError) as info:
        resolve({"ok": "x", "db.password": "pre-${env:MISSING_VAR}"}, env={})
    assert str(info.value) == (
        "Cannot resolve ${env:MISSING_VAR} in configuration db.password: "
        "environment variable MISSING_VAR is not set"
    )


def test_env_provider_takes_no_path() -> None:
    with pytest.raises(ConfigError, match="takes no path"):
        resolve({"k": "${env:some/path:NAME}"}, env={"NAME": "v"})


def test_missing_file_and_missing_key(tmp_path: Path, secrets_file: Path) -> None:
    missing = tmp_path / "absent.properties"
    with pytest.raises(ConfigError, match=r"in configuration k: Properties file not found: "):
        resolve({"k": f"${{file:{missing}:x}}"})
    with pytest.raises(ConfigError, match=r"in configuration k: key nope is not in "):
        resolve({"k": f"${{file:{secrets_file}:nope}}"})
    with pytest.raises(ConfigError, match="needs a path"):
        resolve({"k": "${file:db.password}"})


def test_directory_provider_reads_one_file(tmp_path: Path) -> None:
    (tmp_path / "db-password").write_text("from-a-mounted-secret", encoding="utf-8")
    assert resolve({"k": f"${{directory:{tmp_path}:db-password}}"}) == {
        "k": "from-a-mounted-secret"
    }
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({"k": f"${{directory:{tmp_path}:absent}}"})
    with pytest.raises(ConfigError, match="is not a file name inside"):
        DirectoryConfigProvider().get(str(tmp_path), "../etc/passwd")


def test_more_providers_can_be_registered() -> None:
    class Upper:
        def get(self, path: str | None, key: str) -> str:
            return key.upper()

    providers: dict[str, ConfigProvider] = {**DEFAULT_PROVIDERS, "upper": Upper()}
    resolved = resolve({"k": "${upper:shout} ${env:X}"}, providers=providers, env={"X": "x"})
    assert resolved == {"k": "SHOUT x"}
    assert "upper" not in DEFAULT_PROVIDERS
    assert isinstance(DEFAULT_PROVIDERS["env"], EnvVarConfigProvider)


def test_task_configs_get_the_connectors_references_back() -> None:
    raw = {"password": "${env:DB_PASSWORD}", "url": "jdbc:x", "dir": "${file:/p:dir}/sub"}
    tasks = [
        {"password": "hunter2", "url": "jdbc:x", "dir": "/data/sub", "index": "0"},
        {"url": "jdbc:x", "index": "1"},
    ]
    assert restore_references(raw, tasks) == [
        {"password": "${env:DB_PASSWORD}", "url": "jdbc:x", "dir": "${file:/p:dir}/sub",
         "index": "0"},
        {"url": "jdbc:x", "index": "1"},
    ]  # fmt: skip
    assert has_references("a ${env:X} b") and not has_references("${topic}-${timestamp}")
