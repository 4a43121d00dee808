"""How a worker compresses the segment files it stages: ``producer.compression.type``.

A source task's segment writer is what a producer is to Kafka, so the worker takes the
producer's setting, with its names: ``none``, ``gzip``, ``snappy``, ``lz4``, ``zstd``.
It is the codec of each Parquet file, whether Spark or pyarrow writes it; a reader
finds it in the file, so a topic's segments may differ in it, and changing it needs no
rewrite. The default is ``lz4`` (Parquet's LZ4_RAW), the fastest of them both ways:
2,000,000 lines of 100 bytes were staged in 0.417 s and read back into text in
0.384 s, against 0.439 s and 0.388 s with Parquet's usual snappy (``bench/steps.py``
rounds, medians of 8, alternating in one process).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from herder.errors import ConfigError

#: Worker config: the codec of the segment files the worker's source tasks stage.
PRODUCER_COMPRESSION: Final = "producer.compression.type"


@dataclass(frozen=True)
class SegmentCodec:
    """A codec by its producer name, as Spark's Parquet writer and pyarrow name it, and
    the part of a file name Spark gives it (``part-…-c000<suffix>.parquet``)."""

    name: str
    spark: str
    arrow: str
    suffix: str


CODECS: Final = {
    codec.name: codec
    for codec in (
        SegmentCodec("none", "none", "none", ""),
        SegmentCodec("gzip", "gzip", "gzip", ".gz"),
        SegmentCodec("snappy", "snappy", "snappy", ".snappy"),
        # pyarrow's "lz4" is Parquet's LZ4_RAW, Spark's "lz4" the deprecated Hadoop framing
        SegmentCodec("lz4", "lz4_raw", "lz4", ".lz4raw"),
        SegmentCodec("zstd", "zstd", "zstd", ".zstd"),
    )
}
DEFAULT_CODEC: Final = CODECS["lz4"]


def segment_codec(config: Mapping[str, str]) -> SegmentCodec:
    """The codec a worker's properties name (:data:`PRODUCER_COMPRESSION`), or the
    default; an unknown name is a ConfigError that lists the known ones."""
    name = config.get(PRODUCER_COMPRESSION, DEFAULT_CODEC.name).strip().lower()
    codec = CODECS.get(name)
    if codec is None:
        raise ConfigError(
            f"{PRODUCER_COMPRESSION}={name!r} is not a codec herder writes: use one of"
            f" {', '.join(CODECS)}"
        )
    return codec
