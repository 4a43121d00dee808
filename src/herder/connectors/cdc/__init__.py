"""PostgreSQL change data capture with Debezium's names: :mod:`.source`; and Debezium's
``ExtractNewRecordState`` transform, :mod:`.unwrap`."""

from herder.connectors.cdc.source import PostgresCdcSourceConnector, PostgresCdcSourceTask

__all__ = ["PostgresCdcSourceConnector", "PostgresCdcSourceTask"]
