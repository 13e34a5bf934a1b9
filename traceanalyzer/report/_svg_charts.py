"""The HTML page's charts as inline SVG: one drawing per chart of :mod:`traceanalyzer.report.charts`.

Each function here is the SVG twin of the matplotlib chart of the same name (registered with
:func:`~traceanalyzer.report.charts.svg_chart`): same data, series, labels, colours and title;
the PNG is the reference for what a chart shows. They read only what the results hold (as the
matplotlib charts do) and never import matplotlib. Long series are bounded: a memory line has
at most :data:`MAX_LINE_POINTS` points (bucket maxima, so the peak stays), and the timeline's
thousands of short gaps are summed per pixel column (:func:`_gap_runs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.analyses.export_timeline import ExportTimelineResult
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.analyses.launches import LaunchesResult
from traceanalyzer.analyses.memory_peak import MemoryPeakResult
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.analyses.syncs import SyncsResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.report._svg import TICK_SIZE, Axes, Figure, LegendItem, short, text_width
from traceanalyzer.report.charts import (
    _GPU_CATS,
    _MAX_ROWS,
    BLUE,
    CATEGORY_COLORS,
    CAUSE_COLORS,
    CAUSE_LABELS,
    CYAN,
    GREEN,
    GREY,
    IDLE,
    IDLE_DARK,
    KHAKI,
    ORANGE,
    PINK,
    PURPLE,
    RED,
    _also,
    _byte_unit,
    _max,
    _ms,
    _step_labels,
    svg_chart,
    timeline_rows,
)
from traceanalyzer.units import device_name, fmt_bytes_short, fmt_ns_short

#: Figure size of a one-panel chart (px of the viewBox; the page scales it to its width).
WIDTH, HEIGHT = 880, 440
#: Points per memory line at most (the page shows ~1,000 px; more would only weigh on the file).
MAX_LINE_POINTS = 2_000
#: Room above panels that have their own title (under the chart's).
TOP_TITLED = 68
BOX, LINE, MARK = "box", "line", "marker"


def _bottom(n: int, extra: float = 0.0) -> float:
    """Room under a category x axis of ``n`` labels (rotated past 12), its label and ``extra``."""
    return (68.0 if n > 12 else 52.0) + extra


def _left(labels: Sequence[str], size: float = TICK_SIZE, lo: float = 40, hi: float = 380) -> float:
    """Room left of an axis for its tick labels."""
    return min(hi, max(lo, max((text_width(s, size) for s in labels), default=0.0) + 14))


def _top(values: Sequence[float], headroom: float) -> float:
    top = max(values, default=0.0)
    return top * headroom if top > 0 else 1.0


# ---------------------------------------------------------------------------------------------
# Steps and GPU time
# ---------------------------------------------------------------------------------------------


@svg_chart("steps")
def steps_svg(res: StepsResult, results: Mapping[str, object]) -> str | None:
    if not res.has_steps or res.table.height < 1:
        return None
    t = res.table
    durs = [_ms(v) for v in t["dur_ns"].to_list()]
    labels = _step_labels(t["step"].to_list())
    warm, trunc = t["is_warmup"].to_list(), t["is_truncated"].to_list()
    colors = [ORANGE if w else (GREY if tr else BLUE) for w, tr in zip(warm, trunc)]
    kinds = [" · warm-up" if w else (" · truncated (last)" if tr else "") for w, tr in zip(warm, trunc)]
    n = len(durs)
    fig = Figure("Step time per step", WIDTH, HEIGHT, name="steps")
    ax = fig.panels(left=74, bottom=_bottom(n))[0][0]
    ax.categories_x(labels)
    ax.set_ylim(0, _top(durs, 1.22))
    ax.bars(range(n), durs, 0.8 if n > 1 else 0.4, colors,
            titles=[f"step {lb}: {d:.2f} ms{k}" for lb, d, k in zip(labels, durs, kinds)])
    items = [LegendItem("steady step", BLUE)]
    if any(warm):
        items.append(LegendItem("warm-up", ORANGE))
    if any(trunc):
        items.append(LegendItem("truncated (last)", GREY))
    med = (res.stats or {}).get("median")
    if med is not None:
        ax.hline(med / 1e6, "#333333", 1.2, "5 3")
        items.append(LegendItem(f"median of steady steps: {med / 1e6:.2f} ms", "#333333", LINE, "5 3"))
    ax.legend(items, "upper right", ncol=2)
    ax.xlabel, ax.ylabel = "Step", "Step time (ms)"
    return fig.svg()


@svg_chart("gpu_time")
def gpu_time_svg(res: GpuTimeResult, results: Mapping[str, object]) -> str | None:
    ps = res.per_step
    if ps.height == 0:
        return None
    devices = sorted(d for d in set(ps["device"].to_list()) if d is not None)[:4]
    if not devices:
        return None
    nrow = len(devices)
    height = HEIGHT if nrow == 1 else 240 + 160 * nrow
    fig = Figure("GPU time per step: busy by category vs idle", WIDTH, height, name="gpu_time")
    legend: list[LegendItem] = []
    n_steps = ps.filter(ps["device"] == devices[0]).height
    grid = fig.panels(nrows=nrow, left=84, bottom=_bottom(n_steps, 26), hspace=18)
    for i, dev in enumerate(devices):
        ax = grid[i][0]
        d = ps.filter(ps["device"] == dev).sort("window")
        labels = _step_labels(d["step"].to_list(), d["window"].to_list())
        x = list(range(d.height))
        bottom = [0.0] * d.height
        series: list[tuple[str, list[float]]] = []
        for cat in _GPU_CATS:
            col = f"{cat}_ns"
            if col not in d.columns:
                continue
            vals = [_ms(v) for v in d[col].to_list()]
            if not any(vals) and cat not in ("compute", "idle"):
                continue
            series.append((cat, vals))
            bottom = [b + v for b, v in zip(bottom, vals)]
            if i == 0:
                legend.append(LegendItem(cat, CATEGORY_COLORS[cat]))
        ax.categories_x(labels)
        ax.set_ylim(0, _top(bottom, 1.15))
        stack = [0.0] * d.height
        width = 0.8 if d.height > 1 else 0.4
        for cat, vals in series:
            ax.bars(x, vals, width, CATEGORY_COLORS[cat], bottoms=stack,
                    titles=[f"step {lb} · {cat}: {v:.2f} ms" for lb, v in zip(labels, vals)])
            stack = [b + v for b, v in zip(stack, vals)]
        if "busy_pct" in d.columns and d.height <= 40:
            for xi, top, bp in zip(x, bottom, d["busy_pct"].to_list()):
                if bp is not None:
                    ax.text(xi, top, f"{bp:.0f}%", dy=8, anchor="middle", size=9.5, cls="busy-pct")
        if i < nrow - 1 and ax.xticks is not None:  # shared x: labels on the bottom panel only
            ax.xticks = [(p, "") for p, _ in ax.xticks]
        ax.ylabel = f"{device_name(dev, res.vendor)} (ms)" if nrow > 1 else "Time (ms)"
    grid[-1][0].xlabel = "Step (label: GPU busy %)"
    fig.legend_below(legend)
    return fig.svg()


# ---------------------------------------------------------------------------------------------
# Timeline strip
# ---------------------------------------------------------------------------------------------


def _gap_runs(clipped: pl.DataFrame, px_per_ms: float) -> pl.DataFrame:
    """The clipped gaps (``y``, ``x``/``w`` in ms, ``cause``) summed per pixel column of each row and
    cause, as runs of columns of the same coverage (¼ steps: a column a quarter covered by gaps is
    drawn at a quarter opacity, as an antialiased raster would show it): ``y, cause, level, b0, b1,
    idle_ms``. Thousands of sub-pixel gaps become a few hundred rectangles at most per row."""
    if clipped.height == 0:
        return pl.DataFrame(schema={"y": pl.Int64, "cause": pl.String, "level": pl.Float64, "b0": pl.Int64,
                                    "b1": pl.Int64, "idle_ms": pl.Float64})
    a = pl.col("x") * px_per_ms
    b = (pl.col("x") + pl.col("w")) * px_per_ms
    bins = (  # one lazy query: each eager step would be a polars collect of its own
        clipped.lazy()
        .select(pl.col("y").cast(pl.Int64), pl.col("cause").cast(pl.String), a.alias("a"), b.alias("b"))
        .filter(pl.col("b") > pl.col("a"))
        .with_columns(bin=pl.int_ranges(pl.col("a").floor().cast(pl.Int64),
                                        (pl.col("b") - 1e-9).floor().cast(pl.Int64) + 1))
        .explode("bin")
        .with_columns(cov=pl.min_horizontal(pl.col("b"), pl.col("bin") + 1) - pl.max_horizontal(pl.col("a"),
                                                                                                  pl.col("bin")))
        .group_by("y", "cause", "bin").agg(pl.col("cov").sum().clip(0, 1))
        .with_columns(level=(pl.col("cov") * 4).round() / 4)
        .filter(pl.col("level") > 0)
        .sort("y", "cause", "level", "bin")
    )
    return (
        bins.with_columns(run=pl.col("bin") - pl.int_range(pl.len()).over("y", "cause", "level"))
        .group_by("y", "cause", "level", "run")
        .agg(b0=pl.col("bin").min(), b1=pl.col("bin").max(), idle_ms=pl.col("cov").sum() / px_per_ms)
        .drop("run")
        .sort("y", "cause", "b0")
        .collect()
    )


def _overlapping_rows(g: pl.DataFrame, row_frame: pl.DataFrame) -> pl.DataFrame:
    """Each gap of ``g`` paired with every row window (``row_frame``: ``y, device, ws, we``) of
    its device that it overlaps (``end_ns > ws`` and ``start_ns < we``), one output row per pair.

    The rows of a device are a few dozen step windows in time order, so the pairs come from two
    binary searches per gap (the first window ending after the gap starts, the last starting
    before it ends) rather than from every gap joined with every window of its device. Where
    the windows of a device, ordered by start, do not also end in order (overlapping windows),
    the overlapping ones are not a contiguous run and the plain join decides."""
    parts = []
    for dev_frame in row_frame.partition_by("device", maintain_order=True):
        dev = dev_frame["device"][0]
        if dev is None:  # a join on the device pairs no null with a null
            continue
        win = dev_frame.sort("ws", "y")
        mine = g.filter(pl.col("device") == dev)
        if not win["we"].is_sorted():
            parts.append(mine.join(win.drop("device"), how="cross")
                         .filter((pl.col("end_ns") > pl.col("ws")) & (pl.col("start_ns") < pl.col("we"))))
            continue
        # Int64 before the - 1: the searches give unsigned row numbers.
        first = win["we"].search_sorted(mine["start_ns"], side="right").cast(pl.Int64)
        last = win["ws"].search_sorted(mine["end_ns"], side="left").cast(pl.Int64) - 1
        pairs = (mine.lazy().with_columns(_first=first, _last=last)  # one query, one collect
                 .filter(pl.col("_first") <= pl.col("_last"))
                 .with_columns(_i=pl.int_ranges("_first", pl.col("_last") + 1))
                 .explode("_i")
                 .drop("_first", "_last"))
        w = win.lazy().drop("device").with_row_index("_i").with_columns(pl.col("_i").cast(pl.Int64))
        parts.append(pairs.join(w, on="_i", how="left").drop("_i").collect())
    if not parts:
        return g.join(row_frame, on="device")
    return pl.concat(parts, how="vertical")


@svg_chart("timeline")
def timeline_svg(res: IdleGapsResult, results: Mapping[str, object]) -> str | None:
    prep = timeline_rows(res, results)
    if prep is None:
        return None
    rows, devices, first_last, truncated_rows = prep
    gaps = res.device_gaps
    nrow = len(rows)
    labels = [(f"#{step}" if step is not None else "trace")
              + (f" · {device_name(dev, res.vendor)}" if len(devices) > 1 else "")
              for _window, step, dev, _ws, _we in rows]
    lengths = [_ms(we - ws) for _window, _step, _dev, ws, we in rows]
    max_len = max(lengths, default=0.0)
    g = gaps.select("device", "start_ns", "end_ns", "dur_ns", "cause")
    row_frame = pl.DataFrame({"y": list(range(nrow)), "device": [r[2] for r in rows],
                              "ws": [r[3] for r in rows], "we": [r[4] for r in rows]},
                             schema_overrides={"device": g.schema["device"]})
    clipped = (
        _overlapping_rows(g, row_frame)
        .with_columns(lo=pl.max_horizontal("start_ns", "ws"), hi=pl.min_horizontal("end_ns", "we"))
        .with_columns(x=(pl.col("lo") - pl.col("ws")) / 1e6, w=(pl.col("hi") - pl.col("lo")) / 1e6)
    )
    used_causes = set(clipped["cause"].unique().to_list())
    items = [LegendItem("busy", GREEN), LegendItem("no GPU work", IDLE)]
    items += [LegendItem(f"gap: {CAUSE_LABELS[c]}", CAUSE_COLORS[c]) for c in CAUSE_COLORS if c in used_causes]
    width = WIDTH + 120
    fig = Figure("GPU timeline per step: busy vs idle, longest gaps marked", width,
                 min(1100.0, max(280.0, 170 + 50 * nrow)), name="timeline")
    ax = fig.panels(left=_left(labels), bottom=48 + fig.legend_height(items, 4))[0][0]
    ax.categories_y(labels)
    ax.set_ylim(nrow - 0.5, -1.3)
    ax.set_xlim(0, max_len * 1.01 if max_len > 0 else 1)
    half = 0.3
    for y, length in enumerate(lengths):
        ax.rect(0, length, y - half, y + half, IDLE, f"{labels[y]}: window {length:.2f} ms", cls="row")
    for y, (_window, _step, dev, ws, we) in enumerate(rows):
        fl = first_last.get(dev)
        lo, hi = (max(ws, fl[0]), min(we, fl[1])) if fl else (ws, we)
        if hi > lo:
            ax.rect(_ms(lo - ws), _ms(hi - ws), y - half, y + half, GREEN,
                    f"{labels[y]}: first to last GPU activity {_ms(hi - lo):.2f} ms", cls="busy")
    px_per_ms = ax.w / (ax.xs.hi - ax.xs.lo)
    runs = _gap_runs(clipped, px_per_ms)
    # one path per row, cause and coverage level (a row has hundreds of runs)
    for (y, cause, level), grp in runs.group_by("y", "cause", "level", maintain_order=True):
        boxes = [(b0 / px_per_ms, (b1 + 1) / px_per_ms, y - half, y + half)
                 for b0, b1 in zip(grp["b0"].to_list(), grp["b1"].to_list())]
        ax.rects(boxes, CAUSE_COLORS.get(str(cause), GREY), f"{labels[int(y)]} · gaps: "
                 f"{CAUSE_LABELS.get(str(cause), str(cause))}, {grp['idle_ms'].sum():.3f} ms idle "
                 f"(drawn at {float(level):.0%} cover)", cls="gap", opacity=float(level))
    longest = g.sort("dur_ns", descending=True).head(5)
    longest_keys = {(r["device"], r["start_ns"]) for r in longest.iter_rows(named=True)}
    marks: dict[tuple[Any, Any], tuple[int, float, int, str, str]] = {}
    for r in clipped.filter(pl.col("start_ns").is_in([s for _d, s in longest_keys])).sort("y").iter_rows(named=True):
        key = (r["device"], r["start_ns"])
        if key not in longest_keys:
            continue
        overlap = r["hi"] - r["lo"]
        mid = _ms((r["lo"] + r["hi"]) / 2 - r["ws"])
        if key not in marks or overlap > marks[key][0]:
            marks[key] = (overlap, mid, r["y"], fmt_ns_short(r["dur_ns"]), str(r["cause"]))
    for _, mid, y, text, cause in marks.values():
        edge = mid / max_len if max_len else 0.5
        anchor = "start" if edge < 0.08 else ("end" if edge > 0.92 else "middle")
        ax.marker(mid, y - 0.45, "v", "#222222", 9, title=f"gap of {text} ({CAUSE_LABELS.get(cause, cause)})",
                  cls="mark")
        ax.text(mid, y - 0.45, text, dx=-4 if anchor == "end" else (4 if anchor == "start" else 0), dy=9,
                anchor=anchor, size=10, color="#222222", weight="bold", baseline="auto", halo=True)
    ax.xlabel = "Time since step start (ms)" + (f"  ·  first {_MAX_ROWS} rows" if truncated_rows else "")
    fig.legend_below(items, 4)
    return fig.svg()


# ---------------------------------------------------------------------------------------------
# Idle-gap causes
# ---------------------------------------------------------------------------------------------


@svg_chart("idle_gaps")
def idle_causes_svg(res: IdleGapsResult, results: Mapping[str, object]) -> str | None:
    ps, hist = res.per_step, res.histogram
    if ps.height == 0:
        return None
    has_hist = hist.height > 0 and "total_ns" in hist.columns
    agg = ps.group_by("window", "step").agg([pl.col(f"{c}_ns").sum().alias(c) for c in (*CAUSE_COLORS, "outside_gaps")
                                             if f"{c}_ns" in ps.columns]).sort("window")
    labels = _step_labels(agg["step"].to_list(), agg["window"].to_list())
    x = list(range(agg.height))
    series: list[tuple[str, str, list[float]]] = []
    for cause, color in CAUSE_COLORS.items():
        if cause in agg.columns:
            vals = [_ms(v) for v in agg[cause].to_list()]
            if any(vals):
                series.append((CAUSE_LABELS[cause], color, vals))
    if "outside_gaps" in agg.columns:
        vals = [_ms(v) for v in agg["outside_gaps"].to_list()]
        if any(vals):
            series.append(("no GPU work yet / any more", IDLE, vals))
    items = [LegendItem(label, color) for label, color, _ in series]
    fig = Figure("GPU idle time by cause", WIDTH + (240 if has_hist else 0), HEIGHT, name="idle_gaps")
    h = None
    if has_hist:
        h = hist.group_by("bin", "lo_ns").agg(pl.col("count").sum(), pl.col("total_ns").sum())
        h = h.sort("lo_ns", nulls_last=False)
        h = h.filter(h["count"] > 0) if h.height > 6 else h
    bottom_room = max(_bottom(agg.height), 112.0 if has_hist else 0.0) + fig.legend_height(items, 3)
    grid = fig.panels(ncols=2 if has_hist else 1, left=74, top=TOP_TITLED, bottom=bottom_room,
                      width_ratios=[3, 2] if has_hist else None)
    ax = grid[0][0]
    ax.categories_x(labels)
    stack = [0.0] * agg.height
    for _label, _color, vals in series:
        stack = [b + v for b, v in zip(stack, vals)]
    ax.set_ylim(0, _top(stack, 1.12))
    stack = [0.0] * agg.height
    width = 0.8 if agg.height > 1 else 0.4
    for label, color, vals in series:
        ax.bars(x, vals, width, color, bottoms=stack,
                titles=[f"step {lb} · {label}: {v:.2f} ms" for lb, v in zip(labels, vals)])
        stack = [b + v for b, v in zip(stack, vals)]
    ax.title, ax.xlabel, ax.ylabel = "Idle time per step, by cause", "Step", "Idle time (ms)"
    fig.legend_below(items, 3)
    if h is not None:
        ax2 = grid[0][1]
        xs = list(range(h.height))
        tot = [_ms(v) for v in h["total_ns"].to_list()]
        bins = [short(b, 14) for b in h["bin"].to_list()]
        counts = h["count"].to_list()
        ax2.categories_x(bins)
        ax2.xtick_rotate = True
        ax2.set_ylim(0, _top(tot, 1.18))
        ax2.bars(xs, tot, 0.75, GREY, titles=[f"gaps {b}: {c:,} gaps, {v:.2f} ms idle"
                                               for b, c, v in zip(bins, counts, tot)])
        for xi, v, c in zip(xs, tot, counts):
            ax2.text(xi, v, f"{c:,}", dy=7, anchor="middle", size=9.5, cls="count")
        ax2.title, ax2.xlabel, ax2.ylabel = "Idle time by gap length (n gaps)", "Gap length", "Idle time (ms)"
    return fig.svg()


# ---------------------------------------------------------------------------------------------
# Kernels and launches
# ---------------------------------------------------------------------------------------------


@svg_chart("kernels")
def kernels_svg(res: KernelsResult, results: Mapping[str, object]) -> str | None:
    by = res.by_name
    if by.height == 0:
        return None
    top = by.head(12)
    full = [str(n) for n in top["name"].to_list()]
    names = [short(n, 56) for n in full]
    tot = [_ms(v) for v in top["total_ns"].to_list()]
    comm = top["is_comm"].to_list() if "is_comm" in top.columns else [False] * top.height
    pcts = top["pct_of_kernel_time"].to_list() if "pct_of_kernel_time" in top.columns else [None] * top.height
    counts = top["count"].to_list() if "count" in top.columns else [None] * top.height
    fig = Figure("Top kernels by total GPU time", WIDTH + 160, max(300.0, 130 + 36 * top.height), name="kernels")
    ax = fig.panels(left=_left(names), bottom=56)[0][0]
    ax.categories_y(names)
    ax.set_xlim(0, _top(tot, 1.25))
    ax.barh(range(top.height), tot, 0.7, [PURPLE if c else BLUE for c in comm],
            titles=[f"{n}: {v:.3f} ms" for n, v in zip(full, tot)])
    for yi, v, p, c in zip(range(top.height), tot, pcts, counts):
        label = (f"{p:.1f} %" if p is not None else "") + (f" · {c:,}×" if c is not None else "")
        ax.text(v, yi, label, dx=4, size=10.5)
    ax.xlabel = "Total GPU time (ms)  ·  label: % of kernel time · calls"
    if any(comm):
        ax.legend([LegendItem("compute", BLUE), LegendItem("communication", PURPLE)], "lower right")
    return fig.svg()


@svg_chart("launches")
def launches_svg(res: LaunchesResult, results: Mapping[str, object]) -> str | None:
    ps, by_api = res.per_step, res.by_api
    if ps.height == 0 and by_api.height == 0:
        return None
    has_steps, has_api = ps.height > 0, by_api.height > 0
    b = by_api.head(8)
    names = [short(n, 28) for n in b["api"].to_list()] if has_api else []
    lefts = ([74.0] if has_steps else []) + ([_left(names)] if has_api else [])
    fig = Figure("Kernel launch statistics", WIDTH + 220, HEIGHT, name="launches")
    n = ps.height
    grid = fig.panels(ncols=len(lefts), left=lefts, top=TOP_TITLED, bottom=_bottom(n, 44), wspace=30)
    i = 0
    if has_steps:
        ax = grid[0][i]
        i += 1
        d = ps.sort("window")
        labels = _step_labels(d["step"].to_list(), d["window"].to_list())
        x = list(range(d.height))
        cpu = [_ms(v) for v in d["launch_cpu_ns"].to_list()]
        gpu = [_ms(v) for v in d["launched_gpu_ns"].to_list()]
        w = 0.38
        top = max(cpu + gpu) if cpu + gpu else 0.0
        ax.categories_x(labels)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        ax.bars([xi - w / 2 for xi in x], cpu, w, ORANGE,
                titles=[f"step {lb}: CPU time in launch calls {v:.2f} ms" for lb, v in zip(labels, cpu)])
        ax.bars([xi + w / 2 for xi in x], gpu, w, BLUE,
                titles=[f"step {lb}: GPU time launched {v:.2f} ms" for lb, v in zip(labels, gpu)])
        if "launch_bound" in d.columns:
            for xi, lb in zip(x, d["launch_bound"].to_list()):
                if lb:
                    ax.text(xi, top * 1.02, "launch-bound", anchor="middle", size=9.5, color=RED, weight="bold",
                            baseline="auto")
        ax.title, ax.xlabel, ax.ylabel = "Launch CPU time vs launched GPU time", "Step", "Time (ms)"
        ax.legend([LegendItem("CPU time in launch calls", ORANGE), LegendItem("GPU time launched", BLUE)], "below")
    if has_api:
        ax = grid[0][i]
        y = list(range(b.height))
        h = 0.38
        cpu_us = [float(v or 0) / 1e3 for v in b["median_cpu_ns"].to_list()]
        delay_us = [float(v or 0) / 1e3 for v in b["median_delay_ns"].to_list()]
        ax.categories_y(names)
        m = max(cpu_us + delay_us) if cpu_us + delay_us else 0.0
        positive = [v for v in cpu_us + delay_us if v > 0]
        log = bool(positive) and m / min(positive) > 50
        if log:
            ax.set_xlim(min(positive) / 2, m * 8, log=True)
            ax.xlabel = "Median time (µs, log scale)"
        else:
            ax.set_xlim(0, m * 1.35 if m > 0 else 1)
            ax.xlabel = "Median time (µs)"
        api = [str(a) for a in b["api"].to_list()]

        def shown(vals: list[float]) -> list[float]:  # a zero has no place on a log axis
            return [v if v > 0 or not log else ax.xs.lo for v in vals]

        ax.barh([yi - h / 2 for yi in y], shown(cpu_us), h, ORANGE,
                titles=[f"{a}: median call {v:,.1f} µs" for a, v in zip(api, cpu_us)])
        ax.barh([yi + h / 2 for yi in y], shown(delay_us), h, GREY,
                titles=[f"{a}: median launch delay {v:,.1f} µs" for a, v in zip(api, delay_us)])
        calls = b["calls"].to_list() if "calls" in b.columns else [None] * b.height
        for yi, v, c in zip(y, shown(cpu_us), calls):
            if c is not None:
                ax.text(max(v, ax.xs.lo if log else 0.0), yi - h / 2, f"{c:,} calls", dx=4, size=9.5)
        ax.title = "Per launch API"
        ax.legend([LegendItem("median call (CPU)", ORANGE), LegendItem("median launch delay", GREY)], "below")
    return fig.svg()


# ---------------------------------------------------------------------------------------------
# Copies and syncs
# ---------------------------------------------------------------------------------------------


def _hotspot_svg(name: str, title: str, per_step: pl.DataFrame, step_bars: list[tuple[str, str, str]],
                 sites: pl.DataFrame, site_value: str, site_label: Callable[[dict[str, Any]], str],
                 site_xlabel: str) -> str | None:
    """Left: per-step bars of ``step_bars`` (column, legend, colour), in ms; right: the top call
    sites by ``site_value`` (ns), labelled by ``site_label(row)`` (as the PNG's hotspot figure)."""
    has_steps = per_step.height > 0 and all(c in per_step.columns for c, _, _ in step_bars)
    has_sites = sites.height > 0 and site_value in sites.columns
    if not has_steps and not has_sites:
        return None
    rows = list(sites.sort(site_value, descending=True, nulls_last=True).head(8).iter_rows(named=True)) \
        if has_sites else []
    site_names = [short(r.get("site"), 42) for r in rows]
    lefts = ([74.0] if has_steps else []) + ([_left(site_names)] if has_sites else [])
    ncols = len(lefts)
    fig = Figure(title, WIDTH + (260 if ncols == 2 else 0), HEIGHT, name=name)
    n = per_step.height
    grid = fig.panels(ncols=ncols, left=lefts, top=TOP_TITLED, bottom=_bottom(n, 16 + 17 * len(step_bars)), wspace=30,
                      width_ratios=[2, 3] if ncols == 2 else None)
    i = 0
    if has_steps:
        ax = grid[0][i]
        i += 1
        d = per_step
        labels = _step_labels(d["step"].to_list()) if "step" in d.columns else [str(k) for k in range(d.height)]
        x = list(range(d.height))
        w = 0.8 / len(step_bars)
        series = [(label, color, [_ms(v) for v in d[col].to_list()]) for col, label, color in step_bars]
        ax.categories_x(labels, max_labels=16)
        ax.set_ylim(0, _top([v for _, _, vals in series for v in vals], 1.15))
        for j, (label, color, vals) in enumerate(series):
            ax.bars([xi - 0.4 + w * (j + 0.5) for xi in x], vals, w, color,
                    titles=[f"step {lb}: {label} {v:.2f} ms" for lb, v in zip(labels, vals)])
        ax.title, ax.xlabel, ax.ylabel = "Per step", "Step", "Time (ms)"
        ax.legend([LegendItem(label, color) for _, label, color in step_bars], "below")
    if has_sites:
        ax = grid[0][i]
        vals = [_ms(r[site_value]) for r in rows]
        ax.categories_y(site_names, min_rows=5)
        ax.set_xlim(0, _top(vals, 1.6))
        ax.barh(range(len(rows)), vals, 0.65, RED,
                titles=[f"{r.get('site')}: {v:.2f} ms" for r, v in zip(rows, vals)])
        for yi, v, r in zip(range(len(rows)), vals, rows):
            ax.text(v, yi, short(site_label(r), 40), dx=4, size=10)
        ax.title, ax.xlabel = "Top call sites", site_xlabel
    return fig.svg()


@svg_chart("copies")
def copies_svg(res: CopiesResult, results: Mapping[str, object]) -> str | None:
    def label(r: dict[str, Any]) -> str:
        bits = [str(r.get("directions") or ""), fmt_bytes_short(r.get("bytes")), f"{r.get('count', 0):,}×"]
        if r.get("blocking"):
            bits.append(f"{r['blocking']:,} blocking")
        return " · ".join(b for b in bits if b)

    return _hotspot_svg("copies", "Copies: time per step and hotspots by call site", res.per_step,
                        [("gpu_ns", "GPU copy time", ORANGE), ("cpu_ns", "CPU time in copy ops", BLUE)],
                        res.by_site, "cpu_ns", label, "CPU time in copy ops (ms)")


@svg_chart("syncs")
def syncs_svg(res: SyncsResult, results: Mapping[str, object]) -> str | None:
    def label(r: dict[str, Any]) -> str:
        causes = r.get("causes")
        if isinstance(causes, (list, tuple)):
            causes = ", ".join(map(str, causes))
        return " · ".join(b for b in (str(causes or ""), f"{r.get('count', 0):,}×") if b)

    return _hotspot_svg("syncs", "Host-device syncs: cost per step and hotspots by call site", res.per_step,
                        [("blocked_ns", "CPU blocked", RED), ("idle_after_ns", "GPU idle after", IDLE_DARK)],
                        res.by_site, "blocked_ns", label, "CPU blocked (ms)")


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

_DEVICE_COLORS = (BLUE, PURPLE, GREEN, CYAN)


@svg_chart("memory_steps")
def trace_memory_svg(res: TraceMemoryResult, results: Mapping[str, object]) -> str | None:
    ps = res.per_step
    if ps.height == 0 or "peak_allocated_bytes" not in ps.columns:
        return None
    devices = sorted({d for d in ps["device"].to_list() if d is not None}, key=str)[:4]
    width = 0.8 / max(1, len(devices))
    peaks = {r["device"]: r for r in res.per_device.iter_rows(named=True)}
    scale, unit = _byte_unit(_max(ps["peak_allocated_bytes"]))
    items: list[LegendItem] = []
    per_dev: list[tuple[Any, pl.DataFrame, list[float]]] = []
    top = 0.0
    labels: list[str] = []
    for j, dev in enumerate(devices):
        d = ps.filter(pl.col("device") == dev)
        peak = [float(v or 0) / scale for v in d["peak_allocated_bytes"].to_list()]
        top = max([top, *peak])
        labels = _step_labels(d["step"].to_list())
        per_dev.append((dev, d, peak))
        items.append(LegendItem(f"{device_name(str(dev))} peak allocated", _DEVICE_COLORS[j % 4]))
        if j == 0:
            items += [LegendItem(name, "#222222", MARK, marker=m) for col, m, name in
                      (("start_allocated_bytes", "_", "at step start"), ("end_allocated_bytes", "x", "at step end"))
                      if col in d.columns]
    fig = Figure("GPU memory per step (profiler [memory] events)", WIDTH, HEIGHT, name="memory_steps")
    ax = fig.panels(left=74, bottom=_bottom(len(labels)) + fig.legend_height(items, 4))[0][0]
    ax.categories_x(labels, max_labels=20)
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    for j, (dev, d, peak) in enumerate(per_dev):
        steps = _step_labels(d["step"].to_list())
        xs = [xi - 0.4 + width * (j + 0.5) for xi in range(d.height)]
        dname = device_name(str(dev))
        ax.bars(xs, peak, width * 0.9, _DEVICE_COLORS[j % 4],
                titles=[f"step {s} · {dname}: peak allocated {v:,.2f} {unit}" for s, v in zip(steps, peak)])
        for col, marker, name in (("start_allocated_bytes", "_", "at step start"),
                                  ("end_allocated_bytes", "x", "at step end")):
            if col in d.columns:
                for s, xv, v in zip(steps, xs, d[col].to_list()):
                    yv = float(v or 0) / scale
                    ax.marker(xv, yv, marker, "#222222", 10, title=f"step {s} · {dname}: {name} {yv:,.2f} {unit}")
        pk = peaks.get(dev)
        if pk and peak:
            k = max(range(len(peak)), key=lambda i: peak[i])
            op = pk.get("peak_op")
            text = f"peak {fmt_bytes_short(pk.get('peak_allocated_bytes'))}" + (f"\n{short(op, 30)}" if op else "")
            ax.text(xs[k], peak[k], text, dy=6, anchor="middle", size=10, weight="bold", color="#222222",
                    baseline="auto")
    ax.xlabel, ax.ylabel = "Step", f"Allocated ({unit})"
    fig.legend_below(items, 4)
    return fig.svg()


def _memory_lines(ax: Axes, series: pl.DataFrame, by_time: bool) -> None:
    """Allocated (solid) and reserved (dashed) bytes after each event, per device (steps, at most
    :data:`MAX_LINE_POINTS` points: bucket maxima keep the peak); the peak marked."""
    from traceanalyzer.analyses._memory import decimate

    devices = sorted(d for d in series["device"].unique().to_list() if d is not None)[:4]
    first = series["ts_ns"].min() if by_time else None
    t0 = first if isinstance(first, int) else 0
    hi = max(_max(series["allocated_bytes"]),
             _max(series["reserved_bytes"]) if "reserved_bytes" in series.columns else 0.0)
    scale, unit = _byte_unit(hi)
    lines: list[tuple[int, str, list[float], list[float], list[float] | None]] = []
    for j, dev in enumerate(devices):
        d = series.filter(pl.col("device") == dev)
        if not d["event_idx"].is_sorted():
            d = d.sort("event_idx")
        if d.height > MAX_LINE_POINTS:
            d = decimate(d, MAX_LINE_POINTS)
        if by_time:
            d = d.filter(pl.col("ts_ns").is_not_null())
            xs = [(t - t0) / 1e9 for t in d["ts_ns"].to_list()]
        else:
            xs = [float(v) for v in d["event_idx"].to_list()]
        alloc = [float(v or 0) / scale for v in d["allocated_bytes"].to_list()]
        reserved = ([float(v or 0) / scale for v in d["reserved_bytes"].to_list()]
                    if "reserved_bytes" in d.columns else None)
        lines.append((j, str(dev), xs, alloc, reserved))
    all_x = [x for _, _, xs, _, _ in lines for x in xs]
    x_lo, x_hi = (min(all_x), max(all_x)) if all_x else (0.0, 1.0)
    pad = (x_hi - x_lo) * 0.02 or 1.0
    ax.set_xlim(x_lo - pad, x_hi + pad)
    ax.set_ylim(0, hi / scale * 1.08 if hi > 0 else 1)
    items: list[LegendItem] = []
    for j, dev, xs, alloc, reserved in lines:
        color = _DEVICE_COLORS[j % 4]
        suffix = f" ({device_name(dev)})" if len(devices) > 1 else ""
        ax.line(xs, alloc, color, 1.4, steps=True)
        items.append(LegendItem("allocated" + suffix, color, LINE))
        if reserved is not None:
            ax.line(xs, reserved, color, 1.0, dash="5 3", steps=True, opacity=0.7)
            items.append(LegendItem("reserved" + suffix, color, LINE, "5 3"))
        if alloc:
            k = max(range(len(alloc)), key=lambda i: alloc[i])
            ax.marker(xs[k], alloc[k], "v", RED, 10, title=f"peak {fmt_bytes_short(alloc[k] * scale)}")
            ax.text(xs[k], alloc[k], f"peak {fmt_bytes_short(alloc[k] * scale)}", dx=6, dy=8, size=11,
                    weight="bold", color=RED, baseline="auto", halo=True)
    ax.xlabel = "Time since first event (s)" if by_time else "Allocator event #"
    ax.ylabel = f"Memory ({unit})"
    ax.legend(items, "lower right", ncol=2)


@svg_chart("memory_timeline")
def memory_timeline_svg(res: MemoryTimelineResult, results: Mapping[str, object]) -> str | None:
    series = res.series
    if series.height == 0:
        return None
    peak = _also(results, "memory_peak", MemoryPeakResult)
    sites = peak.top_sites if peak is not None else pl.DataFrame()
    has_live = sites.height > 0 and "bytes" in sites.columns
    by_time = res.x_axis == "time" and series["ts_ns"].null_count() < series.height
    top = sites.head(8) if has_live else sites
    site_names = [short(s, 34) for s in top["site"].to_list()] if has_live else []
    points = series.group_by("device").len()["len"].max()
    history = res.history and isinstance(points, int) and points >= 2
    title = "GPU memory over time, peak annotated" if history else \
        "GPU memory at the dump (no allocator history recorded)"
    fig = Figure(title, WIDTH + (300 if has_live else 0), HEIGHT, name="memory_timeline")
    lefts = [80.0] + ([_left(site_names)] if has_live else [])
    grid = fig.panels(ncols=len(lefts), left=lefts, top=TOP_TITLED if has_live else 46, bottom=56, wspace=30,
                      width_ratios=[3, 2] if has_live else None)
    ax = grid[0][0]
    if history:
        _memory_lines(ax, series, by_time)
    else:  # one point per device: a line would be an empty axis with fractional ticks
        ax.frame = False
        lines = ["No allocator history in this snapshot, so no memory over time:",
                 "it is recorded only while torch.cuda.memory._record_memory_history()",
                 "is on. What the dump itself holds:", ""]
        for dv in res.devices[:4]:
            lines.append(f"cuda:{dv.device}  allocated {fmt_bytes_short(dv.final_allocated)}"
                         f" · reserved {fmt_bytes_short(dv.final_reserved)}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.text(0.0, 0.95, "\n".join(lines), size=12.5, baseline="hanging")
    if has_live:
        ax2 = grid[0][1]
        lscale, lunit = _byte_unit(_max(top["bytes"]))
        vals = [float(v or 0) / lscale for v in top["bytes"].to_list()]
        cats = top["category"].to_list() if "category" in top.columns else [None] * top.height
        palette = {"activation": ORANGE, "parameter": BLUE, "gradient": GREEN, "optimizer_state": PURPLE,
                   "pre_recording": GREY, "unknown": IDLE_DARK}
        ax2.categories_y(site_names)
        ax2.set_xlim(0, _top(vals, 1.6))
        ax2.barh(range(top.height), vals, 0.65, [palette.get(str(c), CYAN) for c in cats],
                 titles=[f"{s}: {v:,.2f} {lunit} live at the peak" for s, v in zip(top["site"].to_list(), vals)])
        pcts = top["pct_of_peak"].to_list() if "pct_of_peak" in top.columns else [None] * top.height
        for yi, v, p, c in zip(range(top.height), vals, pcts, cats):
            ax2.text(v, yi, (f"{p:.0f} %" if p is not None else "") + (f" · {c}" if c else ""), dx=4, size=9.5)
        ax2.title, ax2.xlabel = "Live at the peak, by call site", f"Live at the peak ({lunit})"
    return fig.svg()


@svg_chart("export_timeline")
def export_timeline_svg(res: ExportTimelineResult, results: Mapping[str, object]) -> str | None:
    at_peak = res.at_peak
    if at_peak.height == 0:
        return None
    rows = list(at_peak.sort("bytes", descending=True).iter_rows(named=True))
    maxima = res.max_per_category or {}
    hi = max([float(r["bytes"] or 0) for r in rows] + [float(v or 0) for v in maxima.values()])
    scale, unit = _byte_unit(hi)
    cats = [str(r["category"]) for r in rows]
    fig = Figure("Memory by category at the peak", WIDTH, max(300.0, 160 + 42 * len(rows)), name="export_timeline")
    ax = fig.panels(left=_left(cats), bottom=56)[0][0]
    palette = {"activation": ORANGE, "parameter": BLUE, "gradient": GREEN, "optimizer_state": PURPLE,
               "input": CYAN, "temporary": KHAKI, "autograd_detail": PINK, "unknown": GREY}
    ax.categories_y(cats, min_rows=3)
    ax.set_xlim(0, hi / scale * 1.2 if hi > 0 else 1)
    vals = [float(r["bytes"] or 0) / scale for r in rows]
    ax.barh(range(len(rows)), vals, 0.65, [palette.get(c, GREY) for c in cats],
            titles=[f"{c}: {v:,.2f} {unit} at the peak" for c, v in zip(cats, vals)])
    mx = [float(maxima.get(r["category"]) or 0) / scale for r in rows]
    items = [LegendItem("at the peak", GREY)]
    if any(mx):
        for yi, (c, v) in enumerate(zip(cats, mx)):
            ax.marker(v, yi, "|", "#222222", 18, title=f"{c}: own maximum {v:,.2f} {unit}")
        items.append(LegendItem("own maximum over the run", "#222222", MARK, marker="|"))
    for yi, v, r in zip(range(len(rows)), vals, rows):
        p = r.get("pct_of_peak")
        ax.text(v, yi, f"{p:.1f} %" if p is not None else "", dx=4, size=10.5)
    peak = res.peak_total_bytes
    ax.xlabel = f"Memory ({unit})" + (f"  ·  peak total {fmt_bytes_short(peak)}" if peak else "")
    ax.legend(items, "lower right")
    return fig.svg()
