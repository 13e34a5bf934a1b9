"""model.relations: nesting and deepest covering interval on hand-built intervals with known truth."""

from __future__ import annotations

import polars as pl

from traceanalyzer.model.relations import deepest_at, nest

# Thread (1, 1): A [0,100) holds B [10,50) and C [50,80) (C starts where B ends) and a
# zero-length D at 20; thread (1, 2): E [0,10). Ids are the letters' positions.
A, B, C, D, E = 0, 1, 2, 3, 4
INTERVALS = pl.DataFrame(
    {
        "id": [A, B, C, D, E],
        "ts_ns": [0, 10, 50, 20, 0],
        "end_ns": [100, 50, 80, 20, 10],
        "pid": [1, 1, 1, 1, 1],
        "tid": [1, 1, 1, 1, 2],
    },
    schema={"id": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64},
)


def test_nest_depth_and_parent() -> None:
    got = nest(INTERVALS.filter(pl.col("end_ns") > pl.col("ts_ns"))).sort("id")
    assert got["id"].to_list() == [A, B, C, E]
    assert got["depth"].to_list() == [1, 2, 2, 1]
    assert got["parent_id"].to_list() == [None, A, A, None]


def test_deepest_at_half_open_and_per_thread() -> None:
    cases = [  # (pid, tid, t) -> deepest covering id
        ((1, 1, 0), A), ((1, 1, 10), B), ((1, 1, 20), B),  # the zero-length D never covers
        ((1, 1, 49), B), ((1, 1, 50), C),  # B ends at 50 and C starts there
        ((1, 1, 80), A), ((1, 1, 99), A), ((1, 1, 100), None),
        ((1, 2, 5), E), ((1, 2, 10), None), ((2, 1, 5), None), ((1, 1, -1), None),
    ]
    # Points in shuffled order: the result must stay aligned with the input rows.
    order = [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]
    pts = pl.DataFrame(
        {
            "pid": [cases[i][0][0] for i in order],
            "tid": [cases[i][0][1] for i in order],
            "ts_ns": [cases[i][0][2] for i in order],
        }
    )
    got = deepest_at(INTERVALS, pts)
    assert got.dtype == pl.Int64
    assert got.to_list() == [cases[i][1] for i in order]


def test_deepest_at_only_zero_length_intervals() -> None:
    zero = INTERVALS.with_columns(end_ns=pl.col("ts_ns"))
    got = deepest_at(zero, pl.DataFrame({"pid": [1], "tid": [1], "ts_ns": [10]}))
    assert got.to_list() == [None]
