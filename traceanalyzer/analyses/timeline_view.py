"""Timeline view: the intervals of one representative steady step, bounded, for the report's
interactive timeline.

What it holds
-------------
* **The step shown**: the steady step (not warm-up, not truncated) whose duration is closest
  to the median steady step (the earliest of equals); a trace without steps shows its device
  activity span. Times are ns from the window start.
* **Lanes**: one per GPU stream with activity in the window (kernels, copies, memsets; at most
  ``timeline_view.max_streams`` streams, the busiest), one idle-gap lane per device, and the
  **launching CPU thread** (the thread that issued the most launches in the window) with its
  CPU ops, user annotations and runtime calls down to nesting depth
  ``timeline_view.cpu_depth`` (depth 1 = top level), one row per depth.
* **Items**: ``lane, row, start_ns, dur_ns, name, kind`` (``kernel``, ``memcpy``, ``memset``,
  ``cpu_op``, ``annotation``, ``runtime``, ``merged``), ``n`` (items it stands for) and ``site``
  (for GPU work: the user frame, else the CPU op, that launched it).
* **Gaps**: the device idle gaps of ``idle_gaps`` inside the window (clipped to it), each with
  an id (``g0``, ``g1`` … in device then time order), its cause and CPU context, and, through
  :data:`CAUSE_RULES`, the rules that price gaps of that cause: the report highlights a
  finding's gaps from it.

Bound: an item shorter than one pixel-column of a 2,000-column view (window / 2,000) is merged
with the other short items of its row and column into one ``merged`` item (``n`` = how many,
``dur_ns`` = their extent); if more than ``timeline_view.max_items`` items remain, the longest
are kept (``n_dropped`` says how many were not); likewise the longest ``timeline_view.max_gaps``
gaps (``n_gaps_dropped``). So the embedded data stays a few hundred KB whatever the trace size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._callsites import cpu_tree_index, has_stacks, innermost_frames
from traceanalyzer.analyses._rows import rows
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.relations import by_id, gpu_activity, launches, nest_depth
from traceanalyzer.model.trace import TraceModel
from traceanalyzer.units import fmt_ns

#: idle_gaps cause → the rules that price gaps of that cause (their findings highlight those
#: gaps); ``low_gpu_utilization`` and ``step_outliers`` price idle of every cause.
CAUSE_RULES: dict[str, tuple[str, ...]] = {
    "host_bound": ("host_bound_gaps", "launch_bound_kernels", "kernel_count"),
    "sync": ("explicit_sync", "item_sync", "blocking_copies"),
    "memcpy": ("pageable_memcpy", "blocking_copies", "htod_in_step"),
    "data_loader": ("dataloader_bottleneck",),
    "stream_dependency": (),
    "other": (),  # waits on another stream, device or peer: no rule prices them alone
}
#: Rules whose findings point at every gap of the step shown.
ALL_GAP_RULES: tuple[str, ...] = ("low_gpu_utilization", "step_outliers")

#: Pixel columns the merge of short items assumes (a wide screen).
COLUMNS = 2000

_ITEM_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "lane": pl.Int64, "row": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "name": pl.String,
    "kind": pl.String, "n": pl.Int64, "site": pl.String,
}


@dataclass(frozen=True)
class TimelineViewResult:
    """The intervals of one steady step, bounded (see the module docstring)."""

    step: int | None
    window_start_ns: int
    window_ns: int
    lanes: pl.DataFrame  # lane, kind (gpu|gaps|cpu), label, device, stream, pid, tid, rows
    items: pl.DataFrame  # _ITEM_SCHEMA, sorted by lane, row, start_ns
    gaps: pl.DataFrame  # id, device, start_ns, dur_ns, cause, cpu_context
    n_source_items: int  # intervals in the window before merging
    n_merged: int  # intervals folded into merged items
    n_dropped: int  # intervals left out by the max_items cap
    n_gaps_dropped: int  # gaps left out by the max_gaps cap (the shortest)
    thresholds: dict[str, float]

    def gap_rules(self) -> dict[str, list[str]]:
        """Gap id → the rules that price it (:data:`CAUSE_RULES`, :data:`ALL_GAP_RULES`)."""
        return {g: [*CAUSE_RULES.get(c, ()), *ALL_GAP_RULES]
                for g, c in zip(self.gaps["id"].to_list(), self.gaps["cause"].to_list())}

    def to_json(self) -> dict[str, Any]:
        # Columnar, names and sites as indexes into ``strings``: a few thousand items repeat a few
        # hundred kernel names, and parallel arrays are a third of the size of row objects.
        strings = pl.concat([self.items["name"], self.items["site"].drop_nulls()]).unique(maintain_order=True)
        code = {s: i for i, s in enumerate(strings.to_list())}
        items = self.items.to_dict(as_series=False)
        items["name"] = [code[s] for s in items["name"]]
        items["site"] = [None if s is None else code[s] for s in items["site"]]
        return {
            "step": self.step,
            "window_start_ns": self.window_start_ns,
            "window_ns": self.window_ns,
            "lanes": rows(self.lanes),
            "strings": strings.to_list(),
            "items": items,
            "gaps": rows(self.gaps),
            "cause_rules": {c: list(r) for c, r in CAUSE_RULES.items()},
            "all_gap_rules": list(ALL_GAP_RULES),
            "n_source_items": self.n_source_items,
            "n_merged": self.n_merged,
            "n_dropped": self.n_dropped,
            "n_gaps_dropped": self.n_gaps_dropped,
            "thresholds": self.thresholds,
        }

    def summary(self) -> list[tuple[str, str]]:
        what = f"step #{self.step}" if self.step is not None else "the device activity span"
        out = [("Shown", f"{what}, {fmt_ns(self.window_ns)}: {self.items.height:,} intervals on "
                         f"{self.lanes.height} lanes, {self.gaps.height:,} idle gaps")]
        if self.n_merged or self.n_dropped or self.n_gaps_dropped:
            out.append(("Bounded", f"{self.n_merged:,} short intervals merged, {self.n_dropped:,} left out "
                                   f"(of {self.n_source_items:,}); {self.n_gaps_dropped:,} shortest gaps left out"))
        return out


def _window(sr: StepsResult, act: pl.DataFrame) -> tuple[int | None, int, int]:
    """(step, start_ns, end_ns) of the representative steady step, else the activity span."""
    t = sr.table
    if sr.has_steps and t.height:
        steady = t.filter(pl.col("window").is_in(sr.steady_windows()))
        med = steady["dur_ns"].median()
        pick = (steady.with_columns(_d=(pl.col("dur_ns") - med).abs()).sort(["_d", "start_ns"]).row(0, named=True)
                if med is not None else steady.row(0, named=True))
        return int(pick["step"]), int(pick["start_ns"]), int(pick["end_ns"])
    if act.is_empty():
        raise NotApplicable("no steps and no GPU activity to show on a timeline")
    return None, int(act["ts_ns"].min()), int(act["end_ns"].max())  # type: ignore[arg-type]  # int columns


def _clip(df: pl.DataFrame, lo: int, hi: int, ts: str = "ts_ns", end: str = "end_ns") -> pl.DataFrame:
    """Rows overlapping [lo, hi), their times clipped to it and made relative to ``lo``."""
    return df.filter((pl.col(end) > lo) & (pl.col(ts) < hi)).with_columns(
        start_ns=(pl.max_horizontal(pl.col(ts), pl.lit(lo)) - lo),
        dur_ns=(pl.min_horizontal(pl.col(end), pl.lit(hi)) - pl.max_horizontal(pl.col(ts), pl.lit(lo))),
    )


def _bound(items: pl.DataFrame, window_ns: int, max_items: int) -> tuple[pl.DataFrame, int, int]:
    """Short items merged per (lane, row, pixel column); then the longest ``max_items`` kept."""
    col_ns = max(1, window_ns // COLUMNS)
    items = items.with_columns(_short=pl.col("dur_ns") < col_ns, _col=pl.col("start_ns") // col_ns)
    long = items.filter(~pl.col("_short")).drop("_short", "_col")
    short = (
        items.filter(pl.col("_short"))
        .group_by("lane", "row", "_col")
        .agg(
            start_ns=pl.col("start_ns").min(),
            end_ns=(pl.col("start_ns") + pl.col("dur_ns")).max(),
            name=pl.col("name").first(),
            kind=pl.col("kind").first(),
            n=pl.col("n").sum(),
            site=pl.col("site").first(),
            _k=pl.len(),
        )
    )
    merged = short.filter(pl.col("_k") > 1)
    n_merged = int(merged["n"].sum() or 0) if merged.height else 0
    short = short.with_columns(
        dur_ns=pl.col("end_ns") - pl.col("start_ns"),
        name=pl.when(pl.col("_k") > 1).then(pl.format("{} short intervals", pl.col("n"))).otherwise("name"),
        kind=pl.when(pl.col("_k") > 1).then(pl.lit("merged")).otherwise("kind"),
        site=pl.when(pl.col("_k") > 1).then(pl.lit(None, pl.String)).otherwise("site"),
    ).select(list(_ITEM_SCHEMA))
    out = pl.concat([long.select(list(_ITEM_SCHEMA)), short])
    n_dropped = 0
    if out.height > max_items:
        kept = out.sort(["dur_ns", "lane", "start_ns"], descending=[True, False, False]).head(max_items)
        n_dropped = int(out["n"].sum() or 0) - int(kept["n"].sum() or 0)
        out = kept
    return out.sort(["lane", "row", "start_ns"]), n_merged, n_dropped


@analysis("timeline_view", depends_on=("steps", "idle_gaps"), title="Timeline", order=3,
          shared=("gpu_activity", "launches", "cpu_tree"),
          params={"max_items": 4000, "max_gaps": 1000, "cpu_depth": 4, "max_streams": 8})
def timeline_view(ctx: AnalysisContext[TraceModel]) -> TimelineViewResult:
    """The representative steady step's GPU streams, idle gaps and launching CPU thread, bounded for the page."""
    model = ctx.model
    sr = ctx.need("steps", StepsResult)
    ig = ctx.need("idle_gaps", IdleGapsResult)
    max_items, max_gaps = int(ctx.params.max_items), int(ctx.params.max_gaps)
    cpu_depth, max_streams = int(ctx.params.cpu_depth), int(ctx.params.max_streams)
    act = gpu_activity(ctx.tables).filter(pl.col("device").is_not_null() & pl.col("stream").is_not_null())
    step, lo, hi = _window(sr, act)
    wlen = max(hi - lo, 1)

    # GPU lanes: the busiest streams in the window.
    gpu = _clip(act.select("name", "ts_ns", "end_ns", "device", "stream", "correlation", "activity"), lo, hi)
    streams = (gpu.group_by("device", "stream").agg(busy=pl.col("dur_ns").sum())
               .sort(["busy", "device", "stream"], descending=[True, False, False]).head(max_streams)
               .sort("device", "stream"))
    devices = sorted(set(streams["device"].to_list()))
    lanes_rows: list[dict[str, Any]] = []
    for d in devices:
        for s in streams.filter(pl.col("device") == d)["stream"].to_list():
            lanes_rows.append({"kind": "gpu", "label": f"GPU {d} stream {s}", "device": d, "stream": s,
                               "pid": None, "tid": None, "rows": 1})
        lanes_rows.append({"kind": "gaps", "label": f"GPU {d} idle", "device": d, "stream": None,
                           "pid": None, "tid": None, "rows": 1})
    lane_of = {(r["device"], r["stream"]): i for i, r in enumerate(lanes_rows) if r["kind"] == "gpu"}
    lane_key = pl.DataFrame({"device": [k[0] for k in lane_of], "stream": [k[1] for k in lane_of],
                             "lane": list(lane_of.values())}, schema={"device": pl.Int64, "stream": pl.Int64,
                                                                      "lane": pl.Int64})
    gpu = gpu.join(lane_key, on=["device", "stream"], how="inner")

    # Who launched each GPU item: its runtime call, and the user frame (or CPU op) around that call.
    # The first launch of each correlation id (a filter: no group table, as unique() builds).
    la = launches(ctx.tables).select("correlation", "pid", "tid", pl.col("cpu_ts_ns").alias("ts_ns")).filter(
        pl.col("correlation").is_not_null() & pl.col("correlation").is_first_distinct())
    gpu = gpu.drop("ts_ns", "end_ns").join(la, on="correlation", how="left", maintain_order="left")
    pts = gpu.select("pid", "tid", "ts_ns")
    tree, index = cpu_tree_index(ctx.tables)
    op = by_id(index.lookup(pts), tree["id"], tree["name"]) if tree.height and pts.height else pl.Series(
        "name", [None] * pts.height, dtype=pl.String)
    site = op
    if has_stacks(model) and pts.height:
        frames = innermost_frames(model, pts)
        site = frames["user_frame"].fill_null(op)
    gpu = gpu.with_columns(site.alias("site"), row=pl.lit(0, pl.Int64), n=pl.lit(1, pl.Int64),
                           kind=pl.col("activity"))

    # The launching CPU thread: most launch calls in the window.
    items = [gpu.select(list(_ITEM_SCHEMA))]
    thread = (la.filter((pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi) & pl.col("pid").is_not_null())
              .group_by("pid", "tid").len().sort(["len", "pid", "tid"], descending=[True, False, False]))
    if thread.height:
        pid, tid = int(thread["pid"][0]), int(thread["tid"][0])
        cols = ["name", "ts_ns", "end_ns", "pid", "tid"]
        # Each table's rows of the thread and window first: the kind column and the concat
        # then cover those alone.
        keep = ((pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("end_ns") > lo) & (pl.col("ts_ns") < hi)
                & ~pl.col("name").str.starts_with("ProfilerStep#"))
        cpu = pl.concat([
            df.select(cols).filter(keep).with_columns(kind=pl.lit(kind))
            for df, kind in ((model.cpu_ops, "cpu_op"), (model.annotations, "annotation"), (model.runtime, "runtime"))
        ])
        cpu = cpu.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        depth = nest_depth(cpu.select("id", "ts_ns", "end_ns", "pid", "tid"))
        cpu = cpu.join(depth, on="id", how="left").with_columns(pl.col("depth").fill_null(1))
        cpu = _clip(cpu.filter(pl.col("depth") <= cpu_depth), lo, hi)
        lane = len(lanes_rows)
        rows = int(cpu["depth"].max() or 1) if cpu.height else 1  # type: ignore[arg-type]  # an int column
        name = next((n for p, t, n in model.threads.select("pid", "tid", "name").iter_rows() if p == pid and t == tid),
                    None) if model.threads.height else None
        named = f" ({name})" if name and str(tid) not in name else ""
        lanes_rows.append({"kind": "cpu", "label": f"CPU thread {tid}{named}"
                           + ", launching", "device": None, "stream": None, "pid": pid, "tid": tid, "rows": rows})
        items.append(cpu.select(
            pl.lit(lane, pl.Int64).alias("lane"), (pl.col("depth") - 1).alias("row"), "start_ns", "dur_ns", "name",
            "kind", pl.lit(1, pl.Int64).alias("n"), pl.lit(None, pl.String).alias("site")))
    all_items = pl.concat([i.cast(pl.Schema(_ITEM_SCHEMA)) for i in items])
    n_source = all_items.height
    bounded, n_merged, n_dropped = _bound(all_items, wlen, max_items)

    # Idle gaps of the devices shown, clipped to the window.
    dg = ig.device_gaps
    gaps = _clip(dg.filter(pl.col("device").is_in(devices)).select(
        "device", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"), "cause",
        *[c for c in ("cpu_context",) if c in dg.columns]), lo, hi, "_s", "_e")
    if "cpu_context" not in gaps.columns:
        gaps = gaps.with_columns(cpu_context=pl.lit(None, pl.String))
    gaps = gaps.filter(pl.col("dur_ns") > 0)
    n_gaps_dropped = max(gaps.height - max_gaps, 0)
    if n_gaps_dropped:
        gaps = gaps.sort(["dur_ns", "start_ns"], descending=[True, False]).head(max_gaps)
    gaps = gaps.sort("device", "start_ns")
    gaps = gaps.with_row_index("_i").select(
        pl.format("g{}", pl.col("_i")).alias("id"), "device", "start_ns", "dur_ns", "cause", "cpu_context")

    lanes = pl.DataFrame(lanes_rows, schema={"kind": pl.String, "label": pl.String, "device": pl.Int64,
                                             "stream": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "rows": pl.Int64})
    lanes = lanes.with_row_index("lane").with_columns(pl.col("lane").cast(pl.Int64))
    return TimelineViewResult(
        step=step, window_start_ns=lo, window_ns=wlen, lanes=lanes, items=bounded, gaps=gaps,
        n_source_items=n_source, n_merged=n_merged, n_dropped=n_dropped, n_gaps_dropped=n_gaps_dropped,
        thresholds={"max_items": max_items, "max_gaps": max_gaps, "cpu_depth": cpu_depth, "max_streams": max_streams},
    )
