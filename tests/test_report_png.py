"""PNG charts: one readable, non-blank image per chart; nothing for absent results."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from report_support import shared_report

from traceanalyzer.analyses import Results
from traceanalyzer.pipeline import write_outputs
from traceanalyzer.report import discover
from traceanalyzer.report.charts import Drawn, charts_for, draw_all

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def pixels(png: bytes) -> Any:
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    return np.asarray(img, dtype=float)


def assert_readable_chart(png: bytes, name: str) -> None:
    assert png[:8] == PNG_MAGIC, name
    assert 5_000 < len(png) < 600_000, (name, len(png))
    px = pixels(png)
    h, w, _ = px.shape
    # legible in a ticket thumbnail: wide enough for 10 pt text at 120 dpi, not a poster
    assert 900 <= w <= 1600 and 300 <= h <= 1300, (name, w, h)
    assert px.std() > 20, f"{name} looks blank (pixel std {px.std():.1f})"
    ink = (px.min(axis=2) < 200).mean()  # share of pixels that are not (near) white
    assert 0.02 < ink < 0.9, (name, ink)


@pytest.fixture(scope="module")
def report() -> Any:
    return shared_report(hostile=True)


@pytest.fixture(scope="module")
def drawn(report: Any) -> list[Drawn]:
    """Every chart of ``report``, drawn once for the module, in this process (``jobs=1``).

    Not strict, so draw_all keeps it as the report's charts: the tests below that draw the
    report again (the default ``draw_all``, the PNG renderer) get these, and the forked test
    compares its own, forked, drawing against these in-process bytes.
    """
    discover()  # every chart module registered, as write_outputs does first (report/roofline.py)
    return draw_all(report.results, jobs=1)


def test_every_chart_is_drawn_and_readable(report: Any, drawn: list[Drawn]) -> None:
    assert draw_all(report.results) == drawn  # cached per report: the HTML page draws the same charts
    assert [d.error for d in drawn if d.error] == []
    names = {d.spec.name for d in drawn}
    assert {"steps", "gpu_time", "timeline", "idle_gaps", "kernels", "launches", "copies", "syncs",
            "memory_steps"} <= names
    for d in drawn:
        assert_readable_chart(d.png, d.spec.name)


def test_png_renderer_writes_one_file_per_chart(report: Any, drawn: list[Drawn], tmp_path: Path) -> None:
    written = write_outputs(report, tmp_path, ["png"])
    assert written and all(p.suffix == ".png" and p.parent == tmp_path for p in written)
    assert {p.stem for p in written} == {d.spec.name for d in draw_all(report.results)}
    for p in written:
        assert_readable_chart(p.read_bytes(), p.name)


def test_charts_for_absent_results_are_not_drawn(report: Any) -> None:
    only = Results(values={"overview": report.results["overview"]})
    assert charts_for(only) == []
    assert draw_all(only) == []


class _Boom:
    @property
    def by_name(self) -> Any:
        raise RuntimeError("boom")


def test_a_failing_chart_is_reported_not_fatal(report: Any) -> None:
    broken = Results(values={"steps": report.results["steps"], "kernels": _Boom()})
    drawn = {d.spec.name: d for d in draw_all(broken)}
    assert drawn["kernels"].png is None and drawn["kernels"].error == "RuntimeError: boom"
    assert (drawn["steps"].png or b"")[:8] == PNG_MAGIC
    with pytest.raises(RuntimeError):
        draw_all(broken, strict=True)


SNAPSHOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots" / "MAGMA27__memory_snapshot.pickle"


@pytest.mark.skipif(not SNAPSHOT.exists(), reason="../shared reference snapshot not present")
def test_memory_timeline_chart_of_a_snapshot() -> None:
    from traceanalyzer.pipeline import analyze

    report = analyze(SNAPSHOT)
    drawn = {d.spec.name: d for d in draw_all(report.results)}
    assert drawn["memory_timeline"].error is None
    assert_readable_chart(drawn["memory_timeline"].png, "memory_timeline")


def test_json_only_run_does_not_import_matplotlib(tmp_path: Path) -> None:
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "pt113_sync_bound.json.gz"
    if not sample.exists():
        pytest.skip("sample trace not present")
    code = (
        "import sys\n"
        "from traceanalyzer.pipeline import analyze, write_outputs\n"
        f"write_outputs(analyze({str(sample)!r}), {str(tmp_path)!r}, ['json', 'md'])\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_charts_rendered_in_forked_processes_are_the_same_bytes(report: Any, drawn: list[Drawn]) -> None:
    """Rasterising in forked children (the default on Linux) gives the bytes one process gives,
    in the same order, and reports every chart as it is done. The one-process bytes are the
    module's drawing (``jobs=1``; test_every_chart_is_drawn_and_readable asserts it has no
    error), so every chart is drawn twice in this module, not three times."""
    seen: list[str] = []
    forked = draw_all(report.results, strict=True, jobs=3, on_drawn=lambda d: seen.append(d.spec.name))
    alone = drawn
    assert [d.spec.name for d in forked] == [d.spec.name for d in alone] == [s.name for s in charts_for(report.results)]
    assert sorted(seen) == sorted(d.spec.name for d in forked)
    assert all(a.png == b.png and a.png is not None for a, b in zip(forked, alone))


OOM_SNAPSHOT = SNAPSHOT.parent / "Yiyi__oom_snapshot.pickle"


@pytest.mark.skipif(not OOM_SNAPSHOT.exists(), reason="../shared reference snapshot not present")
def test_memory_chart_of_a_snapshot_without_history_says_why() -> None:
    """A snapshot dumped without allocator history has one point: the chart says why there is
    no line and gives the state at the dump, instead of an empty axis with fractional ticks."""
    from traceanalyzer.pipeline import analyze
    from traceanalyzer.report.charts import _STYLE, _mpl, registry

    report = analyze(OOM_SNAPSHOT)
    assert report.results["memory_timeline"].history is False
    spec = registry()["memory_timeline"]
    with _mpl().rc_context(_STYLE):
        fig = spec.func(report.results["memory_timeline"], report.results)
    left = fig.axes[0]
    text = " ".join(t.get_text() for t in left.texts)
    assert not left.axison and not left.lines
    assert "No allocator history" in text and "cuda:0  allocated 11.0 GiB" in text
    drawn = {d.spec.name: d for d in draw_all(report.results, strict=True)}
    assert_readable_chart(drawn["memory_timeline"].png, "memory_timeline")
