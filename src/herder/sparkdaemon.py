"""Spark's Python daemon, with pyspark imported from its installed package, not its zip.

Spark starts its Python processes (``python -m <spark.python.daemon.module> <worker>``)
with ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``. Python compiles
every module it imports from a zip anew, since zipimport keeps no bytecode cache, and a
session starts one daemon per kind of Python work (UDFs and data source reads, and on
the driver the lookup, creation and read planning of a Python data source), each
forking workers that import more of pyspark. So the first job of each kind, and each
worker started later (Spark stops idle ones), pays for compiling pyspark: measured,
0.8 CPU-s to import what a data source's reader needs from the zip, against 0.2 from the
installed package — seconds of a 2-core machine before the first batch of a worker that
has just started.

When the pyspark installed beside herder is the zip's own version (a pip-installed
pyspark: the zip is a copy of the package), this module takes the zip off
``sys.path``, so pyspark comes from the package and its cached bytecode (and no import
that probes for an optional module reads the zip's directory of 1,500 entries), then
runs Spark's own daemon as Spark would. Any other pyspark leaves the path as it is.
:mod:`herder.dataplane.spark` names this module in ``spark.python.daemon.module``; it
sits at the top of the package, whose ``__init__`` imports neither pyspark nor the rest
of herder, so that nothing
imports pyspark before the path is fixed.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import runpy
import sys
import zipfile

_ZIP_NAME = "pyspark.zip"
_VERSION = re.compile(r"""__version__(?::\s*str)?\s*=\s*["']([^"']+)["']""")


def _version(text: str) -> str | None:
    found = _VERSION.search(text)
    return found.group(1) if found else None


def _zip_version(path: str) -> str | None:
    """The pyspark version the zip at ``path`` holds, or None if it cannot be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _version(archive.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def _installed_version(paths: list[str]) -> str | None:
    """The version of the pyspark package found on ``paths``, or None if none is."""
    spec = importlib.machinery.PathFinder.find_spec("pyspark", paths)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            with open(os.path.join(location, "version.py"), encoding="utf-8") as f:
                return _version(f.read())
        except OSError:
            continue
    return None


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` without pyspark's zip, if the pyspark installed on the rest of it is the
    zip's version; otherwise ``path`` unchanged."""
    zips = [p for p in path if os.path.basename(p) == _ZIP_NAME]
    rest = [p for p in path if p not in zips]
    if not zips:
        return list(path)
    wanted = _zip_version(zips[0])
    if wanted is None or _installed_version([p or os.getcwd() for p in rest]) != wanted:
        return list(path)
    return rest


def main() -> None:
    """Fix ``sys.path``, then run ``pyspark.daemon`` with this process's arguments."""
    sys.path[:] = prefer_installed_pyspark(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
