"""Interval helpers shared by the GPU timeline analyses (steps, gpu_time, idle_gaps, launches).

Private to the analyses package (the leading underscore keeps :func:`discover` from
treating it as an analysis). Everything here is vectorised polars: sorts and as-of
joins, never a Python loop over events.

The central trick is :func:`covered_before`: for a set of disjoint sorted intervals
(the output of :func:`traceanalyzer.timeutil.merge_intervals`) it returns, for any
point ``t``, the covered length in ``(-inf, t)``. The covered length inside any
window ``[a, b)`` is then ``covered_before(b) - covered_before(a)``, which gives
per-step, per-device union lengths with two as-of joins however many steps there are.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceanalyzer.analyses._comm import COMM_KERNEL_RE as _COMM_KERNEL_RE
from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, gpu_activity, trace_tables
from traceanalyzer.timeutil import merge_intervals

# Kernel names of communication libraries (NCCL, RCCL, MSCCL/MSCCL++, HCCL, NVSHMEM, DeepEP,
# vLLM/SGLang/TRT-LLM custom all-reduce, symmetric memory, userbuffers): see _comm.py, which
# also recognises communication by metadata and launching op (comm_classes). HTA also treats
# every name starting with "hip" as communication; we do not (hipMemcpy-like kernels are not comms).
COMM_KERNEL_RE = _COMM_KERNEL_RE

# Runtime/driver calls that block the calling thread until device work finishes.
# MTIA's host call is ``synchronizeStream``; its ``synchronize`` twin (same correlation, on
# the device's pid) is the driver side, not a host wait, hence the anchors.
SYNC_API_RE = (
    r"Synchronize|^urQueueFinish$|^urEventWait$|^zeCommandQueueSynchronize$|^zeEventHostSynchronize$"
    r"|^synchronizeStream$"
)
# Runtime/driver calls that copy memory (blocking or not).
MEMCPY_API_RE = r"(?i)memcpy|^urEnqueueMemBuffer(Read|Write|Copy)"
# CPU ranges of the PyTorch data loader.
DATALOADER_RE = r"^enumerate\((DataLoader|DataPipe)\)#"
# CPU ranges of torch.optim (the profiler records ``Optimizer.step#SGD.step`` …).
OPTIMIZER_STEP_RE = r"^Optimizer\.step#"
OPTIMIZER_ZERO_RE = r"^Optimizer\.zero_grad#"
# Fused optimizer ops (torch.optim ``fused=True``) and multi-tensor ops (``foreach=True``).
FUSED_OPTIMIZER_RE = r"^aten::_fused_(adam|adamw|sgd|adagrad)"
FOREACH_PREFIX = "aten::_foreach_"


def covered_before(
    merged: pl.DataFrame,
    points: pl.DataFrame,
    by: Sequence[str] = (),
    point_col: str = "t",
    presorted: bool = False,
) -> pl.Series:
    """Covered length of disjoint intervals ``merged`` in ``(-inf, t)`` for each point.

    ``merged``: ``*by, start_ns, end_ns`` (disjoint per group, any order, or sorted by
    ``(*by, start_ns)`` when ``presorted``, as :func:`merge_intervals` returns them);
    ``points``: ``*by, point_col``. Returns an Int64 series aligned with ``points``.
    """
    by = list(by)
    if points.is_empty():
        return pl.Series("covered", [], dtype=pl.Int64)
    if merged.is_empty():
        return pl.Series("covered", [0] * points.height, dtype=pl.Int64)
    fast = _covered_before_np(merged, points, by, point_col)
    if fast is not None:
        return fast
    length = pl.col("end_ns") - pl.col("start_ns")
    cum = length.cum_sum().over(by) if by else length.cum_sum()
    m = (merged if presorted else merged.sort([*by, "start_ns"])).with_columns(_before=cum - length)
    casts = [pl.col(c).cast(m.schema[c]) for c in by]
    p = points.select([*casts, pl.col(point_col).alias("_t")]).with_row_index("_row")
    j = (
        p.sort("_t")
        .join_asof(
            m.select([*by, "start_ns", "end_ns", "_before"]),
            left_on="_t",
            right_on="start_ns",
            by=by or None,
            strategy="backward",
            check_sortedness=False,
        )
        .sort("_row")
    )
    inside = (pl.min_horizontal(pl.col("_t"), pl.col("end_ns")) - pl.col("start_ns")).clip(lower_bound=0)
    return j.select((pl.col("_before") + inside).fill_null(0).cast(pl.Int64).alias("covered"))["covered"]


def _covered_before_np(merged: pl.DataFrame, points: pl.DataFrame, by: list[str], point_col: str) -> pl.Series | None:
    """:func:`covered_before` by numpy binary search: the groups of ``merged`` and
    ``points`` numbered together (:func:`~traceanalyzer.timeutil.group_codes`), each
    interval start and each point keyed ``group · span + (t − t_min)``, the last start at or
    before each point found by one ``searchsorted`` (no sort of the points, no as-of join,
    no sort back). None (the caller joins) where a time or group is null, a column is not
    an Int64 / integer, or the key would overflow."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    from traceanalyzer.timeutil import group_codes

    t_col, s_col, e_col = points[point_col], merged["start_ns"], merged["end_ns"]
    if not (t_col.dtype == s_col.dtype == e_col.dtype == pl.Int64) or (
        t_col.null_count() or s_col.null_count() or e_col.null_count()
    ):
        return None
    n_m = merged.height
    if by:
        if any(merged.schema[c] != points.schema[c] for c in by):
            return None
        coded = group_codes(pl.concat([merged.select(by), points.select(by)]), by)
        if coded is None:
            return None
        codes, n_groups = coded
        g_m, g_p = codes[:n_m], codes[n_m:]
    else:
        g_m, g_p, n_groups = np.zeros(n_m, dtype=np.int64), np.zeros(points.height, dtype=np.int64), 1
    start, end, t = s_col.to_numpy(), e_col.to_numpy(), t_col.to_numpy()
    lo = min(int(start.min()), int(t.min()))
    span = max(int(start.max()), int(t.max())) - lo + 1
    if n_groups * span >= 2**62:
        return None
    key_m = g_m * span + (start - lo)
    order = None if bool(np.all(key_m[1:] >= key_m[:-1])) else np.argsort(key_m, kind="stable")
    if order is not None:
        key_m, g_m, start, end = key_m[order], g_m[order], start[order], end[order]
    length = end - start
    before = np.cumsum(length) - length
    if by and n_m:
        # Per group: subtract what the earlier groups hold (their first row's running sum).
        first = np.ones(n_m, dtype=bool)
        first[1:] = g_m[1:] != g_m[:-1]
        before = before - before[np.maximum.accumulate(np.where(first, np.arange(n_m), 0))]
    pos = np.searchsorted(key_m, g_p * span + (t - lo), side="right") - 1
    at = np.clip(pos, 0, None)
    found = (pos >= 0) & (g_m[at] == g_p)
    inside = np.clip(np.minimum(t, end[at]) - start[at], 0, None)
    return pl.Series("covered", np.where(found, before[at] + inside, 0), dtype=pl.Int64)


def asof_rows(
    points: pl.DataFrame, table: pl.DataFrame, by: Sequence[str], point_col: str, table_col: str,
    forward: bool = False,
) -> pl.Series | None:
    """For each row of ``points``, the row number of ``table`` with the same ``by`` values whose
    ``table_col`` is the last at or before the point's ``point_col`` (``forward``: the first at
    or after it); null where none. An as-of join by ``by`` as a row index, by numpy binary
    search: the groups of both frames numbered together
    (:func:`~traceanalyzer.timeutil.group_codes`), each time keyed ``group · span + (t −
    t_min)``, one ``searchsorted`` (no sort of the points, no join, no sort back).

    None (the caller joins) where a group or time is null or not an integer, the key would
    overflow, or two rows of ``table`` share a group and a time (which of them an as-of join
    takes is its own choice)."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    from traceanalyzer.timeutil import group_codes

    by = list(by)
    t_p, t_t = points[point_col], table[table_col]
    if points.is_empty() or table.is_empty() or any(c.null_count() or not c.dtype.is_integer() for c in (t_p, t_t)):
        return None
    coded = group_codes(pl.concat([table.select(pl.col(by).cast(pl.Int64)), points.select(pl.col(by).cast(pl.Int64))]),
                        by)
    if coded is None:
        return None
    codes, n_groups = coded
    tt, tp = t_t.cast(pl.Int64).to_numpy(), t_p.cast(pl.Int64).to_numpy()
    lo = min(int(tt.min()), int(tp.min()))
    span = max(int(tt.max()), int(tp.max())) - lo + 1
    if n_groups * span >= 2**62:
        return None
    n = table.height
    g_t, g_p = codes[:n], codes[n:]
    key = g_t * span + (tt - lo)
    order = np.argsort(key, kind="stable")
    key = key[order]
    if bool((key[1:] == key[:-1]).any()):
        return None
    q = g_p * span + (tp - lo)
    if forward:
        pos = np.searchsorted(key, q, side="left")
        ok = pos < n
    else:
        pos = np.searchsorted(key, q, side="right") - 1
        ok = pos >= 0
    at = order[np.clip(pos, 0, n - 1)]
    found = ok & (g_t[at] == g_p)
    return pl.select(pl.when(pl.lit(pl.Series(found))).then(pl.lit(pl.Series(at, dtype=pl.Int64)))).to_series()


def window_union_lengths(
    activity: pl.DataFrame,
    windows: pl.DataFrame,
    by: Sequence[str] = (),
    start: str = "ts_ns",
    end: str = "end_ns",
) -> pl.DataFrame:
    """Length of the union of ``activity`` intervals inside each window, per group.

    ``windows``: ``window, start_ns, end_ns`` (disjoint or not, each counted alone).
    Returns ``*by, window, length_ns`` for every (group present in ``activity``) × window.
    """
    by = list(by)
    if activity.is_empty() or windows.is_empty():
        return pl.DataFrame(
            schema={**{b: activity.schema[b] for b in by}, "window": pl.Int64, "length_ns": pl.Int64}
        )
    merged = merge_intervals(activity.filter(pl.col(end) > pl.col(start)), start, end, by)
    groups = activity.select(by).unique() if by else pl.DataFrame({"_g": [0]})
    grid = groups.join(windows.select("window", "start_ns", "end_ns"), how="cross")
    out = grid.with_columns(length_ns=covered_within(merged, grid, by))
    return out.select([*by, "window", "length_ns"])


def covered_within(merged: pl.DataFrame, spans: pl.DataFrame, by: Sequence[str] = ()) -> pl.Series:
    """Covered length of ``merged`` (the output of :func:`merge_intervals`, sorted) inside
    each row ``[start_ns, end_ns)`` of ``spans`` (``*by, start_ns, end_ns``), aligned with
    ``spans``: one :func:`covered_before` pass over both ends."""
    by = list(by)
    n = spans.height
    pts = pl.concat([spans.select([*by, pl.col("start_ns").alias("t")]),
                     spans.select([*by, pl.col("end_ns").alias("t")])])
    c = covered_before(merged, pts, by, presorted=True)
    return (c.slice(n, n) - c.slice(0, n)).alias("covered")


def assign_window(
    df: pl.DataFrame,
    windows: pl.DataFrame,
    ts_col: str = "ts_ns",
    out_col: str = "window",
    carry: Sequence[str] = (),
) -> pl.DataFrame:
    """Add ``out_col``: the index of the window ``[start_ns, end_ns)`` containing ``ts_col``,
    and the ``carry`` columns of that window (``step`` …).

    ``windows`` must be disjoint; rows outside every window get null.
    """
    carry = list(carry)
    if df.is_empty() or windows.is_empty():
        return df.with_columns(pl.lit(None, dtype=pl.Int64).alias(out_col),
                               *[pl.lit(None, windows.schema[c]).alias(c) for c in carry])
    w = windows.select("window", *carry, "start_ns", "end_ns").sort("start_ns", maintain_order=True)
    t = df[ts_col]
    # Below a few thousand rows the fixed cost of the numpy route outweighs its gain.
    if df.height >= 4096 and t.dtype == w.schema["start_ns"] == w.schema["end_ns"] == pl.Int64 and not (
        w["start_ns"].null_count() or w["end_ns"].null_count()
    ):
        return df.with_columns(_window_rows(t, w, out_col, carry))
    # The last window starting at or before t, by binary search on the (few) window
    # starts: no sort of the rows and no join (as an as-of join, backward, would).
    tc = pl.col(ts_col)
    pos = pl.lit(w["start_ns"]).search_sorted(tc, side="right").cast(pl.Int64) - 1
    at = pos.clip(lower_bound=0)
    inside = tc.is_not_null() & (pos >= 0) & (tc < pl.lit(w["end_ns"]).gather(at))
    return df.with_columns(
        pl.when(inside).then(pl.lit(w["window"]).gather(at)).otherwise(None).cast(pl.Int64).alias(out_col),
        *[pl.when(inside).then(pl.lit(w[c]).gather(at)).otherwise(None).cast(w.schema[c]).alias(c) for c in carry],
    )


def _window_rows(t: pl.Series, w: pl.DataFrame, out_col: str, carry: list[str]) -> list[pl.Series]:
    """:func:`assign_window`'s columns for Int64 times ``t`` and windows ``w`` sorted by
    start (no nulls): the window row of each time by one numpy binary search (several
    times faster than polars' on a few window starts), then one gather per column."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    tn = t.fill_null(0).to_numpy()
    starts, ends = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
    pos = np.searchsorted(starts, tn, side="right") - 1
    at = np.clip(pos, 0, None)
    inside = (pos >= 0) & (tn < ends[at])
    if t.null_count():
        inside &= t.is_not_null().to_numpy()
    rows = pl.Series(np.where(inside, at, 0), dtype=pl.Int64)
    if not inside.all():
        rows = pl.select(pl.when(pl.lit(pl.Series(inside))).then(pl.lit(rows))).to_series()
    return [
        w["window"].gather(rows).cast(pl.Int64).alias(out_col),
        *[w[c].gather(rows).cast(w.schema[c]).alias(c) for c in carry],
    ]


def is_comm_kernel(name: pl.Expr, comm_name: pl.Expr | None = None) -> pl.Expr:
    """True for communication kernels by name family or carrying collective args (the signals
    a kernel row has on its own; :func:`~traceanalyzer.analyses._comm.comm_classes` adds the
    launching CPU op and is what the analyses use)."""
    expr = name.str.contains(COMM_KERNEL_RE)
    if comm_name is not None:
        expr = expr | comm_name.is_not_null()
    return expr.fill_null(False)


def gpu_activity_classes(src: TraceModel | TraceTables) -> pl.DataFrame:
    """All device activity with a ``category`` column: compute / communication / memcpy / memset
    (communication: :func:`~traceanalyzer.analyses._comm.comm_classes`).

    Columns: ``name, ts_ns, dur_ns, end_ns, device, stream, correlation, external_id,
    activity, category``. Built once per run (read-only).
    """
    t = trace_tables(src)
    return t.get("gpu_activity_classes", lambda: _gpu_activity_classes(t))


def device_union(src: TraceModel | TraceTables) -> pl.DataFrame:
    """:func:`~traceanalyzer.timeutil.merge_intervals` of every GPU activity with a device,
    per ``device`` (built once per run; gpu_time, idle_gaps and syncs need it)."""
    t = trace_tables(src)
    return t.get(
        "device_union",
        lambda: merge_intervals(gpu_activity(t).filter(pl.col("device").is_not_null()), by=["device"]),
    )


def _gpu_activity_classes(t: TraceTables) -> pl.DataFrame:
    k = t.model.kernels
    gpu = gpu_activity(t)
    comm = comm_classes(t)["is_comm"] if k.height else pl.Series("c", [], dtype=pl.Boolean)
    # gpu_activity() concatenates kernels first, in their order: align the flag.
    flag = pl.concat([comm, pl.Series([False] * (gpu.height - k.height), dtype=pl.Boolean)])
    return gpu.with_columns(
        category=pl.when(pl.col("activity") != "kernel")
        .then(pl.col("activity"))
        .when(flag)
        .then(pl.lit("communication"))
        .otherwise(pl.lit("compute"))
    )


def mean_of(s: pl.Series) -> float | None:
    """The mean of a numeric series as a float (None when it has no non-null value)."""
    m = s.mean()
    return float(m) if isinstance(m, (int, float)) else None


def pct(part: float | int | None, whole: float | int | None) -> float | None:
    """``part`` as a percentage of ``whole`` (3 decimals), None when either is missing or whole is 0."""
    return round(float(part) * 100.0 / float(whole), 3) if part is not None and whole else None


def dist_stats(s: pl.Series) -> dict[str, float | int | None]:
    """count, mean, median, p95, std, min, max of an ns series (ints where exact)."""
    s = s.drop_nulls()
    n = s.len()
    if n == 0:
        return {"count": 0, "mean": None, "median": None, "p95": None, "std": None, "min": None, "max": None}
    std = s.std() if n > 1 else 0.0
    return {
        "count": int(n),
        "mean": round(float(s.mean()), 1),  # type: ignore[arg-type]
        "median": round(float(s.median()), 1),  # type: ignore[arg-type]
        "p95": round(float(s.quantile(0.95, "linear")), 1),  # type: ignore[arg-type]
        "std": round(float(std), 1),  # type: ignore[arg-type]
        "min": int(s.min()),  # type: ignore[arg-type]
        "max": int(s.max()),  # type: ignore[arg-type]
    }


def ms(ns: float | int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.3f} ms"


def us(ns: float | int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e3:,.1f} µs"


# Log-spaced duration bins (ns), shared by the gap and kernel histograms.
LOG_BINS_NS: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
SHORT_BINS_NS: tuple[int, ...] = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000)


def _bin_label(lo: int | None, hi: int | None) -> str:
    def f(v: int) -> str:
        return f"{v // 1_000_000} ms" if v >= 1_000_000 else f"{v // 1_000} µs"

    if lo is None:
        return f"< {f(hi)}"  # type: ignore[arg-type]
    if hi is None:
        return f">= {f(lo)}"
    return f"{f(lo)} – {f(hi)}"


def histogram(durations: pl.Series, edges: Sequence[int] = LOG_BINS_NS) -> pl.DataFrame:
    """Count and total of ns ``durations`` per bin ``[edge_i, edge_i+1)``; every bin present."""
    edges = list(edges)
    lows: list[int | None] = [None, *edges]
    highs: list[int | None] = [*edges, None]
    labels = [_bin_label(lo, hi) for lo, hi in zip(lows, highs)]
    d = pl.DataFrame({"d": durations.cast(pl.Int64)}).drop_nulls()
    idx = d.select(
        b=pl.sum_horizontal([(pl.col("d") >= e).cast(pl.Int32) for e in edges]) if edges else pl.lit(0),
        d=pl.col("d"),
    )
    agg = idx.group_by("b").agg(count=pl.len().cast(pl.Int64), total_ns=pl.col("d").sum())
    base = pl.DataFrame(
        {
            "b": list(range(len(labels))),
            "bin": labels,
            "lo_ns": lows,
            "hi_ns": highs,
        },
        schema={"b": pl.Int32, "bin": pl.String, "lo_ns": pl.Int64, "hi_ns": pl.Int64},
    )
    return (
        base.join(agg.with_columns(pl.col("b").cast(pl.Int32)), on="b", how="left")
        .with_columns(pl.col("count").fill_null(0), pl.col("total_ns").fill_null(0))
        .sort("b")
        .drop("b")
    )
