"""Source tasks: read from an external system and hand records to the runtime.

The runtime calls :meth:`SourceTask.poll` in a loop on a thread of its own, turns what
comes back into topic data with Spark, and commits the records together with their
source offsets in one transaction: after a crash a task resumes exactly after the last
committed record, read back through ``context.offset_reader``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from herder.connect.records import SourceBatch, SourceOffset, SourcePartition, SourceRecord
from herder.connect.task import Task

__all__ = ["OffsetReader", "SourceTask", "SourceTaskContext"]


class OffsetReader(ABC):
    """The committed offsets of this connector's source partitions.

    Read them in :meth:`SourceTask.start` to resume where the previous incarnation of
    the task stopped. Reads go to the cluster, so ask for all partitions in one call
    to :meth:`offsets` rather than one :meth:`offset` call each.
    """

    def offset(self, partition: SourcePartition) -> SourceOffset | None:
        """The last committed offset for ``partition``, None if nothing was committed."""
        return self.offsets([partition])[0]

    @abstractmethod
    def offsets(self, partitions: Sequence[SourcePartition]) -> list[SourceOffset | None]:
        """The last committed offset of each partition, in the same order (None if none)."""


class SourceTaskContext(ABC):
    """The runtime, as a running source task sees it. Available as ``SourceTask.context``."""

    @property
    @abstractmethod
    def configs(self) -> Mapping[str, str]:
        """The task's config, as passed to :meth:`SourceTask.start`."""

    @property
    @abstractmethod
    def offset_reader(self) -> OffsetReader:
        """Where to read the offsets this connector committed before."""


class SourceTask(Task):
    """Reads one share of a source connector's work.

    Lifecycle: :meth:`initialize`, :meth:`start`, then :meth:`poll` repeatedly on the
    runtime's thread, with :meth:`commit_record` and :meth:`commit` as records are
    committed, and finally :meth:`stop` (from another thread, possibly while
    :meth:`poll` is running: make :meth:`poll` notice and return promptly).
    """

    context: SourceTaskContext

    def initialize(self, context: SourceTaskContext) -> None:
        """Receive the runtime's context before :meth:`start`; override only to extend."""
        self.context = context

    @abstractmethod
    def poll(self) -> list[SourceRecord] | SourceBatch | None:
        """New data since the last call, or None (or ``[]``) if there is none yet.

        Return records when they are produced in Python, or a :class:`SourceBatch` when
        Spark can read the data itself. The runtime gathers several polls' records into
        one Spark job, so return what is available now instead of waiting for a full
        batch, but do wait a little (up to a second, say) when there is nothing, or the
        runtime spins. Raising fails the task.
        """

    def commit(self) -> None:
        """Everything returned by :meth:`poll` so far is committed.

        Sources that must acknowledge data upstream (a message queue) do so here or in
        :meth:`commit_record`. The default does nothing.
        """

    def commit_record(self, record: SourceRecord) -> None:
        """``record`` has been committed to its topic. The default does nothing.

        Called for records returned from :meth:`poll`, not for :class:`SourceBatch`
        rows; use :meth:`commit` for those.
        """

    def lag(self) -> Mapping[str, int | float] | None:
        """How far the source system is ahead of what this task has committed, as
        figures by name (``{"bytes": …, "seconds": …}``), or None if it cannot say.

        The runtime shows it as ``lag`` in the task's status (``GET
        /connectors/<name>/status``) so an operator sees a backlog without asking the
        source system. It calls this every few seconds on a thread of its own, also while
        the task is paused and :meth:`poll` is not called, so a backlog that grows while
        nothing reads it shows: make it safe to call beside :meth:`poll`. The default
        says nothing.
        """
        return None
