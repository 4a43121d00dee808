"""How a batch of a table (or a snapshot chunk) is cut into key ranges read in parallel."""

from __future__ import annotations

import itertools

import pytest

from herder.connectors.cdc.events import TableShape
from herder.connectors.cdc.snapshot import plan_chunk
from herder.connectors.jdbc.postgres import Column, TableId
from herder.connectors.jdbc.reading import key_ranges, piece_count

pytestmark = pytest.mark.unit


def test_a_batch_is_read_in_a_multiple_of_the_cores_pieces() -> None:
    # one piece of 250,000 rows would leave one of two cores idle: two of 125,000
    assert piece_count(250_000, 250_000, 2) == 2
    assert piece_count(1_000_000, 250_000, 2) == 4
    assert piece_count(1_100_000, 250_000, 2) == 6
    assert piece_count(1_000_000, 250_000, 8) == 8
    # no cores known (Spark Connect) or one core: pieces of split_rows
    assert piece_count(1_000_000, 250_000, None) == 4
    assert piece_count(250_000, 250_000, 1) == 1
    assert piece_count(0, 250_000, 2) == 2


def test_key_ranges_cover_the_keys_once_in_order() -> None:
    ranges = key_ranges(1, 1_000_000, 4)
    assert ranges == [(1, 250_001), (250_001, 500_001), (500_001, 750_001), (750_001, 1_000_001)]
    for low, high, count in [(5, 5, 4), (-10, 10, 3), (1, 7, 2), (100, 1_000_003, 6)]:
        ranges = key_ranges(low, high, count)
        assert 1 <= len(ranges) <= count
        assert ranges[0][0] == low and ranges[-1][1] == high + 1
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(start < end for start, end in ranges)


def test_a_snapshot_chunk_is_read_in_pieces_for_every_core() -> None:
    """A chunk of 200,000 rows in pieces of about 50,000: 4 pieces on 1, 2 or 4 cores,
    8 on 8 cores (4 would leave half of them idle), covering the chunk's keys."""
    shape = TableShape(
        TableId("public", "orders"),
        "db.public.orders",
        (Column("id", "bigint", False), Column("note", "text")),
        ("id",),
    )

    def plan(parallelism: int | None) -> list[str]:
        chunk = plan_chunk(
            lambda sql: (200_000, 1, 200_000), shape, None, 200_000, 50_000, None, parallelism
        )
        assert chunk is not None and chunk.last == 200_000 and chunk.rows == 200_000
        return list(chunk.pieces)

    assert [len(plan(p)) for p in (None, 1, 2, 4, 8)] == [4, 4, 4, 4, 8]
    pieces = plan(8)
    assert pieces[0] == '"id" >= 1 AND "id" < 25001'
    assert pieces[-1] == '"id" >= 175001 AND "id" < 200001'
