"""GPU time: busy/idle breakdown per device and per step, plus tb_plugin's step breakdown.

Device breakdown (union semantics)
----------------------------------
Every kernel, memcpy and memset of a device is an interval ``[ts, ts+dur)``. Each
instant of a step window is counted **once**, in the first category that covers it on
that device, in this fixed precedence:

    compute  >  communication  >  memcpy  >  memset  >  idle

* ``compute``: kernels that are not collectives;
* ``communication``: communication kernels (collective metadata, launching communication
  CPU op, or a communication library's name family: ``docs/communication.md``) — i.e.
  *exposed* communication, not hidden under compute;
* ``memcpy`` / ``memset``: copies and fills not hidden under any kernel;
* ``idle``: no device activity at all.

So overlapping streams are counted once and the five add up to the window
(``busy = compute + communication + memcpy + memset``). This is TraceLens's identity
(computation + exposed comm + exposed memcpy + idle = total) with memsets split out.
Per step the window is the step window (see ``steps``); the whole-trace row sums the
windows. ``gpu_span`` gives, per device, the same numbers over HTA's window (first to
last activity on the device) for comparison with HTA's temporal breakdown
(HTA "compute" = our compute; HTA "non-compute" = communication + memcpy + memset).

tb_plugin step breakdown (exclusive, all devices and threads)
-------------------------------------------------------------
Priority ``kernel > memcpy > memset > communication > runtime > dataloader > cpu_exec >
other``: kernel = non-collective kernels; communication = communication kernels and CPU
communication ops (``nccl:*``, ``gloo:*``, ``c10d::*``, ``record_param_comms``, functional
collectives, ``symm_mem::*``, custom all-reduce and DeepEP ops: ``_comm.COMM_OP_RE``); runtime =
CUDA/HIP/XPU runtime and driver calls; dataloader = ``enumerate(DataLoader)#…`` /
``enumerate(DataPipe)#…`` ranges; cpu_exec = every other CPU op or user annotation
(``ProfilerStep#`` itself excluded; Python frames are not counted, as in tb_plugin,
because the outermost frame would swallow "other"); other = the rest. The eight add up
to the step window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import Results, analysis
from traceanalyzer.analyses._comm import COMM_OP_RE
from traceanalyzer.analyses._intervals import (
    DATALOADER_RE,
    covered_within,
    device_union,
    gpu_activity_classes,
    ms,
    pct,
)
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.timeutil import merge_intervals, sort_within_groups

DEVICE_CATEGORIES = ("compute", "communication", "memcpy", "memset")
TB_CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")
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
    b = sort_within_groups(pl.concat([p.cast(schema) for p in parts]), by, "t")  # type: ignore[arg-type]
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


@dataclass(frozen=True)
class GpuTimeResult:
    """Busy/idle per device and step, HTA-comparable span numbers, tb_plugin breakdown."""

    per_device: pl.DataFrame  # device, window_ns, busy_ns, compute_ns, …, idle_ns, busy_pct
    per_step: pl.DataFrame  # window, step, device, dur_ns, compute_ns, …, idle_ns, busy_pct
    gpu_span: pl.DataFrame  # device, first_ns, last_ns, span_ns, busy_ns, compute_ns, non_compute_ns, idle_ns
    tb_breakdown: pl.DataFrame  # window, step, kernel_ns … other_ns, total_ns
    tb_average: dict[str, float]  # mean per steady step, ns
    steady_busy_pct: dict[int, float | None]  # device → busy % over steady steps

    def to_json(self) -> dict[str, Any]:
        return {
            "per_device": self.per_device.to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "gpu_span": self.gpu_span.to_dicts(),
            "tb_breakdown": self.tb_breakdown.to_dicts(),
            "tb_average_ns": self.tb_average,
            "steady_busy_pct": {str(k): v for k, v in self.steady_busy_pct.items()},
            "precedence": list(DEVICE_CATEGORIES),
        }

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for r in self.per_device.iter_rows(named=True):
            w = r["window_ns"]
            parts = ", ".join(
                f"{c} {pct(r[f'{c}_ns'], w) or 0:.1f} %" for c in (*DEVICE_CATEGORIES, "idle")
            )
            out.append((f"GPU {r['device']} busy (all step windows)",
                        f"{r['busy_pct'] or 0:.1f} % of {ms(w)} ({parts} of the windows)"))
        if self.tb_average:
            total = self.tb_average.get("total_ns") or 0
            top = sorted(
                ((k[:-3], v) for k, v in self.tb_average.items() if k != "total_ns"), key=lambda kv: -kv[1]
            )[:4]
            out.append(
                ("Step breakdown (tb_plugin)",
                 ", ".join(f"{k} {pct(v, total) or 0:.1f} %" for k, v in top) + " of the mean steady step")
            )
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "GPU time per device": self.per_device,
            "GPU time per step": self.per_step,
            "Step time breakdown (tb_plugin priority)": self.tb_breakdown,
        }


def _with_pct(df: pl.DataFrame, total: str) -> pl.DataFrame:
    return df.with_columns(
        busy_pct=pl.when(pl.col(total) > 0).then((pl.col("busy_ns") * 100.0 / pl.col(total)).round(3)).otherwise(None)
    )


@analysis(
    "gpu_time", depends_on=("steps",), title="GPU busy / idle", order=20,
    shared=("device_union", "gpu_activity", "gpu_activity_classes", "comm_classes", "op_nesting"),
)
def gpu_time(model: TraceModel, results: Results, config: Config) -> GpuTimeResult:
    """Busy/idle per device and step (compute > communication > memcpy > memset), tb_plugin breakdown."""
    if not model.has_gpu:
        raise NotApplicable("no GPU activity in this trace (no kernels, memcpy or memset)")
    sr: StepsResult = results["steps"]
    windows = sr.windows()
    act = gpu_activity_classes(model).filter(pl.col("device").is_not_null())
    levels = [(c, act.filter(pl.col("category") == c)) for c in DEVICE_CATEGORIES]
    ex = exclusive_breakdown(levels, windows, ["device"], "idle")
    ex = ex.join(windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")), on="window")
    busy = pl.sum_horizontal([pl.col(f"{c}_ns") for c in DEVICE_CATEGORIES])
    per_step = _with_pct(
        ex.with_columns(busy_ns=busy).select(
            "window", "step", "device", "dur_ns", "busy_ns", *[f"{c}_ns" for c in DEVICE_CATEGORIES], "idle_ns"
        ),
        "dur_ns",
    ).sort(["window", "device"])
    sums = [pl.col(c).sum() for c in ("dur_ns", "busy_ns", *[f"{c}_ns" for c in DEVICE_CATEGORIES], "idle_ns")]
    per_device = _with_pct(
        per_step.group_by("device").agg(sums).rename({"dur_ns": "window_ns"}).sort("device"), "window_ns"
    )
    steady = per_step.filter(pl.col("window").is_in(sr.steady_windows()))
    steady_dev = steady.group_by("device").agg(pl.col("busy_ns").sum(), pl.col("dur_ns").sum()).sort("device")
    steady_busy = {int(d): pct(b, w) for d, b, w in steady_dev.select("device", "busy_ns", "dur_ns").iter_rows()}

    # HTA-comparable: per device, first to last activity.
    all_m = device_union(model)  # = merge_intervals(act, by=["device"]): the same rows
    comp_m = merge_intervals(act.filter(pl.col("category") == "compute"), by=["device"])
    span = (
        all_m.group_by("device")
        .agg(
            first_ns=pl.col("start_ns").min(),
            last_ns=pl.col("end_ns").max(),
            busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
        )
        .join(
            comp_m.group_by("device").agg(compute_ns=(pl.col("end_ns") - pl.col("start_ns")).sum()),
            on="device",
            how="left",
        )
        .with_columns(pl.col("compute_ns").fill_null(0), span_ns=pl.col("last_ns") - pl.col("first_ns"))
        .with_columns(
            non_compute_ns=pl.col("busy_ns") - pl.col("compute_ns"), idle_ns=pl.col("span_ns") - pl.col("busy_ns")
        )
        .select("device", "first_ns", "last_ns", "span_ns", "busy_ns", "compute_ns", "non_compute_ns", "idle_ns")
        .sort("device")
    )

    tb = _tb_breakdown(model, act, windows)
    tb_steady = tb.filter(pl.col("window").is_in(sr.steady_windows()))
    cols = [f"{c}_ns" for c in (*TB_CATEGORIES, "other")] + ["total_ns"]
    tb_avg = {c: round(float(tb_steady[c].mean()), 1) for c in cols} if tb_steady.height else {}  # type: ignore[arg-type]
    return GpuTimeResult(per_device, per_step, span, tb, tb_avg, steady_busy)


def _tb_breakdown(model: TraceModel, act: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    iv = ["ts_ns", "end_ns"]
    cpu = pl.concat(
        [
            model.cpu_ops.select("name", *iv),
            model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#")).select("name", *iv),
        ]
    )
    levels = [
        ("kernel", act.filter(pl.col("category") == "compute").select(iv)),
        ("memcpy", act.filter(pl.col("category") == "memcpy").select(iv)),
        ("memset", act.filter(pl.col("category") == "memset").select(iv)),
        (
            "communication",
            pl.concat(
                [
                    act.filter(pl.col("category") == "communication").select(iv),
                    cpu.filter(pl.col("name").str.contains(CPU_COMM_RE)).select(iv),
                ]
            ),
        ),
        ("runtime", model.runtime.select(iv)),
        ("dataloader", cpu.filter(pl.col("name").str.contains(DATALOADER_RE)).select(iv)),
        ("cpu_exec", cpu.select(iv)),
    ]
    ex = exclusive_breakdown(levels, windows, [], "other")
    return ex.join(
        windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("total_ns")), on="window"
    ).select("window", "step", *[f"{c}_ns" for c in (*TB_CATEGORIES, "other")], "total_ns")
