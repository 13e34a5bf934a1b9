"""The roofline chart of the ``efficiency`` analysis (PNG and the HTML report's efficiency section).

A log-log plot of achieved TFLOP/s against arithmetic intensity (FLOP per byte moved): the
memory roof is bandwidth × intensity, each compute roof the device's peak for a precision the
run used (bf16 tensor, fp32 vector …). The heaviest operation types (op name and precision,
``efficiency.by_op``) are placed on it, each a disc whose area is proportional to its kernel
time; the gap between a disc and the roof above it is what the efficiency findings price.
Operations with no FLOPs (copies, embedding lookups) have no place on a log axis and are left
out. Registered with :func:`traceanalyzer.report.charts.chart` (the PNG, matplotlib) and
:func:`~traceanalyzer.report.charts.svg_chart` (the HTML page, inline SVG), so both draw it like
any chart; it only draws what the result holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.report._svg import Figure as SvgFigure
from traceanalyzer.report._svg import LegendItem, short
from traceanalyzer.report.charts import (
    BLUE,
    BROWN,
    GREEN,
    GREY,
    ORANGE,
    PINK,
    PURPLE,
    RED,
    _short,
    chart,
    new_figure,
    svg_chart,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: How many operation types are placed on the chart (the heaviest by kernel time).
MAX_POINTS = 12
#: How many of them are labelled.
MAX_LABELS = 6
FAMILY_COLORS = {"gemm": BLUE, "conv": GREEN, "attention": PURPLE, "norm": ORANGE, "softmax": RED,
                 "elementwise": BROWN, "embedding": PINK, "copy": GREY}
_PEAK_LABELS = {"fp64": "FP64 vector", "fp64_tensor": "FP64 tensor", "fp32": "FP32 vector",
                "fp32_tensor": "FP32 matrix", "tf32_tensor": "TF32 tensor", "fp16_tensor": "FP16 tensor",
                "bf16_tensor": "BF16 tensor", "fp8_tensor": "FP8 tensor", "int8_tensor": "INT8 tensor"}


def roofline_points(res: EfficiencyResult, limit: int = MAX_POINTS) -> pl.DataFrame:
    """The operation types drawn: FLOPs and time > 0, heaviest first (``op, family, precision,
    peak_key, intensity, tflops, kernel_ns``)."""
    return res.by_op.filter((pl.col("flops") > 0) & (pl.col("kernel_ns") > 0) & (pl.col("bytes") > 0)).sort(
        "kernel_ns", descending=True).head(limit).select(
        "op", "family", "precision", "peak_key", "intensity", "tflops", "kernel_ns")


@dataclass(frozen=True)
class _Layout:
    """What both drawings place: the points, the roofs and the axes' ranges."""

    pts: pl.DataFrame
    bw: float
    peaks: dict[str, float]
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    device: str


def _layout(res: EfficiencyResult) -> _Layout | None:
    pts = roofline_points(res)
    bw = res.peaks.get("mem_bw_tbs")
    if pts.is_empty() or not bw:
        return None
    ai = [float(v) for v in pts["intensity"]]
    tf = [float(v) for v in pts["tflops"]]
    keys = sorted({k for k in pts["peak_key"].drop_nulls().to_list() if res.peaks.get(k)},
                  key=lambda k: -float(res.peaks[k]))
    peaks = {k: float(res.peaks[k]) for k in keys}
    top = max([*peaks.values(), *tf])
    x_lo = 10 ** math.floor(math.log10(max(min(ai), 1e-3)) - 0.5)
    x_hi = 10 ** math.ceil(math.log10(max(max(ai), top / float(bw) * 4)) + 0.5)
    y_lo = 10 ** math.floor(math.log10(max(min(tf), 1e-4)) - 0.5)
    return _Layout(pts, float(bw), peaks, x_lo, x_hi, y_lo, top * 3, str(res.peaks.get("device") or "device"))


@svg_chart("roofline")
def roofline_svg(res: EfficiencyResult, results: Mapping[str, object]) -> str | None:
    """The roofline as inline SVG (the HTML page's), the same marks as :func:`roofline_chart`."""
    lay = _layout(res)
    if lay is None:
        return None
    fig = SvgFigure(f"Roofline ({lay.device}): heaviest operations, area = kernel time", 880, 440, name="roofline")
    ax = fig.panels(left=80, bottom=56)[0][0]
    ax.set_xlim(lay.x_lo, lay.x_hi, log=True)
    ax.set_ylim(lay.y_lo, lay.y_hi, log=True)
    ax.grid = "both"
    # the memory roof is straight on log-log axes: two points; clipped to the plot's top
    x_top = min(lay.x_hi, lay.y_hi / lay.bw)
    ax.line([lay.x_lo, x_top], [lay.bw * lay.x_lo, lay.bw * x_top], "#444444", 1.2, dash="5 3",
            title=f"memory roof {lay.bw:g} TB/s")
    for k, p in lay.peaks.items():
        ax.line([p / lay.bw, lay.x_hi], [p, p], "#444444", 1.2, title=f"{_PEAK_LABELS.get(k, k)} peak {p:,.0f} TFLOP/s")
        ax.text(lay.x_hi, p, f"{_PEAK_LABELS.get(k, k)} {p:,.0f}", dx=-4, dy=4, anchor="end", size=10.5,
                color="#444444", baseline="auto")
    total = float(lay.pts["kernel_ns"].sum()) or 1.0
    for i, r in enumerate(lay.pts.iter_rows(named=True)):
        # matplotlib's ``s`` is an area in pt²: the same relative areas, as a diameter in px
        size = math.sqrt(40 + 1600 * float(r["kernel_ns"]) / total) * 1.4
        name = f"{r['op'].removeprefix('aten::')} {r['precision']}"
        ax.marker(r["intensity"], r["tflops"], "o", FAMILY_COLORS.get(r["family"], GREY), size, opacity=0.6,
                  stroke="#ffffff", title=f"{name}: {float(r['tflops']):,.2f} TFLOP/s at {float(r['intensity']):,.1f}"
                  f" FLOP/B · {float(r['kernel_ns']) / 1e6:,.2f} ms kernel time")
        if i < MAX_LABELS:  # the lighter ones unlabelled: their labels would pile up
            ax.text(r["intensity"], r["tflops"], short(name, 28), dx=6, dy=-3, size=10)
    ax.xlabel, ax.ylabel = "arithmetic intensity (FLOP per byte moved)", "achieved TFLOP/s"
    items = [LegendItem(f"memory roof {lay.bw:g} TB/s", "#444444", "line", "5 3")]
    items += [LegendItem(fam, FAMILY_COLORS.get(fam, GREY), "marker", marker="o")
              for fam in dict.fromkeys(lay.pts["family"].to_list())]
    ax.legend(items, "upper left")
    return fig.svg()


@chart("roofline", section="efficiency", title="Roofline: achieved TFLOP/s against arithmetic intensity", order=90)
def roofline_chart(res: EfficiencyResult, results: Mapping[str, object]) -> Figure | None:
    lay = _layout(res)
    if lay is None:
        return None
    pts, bw, peaks, x_lo, x_hi = lay.pts, lay.bw, lay.peaks, lay.x_lo, lay.x_hi
    fig, axes = new_figure(f"Roofline ({lay.device}): heaviest operations, area = kernel time")
    ax = axes[0, 0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [bw * x for x in xs], color="#444444", linewidth=1.2, linestyle="--",
            label=f"memory roof {bw:g} TB/s")
    for k, p in peaks.items():
        ridge = p / bw
        ax.plot([ridge, x_hi], [p, p], color="#444444", linewidth=1.2)
        ax.annotate(f"{_PEAK_LABELS.get(k, k)} {p:,.0f}", (x_hi, p), textcoords="offset points", xytext=(-4, 3),
                    ha="right", fontsize=9, color="#444444")
    total = float(pts["kernel_ns"].sum()) or 1.0
    for i, r in enumerate(pts.iter_rows(named=True)):
        size = 40 + 1600 * float(r["kernel_ns"]) / total
        ax.scatter([r["intensity"]], [r["tflops"]], s=size, alpha=0.6, color=FAMILY_COLORS.get(r["family"], GREY),
                   edgecolors="white", linewidths=0.8, zorder=3)
        if i >= MAX_LABELS:  # the lighter ones unlabelled: their labels would pile up
            continue
        ax.annotate(_short(f"{r['op'].removeprefix('aten::')} {r['precision']}", 28), (r["intensity"], r["tflops"]),
                    textcoords="offset points", xytext=(6, -3), fontsize=8.5, zorder=4)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(lay.y_lo, lay.y_hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", axis="both", color="#E6E6E6", linewidth=0.8)
    for fam in dict.fromkeys(pts["family"].to_list()):
        ax.scatter([], [], s=60, color=FAMILY_COLORS.get(fam, GREY), alpha=0.6, label=fam)
    ax.legend(loc="upper left", fontsize=9)
    return fig
