"""contains_by_name: the per-row regex's values, from one pass over each frame's distinct names."""

from __future__ import annotations

import gc

import polars as pl

from traceanalyzer.analyses import _names


def _frame(n: int) -> pl.DataFrame:
    names = ["aten::mm", "aten::add", None, "ncclKernel_AllReduce", "aten::addmm"]
    return pl.DataFrame({"name": [names[i % len(names)] for i in range(n)], "x": list(range(n))})


def test_same_values_as_the_row_regex_on_big_and_small_frames() -> None:
    for n in (10, 5000):
        df = _frame(n)
        for pattern in (r"^aten::(mm|addmm)$", "nccl", "^aten::"):
            got = df.select(_names.contains_by_name(df, pattern)).to_series()
            want = df.select(pl.col("name").str.contains(pattern)).to_series()
            assert got.to_list() == want.to_list()
        assert df.filter(_names.contains_by_name(df, r"^aten::(mm|addmm)$")).height == 2 * n // 5


def test_one_distinct_pass_per_frame_and_forgotten_with_it() -> None:
    df = _frame(5000)
    _names.contains_by_name(df, "mm")
    _names.contains_by_name(df, "nccl")
    key = (id(df), "name")
    assert set(_names._SEEN[key][2]) == {"mm", "nccl"}
    assert sorted(_names._SEEN[key][2]["mm"].to_list()) == ["aten::addmm", "aten::mm"]
    other = _frame(6000)  # another frame: its own distinct names
    assert other.filter(_names.contains_by_name(other, "nccl")).height == 1200
    del df
    gc.collect()
    assert key not in _names._SEEN
