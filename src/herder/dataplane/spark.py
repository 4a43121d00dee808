"""One SparkSession per worker process, and the threads its jobs are submitted from.

A worker runs every task's pipeline on one session, configured from the worker's
``spark.*`` properties (any ``spark.*`` key passes through; ``spark.master`` defaults
to ``local[*]``). herder adds what it needs on top:

* ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are this interpreter, so Spark's
  Python workers run the same virtualenv and import connectors from the packages
  installed there (``spark.pyspark.python`` still wins if given). A module that is not
  installed (a test's own connector) reaches them with :func:`register_module_by_value`.
* The FAIR scheduler, with one scheduler pool per task (:meth:`SparkRuntime.pool`): a
  task with a big batch does not hold up the others' small ones. Pools are created on
  first use with Spark's defaults (weight 1); an allocation file can be given with
  ``spark.scheduler.allocation.file``.
* Arrow for every crossing between Python and the JVM, no UI, no console progress
  bars, log level WARN, no ``_SUCCESS`` marker files; a local master, or a cluster
  master on a loopback address, binds to 127.0.0.1 unless ``SPARK_LOCAL_IP`` says
  otherwise.

Spark jobs block, so they run on a bounded thread pool (``dataplane.job.threads``,
default 4), never on the event loop: ``await run_in_spark(fn, *args, pool=...)``. The
pool's local property is set in the submitting thread, as Spark requires, and reset
afterwards because the threads are reused.

**Spark Connect** (``spark.remote=sc://host:port``) goes to
``SparkSession.builder.remote``; the other ``spark.*`` keys are sent as session
configs (static ones such as ``spark.master`` must be set on the server instead).
It needs herder's ``connect`` extra (``pip install 'herder[connect]'``) here, and the
Connect server's Python needs herder and the connectors installed. What it cannot do:
there is no SparkContext on the client, so **no per-task scheduler pools**
(:meth:`SparkRuntime.pool` does nothing: every task's jobs share the server's default
pool) and no job cancellation by pool; the server's own log level and UI settings apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from herder.errors import ConfigError
from herder.runtime.task_metrics import JobTimes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Session confs herder sets unless the worker's properties say otherwise, on a
#: SparkSession of its own as on a Spark Connect server's session:
#:
#: * Arrow for moving rows between Python and the JVM;
#: * a union keeps each input's partitions as partitions of its own. Spark would
#:   otherwise merge the partitions of inputs that are one partition each into one: a
#:   sink's read, a union of one-partition scans of a topic's files (see
#:   :func:`~herder.dataplane.reader.slices_dataframe`), would be read by one task;
#: * timestamps written to Parquet as its standard INT64 microseconds, not the legacy
#:   INT96 that Spark writes by default: a typed timestamp in a segment, or a column of
#:   a Parquet file a sink writes, reads back elsewhere (Arrow) as the type it came in.
SESSION_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.unionOutputPartitioning": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}
#: What herder sets unless the worker's properties say otherwise.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "herder",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN",
    "spark.scheduler.mode": "FAIR",
    **SESSION_CONF,
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # Python workers import pyspark from its installed package, not from its zip
    "spark.python.daemon.module": "herder.sparkdaemon",
}
#: The worker property that bounds how many Spark jobs a worker submits at once.
JOB_THREADS_KEY = "dataplane.job.threads"
POOL_PROPERTY = "spark.scheduler.pool"
JOB_GROUP_PROPERTY = "spark.jobGroup.id"


@dataclass(frozen=True)
class SparkSettings:
    """The session's configuration: ``spark.*`` keys with herder's defaults filled in."""

    conf: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CONF))
    #: the Spark Connect URL (``spark.remote``), or None for a classic session
    remote: str | None = None
    job_threads: int = 4

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> SparkSettings:
        """Settings from a worker's properties; keys not starting with ``spark.`` are ignored."""
        given = {str(k): str(v) for k, v in props.items() if str(k).startswith("spark.")}
        remote = given.pop("spark.remote", None) or None
        threads_raw = props.get(JOB_THREADS_KEY, 4)
        try:
            threads = int(threads_raw)
        except (TypeError, ValueError):
            threads = 0
        if threads < 1:
            raise ConfigError(f"{JOB_THREADS_KEY}={threads_raw!r}: give a whole number >= 1")
        if remote is not None:
            if not remote.startswith("sc://"):
                raise ConfigError(f"spark.remote={remote!r}: a Spark Connect URL is sc://host:port")
            # herder's other defaults are static confs the Connect server owns; send only
            # what the user gave, and the session confs
            conf = {**SESSION_CONF, **given}
            conf.pop("spark.master", None)
            return cls(conf, remote, threads)
        return cls({**DEFAULT_CONF, **given}, None, threads)

    @property
    def local(self) -> bool:
        return self.remote is None and self.conf.get("spark.master", "").startswith("local")

    @property
    def where(self) -> str:
        """The setting that says where jobs run, as ``key=value``, for messages."""
        if self.remote is not None:
            return f"spark.remote={self.remote}"
        return f"spark.master={self.conf.get('spark.master', '')}"

    @property
    def spans_machines(self) -> bool:
        """Whether jobs may run on other machines than this one.

        A local master runs them here. A standalone master (``spark://``) or a Spark
        Connect server on a loopback address has its executors here too, since no other
        machine can reach it; on any other host, and under YARN or Kubernetes, they may
        be anywhere. (A Connect server on this machine may itself use a cluster: that is
        the server's setting, which a client cannot see.)
        """
        if self.local:
            return False
        target = self.remote if self.remote is not None else self.conf.get("spark.master", "")
        scheme, sep, rest = target.partition("://")
        if not sep or scheme not in ("spark", "sc"):
            return True
        first = rest.split(",")[0]
        host = urlsplit(f"http://{first}").hostname or ""
        return not _is_loopback(host)


class SparkRuntime:
    """A lazily started SparkSession and the bounded thread pool jobs run on."""

    def __init__(self, settings: SparkSettings) -> None:
        self.settings = settings
        self._session: SparkSession | None = None
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=settings.job_threads, thread_name_prefix="herder-spark"
        )
        #: per scheduler pool (a task's), what its jobs took: its task's metrics
        self.job_times: dict[str, JobTimes] = {}
        self._parallelism: int | None = None

    @property
    def remote(self) -> bool:
        return self.settings.remote is not None

    @property
    def session(self) -> SparkSession:
        """The session, started on first use (seconds: call it from a job thread)."""
        session = self._session
        if session is None:
            with self._lock:
                if self._session is None:
                    self._session = self._build()
                session = self._session
        return session

    def _build(self) -> SparkSession:
        from pyspark.sql import SparkSession

        settings = self.settings
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if settings.remote is not None:
            try:
                import grpc  # noqa: F401  (pyspark's Connect client fails later and obscurely)
            except ImportError as exc:
                raise ConfigError(
                    "spark.remote needs Spark Connect's client libraries: "
                    "pip install 'herder[connect]' (or 'pyspark[connect]==4.3.0')"
                ) from exc
            builder = SparkSession.builder.remote(settings.remote)
        else:
            check_spark_home(os.environ.get("SPARK_HOME"))
            if not settings.spans_machines:
                # nothing outside this machine takes part: Spark would otherwise pick
                # the first non-loopback interface for its driver and block manager
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = SparkSession.builder
        for key, value in settings.conf.items():
            builder = builder.config(key, value)
        log.info(
            "starting Spark session (%s)",
            settings.remote or settings.conf.get("spark.master", "local[*]"),
        )
        session = builder.getOrCreate()
        if settings.remote is None:
            _quiet_pool_creation(session)
            self._parallelism = int(session.sparkContext.defaultParallelism)
        return session

    def start(self) -> SparkSession:
        """Start the session now (blocking) rather than on the first job."""
        return self.session

    @property
    def parallelism(self) -> int | None:
        """How many tasks Spark runs at once by default (its ``defaultParallelism``);
        None under Spark Connect, whose client cannot ask."""
        return self.refresh_parallelism()

    @property
    def known_parallelism(self) -> int | None:
        """:attr:`parallelism` as last seen (when the session started, or at the last
        :meth:`refresh_parallelism`), without a call into the JVM (for the event loop);
        None before the session started, and under Spark Connect."""
        return self._parallelism

    def refresh_parallelism(self) -> int | None:
        """:attr:`parallelism`, asked of Spark (a call into the JVM: on a job thread) and
        kept as :attr:`known_parallelism`, since a cluster's executors, and so its
        cores, come and go."""
        if self.remote:
            return None
        self._parallelism = int(self.session.sparkContext.defaultParallelism)
        return self._parallelism

    @contextlib.contextmanager
    def pool(self, name: str | None) -> Iterator[None]:
        """Run the jobs this thread submits inside in FAIR scheduler pool ``name``, and
        add the time they take to that pool's :attr:`job_times` (its task's metrics).

        Under Spark Connect there is no SparkContext and no pool: only the time counts.
        """
        times = self.job_times.get(name) if name is not None else None
        began = time.monotonic()
        if name is None or self.remote:
            try:
                yield
            finally:
                if times is not None:
                    times.add(time.monotonic() - began)
            return
        context = self.session.sparkContext
        previous = context.getLocalProperty(POOL_PROPERTY)
        previous_group = context.getLocalProperty(JOB_GROUP_PROPERTY)
        context.setLocalProperty(POOL_PROPERTY, name)
        # the pool's name as the job group too, so its jobs can be counted
        context.setLocalProperty(JOB_GROUP_PROPERTY, name)
        try:
            yield
        finally:
            context.setLocalProperty(POOL_PROPERTY, previous)  # type: ignore[arg-type]
            context.setLocalProperty(JOB_GROUP_PROPERTY, previous_group)  # type: ignore[arg-type]
            if times is not None:
                took = time.monotonic() - began
                try:
                    times.add(took, context.statusTracker().getJobIdsForGroup(name))
                except Exception:  # a session stopping under us: count the submission
                    times.add(took)

    async def run(self, fn: Callable[..., T], *args: Any, pool: str | None = None) -> T:
        """``fn(*args)`` on a Spark job thread, inside scheduler pool ``pool``."""

        def job() -> T:
            with self.pool(pool):
                return fn(*args)

        loop = asyncio.get_running_loop()
        # in the caller's log context: a job's lines name its task
        return await loop.run_in_executor(self._executor, contextvars.copy_context().run, job)

    def stop(self) -> None:
        """Stop the session and the job threads (blocking)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._session is not None:
                self._session.stop()
                self._session = None


#: each session's :func:`derived_session` sessions, by the confs they were made with
_derived: weakref.WeakKeyDictionary[SparkSession, dict[frozenset[tuple[str, str]], SparkSession]]
_derived = weakref.WeakKeyDictionary()
_derived_lock = threading.Lock()


def derived_session(spark: SparkSession, conf: Mapping[str, str]) -> SparkSession | None:
    """A session of ``spark``'s Spark (its context, its jobs, its scheduler pools) with
    ``conf`` set on it, for reads that need a file-scan setting of their own; the same
    session for the same ``conf`` each time. None under Spark Connect, which has no
    such session.

    A scan's settings (how files are cut into splits, how splits are packed) are the
    session's, not the scan's: set on ``spark`` they would change every other read of
    the worker, and the same jobs' settings cannot be changed under them. A derived
    session starts from the Spark configuration (the worker's ``spark.*`` properties),
    and takes herder's session confs (:data:`SESSION_CONF`) as ``spark`` has them, in
    case they were set on ``spark`` alone. A DataFrame read in it, and what derives from
    it (a staged write, a sink's projection), runs in it.

    ``conf`` names Spark SQL confs. Each is set only where the new session's value (its
    default, if nothing set it) differs, so that ``conf`` may hold a deprecated conf at
    its default against the worker's properties without Spark warning that it was set.
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    key = frozenset(conf.items())
    with _derived_lock:
        sessions = _derived.setdefault(spark, {})
        found = sessions.get(key)
        if found is None:
            found = spark.newSession()
            inherited = {name: spark.conf.get(name, None) for name in SESSION_CONF}
            wanted = {name: v for name, v in inherited.items() if v is not None} | dict(conf)
            for name, value in wanted.items():
                current = found.conf.get(name)  # its default if nothing set it
                if current is None or current.lower() != value.lower():
                    found.conf.set(name, value)
            sessions[key] = found
        return found


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_spark_home(spark_home: str | None) -> None:
    """Refuse a ``SPARK_HOME`` that pyspark cannot launch, or one of another Spark.

    pyspark launches its JVM with ``$SPARK_HOME/bin/spark-submit`` when the variable is
    set, and only falls back to its own copy of Spark when it is not: a variable left
    pointing at an old or removed install fails deep in the launch ("No such file or
    directory: './bin/spark-submit'"), and one pointing at another version of Spark
    fails later and stranger. Unset, pyspark's own Spark is used, which always fits.
    """
    if not spark_home:
        return
    import pyspark

    home = Path(spark_home)
    fix = "unset SPARK_HOME to use the Spark that comes with pyspark"
    if not (home / "bin" / "spark-submit").is_file():
        raise ConfigError(f"SPARK_HOME={spark_home} has no bin/spark-submit: {fix}")
    wanted = pyspark.__version__
    cores = sorted((home / "jars").glob("spark-core_*.jar"))
    if cores:
        found = cores[0].stem.rpartition("-")[2]
        if found.split(".")[:2] != wanted.split(".")[:2]:
            raise ConfigError(
                f"SPARK_HOME={spark_home} is Spark {found}, but herder runs pyspark {wanted}: "
                f"{fix}, or point it at a Spark {'.'.join(wanted.split('.')[:2])} install"
            )


def _quiet_pool_creation(session: SparkSession) -> None:
    """Per-task pools are made on the fly by design; Spark warns about each one."""
    jvm = session.sparkContext._jvm
    if jvm is None:
        return
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(
        "org.apache.spark.scheduler.FairSchedulableBuilder", log4j.Level.ERROR
    )


_runtime: SparkRuntime | None = None
_runtime_lock = threading.Lock()


def spark_runtime(props: Mapping[str, Any] | None = None) -> SparkRuntime:
    """The process's one :class:`SparkRuntime`, created from ``props`` on the first call.

    Like ``SparkSession.builder.getOrCreate``, later calls get the existing runtime;
    settings that differ from it are logged and ignored, since a JVM cannot be
    reconfigured in place.
    """
    global _runtime
    with _runtime_lock:
        settings = SparkSettings.from_properties(props or {})
        if _runtime is None:
            _runtime = SparkRuntime(settings)
        elif props is not None and settings != _runtime.settings:
            log.warning("a Spark session already exists in this process; ignoring new settings")
        return _runtime


def stop_spark() -> None:
    """Stop the process's Spark runtime, if one was created."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.stop()


async def run_in_spark(fn: Callable[..., T], *args: Any, pool: str | None = None) -> T:
    """``fn(*args)`` on the process runtime's job threads, in scheduler pool ``pool``."""
    return await spark_runtime().run(fn, *args, pool=pool)


def register_module_by_value(module: ModuleType) -> None:
    """Ship ``module``'s code inside pickled functions, for modules Spark cannot import.

    Installed connectors need nothing; this is for code that lives only where the
    driver runs (a test's module, a notebook).
    """
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
