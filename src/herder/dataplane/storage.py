"""Where segment files live, and how they are laid out under ``storage.root``.

Spark writes each batch of a writer (a source task) into its own directory, and a
segment is one partition directory of it::

    <root>/_staging/<task>-e<epoch>/<batch>/topic=<topic>/partition=<p>/part-*.parquet

The files stay where Spark wrote them: committing a segment only publishes its
metadata to the ensemble, so there is no rename to lose in a crash (and object stores,
which cannot rename, work the same). ``_staging`` therefore holds committed segments as
well as batches that never committed; a batch is garbage only when no committed
segment names it and its writer's epoch is over (see
:meth:`~herder.dataplane.topics.Topics.reap_staging`).

Paths in the ensemble are relative to the root, so the root can be mounted elsewhere
or moved. Spark gets full paths or URIs; everything else (listing, deleting, Parquet
footers, the CLI's reads) goes through ``pyarrow.fs``, which knows local paths,
``file://``, ``s3://`` (``s3a://`` and ``s3n://`` are read as ``s3://``), ``gs://``,
``abfs://`` and ``hdfs://`` (with libhdfs). A root in a scheme pyarrow does not know is
refused with a ConfigError, rather than half working.

A local root is the only copy of a topic's data, so a batch's files, and the directory
entries that lead to them, are flushed to disk before its commit publishes them
(:meth:`Storage.make_durable`), as the ensemble's log is before a transaction is
acknowledged. A distributed filesystem or an object store makes a closed file durable
itself.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from herder.errors import ConfigError
from herder.files import fsync_path

STAGING = "_staging"
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_WRITER_DIR = re.compile(r"(?P<task>[A-Za-z0-9._-]+)-e(?P<epoch>\d+)")


#: The worker property that declares a local ``storage.root`` a mount every machine shares.
SHARED_KEY = "storage.root.shared"


def is_local_path(root: str) -> bool:
    """Whether ``root`` names a directory of this machine's filesystem (a plain path or a
    ``file:`` URI) rather than a filesystem every machine reaches by URI."""
    scheme, sep, _ = root.partition("://")
    return not sep or scheme == "file" or root.startswith("file:")


def check_reachable(root: str, where: str, spans_machines: bool, shared: bool) -> None:
    """Refuse a local ``storage.root`` when jobs run on other machines.

    Executors write and read a topic's files where the driver says they are, so a
    directory only this machine has would scatter a topic over the executors' own
    disks, or fail on them. ``where`` is the setting that sends jobs elsewhere
    (``spark.master=…``), ``shared`` the operator's word that the path is a mount every
    machine has (NFS and the like).
    """
    if spans_machines and is_local_path(root) and not shared:
        raise ConfigError(
            f"storage.root={root} is a local path, but {where} runs jobs on other machines, "
            "which cannot see it: put topic data where every worker and executor reaches it "
            f"(hdfs://…, s3a://…), or, if {root} is a shared mount on every machine (NFS), "
            f"set {SHARED_KEY}=true"
        )


def check_task_name(task: str) -> str:
    if not _SAFE_NAME.fullmatch(task) or task in (".", ".."):
        raise ConfigError(f"{task!r} cannot name a writer: use 1 to 200 of A-Z a-z 0-9 . _ -")
    return task


def writer_dir(task: str, epoch: int) -> str:
    """The directory of every batch ``task`` writes with fencing epoch ``epoch``."""
    return f"{STAGING}/{task}-e{epoch}"


def parse_writer_dir(name: str) -> tuple[str, int] | None:
    """(task, epoch) of a writer directory's name, or None if it is not one."""
    match = _WRITER_DIR.fullmatch(name)
    return (match["task"], int(match["epoch"])) if match else None


def batch_dir(task: str, epoch: int, batch: int) -> str:
    return f"{writer_dir(task, epoch)}/{batch:010d}"


def batch_of(path: str) -> str:
    """The batch directory a segment file lies in (its first three components)."""
    return "/".join(path.split("/")[:3])


#: What Hadoop reads in a path as a glob pattern (its ``GlobPattern``): Spark's readers
#: expand every path they are given, and a file whose name has one of these would be
#: missed (``a[1]`` matches ``a1``) or read with others (``a*`` matches ``ab``).
_GLOB_CHARACTER = re.compile(r"([\\*?\[\]{}])")
#: A URI's scheme and authority: not globbed (an IPv6 host is written in brackets)
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]*")


def literal(path: str) -> str:
    """``path`` (a path or URI) as a Spark read takes it to name one file or directory:
    the glob characters of its path escaped, as Hadoop's globbing reads ``\\c`` as ``c``
    itself. Only for reads: a write takes its path as it is."""
    authority = _AUTHORITY.match(path)
    start = authority.end() if authority else 0
    return path[:start] + _GLOB_CHARACTER.sub(r"\\\1", path[start:])


def filesystem(location: str) -> tuple[pafs.FileSystem, str, str]:
    """A pyarrow filesystem for ``location`` (a local path or a URI), the path within it,
    and the location as Spark should get it. ``s3a://``/``s3n://`` (Hadoop's names) are
    ``s3://`` to pyarrow. Raises ``ValueError`` if pyarrow cannot reach it."""
    scheme, sep, _ = location.partition("://")
    if not sep:
        local = os.path.abspath(location).rstrip("/") or "/"
        return pafs.LocalFileSystem(), local, local
    uri = location
    if scheme in ("s3a", "s3n"):
        uri = "s3://" + location[len(scheme) + 3 :]
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise ValueError(str(exc)) from exc
    return fs, path.rstrip("/"), location.rstrip("/")


@dataclass(frozen=True)
class FileEntry:
    """A file or directory, by its path relative to the root."""

    path: str
    is_dir: bool
    size: int


class Storage:
    """``storage.root``: full paths for Spark, a pyarrow filesystem for the rest."""

    def __init__(self, root: str) -> None:
        if not root:
            raise ConfigError(
                "storage.root is empty: give a local directory or a filesystem URI for topic data"
            )
        try:
            self.fs, self._base, self.root = filesystem(root)
        except ValueError as exc:
            raise ConfigError(f"storage.root {root!r} cannot be used: {exc}") from exc

    def __repr__(self) -> str:
        return f"Storage({self.root!r})"

    def uri(self, rel: str) -> str:
        """The full path of ``rel`` as Spark should get it to write there."""
        return f"{self.root}/{rel}"

    def read_uri(self, rel: str) -> str:
        """The full path of ``rel`` as Spark should get it to read it (see :func:`literal`)."""
        return literal(self.uri(rel))

    def fs_path(self, rel: str) -> str:
        return f"{self._base}/{rel}"

    def _rel(self, fs_path: str) -> str:
        return fs_path[len(self._base) + 1 :]

    def list_dir(self, rel: str, *, recursive: bool = False) -> list[FileEntry]:
        """Entries under ``rel`` (nothing if it does not exist)."""
        selector = pafs.FileSelector(self.fs_path(rel), allow_not_found=True, recursive=recursive)
        return [
            FileEntry(self._rel(info.path), info.type == pafs.FileType.Directory, info.size or 0)
            for info in self.fs.get_file_info(selector)
        ]

    def delete_dir(self, rel: str) -> None:
        """Delete ``rel`` and everything under it; a missing directory is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.fs_path(rel))

    def delete(self, entry: FileEntry) -> None:
        """Delete a file, or a directory and everything under it; missing is fine."""
        if entry.is_dir:
            self.delete_dir(entry.path)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.fs_path(entry.path))

    def delete_if_empty(self, rel: str) -> bool:
        """Delete directory ``rel`` if nothing is left in it (object stores have no dirs)."""
        info = self.fs.get_file_info(self.fs_path(rel))
        if info.type != pafs.FileType.Directory:
            return False
        if self.list_dir(rel):
            return False
        self.delete_dir(rel)
        return True

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def make_durable(self, files: Iterable[str]) -> None:
        """Flush ``files`` (paths under the root) to disk, and every directory from
        theirs up to the root, so that a power loss after the commit that publishes them
        cannot take them back. Nothing to do off a local root (see the module docstring).
        """
        if not self.local:
            return
        directories = {""}
        for rel in files:
            fsync_path(self.fs_path(rel))
            parts = rel.split("/")[:-1]
            directories.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        # deepest first: each directory's entry in its parent is flushed after it
        for rel in sorted(directories, key=lambda d: d.count("/") + bool(d), reverse=True):
            fsync_path(self.fs_path(rel) if rel else self._base)

    def footer(self, rel: str) -> pq.FileMetaData:
        return pq.read_metadata(self.fs_path(rel), filesystem=self.fs)

    def read_table(
        self,
        files: Iterable[str],
        columns: list[str] | None = None,
        schema: pa.Schema | None = None,
    ) -> pa.Table:
        """The Parquet ``files`` as one Arrow table (of ``schema``: columns a file lacks
        are null)."""
        paths = [self.fs_path(f) for f in files]
        dataset = pq.ParquetDataset(paths, filesystem=self.fs, partitioning=None, schema=schema)
        return dataset.read(columns=columns)

    def iter_batches(self, rel: str, schema: pa.Schema, max_rows: int) -> Iterator[pa.RecordBatch]:
        """The Parquet file ``rel`` as record batches of ``schema`` (columns the file lacks
        are null) of at most ``max_rows`` rows, in the file's order, read as they are asked
        for (and a few ahead)."""
        import pyarrow.dataset as ds  # here: importing it costs a CLI command 0.4 s

        dataset = ds.dataset(self.fs_path(rel), schema=schema, format="parquet", filesystem=self.fs)
        # one thread: batches come in the file's order
        return dataset.to_batches(batch_size=max_rows, use_threads=False)
