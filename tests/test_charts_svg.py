"""The HTML page's charts as inline SVG: well-formed, the result's data in them, no matplotlib.

Each SVG chart of the small synthetic report (3 steps, a planted hostile kernel name) parses as
XML, has one bar per step / kernel / category it draws, labels taken from the result, and no
``nan``/``inf`` in a coordinate. A default ``analyze`` writes no PNG, embeds SVG and never
imports matplotlib; ``png`` stays available (``--format png`` / ``all``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from report_support import shared_report

from traceanalyzer.analyses import Results
from traceanalyzer.report import _svg_charts
from traceanalyzer.report._svg import Scale, esc, nice_step, num, short
from traceanalyzer.report.charts import DrawnSvg, charts_for, draw_svgs

NS = "{http://www.w3.org/2000/svg}"
SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "pt113_sync_bound.json.gz"
COORDS = ("x", "y", "width", "height", "cx", "cy", "r", "d", "transform", "viewBox")


@pytest.fixture(scope="module")
def report() -> Any:
    return shared_report(hostile=True)


@pytest.fixture(scope="module")
def svgs(report: Any) -> dict[str, ET.Element]:
    drawn = draw_svgs(report.results, strict=True)
    return {d.spec.name: ET.fromstring(d.svg or "") for d in drawn}


def by_class(root: ET.Element, cls: str, tag: str = "") -> list[ET.Element]:
    return [e for e in root.iter() if e.get("class") == cls and (not tag or e.tag == NS + tag)]


def texts(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in root.iter(NS + "text")]


def test_every_chart_parses_scales_and_has_finite_coordinates(report: Any, svgs: dict[str, ET.Element]) -> None:
    assert list(svgs) == [s.name for s in charts_for(report.results)]
    assert {"steps", "gpu_time", "timeline", "idle_gaps", "kernels", "launches", "copies", "syncs",
            "memory_steps"} <= set(svgs)
    for name, root in svgs.items():
        assert root.tag == NS + "svg" and root.get("data-chart") == name
        assert re.fullmatch(r"0 0 \d+(\.\d)? \d+(\.\d)?", root.get("viewBox") or ""), name
        for e in root.iter():
            for attr in COORDS:
                value = e.get(attr)
                assert value is None or not re.search(r"nan|inf", value, re.I), (name, e.tag, attr, value)
        assert by_class(root, "bar") or by_class(root, "row") or by_class(root, "pt"), f"{name}: nothing drawn"
        assert all(e.find(NS + "title") is not None for e in by_class(root, "bar")), f"{name}: bars without hover"


def test_steps_chart_one_bar_per_step_and_the_median(report: Any, svgs: dict[str, ET.Element]) -> None:
    steps = report.results["steps"]
    root = svgs["steps"]
    bars = by_class(root, "bar", "rect")
    assert len(bars) == steps.table.height == 3
    labels = texts(root)
    assert [f"#{s}" for s in steps.table["step"].to_list()] == [t for t in labels if t.startswith("#")]
    median_ms = steps.stats["median"] / 1e6
    assert f"median of steady steps: {median_ms:.2f} ms" in labels
    # the tallest bar is the longest step
    heights = [float(b.get("height") or 0) for b in bars]
    durs = steps.table["dur_ns"].to_list()
    assert heights.index(max(heights)) == durs.index(max(durs))
    assert "Step time per step" in labels


def test_kernels_chart_names_the_top_kernels_escaped(report: Any, svgs: dict[str, ET.Element]) -> None:
    by = report.results["kernels"].by_name.head(12)
    root = svgs["kernels"]
    assert len(by_class(root, "bar", "rect")) == by.height
    labels = texts(root)
    for name in by["name"].to_list():
        assert short(name, 56) in labels  # the text as the result holds it, after XML unescaping
    hover = ["".join(b.find(NS + "title").itertext()) for b in by_class(root, "bar")]  # type: ignore[union-attr]
    assert any(h.startswith("evil|kernel") for h in hover), "the planted name is shown, as text"


def test_stacked_and_grouped_bars_match_the_results(report: Any, svgs: dict[str, ET.Element]) -> None:
    gt = report.results["gpu_time"].per_step
    cats = [c for c in ("compute", "communication", "memcpy", "memset", "idle") if f"{c}_ns" in gt.columns
            and (c in ("compute", "idle") or gt[f"{c}_ns"].sum() > 0)]
    assert len(by_class(svgs["gpu_time"], "bar")) == gt.height * len(cats)
    busy = [f"{v:.0f}%" for v in gt.sort("window")["busy_pct"].to_list()]
    assert busy == ["".join(e.itertext()) for e in by_class(svgs["gpu_time"], "busy-pct")]
    launches = report.results["launches"]
    assert len(by_class(svgs["launches"], "bar")) == 2 * launches.per_step.height + 2 * min(8, launches.by_api.height)
    hist = report.results["idle_gaps"].histogram
    h = hist.group_by("bin", "lo_ns").agg(pl.col("count").sum()).sort("lo_ns")
    h = h.filter(pl.col("count") > 0) if h.height > 6 else h
    shown = ["".join(e.itertext()) for e in by_class(svgs["idle_gaps"], "count")]
    assert shown == [f"{c:,}" for c in h["count"].to_list()]
    ps = report.results["idle_gaps"].per_step
    series = [c for c in ("host_bound", "sync", "memcpy", "data_loader", "stream_dependency", "other", "outside_gaps")
              if f"{c}_ns" in ps.columns and ps[f"{c}_ns"].sum() > 0]
    n_windows = ps["window"].n_unique()
    assert len(by_class(svgs["idle_gaps"], "bar")) == h.height + n_windows * len(series)  # + stacked per step


def test_timeline_rows_busy_spans_gaps_and_marks(report: Any, svgs: dict[str, ET.Element]) -> None:
    root = svgs["timeline"]
    n_steps = report.results["steps"].table.height
    assert len(by_class(root, "row")) == n_steps and len(by_class(root, "busy")) == n_steps
    gaps = by_class(root, "gap")
    assert gaps and all(0 < float(g.get("fill-opacity") or 1) <= 1 for g in gaps)
    assert 1 <= len(by_class(root, "mark")) <= 5
    assert {"#1", "#2", "#3"} <= set(texts(root))


def test_timeline_sums_sub_pixel_gaps_per_pixel_column() -> None:
    # 1,000 gaps of 0.001 ms, one every 0.01 ms over 10 ms, at 100 px per ms: 1,000 columns a
    # tenth covered, which round to no run at all; 10 gaps of 0.1 ms each fill 10 columns (one run each)
    tiny = pl.DataFrame({"y": [0] * 1000, "x": [i * 0.01 for i in range(1000)], "w": [0.001] * 1000,
                         "cause": ["sync"] * 1000})
    assert _svg_charts._gap_runs(tiny, 100.0).height == 0
    wide = pl.DataFrame({"y": [1] * 10, "x": [i * 1.0 for i in range(10)], "w": [0.1] * 10,
                         "cause": ["host_bound"] * 10})
    runs = _svg_charts._gap_runs(wide, 100.0)
    assert runs.height == 10 and runs["level"].to_list() == [1.0] * 10
    assert runs["b0"].to_list() == [100 * i for i in range(10)] and runs["b1"].to_list() == [100 * i + 9
                                                                                            for i in range(10)]
    assert runs["idle_ms"].sum() == pytest.approx(1.0)
    # half-covered columns are drawn at half opacity, as one run
    half = pl.DataFrame({"y": [0] * 4, "x": [0.0, 0.01, 0.02, 0.03], "w": [0.005] * 4, "cause": ["sync"] * 4})
    assert _svg_charts._gap_runs(half, 100.0).select("level", "b0", "b1").rows() == [(0.5, 0, 3)]


def test_memory_line_is_bounded_and_keeps_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult

    n = 10_000
    alloc = [(i % 1000) * 1024 * 1024 for i in range(n)]
    alloc[7777] = 5 << 30  # the peak: 5 GiB
    series = pl.DataFrame({"device": [0] * n, "event_idx": list(range(n)), "ts_ns": [i * 1000 for i in range(n)],
                           "action": ["alloc"] * n, "allocated_bytes": alloc, "active_bytes": alloc,
                           "reserved_bytes": [6 << 30] * n})
    res = MemoryTimelineResult(devices=(), series=series, allocations=pl.DataFrame(), x_axis="time", history=True)
    monkeypatch.setattr(_svg_charts, "MAX_LINE_POINTS", 200)
    svg = _svg_charts.memory_timeline_svg(res, {"memory_timeline": res})
    assert svg is not None
    root = ET.fromstring(svg)
    lines = by_class(root, "line", "path")
    assert len(lines) == 2  # allocated and reserved
    for line in lines:
        assert (line.get("d") or "").count("H") <= 200
    assert "peak 5.0 GiB" in texts(root)
    assert "Time since first event (s)" in texts(root) and "Memory (GiB)" in texts(root)


def test_roofline_places_the_heaviest_ops() -> None:
    from test_efficiency import _planted

    from traceanalyzer.analyses import run_analyses
    from traceanalyzer.analyses.efficiency import EfficiencyResult
    from traceanalyzer.report import discover
    from traceanalyzer.report.roofline import MAX_LABELS, roofline_points

    discover()
    results = run_analyses(_planted(), only=("steps", "efficiency"), strict=True)
    drawn = {d.spec.name: d for d in draw_svgs(results, strict=True)}
    root = ET.fromstring(drawn["roofline"].svg or "")
    eff = results["efficiency"]
    assert isinstance(eff, EfficiencyResult)
    pts = roofline_points(eff)
    discs = by_class(root, "pt", "circle")
    assert len(discs) == pts.height == 2
    labels = texts(root)
    for op in pts["op"].to_list()[:MAX_LABELS]:
        assert any(t.startswith(op.removeprefix("aten::")[:20]) for t in labels), op
    # the heavier op has the larger disc
    radii = [float(d.get("r") or 0) for d in discs]
    assert radii[0] > radii[1]
    assert any(t.startswith("memory roof") for t in labels) and "achieved TFLOP/s" in labels
    bare = run_analyses(_planted(props=None), only=("steps", "efficiency"), strict=True)
    assert "roofline" not in {d.spec.name for d in draw_svgs(bare, strict=True)}


class _Boom:
    @property
    def by_name(self) -> Any:
        raise RuntimeError("boom")


def test_a_failing_chart_is_reported_on_the_page_not_fatal(report: Any) -> None:
    from dataclasses import replace

    from traceanalyzer.report.html import to_html

    broken = Results(values={"steps": report.results["steps"], "kernels": _Boom()})  # type: ignore[dict-item]  # a result that fails
    drawn = {d.spec.name: d for d in draw_svgs(broken)}
    assert drawn["kernels"] == DrawnSvg(drawn["kernels"].spec, None, "RuntimeError: boom")
    assert drawn["steps"].svg is not None
    with pytest.raises(RuntimeError, match="boom"):
        draw_svgs(broken, strict=True)
    page = to_html(replace(report), charts=list(drawn.values()))
    assert "could not be drawn: RuntimeError: boom" in page and 'id="chart-steps"' in page


def test_primitives_escape_and_never_write_nan() -> None:
    assert [num(v) for v in (float("nan"), float("inf"), 1e9, -0.04, 2.0, 2.25)] == ["0", "0", "100000", "0", "2",
                                                                                    "2.2"]
    assert esc("a<b>&\"'\x00\x1b") == "a&lt;b&gt;&amp;&quot;&#x27;"
    assert [nice_step(s, 5) for s in (10, 7, 1.2, 0.03)] == [2, 2, 0.25, 0.01]
    assert [lb for _, lb in Scale(0, 10, 0, 100).ticks()] == ["0", "2", "4", "6", "8", "10"]
    assert [lb for _, lb in Scale(0, 1.2, 0, 100).ticks()] == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert [lb for _, lb in Scale(0.05, 2000, 0, 100, log=True).ticks()] == ["0.1", "1", "10", "100", "1,000"]
    assert Scale(0, 10, 0, 100)(5) == 50 and Scale(5, 5, 0, 100)(5) == 0


# ---------------------------------------------------------------------------------------------
# The default formats
# ---------------------------------------------------------------------------------------------


def test_png_is_not_a_default_format_but_is_in_all() -> None:
    from traceanalyzer.pipeline import resolve_formats
    from traceanalyzer.report import all_formats, default_formats

    assert "png" not in default_formats() and "png" not in resolve_formats(None)
    assert set(resolve_formats(None)) == {"html", "md", "json"}
    assert "png" in all_formats() and set(resolve_formats(["all"])) == {"html", "md", "json", "png"}
    assert resolve_formats(["png"]) == ["png"]


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample trace not present")
def test_default_analyze_writes_svg_charts_no_png_and_never_imports_matplotlib(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from traceanalyzer.cli import cli\n"
        f"r = CliRunner().invoke(cli, ['analyze', {str(SAMPLE)!r}, '-o', {str(tmp_path)!r}, '-q'])\n"
        "print(r.exit_code, 'matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr
    assert not list(tmp_path.glob("*.png"))
    assert {p.name for p in tmp_path.iterdir()} >= {"report.html", "report.md", "summary.json"}
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "data:image/png" not in page and "<img" not in page and "also written as" not in page
    figures = re.findall(r'<figure class="chart" id="chart-([a-z_]+)"><svg ', page)
    assert "steps" in figures and "kernels" in figures
    assert "--format png" in page  # where to get the PNGs


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample trace not present")
def test_format_png_still_writes_every_chart(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from traceanalyzer.cli import cli

    r = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", str(tmp_path), "-q", "--format", "all"])
    assert r.exit_code == 0, r.output
    pngs = {p.stem for p in tmp_path.glob("*.png")}
    svgs = set(re.findall(r'id="chart-([a-z_]+)"><svg', (tmp_path / "report.html").read_text(encoding="utf-8")))
    assert pngs and pngs == svgs  # the same charts, both ways


def _plain_overlap_join(g: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    return g.join(rows, on="device").filter((pl.col("end_ns") > pl.col("ws")) & (pl.col("start_ns") < pl.col("we")))


@pytest.mark.parametrize("overlapping_windows", [False, True])
def test_timeline_gap_row_pairs_match_the_plain_join(overlapping_windows: bool) -> None:
    # Two devices; gaps inside a window, across a window boundary (two pairs), spanning three
    # windows, touching a window's edge (no overlap: half-open), before and after every window.
    rows = pl.DataFrame({"y": [0, 1, 2, 3, 4], "device": [0, 0, 0, 1, 1],
                         "ws": [100, 200, 300, 100, 250], "we": [200, 300, 400, 250, 400]})
    if overlapping_windows:  # window 1 ends after window 2: the searches cannot decide, the join does
        rows = rows.with_columns(we=pl.Series([200, 350, 340, 250, 400]))
    # A gap and a row without a device: the join pairs no null with a null.
    rows = pl.concat([rows, pl.DataFrame({"y": [5], "device": [None], "ws": [100], "we": [400]},
                                         schema=rows.schema)])
    g = pl.DataFrame({"device": [0, 0, 0, 0, 0, 0, 1, 1, 2, None],
                      "start_ns": [120, 190, 150, 200, 10, 450, 240, 90, 100, 150],
                      "end_ns": [130, 210, 390, 205, 100, 460, 260, 120, 200, 160],
                      "dur_ns": [10, 20, 240, 5, 90, 10, 20, 30, 100, 10],
                      "cause": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]})
    got = _svg_charts._overlapping_rows(g, rows)
    want = _plain_overlap_join(g, rows)
    key = ["device", "start_ns", "y"]
    assert got.select(sorted(got.columns)).sort(key).equals(want.select(sorted(want.columns)).sort(key))
    assert got.height == 10  # 1 + 2 + 3 + 1 on device 0, 2 + 1 on device 1
