"""Epoch milliseconds as Spark columns, in UTC: what TimestampConverter, TimestampRouter
and the typed transforms share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import Column

DAY_MS: Final = 86_400_000


def epoch_ntz() -> Column:
    """1970-01-01T00:00 as a timestamp without time zone: arithmetic from it is UTC."""
    from pyspark.sql import functions as F

    return F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")


def format_millis(millis: Column, pattern: str) -> Column:
    """Epoch milliseconds formatted with ``pattern``, in UTC."""
    from pyspark.sql import functions as F

    return F.date_format(F.timestamp_add("MILLISECOND", millis, epoch_ntz()), pattern)
