"""herder's connector API: everything a connector author needs, and nothing else.

A connector is two classes: a :class:`SourceConnector` or :class:`SinkConnector` that
splits the work into task configs, and a :class:`SourceTask` or :class:`SinkTask` that
does it. Source tasks return :class:`SourceRecord` lists or a :class:`SourceBatch` (a
Spark DataFrame plus the source offsets it reaches) from ``poll``; sink tasks receive
DataFrames in ``put``. A minimal source::

    import time

    from herder.connect import SourceConnector, SourceRecord, SourceTask

    class TickerConnector(SourceConnector):
        def start(self, config): self.config = config
        def task_class(self): return TickerTask
        def task_configs(self, max_tasks): return [self.config]
        def stop(self): pass

    class TickerTask(SourceTask):
        def start(self, config):
            offset = self.context.offset_reader.offset({"ticker": "main"})
            self.n = offset["n"] if offset else 0
            self.topic = config["topic"]
        def poll(self):
            time.sleep(1)
            self.n += 1
            return [SourceRecord({"ticker": "main"}, {"n": self.n}, self.topic, str(self.n))]
        def stop(self): pass

Make it known to workers through the ``herder.connectors`` entry-point group of your
package (``ticker = "mypkg.ticker:TickerConnector"``), then create it with
``connector.class=TickerConnector`` (or ``Ticker``, or ``mypkg.ticker.TickerConnector``).
Declare your keys in :meth:`Connector.config_def` with :class:`herder.config.ConfigDef`.

A single message transform is a :class:`Transformation` (and a condition on records a
:class:`Predicate`), installed the same way under ``herder.transforms`` (and
``herder.predicates``): see :mod:`herder.connect.transforms`.
"""

from herder.connect.connector import (
    Connector,
    ConnectorContext,
    ConnectorType,
    SinkConnector,
    SourceConnector,
)
from herder.connect.records import (
    SINK_COLUMNS,
    SOURCE_BATCH_COLUMNS,
    ArrowPieces,
    Header,
    OffsetRange,
    SourceBatch,
    SourceOffset,
    SourcePartition,
    SourceRecord,
    TopicPartition,
)
from herder.connect.sink import SinkTask, SinkTaskContext, partitions_of, rows_in
from herder.connect.source import OffsetReader, SourceTask, SourceTaskContext
from herder.connect.task import UNDEFINED_VERSION, Task
from herder.connect.transforms import Outcome, Predicate, Record, Transformation

__all__ = [
    "SINK_COLUMNS",
    "SOURCE_BATCH_COLUMNS",
    "UNDEFINED_VERSION",
    "ArrowPieces",
    "Connector",
    "ConnectorContext",
    "ConnectorType",
    "Header",
    "OffsetRange",
    "OffsetReader",
    "Outcome",
    "Predicate",
    "Record",
    "SinkConnector",
    "SinkTask",
    "SinkTaskContext",
    "SourceBatch",
    "SourceConnector",
    "SourceOffset",
    "SourcePartition",
    "SourceRecord",
    "SourceTask",
    "SourceTaskContext",
    "Task",
    "TopicPartition",
    "Transformation",
    "partitions_of",
    "rows_in",
]
