"""Exclusive time breakdowns by precedence (private to the analyses package).

``gpu_time`` (the tb_plugin-style CPU/GPU breakdown) and ``phases`` both attribute every
instant of a window to the first of several interval levels that covers it
(:func:`exclusive_breakdown`).
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.analyses._comm import COMM_OP_RE
from traceanalyzer.analyses._intervals import covered_within
from traceanalyzer.timeutil import group_codes, merge_intervals, sort_within_groups

CPU_COMM_RE = COMM_OP_RE  # CPU ops/annotations of communication (_comm: c10d, nccl:*, symm_mem, DeepEP …)


def exclusive_breakdown(
    levels: list[tuple[str, pl.DataFrame]],
    windows: pl.DataFrame,
    by: list[str],
    rest: str,
) -> pl.DataFrame:
    """Exclusive time per level in precedence order, per group and window.

    ``levels``: (name, frame with ``*by, ts_ns, end_ns``) highest precedence first.
    Returns ``*by, window, <name>_ns…, <rest>_ns`` where ``<rest>`` is the window not
    covered by any level. Groups are those present in any level.
    """
    groups = pl.concat([df.select(by) for _, df in levels]).unique() if by else pl.DataFrame({"_g": [0]})
    grid = groups.join(windows.select("window", "start_ns", "end_ns"), how="cross")
    w = windows.select("start_ns", "end_ns").sort("start_ns")
    disjoint = w.height < 2 or bool((w["start_ns"].slice(1) >= w["end_ns"].slice(0, w.height - 1)).all())
    # Per device, one sweep over every boundary beats a union per level (window functions
    # over the groups); without groups the unions are cheaper (nested CPU ranges merge
    # to few rows). Both give the same numbers.
    if disjoint and levels and by:
        out = _exclusive_sweep(levels, windows, by, grid)
    else:
        out = _exclusive_by_unions(levels, by, grid)
    out = out.with_columns(
        ((pl.col("end_ns") - pl.col("start_ns")) - pl.sum_horizontal([pl.col(f"{n}_ns") for n, _ in levels]))
        .cast(pl.Int64).alias(f"{rest}_ns")
    ) if levels else out.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias(f"{rest}_ns"))
    keep = [*by, "window", *[f"{n}_ns" for n, _ in levels], f"{rest}_ns"]
    return out.select(keep).sort([*by, "window"])


def _exclusive_sweep(
    levels: list[tuple[str, pl.DataFrame]], windows: pl.DataFrame, by: list[str], grid: pl.DataFrame
) -> pl.DataFrame:
    """:func:`exclusive_breakdown` for disjoint windows in one sweep over all boundaries.

    Every interval start (+1) and end (−1) of every level, plus the window edges of each
    group, sorted by (group, t): the running count per level says which levels cover the
    piece [t, next t) of the group, which goes to the first of them; window edges being
    boundaries, a piece lies inside one window or outside all. Same numbers as growing
    the union level by level (each piece of the window is counted once, in the first
    level covering it), with one sort instead of a merge and two searches per level.
    """
    fast = _exclusive_sweep_np(levels, by, grid)
    if fast is not None:
        return fast
    k = len(levels)
    parts = []
    for i, (_, df) in enumerate(levels):
        iv = df.select([*by, "ts_ns", "end_ns"]).filter(pl.col("end_ns") > pl.col("ts_ns"))
        # A null group never matched in the as-of searches of the union version: it counts
        # as uncovered there, and here too.
        iv = iv.drop_nulls(by) if by else iv
        lvl = pl.lit(i, pl.Int32).alias("lvl")
        parts.append(iv.select(*by, pl.col("ts_ns").alias("t"), lvl, pl.lit(1, pl.Int32).alias("d")))
        parts.append(iv.select(*by, pl.col("end_ns").alias("t"), lvl, pl.lit(-1, pl.Int32).alias("d")))
    # Window edges: lvl −1 (start) and −2 (end), d carrying the window index.
    for lvl_code, col in ((-1, "start_ns"), (-2, "end_ns")):
        parts.append(grid.select(*by, pl.col(col).alias("t"), pl.lit(lvl_code, pl.Int32).alias("lvl"),
                                 pl.col("window").cast(pl.Int32).alias("d")))
    schema = parts[0].schema
    b = sort_within_groups(pl.concat([p.cast(schema) for p in parts]), by, "t")
    # Per-level counts: plain running sums are per group (each interval's +1 and −1 are in
    # its group, and groups are contiguous after the sort).
    counts = [pl.when(pl.col("lvl") == i).then(pl.col("d")).otherwise(0).cum_sum() for i in range(k)]
    top = pl.coalesce([pl.when(c > 0).then(pl.lit(i, pl.Int32)) for i, c in enumerate(counts)])
    same_group = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(-1)) for c in by]) if by else pl.lit(True)
    piece = pl.when(same_group).then(pl.col("t").shift(-1) - pl.col("t")).otherwise(0)
    b = b.select(*by, "lvl", "d", top.alias("top"), piece.fill_null(0).alias("len"))
    # Length given to each level before each row (running sums minus the row's own piece);
    # a window's share is the difference between its end and start edges (no piece
    # crosses an edge: edges are boundaries of their group).
    before = [
        (pl.when(pl.col("top") == i).then(pl.col("len")).otherwise(0).cum_sum()
         - pl.when(pl.col("top") == i).then(pl.col("len")).otherwise(0)).alias(f"_c{i}")
        for i in range(k)
    ]
    e = b.with_columns(before).filter(pl.col("lvl") < 0).select(
        *by, pl.col("d").cast(pl.Int64).alias("window"), (pl.col("lvl") == -2).alias("_end"),
        *[f"_c{i}" for i in range(k)],
    )
    keys = [*by, "window"]
    agg = e.group_by(keys).agg(
        (pl.col(f"_c{i}").filter("_end").first() - pl.col(f"_c{i}").filter(~pl.col("_end")).first())
        .cast(pl.Int64).alias(f"{n}_ns")
        for i, (n, _) in enumerate(levels)
    )
    cols = [f"{n}_ns" for n, _ in levels]
    return grid.join(agg, on=keys, how="left", nulls_equal=True).with_columns(pl.col(c).fill_null(0) for c in cols)


def _exclusive_sweep_np(
    levels: list[tuple[str, pl.DataFrame]], by: list[str], grid: pl.DataFrame
) -> pl.DataFrame | None:
    """:func:`_exclusive_sweep` on numpy arrays: the same boundaries and running counts,
    sorted by one key ``group · span + (t − t_min)`` (:func:`group_codes`), and each window's
    share read at its own edge rows (their place in the sorted order), so no group_by and no
    join back. The order of boundaries at one instant does not matter: the pieces between
    them have no length, and the counts after the last of them are the same in any order.
    None (the caller takes the polars route) where a group or time is null, a column is not
    an Int64 / integer, or the key would overflow."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    if grid.is_empty():
        return None
    ivs = [df.select([*by, "ts_ns", "end_ns"]).filter(pl.col("end_ns") > pl.col("ts_ns")) for _, df in levels]
    times = [grid["start_ns"], grid["end_ns"], *[iv[c] for iv in ivs for c in ("ts_ns", "end_ns")]]
    if any(c.dtype != pl.Int64 or c.null_count() for c in times):
        return None
    coded = group_codes(
        pl.concat([grid.select(by), *[iv.select(by).cast({c: grid.schema[c] for c in by}) for iv in ivs]]), by)
    if coded is None:
        return None
    codes, n_groups = coded
    nw = grid.height
    lo = min(int(c.min()) for c in times if c.len())  # type: ignore[arg-type]  # Int64 columns
    hi = max(int(c.max()) for c in times if c.len())  # type: ignore[arg-type]  # as above
    span = hi - lo + 1
    if n_groups * span >= 2**62:
        return None
    # Rows: window starts, window ends, then each level's starts and ends.
    sizes = [iv.height for iv in ivs]
    per_level = np.split(codes[nw:], np.cumsum(sizes)[:-1])
    g = np.concatenate([codes[:nw], codes[:nw], *[np.concatenate([part, part]) for part in per_level]])
    t = np.concatenate([c.to_numpy() for c in times])
    lvl = np.concatenate([np.full(2 * nw, -1, dtype=np.int32),
                          *[np.full(2 * h, i, dtype=np.int32) for i, h in enumerate(sizes)]])
    d = np.concatenate([np.zeros(2 * nw, dtype=np.int32),
                        *[np.concatenate([np.ones(h, dtype=np.int32), -np.ones(h, dtype=np.int32)]) for h in sizes]])
    order = np.argsort(g * span + (t - lo), kind="stable")
    g, t, lvl, d = g[order], t[order], lvl[order], d[order]
    n = t.shape[0]
    # Piece [t, next t) of the group, given to the first level with a positive running count.
    piece = np.zeros(n, dtype=np.int64)
    same = g[1:] == g[:-1]
    piece[:-1] = np.where(same, t[1:] - t[:-1], 0)
    top = np.full(n, -1, dtype=np.int32)
    for i in range(len(levels) - 1, -1, -1):  # the first level covering wins: assigned last
        covered = np.cumsum(np.where(lvl == i, d, 0)) > 0
        top[covered] = i
    at = np.empty(n, dtype=np.int64)
    at[order] = np.arange(n)
    w_start, w_end = at[:nw], at[nw:2 * nw]
    cols = []
    for i, (name, _) in enumerate(levels):
        got = np.where(top == i, piece, 0)
        before = np.cumsum(got) - got
        cols.append(pl.Series(f"{name}_ns", before[w_end] - before[w_start], dtype=pl.Int64))
    return grid.with_columns(cols)


def _exclusive_by_unions(levels: list[tuple[str, pl.DataFrame]], by: list[str], grid: pl.DataFrame) -> pl.DataFrame:
    """:func:`exclusive_breakdown` for any windows: the union of the levels so far, per window."""
    merged: pl.DataFrame | None = None
    prev = None
    for name, df in levels:
        # Union of the levels so far, grown one level at a time: merging the previous
        # union (disjoint, short) with the new level gives the same intervals as merging
        # every level again (positive lengths only, as window_union_lengths keeps).
        iv = df.select([*by, "ts_ns", "end_ns"]).filter(pl.col("end_ns") > pl.col("ts_ns"))
        if merged is not None:
            iv = pl.concat([merged.select([*by, pl.col("start_ns").alias("ts_ns"), "end_ns"]), iv])
        merged = merge_intervals(iv, by=by)
        grid = grid.with_columns(covered_within(merged, grid, by).alias(f"_cum_{name}"))
        excl = pl.col(f"_cum_{name}") - (pl.col(prev) if prev else 0)
        grid = grid.with_columns(excl.alias(f"{name}_ns"))
        prev = f"_cum_{name}"
    return grid
