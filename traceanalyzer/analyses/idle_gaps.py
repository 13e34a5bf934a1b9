"""Idle gaps: every stretch of time a device (or a stream) had nothing running, and why.

Definitions
-----------
* **Device gap**: a hole between consecutive intervals of the union of all kernels,
  copies and memsets of one device (overlapping streams counted once), from the end of
  the activity that drained the device to the start of the next one. Time before the
  first and after the last activity of a device is not a gap (it is idle in
  ``gpu_time``'s step windows). The sum of device gaps equals ``gpu_time``'s
  ``gpu_span`` idle.
* **Stream gap**: the same on one stream alone (what HTA's idle-time breakdown uses).
* The **next activity** ends the gap; its runtime call (joined by correlation id) is
  the **launch**, on the **launching thread**. ``queued`` is true when that launch call
  started before the gap began (work was already issued when the device drained).

Causes (one per gap; per-gap overlaps are computed on the launching process)
* ``host_bound`` — not queued: the CPU issued the launch only after the GPU drained,
  and none of the more specific causes below overlaps the gap;
* ``sync`` / ``memcpy`` / ``data_loader`` — not queued, and a synchronising runtime call
  (``*Synchronize``; its end extended by ``idle_gaps.sync_tolerance_us``, default 10 µs,
  because the GPU drains just before a sync returns), a blocking memcpy call (a
  synchronous API, or any copy from/to pageable host memory), or an
  ``enumerate(DataLoader)#…`` range overlaps the gap: the one overlapping most wins
  (ties: sync, memcpy, data loader);
* ``stream_dependency`` — stream gaps only: queued, and another stream of the device
  was busy during the gap (the stream waited on an event of another stream);
* ``other`` — queued with the device idle (waiting on another device or a collective
  peer, or device-side launch latency), or no launch call found.

Per step (``per_step``): every device gap is **split across the step windows it spans**
(a gap from the end of step 1 into step 2 puts each part in its own step), so a step's
``idle_ns`` is the gap time inside its window; ``n_gaps`` counts the gap pieces. Window
time on a device before its first or after its last activity is idle but lies in no gap:
it is ``outside_gaps_ns``. Per (window, device), ``idle_ns + outside_gaps_ns`` equals
``gpu_time``'s ``idle_ns``. The gap listings keep each gap whole, under the step it starts in.

CPU attribution: each gap with a launch is attributed to the deepest CPU interval
(CPU op, user annotation or Python frame) covering the gap's midpoint on the launching
thread (``cpu_context``), and separately to the deepest user annotation. Aggregates
over **long** gaps (≥ ``idle_gaps.long_gap_us``, default 100 µs) answer "what was the
CPU doing while the GPU idled". Every other number is threshold-free; a histogram of
gap lengths is given per device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._callsites import cpu_tree_index
from traceanalyzer.analyses._intervals import (
    DATALOADER_RE,
    LOG_BINS_NS,
    MEMCPY_API_RE,
    SYNC_API_RE,
    asof_rows,
    covered_before,
    device_union,
    gpu_activity_classes,
    histogram,
    ms,
    pct,
)
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, annotation_index, by_id, cpu_context, deepest_at, join_unique
from traceanalyzer.timeutil import gaps_between, merge_intervals
from traceanalyzer.units import device_name

CAUSES = ("host_bound", "sync", "memcpy", "data_loader", "stream_dependency", "other")


@dataclass(frozen=True)
class IdleGapsResult:
    """Gaps per device and per stream with causes and CPU attribution."""

    device_gaps: pl.DataFrame
    stream_gaps: pl.DataFrame
    per_device: pl.DataFrame  # device, n_gaps, idle_ns, <cause>_ns …
    per_stream: pl.DataFrame  # device, stream, n_gaps, idle_ns, queued_ns, <cause>_ns …
    per_step: pl.DataFrame  # window, step, device, n_gaps, idle_ns, <cause>_ns …, outside_gaps_ns
    histogram: pl.DataFrame  # device, bin, lo_ns, hi_ns, count, total_ns
    attribution: pl.DataFrame  # long gaps grouped by deepest CPU context
    attribution_annotation: pl.DataFrame  # long gaps grouped by deepest user annotation
    long_gap_ns: int
    thresholds: dict[str, float]
    #: The trace's vendor (``TraceMeta.vendor``): how its devices are named in text (not in to_json).
    vendor: str = "unknown"

    @functools.cached_property
    def _longest_gaps(self) -> pl.DataFrame:
        """The 50 longest device gaps, longest first: summary.json keeps them, the tables show 20."""
        return self.device_gaps.sort("dur_ns", descending=True).head(50)

    def to_json(self) -> dict[str, Any]:
        return {
            "thresholds": self.thresholds,
            "long_gap_ns": self.long_gap_ns,
            "per_device": self.per_device.to_dicts(),
            "per_stream": self.per_stream.to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "histogram": self.histogram.to_dicts(),
            "attribution": self.attribution.to_dicts(),
            "attribution_annotation": self.attribution_annotation.to_dicts(),
            "n_device_gaps": self.device_gaps.height,
            "n_stream_gaps": self.stream_gaps.height,
            "longest_gaps": self._longest_gaps.to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for r in self.per_device.iter_rows(named=True):
            idle = r["idle_ns"]
            causes = ", ".join(
                f"{c} {pct(r[f'{c}_ns'], idle) or 0:.0f} %" for c in CAUSES if r.get(f"{c}_ns")
            )
            out.append((f"{device_name(r['device'], self.vendor)} gaps",
                        f"{r['n_gaps']:,} gaps, {ms(idle)} idle in gaps ({causes} of gap idle)"))
        if self.attribution.height:
            top = self.attribution.row(0, named=True)
            out.append(
                (
                    "Idle time attributed",
                    f"{top['pct_of_idle']:.0f} % of idle time is inside `{top['cpu_context']}`"
                    + (f" ({top['source']})" if top.get("source") else ""),
                )
            )
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "Idle per device": self.per_device,
            "Idle per stream": self.per_stream,
            "Idle per step": self.per_step,
            "Gap length histogram": self.histogram,
            "Longest gaps": self._longest_gaps.head(20),
            "What the CPU was doing during long gaps": self.attribution.head(20),
        }


def _next_activity(gaps: pl.DataFrame, act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Join each gap to the first activity starting at or after its end, per ``by``."""
    cols = [*by, pl.col("ts_ns").alias("next_ts_ns"), pl.col("name").alias("next_name"),
            pl.col("correlation").alias("next_correlation")]
    if "stream" not in by:
        cols.append(pl.col("stream").alias("next_stream"))
    # the first activity of the group starting at or after the gap's end
    rows = asof_rows(gaps, act, by, "end_ns", "ts_ns", forward=True)
    if rows is not None:
        return gaps.hstack(act.select(cols).drop(*by, "next_ts_ns").select(pl.all().gather(rows)).get_columns())
    nxt = act.select(cols).sort("next_ts_ns")
    return (
        gaps.with_row_index("_row")
        .sort("end_ns")
        .join_asof(nxt, left_on="end_ns", right_on="next_ts_ns", by=by, strategy="forward", check_sortedness=False)
        .sort("_row")
        .drop("_row", "next_ts_ns")
    )


def _overlaps(frames: list[pl.DataFrame], merged: pl.DataFrame, by: list[str], presorted: bool) -> list[pl.Series]:
    """Length of each gap ``[start_ns, end_ns)`` of each frame covered by ``merged`` (a union
    of intervals per ``by``, :func:`~traceanalyzer.timeutil.merge_intervals`), one series
    aligned with each frame: both ends of every gap of every frame in one
    :func:`covered_before` (its cost is mostly per call; each point's value is its own)."""
    pts = pl.concat([f.select([*by, pl.col(c).alias("t")]) for f in frames for c in ("start_ns", "end_ns")])
    cov = covered_before(merged, pts, by, presorted=presorted)
    out, at = [], 0
    for f in frames:
        n = f.height
        out.append((cov.slice(at + n, n) - cov.slice(at, n)).fill_null(0))
        at += 2 * n
    return out


def _blocking_copies(model: TraceModel) -> pl.DataFrame:
    """Memcpy API calls that block the host: synchronous APIs, or any copy to/from pageable
    memory."""
    rt = model.runtime.filter(contains_by_name(model.runtime, MEMCPY_API_RE))
    pageable = (
        model.memcpy.filter((pl.col("src") == "Pageable") | (pl.col("dst") == "Pageable"))
        .select("correlation")
        .drop_nulls()
        .unique()
        .with_columns(_pg=pl.lit(True))
    )
    rt = rt.join(pageable, on="correlation", how="left")
    return rt.filter(~pl.col("name").str.contains("(?i)async") | pl.col("_pg").fill_null(False))


def _host_unions(model: TraceModel, sync_tol_ns: int) -> dict[str, pl.DataFrame]:
    """Per launching process, the unions of the synchronising calls (ends extended by the
    tolerance), the blocking memcpy calls and the data-loader ranges: what
    :func:`_classify` overlaps the gaps with (built once for device and stream gaps)."""
    # The regexes run once per distinct name (runtime and op names repeat; each model
    # table's distinct names are found once per run, shared with the other analyses), each
    # table filtered before anything is concatenated.
    rt = model.runtime
    sync_iv = rt.filter(contains_by_name(rt, SYNC_API_RE)).select(
        pl.col("pid").alias("launch_pid"), "ts_ns", (pl.col("end_ns") + sync_tol_ns).alias("end_ns")
    )
    memcpy_iv = _blocking_copies(model).select(pl.col("pid").alias("launch_pid"), "ts_ns", "end_ns")
    dl_iv = pl.concat(
        [
            df.filter(contains_by_name(df, DATALOADER_RE)).select(pl.col("pid").alias("launch_pid"), "ts_ns", "end_ns")
            for df in (model.annotations, model.cpu_ops)
        ]
    )
    by = ["launch_pid"]
    return {"sync": merge_intervals(sync_iv, by=by), "memcpy": merge_intervals(memcpy_iv, by=by),
            "dl": merge_intervals(dl_iv, by=by)}


def _classify(
    frames: list[tuple[pl.DataFrame, pl.DataFrame | None]],
    launch: pl.DataFrame,
    host: dict[str, pl.DataFrame],
) -> list[pl.DataFrame]:
    """Add launch columns, ``queued`` and ``cause`` to each gap frame carrying
    ``next_correlation``; ``frames``: (gaps, the device union their other streams' busy time
    is read from, or None) (``host``: :func:`_host_unions`). The frames' host overlaps are
    computed together, one :func:`covered_before` per host union."""
    gs = [
        join_unique(gaps, launch, "next_correlation", "correlation").with_columns(
            queued=pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") < pl.col("start_ns"))
        )
        for gaps, _ in frames
    ]
    # The host overlaps where the launching process is known, 0 elsewhere, put back in the
    # gaps' row order.
    known = [g["launch_pid"].is_not_null() for g in gs]
    has = [g.filter(k) for g, k in zip(gs, known)]
    over = {k: _overlaps(has, host[k], ["launch_pid"], presorted=True) for k in ("sync", "memcpy", "dl")}
    del has
    out = []
    for i, (g, (_, device_merged)) in enumerate(zip(gs, frames)):
        at = known[i].arg_true()
        g = g.with_columns(
            pl.zeros(g.height, pl.Int64, eager=True).scatter(at, over[k][i]).alias(f"_{k}")
            for k in ("sync", "memcpy", "dl")
        )
        if device_merged is not None and g.height:
            g = g.with_columns(other_streams_busy_ns=_overlaps([g.select("device", "start_ns", "end_ns")],
                                                               device_merged, ["device"], presorted=False)[0])
        else:
            g = g.with_columns(other_streams_busy_ns=pl.lit(0, pl.Int64))
        out.append(_with_cause(g))
    return out


def _with_cause(g: pl.DataFrame) -> pl.DataFrame:
    """``cause`` from the launch, ``queued``, the host overlaps ``_sync, _memcpy, _dl`` (then
    dropped) and ``other_streams_busy_ns`` (see the module docstring)."""
    best = pl.max_horizontal("_sync", "_memcpy", "_dl")
    # The cause's position in CAUSES, then its name by one gather (a chain of string
    # literals builds a string column per branch).
    code = {c: pl.lit(i, pl.UInt32) for i, c in enumerate(CAUSES)}
    host_cause = (
        pl.when(best <= 0)
        .then(code["host_bound"])
        .when(pl.col("_sync") == best)
        .then(code["sync"])
        .when(pl.col("_memcpy") == best)
        .then(code["memcpy"])
        .otherwise(code["data_loader"])
    )
    cause = (
        pl.when(pl.col("launch_ts_ns").is_null())
        .then(code["other"])
        .when(~pl.col("queued"))
        .then(host_cause)
        .when(pl.col("other_streams_busy_ns") > 0)
        .then(code["stream_dependency"])
        .otherwise(code["other"])
    )
    return g.with_columns(cause=pl.lit(pl.Series(CAUSES, dtype=pl.String)).gather(cause)).drop(
        "_sync", "_memcpy", "_dl")


def _attribution(gaps: list[pl.DataFrame], t: TraceTables) -> list[pl.DataFrame]:
    """``cpu_context``, ``source`` and ``annotation`` of each gap of each frame (the deepest
    intervals at the gap midpoint on the launching thread), one frame aligned with each of
    ``gaps``: the points of all of them are looked up at once (the indexes are built once),
    and no gap frame is copied to do it."""
    pts = pl.concat([
        g.select(
            pl.col("launch_pid").alias("pid"),
            pl.col("launch_tid").alias("tid"),
            ((pl.col("start_ns") + pl.col("end_ns")) // 2).alias("ts_ns"),
        )
        for g in gaps
    ])
    cols = _attribute_points(pts, t)
    out, at = [], 0
    for g in gaps:
        out.append(cols.slice(at, g.height))
        at += g.height
    return out


def _attribute_points(pts: pl.DataFrame, t: TraceTables) -> pl.DataFrame:
    """``cpu_context, source, annotation`` of each point (``pid, tid, ts_ns``)."""
    model = t.model
    if pts.is_empty():
        return pl.DataFrame(schema={"cpu_context": pl.String, "source": pl.String, "annotation": pl.String})
    if model.python_frames.is_empty():
        # Then the context is the CPU tree copies and syncs use (ops and annotations but
        # ProfilerStep#, in the same order, so equal ids among ties): its index is shared.
        ctx, index = cpu_tree_index(t)
        ids = index.lookup(pts)
    else:
        # Legacy traces record ProfilerStep#N as an op: a step is not "what the CPU was doing".
        ctx = cpu_context(model).filter(~pl.col("name").str.starts_with("ProfilerStep#"))
        ids = deepest_at(ctx, pts)
    # The annotations of ctx, in the same order (so the same innermost one among ties),
    # indexed once per run (phases looks them up too).
    ann_names, ann_index = annotation_index(t)
    aids = ann_index.lookup(pts)
    return pl.DataFrame([
        by_id(ids, ctx["id"], ctx["name"]).alias("cpu_context"),
        by_id(ids, ctx["id"], ctx["source"]).alias("source"),
        by_id(aids, ann_names["id"], ann_names["name"]).alias("annotation"),
    ])


def _split_by_window(gaps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The pieces of each gap inside each step window it overlaps: ``window, step, device,
    dur_ns`` (the piece's length), ``cause``, ``queued``. Windows are disjoint and sorted, so
    the windows a gap ``[a, b)`` overlaps are a contiguous index range, found by two binary
    searches; a gap spans few windows, so exploding that range stays small."""
    w = windows.sort("start_ns")
    if gaps.is_empty() or w.is_empty():
        return pl.DataFrame(schema={"window": pl.Int64, "step": pl.Int64, "device": gaps.schema.get("device", pl.Int64),
                                    "dur_ns": pl.Int64, "cause": pl.String, "queued": pl.Boolean})
    ws, we = w["start_ns"], w["end_ns"]
    a, b = gaps["start_ns"], gaps["end_ns"]
    lo = we.search_sorted(a, side="right").cast(pl.Int64)  # first window ending after a
    hi = ws.search_sorted(b, side="left").cast(pl.Int64) - 1  # last window starting before b
    pieces = (
        gaps.select("device", "start_ns", "end_ns", "cause", "queued")
        .with_columns(_i=pl.int_ranges(lo, pl.max_horizontal(lo, hi + 1)))
        .explode("_i")
        .filter(pl.col("_i").is_not_null())
    )
    wi = w.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"), "window", "step",
                  pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"))
    pieces = pieces.join(wi, on="_i", how="inner").with_columns(
        dur_ns=(pl.min_horizontal("end_ns", "_we") - pl.max_horizontal("start_ns", "_ws")).cast(pl.Int64)
    ).filter(pl.col("dur_ns") > 0)
    return pieces.select("window", "step", "device", "dur_ns", "cause", "queued")


def _per_step(gaps: pl.DataFrame, windows: pl.DataFrame, dev_m: pl.DataFrame) -> pl.DataFrame:
    """Idle per (window, device): gap pieces by cause, plus the window time before the
    device's first / after its last activity (``outside_gaps_ns``). One row per window and
    device that has any activity in the trace."""
    per = _per(_split_by_window(gaps, windows), ["window", "step", "device"])
    if dev_m.is_empty() or windows.is_empty():
        return per.with_columns(outside_gaps_ns=pl.lit(0, pl.Int64))
    span = dev_m.group_by("device").agg(_first=pl.col("start_ns").min(), _last=pl.col("end_ns").max())
    grid = span.join(windows.select("window", "step", "start_ns", "end_ns"), how="cross").with_columns(
        outside_gaps_ns=(
            (pl.min_horizontal("end_ns", "_first") - pl.col("start_ns")).clip(lower_bound=0)
            + (pl.col("end_ns") - pl.max_horizontal("start_ns", "_last")).clip(lower_bound=0)
            # a window with no activity of the device at all: both terms count it, keep it once
            - (pl.min_horizontal("end_ns", "_first") - pl.max_horizontal("start_ns", "_last")).clip(lower_bound=0)
        ).cast(pl.Int64)
    ).select("window", "step", pl.col("device").cast(per.schema["device"]), "outside_gaps_ns")
    zero = [c for c in per.columns if c not in ("window", "step", "device")]
    out = grid.join(per.drop("step"), on=["window", "device"], how="left").with_columns(
        [pl.col(c).fill_null(0).cast(pl.Int64) for c in zero])
    return out.select(*per.columns, "outside_gaps_ns").sort(["window", "device"])


def _per(gaps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    aggs = [pl.len().cast(pl.Int64).alias("n_gaps"), pl.col("dur_ns").sum().alias("idle_ns")]
    aggs += [pl.col("dur_ns").filter(pl.col("cause") == c).sum().alias(f"{c}_ns") for c in CAUSES]
    aggs += [pl.col("dur_ns").filter(pl.col("queued")).sum().alias("queued_ns")]
    return gaps.group_by(by).agg(aggs).sort(by)


@analysis(
    "idle_gaps", depends_on=("steps",), title="GPU idle gaps", order=30,
    shared=("annotation_index", "cpu_tree", "device_union", "gpu_activity_classes", "comm_classes", "op_nesting"),
    params={"long_gap_us": 100.0, "sync_tolerance_us": 10.0},
)
def idle_gaps(ctx: AnalysisContext[TraceModel]) -> IdleGapsResult:
    """Every device/stream gap with a cause and what the launching CPU thread was doing."""
    model = ctx.model
    if not model.has_gpu:
        raise NotApplicable("no GPU activity in this trace (no kernels, memcpy or memset)")
    long_us = ctx.params.long_gap_us
    tol_us = ctx.params.sync_tolerance_us
    long_ns, tol_ns = int(long_us * 1000), int(tol_us * 1000)
    sr = ctx.need("steps", StepsResult)
    # The columns read below, then the rows: a filter copies every column it is given.
    # One filter (each copies the columns it keeps); ``n_dev`` counts the rows with a device.
    act = gpu_activity_classes(ctx.tables).select("name", "ts_ns", "end_ns", "device", "stream", "correlation")
    on_dev = act["device"].is_not_null()
    n_dev = int(on_dev.sum())
    act = act.filter(on_dev & act["stream"].is_not_null() & (act["end_ns"] >= act["ts_ns"]))
    del on_dev
    launch = (
        model.runtime.select(
            "correlation",
            pl.col("name").alias("launch_api"),
            pl.col("ts_ns").alias("launch_ts_ns"),
            pl.col("pid").alias("launch_pid"),
            pl.col("tid").alias("launch_tid"),
        )
        # the first call of each correlation id (a filter: no group table, as unique() builds)
        .filter(pl.col("correlation").is_not_null() & pl.col("correlation").is_first_distinct())
    )

    # The shared union when the stream / length filters above dropped nothing.
    dev_m = device_union(ctx.tables) if act.height == n_dev else merge_intervals(act, by=["device"])
    # Gap tables come out of gaps_between sorted by (*by, start_ns), as merge_intervals sorts
    # its union, and every step below keeps the row order: dgaps stays sorted by (device,
    # start_ns) and sgaps by (device, stream, start_ns) (unique keys) without a sort, which
    # would gather every column of these, the analysis' widest frames.
    dgaps = _next_activity(gaps_between(dev_m, ["device"]), act, ["device"])
    # first / last activity per device, for the window idle outside any gap (per_step)
    dev_gpu = dev_m.group_by("device").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    str_m = merge_intervals(act, by=["device", "stream"])
    sgaps = _next_activity(gaps_between(str_m, ["device", "stream"]), act, ["device", "stream"])
    del act, str_m
    host = _host_unions(model, tol_ns)
    # Busy time of the *other* streams during a stream gap = device coverage (this one is idle).
    dgaps, sgaps = _classify([(dgaps, None), (sgaps, dev_m)], launch, host)
    dgaps = assign_steps(dgaps, sr, "start_ns")
    # The per-event inputs are done with: free them before the tables below are built (on
    # a big trace these frames are a few hundred MB).
    del launch, dev_m, host
    # One attribution pass for both tables (the as-of state is built once). sgaps keeps
    # the column order it has always had (``stream`` after ``cause``).
    d_attr, s_attr = _attribution([dgaps, sgaps], ctx.tables)
    dgaps = dgaps.hstack(d_attr)
    sgaps = sgaps.select(pl.exclude("stream"), "stream").hstack(s_attr)
    del d_attr, s_attr
    sgaps = assign_steps(sgaps, sr, "start_ns")

    per_device = _per(dgaps, ["device"])
    per_stream = _per(sgaps, ["device", "stream"])
    per_step = _per_step(dgaps, sr.windows(), dev_gpu)

    hists = [
        histogram(dgaps.filter(pl.col("device") == d)["dur_ns"], LOG_BINS_NS).with_columns(device=pl.lit(d, pl.Int64))
        for d in per_device["device"].to_list()
    ]
    hist = pl.concat(hists).select("device", "bin", "lo_ns", "hi_ns", "count", "total_ns") if hists else pl.DataFrame()

    total_idle = int(dgaps["dur_ns"].sum()) if dgaps.height else 0
    long = dgaps.filter(pl.col("dur_ns") >= long_ns)
    long_total = int(long["dur_ns"].sum()) if long.height else 0

    def group(col: str, extra: list[str]) -> pl.DataFrame:
        return (
            long.with_columns(pl.col(col).fill_null("<no CPU activity on the launching thread>"))
            .group_by([col, *extra])
            .agg(n_gaps=pl.len().cast(pl.Int64), idle_ns=pl.col("dur_ns").sum())
            .with_columns(
                pct_of_idle=(pl.col("idle_ns") * 100.0 / max(total_idle, 1)).round(2),
                pct_of_long_gap_idle=(pl.col("idle_ns") * 100.0 / max(long_total, 1)).round(2),
            )
            .sort(["idle_ns", col], descending=[True, False])
        )

    attribution = group("cpu_context", ["source"])
    attribution_ann = group("annotation", [])
    return IdleGapsResult(
        device_gaps=dgaps,
        stream_gaps=sgaps,
        per_device=per_device,
        per_stream=per_stream,
        per_step=per_step,
        histogram=hist,
        attribution=attribution,
        attribution_annotation=attribution_ann,
        long_gap_ns=long_ns,
        thresholds={"long_gap_us": long_us, "sync_tolerance_us": tol_us},
        vendor=ctx.model.meta.vendor,
    )
