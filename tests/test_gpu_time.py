"""GPU busy/idle breakdown (union, precedence) and the tb_plugin exclusive step breakdown."""

from __future__ import annotations

import pytest
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses


def _scenario(with_steps: bool = False) -> Trace:
    t = Trace()
    if with_steps:
        t.step(1, 0, 80)
        t.step(2, 80, 220)
    t.op("aten::train_loop", 0, 300)
    t.ann("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 200, 50)
    t.launch(1, 2, 10, 40, name="gemm", stream=7)  # compute 10..50
    t.launch(4, 2, 30, 40, name="gemm", stream=8)  # compute 30..70 (overlaps: counted once)
    t.launch(7, 2, 60, 40, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             stream=9)  # comm 60..100, exposed 70..100
    t.launch(10, 2, 90, 30, name="Memcpy DtoD (Device -> Device)", api="cudaMemcpyAsync",
             activity="memcpy")  # memcpy 90..120, exposed 100..120
    t.launch(13, 2, 115, 10, name="Memset (Device)", api="cudaMemsetAsync", activity="memset")  # 120..125
    return t


def test_device_breakdown_union_with_precedence():
    r = run_analyses(_scenario().model(), only=("gpu_time",), strict=True)["gpu_time"]
    row = r.per_device.row(0, named=True)
    assert row["device"] == 0
    assert row["window_ns"] == ns(300)
    assert row["compute_ns"] == ns(60)
    assert row["communication_ns"] == ns(30)
    assert row["memcpy_ns"] == ns(20)
    assert row["memset_ns"] == ns(5)
    assert row["busy_ns"] == ns(115)
    assert row["idle_ns"] == ns(185)
    assert row["busy_pct"] == pytest.approx(115 / 300 * 100, abs=1e-3)
    span = r.gpu_span.row(0, named=True)
    assert (span["span_ns"], span["busy_ns"], span["compute_ns"], span["non_compute_ns"], span["idle_ns"]) == (
        ns(115), ns(115), ns(60), ns(55), 0)


def test_tb_plugin_breakdown_adds_up_with_priority():
    r = run_analyses(_scenario().model(), only=("gpu_time",), strict=True)["gpu_time"]
    row = r.tb_breakdown.row(0, named=True)
    assert row["kernel_ns"] == ns(60)
    assert row["memcpy_ns"] == ns(30)  # memcpy 90..120 minus kernels (<70)
    assert row["memset_ns"] == ns(5)
    assert row["communication_ns"] == ns(20)  # 70..90
    assert row["runtime_ns"] == ns(6)  # the three launch calls before the first kernel
    assert row["dataloader_ns"] == ns(50)
    assert row["cpu_exec_ns"] == ns(300 - 60 - 30 - 5 - 20 - 6 - 50)
    assert row["other_ns"] == 0
    parts = [row[c] for c in row if c.endswith("_ns") and c != "total_ns"]
    assert sum(parts) == row["total_ns"] == ns(300)


def test_per_step_rows_sum_to_device_totals():
    r = run_analyses(_scenario(with_steps=True).model(), only=("gpu_time",), strict=True)["gpu_time"]
    ps = r.per_step
    assert ps["step"].to_list() == [1, 2]
    # Everything was launched inside step 1, whose window extends to the end of that
    # work (125) although its CPU range ends at 80; step 2 starts there.
    assert ps["dur_ns"].to_list() == [ns(125), ns(175)]
    assert ps["compute_ns"].to_list() == [ns(60), 0]
    assert ps["communication_ns"].to_list() == [ns(30), 0]
    assert ps["idle_ns"].to_list() == [ns(10), ns(175)]
    dev = r.per_device.row(0, named=True)
    for c in ("busy_ns", "compute_ns", "communication_ns", "memcpy_ns", "memset_ns", "idle_ns"):
        assert ps[c].sum() == dev[c]
    assert r.tb_breakdown["total_ns"].to_list() == [ns(125), ns(175)]


def test_cpu_only_trace_is_not_applicable():
    t = Trace()
    t.op("aten::mm", 0, 10)
    res = run_analyses(t.model(), only=("gpu_time", "idle_gaps", "kernels", "launches"))
    for name in ("gpu_time", "idle_gaps", "kernels", "launches"):
        assert name in res.skipped, name
    assert "no GPU activity" in res.skipped["gpu_time"]


def test_exclusive_breakdown_sweep_and_unions_agree_with_hand_truth():
    """Per device (sweep over boundaries) and without groups (level-by-level unions), and the
    unions for overlapping windows: the same hand-computed numbers."""
    import polars as pl

    from traceanalyzer.analyses._gputime import exclusive_breakdown

    a = pl.DataFrame({"device": [0, 0, 1], "ts_ns": [0, 12, 3], "end_ns": [10, 12, 4]})  # [0,10), zero-length, [3,4)
    b = pl.DataFrame({"device": [0, 0], "ts_ns": [5, 16], "end_ns": [15, 18]})  # under a until 10
    windows = pl.DataFrame({"window": [0, 1], "start_ns": [0, 8], "end_ns": [8, 20]})
    got = exclusive_breakdown([("a", a), ("b", b)], windows, ["device"], "rest")
    assert got.to_dicts() == [
        {"device": 0, "window": 0, "a_ns": 8, "b_ns": 0, "rest_ns": 0},
        {"device": 0, "window": 1, "a_ns": 2, "b_ns": 7, "rest_ns": 3},
        {"device": 1, "window": 0, "a_ns": 1, "b_ns": 0, "rest_ns": 7},
        {"device": 1, "window": 1, "a_ns": 0, "b_ns": 0, "rest_ns": 12},
    ]
    flat = exclusive_breakdown([("a", a.drop("device")), ("b", b.drop("device"))], windows, [], "rest")
    assert flat.to_dicts() == [{"window": 0, "a_ns": 8, "b_ns": 0, "rest_ns": 0},
                               {"window": 1, "a_ns": 2, "b_ns": 7, "rest_ns": 3}]
    overlapping = pl.DataFrame({"window": [0, 1], "start_ns": [0, 5], "end_ns": [8, 20]})
    got = exclusive_breakdown([("a", a), ("b", b)], overlapping, ["device"], "rest").filter(pl.col("device") == 0)
    assert got.select("a_ns", "b_ns", "rest_ns").rows() == [(8, 0, 0), (5, 7, 3)]


def test_merge_intervals_touching_nested_zero_length_and_negative():
    import polars as pl

    from traceanalyzer.timeutil import merge_intervals

    df = pl.DataFrame({"device": [0, 0, 0, 0, 1, 1], "ts_ns": [10, 0, 5, 30, 7, 20], "end_ns": [20, 10, 8, 30, 9, 25]})
    got = merge_intervals(df, by=["device"])  # touching [0,10)+[10,20) merge; [30,30) kept, isolated
    assert got.rows() == [(0, 0, 20), (0, 30, 30), (1, 7, 9), (1, 20, 25)]
    # A negative length takes the general path: [50, 40) ends before 52 starts, so 52 opens
    # a new union, as it always did.
    neg = pl.DataFrame({"ts_ns": [0, 50, 52], "end_ns": [10, 40, 60]})
    assert merge_intervals(neg).rows() == [(0, 10), (50, 40), (52, 60)]


def test_merge_intervals_groups_do_not_carry_into_each_other():
    """Per-group unions by one running maximum over offset times: a long interval of one
    group must not swallow the next group's intervals (random cases against a plain sweep)."""
    import random

    import polars as pl

    from traceanalyzer.timeutil import merge_intervals

    def sweep(rows: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        for key in sorted({(p, t) for p, t, _, _ in rows}):
            ivs = sorted((s, e) for p, t, s, e in rows if (p, t) == key)
            cur = list(ivs[0])
            for s, e in ivs[1:]:
                if s > cur[1]:
                    out.append((*key, cur[0], cur[1]))
                    cur = [s, e]
                else:
                    cur[1] = max(cur[1], e)
            out.append((*key, cur[0], cur[1]))
        return out

    rng = random.Random(7)
    for _ in range(30):
        rows = []
        for _ in range(rng.randint(1, 40)):
            s = rng.randint(0, 100)
            rows.append((rng.choice([1, 2]), rng.choice([5, 9, 11]), s, s + rng.choice([0, 1, 3, 10, 90])))
        df = pl.DataFrame(rows, schema=["pid", "tid", "ts_ns", "end_ns"], orient="row")
        assert merge_intervals(df, by=["pid", "tid"]).rows() == sweep(rows)
        assert merge_intervals(df.with_columns(pid=pl.lit(0), tid=pl.lit(0)), by=["pid", "tid"]).rows() == sweep(
            [(0, 0, s, e) for _, _, s, e in rows]
        )
        assert merge_intervals(df).rows() == [(s, e) for _, _, s, e in sweep([(0, 0, s, e) for _, _, s, e in rows])]


def test_covered_before_and_within_match_a_brute_force_count():
    """Covered length of a union before a point / inside a span, per group, on random data."""
    import random

    import polars as pl

    from traceanalyzer.analyses._intervals import covered_before, covered_within
    from traceanalyzer.timeutil import merge_intervals

    rng = random.Random(11)
    for _ in range(20):
        rows = [(rng.choice([0, 1]), s, s + rng.choice([0, 1, 4, 15])) for s in (rng.randint(0, 60) for _ in range(25))]
        df = pl.DataFrame(rows, schema=["device", "ts_ns", "end_ns"], orient="row")
        merged = merge_intervals(df, by=["device"])
        covered = {d: {t for dd, s, e in rows if dd == d for t in range(s, e)} for d in (0, 1, 2)}
        pts = [(rng.choice([0, 1, 2]), rng.randint(-3, 80)) for _ in range(40)]
        got = covered_before(merged, pl.DataFrame(pts, schema=["device", "t"], orient="row"), ["device"],
                             presorted=True)
        assert got.to_list() == [sum(1 for x in covered[d] if x < t) for d, t in pts]
        spans = [(d, a, a + rng.randint(0, 30)) for d, a in pts]
        got = covered_within(merged, pl.DataFrame(spans, schema=["device", "start_ns", "end_ns"], orient="row"),
                             ["device"])
        assert got.to_list() == [sum(1 for x in covered[d] if a <= x < b) for d, a, b in spans]


def test_exclusive_breakdown_sweep_and_unions_match_a_brute_force_count():
    """Each instant of a window goes to the first level covering it: random levels per device,
    disjoint windows (the sweep) and the same windows taken as overlapping (the unions)."""
    import random

    import polars as pl

    from traceanalyzer.analyses import _gputime
    from traceanalyzer.analyses._gputime import exclusive_breakdown

    rng = random.Random(5)
    for _ in range(15):
        levels = []
        for name in ("a", "b", "c"):
            rows = [(rng.choice([0, 1]), s, s + rng.choice([0, 1, 3, 8, 25])) for s in
                    (rng.randint(-5, 70) for _ in range(rng.randint(0, 12)))]
            levels.append((name, pl.DataFrame(rows, schema={"device": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64},
                                              orient="row")))
        edges = sorted(rng.sample(range(0, 70), 4))
        windows = pl.DataFrame({"window": [0, 1], "start_ns": [edges[0], edges[2]], "end_ns": [edges[1], edges[3]]})
        devices = sorted({d for _, df in levels for d in df["device"].to_list()})
        want = []
        for d in devices:
            for w, lo, hi in windows.rows():
                counts = {n: 0 for n, _ in levels} | {"rest": 0}
                for t in range(lo, hi):
                    owner = next((n for n, df in levels
                                  if any(dd == d and s <= t < e for dd, s, e in df.rows())), "rest")
                    counts[owner] += 1
                want.append({"device": d, "window": w, **{f"{k}_ns": v for k, v in counts.items()}})
        got = exclusive_breakdown(levels, windows, ["device"], "rest").to_dicts()
        assert got == want
        # the polars sweep (the numpy one's fallback, where a group or time is null), forced
        fast = _gputime._exclusive_sweep_np
        _gputime._exclusive_sweep_np = lambda *_: None  # type: ignore[assignment]
        try:
            assert exclusive_breakdown(levels, windows, ["device"], "rest").to_dicts() == want
        finally:
            _gputime._exclusive_sweep_np = fast
        unions = _gputime._exclusive_by_unions  # the general path, forced
        grid = pl.DataFrame({"device": devices}).join(windows, how="cross")
        forced = unions(levels, ["device"], grid).with_columns(
            rest_ns=pl.col("end_ns") - pl.col("start_ns") - pl.col("a_ns") - pl.col("b_ns") - pl.col("c_ns")
        ).select("device", "window", "a_ns", "b_ns", "c_ns", "rest_ns").sort("device", "window").to_dicts()
        assert forced == want


def test_assign_steps_and_window_union_lengths_match_brute_force():
    """assign_steps: the disjoint window holding each time (half-open, unsorted windows, null
    times); window_union_lengths: the union's length inside each window (windows may overlap)."""
    import random

    import polars as pl

    from traceanalyzer.analyses._intervals import window_union_lengths
    from traceanalyzer.analyses._steps import assign_steps

    rng = random.Random(21)
    for _ in range(20):
        edges = sorted(rng.sample(range(0, 100), 6))
        win = [(i, 10 + i, edges[2 * i], edges[2 * i + 1]) for i in range(3)]
        rng.shuffle(win)
        windows = pl.DataFrame(win, schema=["window", "step", "start_ns", "end_ns"], orient="row")
        ts = [rng.choice([None, *edges, rng.randint(-5, 105)]) for _ in range(50)]
        got = assign_steps(pl.DataFrame({"ts_ns": ts}, schema={"ts_ns": pl.Int64}), windows)
        want = [next(((w, s) for w, s, a, b in win if t is not None and a <= t < b), (None, None)) for t in ts]
        assert list(zip(got["window"].to_list(), got["step"].to_list())) == want

        rows = [
            (rng.choice([0, 1]), s, s + rng.choice([0, 2, 7, 30])) for s in (rng.randint(-10, 100) for _ in range(15))
        ]
        act = pl.DataFrame(rows, schema=["device", "ts_ns", "end_ns"], orient="row")
        over = pl.DataFrame({"window": [0, 1], "start_ns": [edges[0], edges[1]], "end_ns": [edges[4], edges[5]]})
        got = window_union_lengths(act, over, ["device"]).sort("device", "window")
        want = [(d, w, sum(1 for t in range(a, b) if any(dd == d and s <= t < e for dd, s, e in rows)))
                for d in sorted({r[0] for r in rows}) for w, a, b in over.rows()]
        assert got.rows() == want


def test_asof_rows_matches_the_asof_join() -> None:
    """asof_rows (numpy search) = join_asof by group, backward and forward, on unique times per
    group; None where a group repeats a time."""
    import random

    import polars as pl

    from traceanalyzer.analyses._intervals import asof_rows

    rng = random.Random(9)
    for _ in range(60):
        n, m = rng.randint(1, 30), rng.randint(1, 30)
        table = pl.DataFrame({"g": [rng.randint(0, 2) for _ in range(n)], "t": rng.sample(range(0, 200), n)}
                             ).with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
        pts = pl.DataFrame({"g": [rng.randint(0, 3) for _ in range(m)], "p": [rng.randint(-5, 205) for _ in range(m)]})
        for forward in (False, True):
            want = pts.with_row_index("_i").sort("p").join_asof(
                table.sort("t"), left_on="p", right_on="t", by="g", strategy="forward" if forward else "backward",
                check_sortedness=False,
            ).sort("_i")["row"]
            got = asof_rows(pts, table, ["g"], "p", "t", forward=forward)
            assert got is not None and got.to_list() == want.to_list()
    tied = pl.DataFrame({"g": [0, 0], "t": [5, 5]})
    assert asof_rows(pl.DataFrame({"g": [0], "p": [6]}), tied, ["g"], "p", "t") is None
