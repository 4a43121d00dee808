"""The layer order cannot be got around: nothing imports herder by name, and every part of
herder sits in a layer of the import contract that ``make lint`` checks (lint-imports)."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "herder"

#: a herder module named to the import machinery as a string, where lint-imports cannot see it
BY_NAME = re.compile(r"""(?:import_module|__import__)\(\s*f?["']herder\b""")
IMPORTERS = frozenset({"import_module", "__import__"})


def _sources() -> Iterator[tuple[str, str]]:
    for path in sorted(SOURCE.rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()


def _herder_name(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The herder module ``node`` spells out, if it is one: a literal, an f-string that
    starts with one, or a module-level constant holding one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        text = first.value if isinstance(first, ast.Constant) else ""
    elif isinstance(node, ast.Name):
        text = constants.get(node.id, "")
    else:
        return None
    return text if re.match(r"herder\b", str(text)) else None


def _imports_by_name(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    constants: dict[str, str] = {}
    for statement in tree.body:
        targets: list[ast.expr] = []
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        if targets and isinstance(value, ast.Constant) and isinstance(value.value, str):
            constants.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        if name in IMPORTERS and (module := _herder_name(node.args[0], constants)):
            found.append((node.lineno, module))
    return found


def test_no_herder_module_is_imported_by_name() -> None:
    offenders = [
        f"{path}:{source[: match.start()].count(chr(10)) + 1}: {match.group(0)}"
        for path, source in _sources()
        for match in BY_NAME.finditer(source)
    ]
    offenders += [
        f"{path}:{line}: imports {module!r} by name"
        for path, source in _sources()
        for line, module in _imports_by_name(source)
    ]
    assert not offenders, (
        "importing a herder module by name hides the import from the layer contract; "
        "import it, or have the layer above pass it in:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "source",
    [
        'importlib.import_module("herder.dataplane.transforms")',
        "import_module(f'herder.{layer}.plugins')",
        '__import__("herder.cli")',
        'MODULE = "herder.dataplane"\nimportlib.import_module(MODULE)',
    ],
)
def test_the_check_sees_each_way_of_naming_a_module(source: str) -> None:
    assert BY_NAME.search(source) or _imports_by_name(source)


def test_a_user_named_module_is_no_offence() -> None:
    assert not _imports_by_name("importlib.import_module(module_name)")
    assert not BY_NAME.search('importlib.import_module("mypkg.herder")')


def test_every_part_of_herder_sits_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    placed = {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}
    parts = {
        f"herder.{path.stem if path.is_file() else path.name}"
        for path in SOURCE.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert parts - placed == set(), "add these to a layer of [tool.importlinter] in pyproject"
    assert placed - parts == set(), "these layers name nothing under src/herder"
