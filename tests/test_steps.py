"""Step windows: CPU ProfilerStep#N extended to GPU work, flags, stats, assign_steps."""

from __future__ import annotations

import polars as pl
import pytest
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._steps import assign_steps


def _steps(t: Trace):
    return run_analyses(t.model(), only=("steps",), strict=True)["steps"]


def test_no_steps_gives_one_whole_trace_window():
    t = Trace()
    t.op("aten::mm", 10, 5)
    t.launch(12, 2, 20, 30)
    r = _steps(t)
    assert not r.has_steps and r.n_windows == 1
    row = r.table.row(0, named=True)
    assert (row["start_ns"], row["end_ns"], row["step"]) == (ns(10), ns(50), None)
    assert r.to_json()["n_steps"] == 0


def test_windows_extend_to_gpu_tail_and_stay_disjoint():
    t = Trace()
    t.step(1, 0, 100)
    t.launch(10, 5, 20, 150)  # runs until 170, past the CPU end (100) and into step 2
    t.step(2, 100, 100)
    t.launch(110, 5, 170, 10)  # queued behind: 170..180
    t.step(3, 200, 100)
    t.launch(210, 5, 215, 10)
    r = _steps(t)
    assert r.table["step"].to_list() == [1, 2, 3]  # GPU-side duplicates are not steps
    assert r.table["start_ns"].to_list() == [0, ns(170), ns(200)]
    assert r.table["end_ns"].to_list() == [ns(170), ns(200), ns(300)]
    assert r.table["gpu_tail_ns"].to_list() == [ns(70), 0, 0]
    assert r.table["launches"].to_list() == [1, 1, 1]
    assert r.window_ns == ns(300)


def test_warmup_and_truncated_last_step_flagged_and_excluded_from_stats():
    t = Trace()
    durs = [500, 100, 110, 90, 100, 20]
    start = 0
    for i, d in enumerate(durs):
        t.step(i, start, d)
        if i < len(durs) - 1:  # the last step launches nothing: truncated
            t.launch(start + 1, 2, start + 5, 5)
        start += d
    r = _steps(t)
    assert r.warmup_steps == (0,)
    assert r.truncated_step == 5
    assert r.stats["count"] == 4 and r.stats["steps"] == [1, 2, 3, 4]
    assert r.stats["median"] == pytest.approx(ns(100))
    assert r.stats["mean"] == pytest.approx(ns(100))
    assert r.stats["max"] == ns(110) and r.stats["min"] == ns(90)
    assert r.stats_all["count"] == 6
    assert r.steady_windows() == [1, 2, 3, 4]


def test_no_flags_on_regular_steps():
    t = Trace()
    for i in range(4):
        t.step(i, i * 100, 100)
        t.launch(i * 100 + 1, 2, i * 100 + 5, 5)
    r = _steps(t)
    assert r.warmup_steps == () and r.truncated_step is None


def test_assign_steps_as_of_join():
    t = Trace()
    t.step(7, 0, 100)
    t.step(8, 100, 100)
    r = _steps(t)
    df = pl.DataFrame({"ts_ns": [ns(-5), 0, ns(99.999), ns(100), ns(250)]})
    out = assign_steps(df, r)
    assert out["step"].to_list() == [None, 7, 7, 8, None]
    assert out["window"].to_list() == [None, 0, 0, 1, None]


def test_assign_window_edges_nulls_and_zero_length_windows():
    from traceanalyzer.analyses._intervals import assign_window

    windows = pl.DataFrame({"window": [0, 1, 2, 3], "start_ns": [10, 20, 20, 40], "end_ns": [20, 20, 30, 50]})
    df = pl.DataFrame({"ts_ns": [None, 5, 10, 19, 20, 29, 30, 45, 60]}, schema={"ts_ns": pl.Int64})
    got = assign_window(df, windows)  # half-open windows; [20,20) holds nothing
    assert got["window"].to_list() == [None, None, 0, 0, 2, 2, None, 3, None]
    assert got.columns == ["ts_ns", "window"]
