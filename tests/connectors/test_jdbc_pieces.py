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


ORDERS = TableShape(
    TableId("public", "orders"),
    "db.public.orders",
    (Column("id", "bigint", False), Column("note", "text")),
    ("id",),
)


class Catalog:
    """Answers :func:`plan_chunk`'s queries for a table whose statistics estimate
    ``estimate`` rows between keys ``lowest`` and ``highest``, and records them."""

    def __init__(self, estimate: float, lowest: int, highest: int, low: int) -> None:
        self.bounds = (estimate, lowest, highest, low)
        self.counted: tuple[int, int] | None = None
        self.asked: list[str] = []

    def __call__(self, sql: str) -> tuple[object, ...]:
        self.asked.append(sql)
        if "reltuples" in sql:
            return self.bounds
        assert self.counted is not None, f"not expected: {sql}"
        return self.counted


def test_a_snapshot_chunk_is_read_in_pieces_for_every_core() -> None:
    """A chunk of 200,000 rows in pieces of about 50,000: 4 pieces on 1, 2 or 4 cores,
    8 on 8 cores (4 would leave half of them idle), covering the chunk's keys."""

    def plan(parallelism: int | None) -> list[str]:
        chunk = plan_chunk(
            Catalog(1_000_000, 1, 1_000_000, 1), ORDERS, None, 200_000, 50_000, None,
            parallelism,
        )  # fmt: skip
        assert chunk is not None and chunk.last == 200_000 and chunk.rows == 200_000
        return list(chunk.pieces)

    assert [len(plan(p)) for p in (None, 1, 2, 4, 8)] == [4, 4, 4, 4, 8]
    pieces = plan(8)
    assert pieces[0] == '"id" >= 1 AND "id" < 25001'
    assert pieces[-1] == '"id" >= 175001 AND "id" < 200001'


def test_a_table_of_dense_keys_is_cut_by_key_ranges_without_counting() -> None:
    """Keys 1 to 1,000,000 with a fifth of them deleted: 1.25 keys a row, so a chunk
    of 100,000 rows spans 125,000 keys; no query counts them. The last chunk runs to
    where the snapshot ends."""
    catalog = Catalog(800_000, 1, 1_000_000, 300_001)
    chunk = plan_chunk(catalog, ORDERS, 300_000, 100_000, 50_000, None, 2)
    assert chunk is not None and (chunk.last, chunk.rows) == (425_000, 100_000)
    assert chunk.pieces == ('"id" >= 300001 AND "id" < 362501', '"id" >= 362501 AND "id" < 425001')
    assert len(catalog.asked) == 1 and "count" not in catalog.asked[0]
    last = plan_chunk(Catalog(800_000, 1, 1_000_000, 950_001), ORDERS, 950_000, 100_000,
                      50_000, 990_000, 2)  # fmt: skip
    assert last is not None and last.last is None and last.rows == 32_000
    assert last.pieces[-1].endswith('"id" < 990001')
    assert plan_chunk(Catalog(800_000, 1, 1_000_000, None), ORDERS, 990_000, 100_000,
                      50_000, 990_000, 2) is None  # fmt: skip


@pytest.mark.parametrize(
    "estimate", [-1, 0, 1_000, 400_000], ids=["never-analysed", "empty", "sparse", "stale"]
)
def test_a_table_of_sparse_or_unknown_keys_is_cut_by_counted_keys(estimate: float) -> None:
    """Without statistics, or with more than two keys a row (as the statistics say,
    however stale), a chunk is the next keys counted: a chunk by key range would hold
    too few rows, or an estimate too low would make it hold too many."""
    catalog = Catalog(estimate, 1, 1_000_000, 11)
    catalog.counted = (100_000, 500_000)
    chunk = plan_chunk(catalog, ORDERS, 10, 100_000, 50_000, None, 2)
    assert chunk is not None and (chunk.last, chunk.rows) == (500_000, 100_000)
    assert chunk.pieces == ('"id" >= 11 AND "id" < 250006', '"id" >= 250006 AND "id" < 500001')
    assert len(catalog.asked) == 2 and "count(*)" in catalog.asked[1]
    catalog.counted = (7, 600_000)  # fewer rows than a chunk: the rest of the table
    rest = plan_chunk(catalog, ORDERS, 500_000, 100_000, 50_000, None, 2)
    assert rest is not None and rest.last is None and rest.rows == 7
