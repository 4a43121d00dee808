"""Spark's Python workers import pyspark from its installed package, not pyspark.zip."""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest

from herder.dataplane.spark import SparkRuntime
from herder.sparkdaemon import prefer_installed_pyspark


def _zip_of(path: Path, version: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/version.py", f"__version__: str = '{version}'\n")
    return str(path)


@pytest.mark.unit
def test_the_zip_leaves_the_path_only_when_the_installed_pyspark_is_its_version(
    tmp_path: Path,
) -> None:
    installed = [p for p in sys.path if not p.endswith(".zip")]
    same = _zip_of(tmp_path / "pyspark.zip", pyspark.__version__)
    assert prefer_installed_pyspark([same, *installed]) == installed
    (tmp_path / "other").mkdir()
    other = _zip_of(tmp_path / "other" / "pyspark.zip", "3.5.0")
    assert prefer_installed_pyspark([other, *installed]) == [other, *installed]
    # no pyspark installed beside the zip: the zip is all there is
    assert prefer_installed_pyspark([same, str(tmp_path / "empty")]) == [
        same,
        str(tmp_path / "empty"),
    ]


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_python_workers_import_the_installed_pyspark(spark: SparkRuntime) -> None:
    def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__]})

    session = spark.session
    assert session.conf.get("spark.python.daemon.module") == "herder.sparkdaemon"
    found = {
        r["file"] for r in session.range(0, 2, 1, 2).mapInArrow(where, "file string").collect()
    }
    assert found == {pyspark.__file__}
    assert not any(".zip" in f for f in found)
