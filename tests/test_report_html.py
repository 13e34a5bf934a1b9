"""report.html: self-contained, escaped, small; and it works in a real headless browser.

The browser test drives Debian's ``chromium`` (or ``chromium-browser`` /
``google-chrome``) when one is installed, and skips otherwise; the test installs
nothing (``.ci/run`` installs chromium). It loads the page twice from a file:// URL:

* ``--dump-dom`` of ``report.html#ta-selftest``: the page's own script records script
  errors (``data-js-errors``), Content-Security-Policy violations (``data-csp-violations``,
  which is what a planted ``<script>`` or ``onerror=`` would cause if it ever reached
  the markup unescaped), opens a collapsed table and sorts a numeric column
  (``data-selftest="ok"``), and marks that it ran (``data-js-ready``). A planted
  script that ran would set ``data-pwned`` on ``<html>``. Console errors are also
  looked for in chromium's ``--enable-logging=stderr`` output.
* ``--screenshot``: saved into the test's tmp dir and checked to be a non-blank PNG.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from report_support import HOSTILE, shared_report

from traceanalyzer.pipeline import write_outputs
from traceanalyzer.report.html import JS, to_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((p for p in (shutil.which(b) for b in BROWSERS) if p), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium/chrome installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def report() -> Any:
    return shared_report(hostile=True)


@pytest.fixture(scope="module")
def page(report: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    (path,) = write_outputs(report, out, ["html"])
    return path


# ---------------------------------------------------------------------------------------------
# Static checks
# ---------------------------------------------------------------------------------------------


def test_self_contained_no_external_urls(page: Path) -> None:
    html = page.read_text(encoding="utf-8")
    srcs = re.findall(r'\bsrc\s*=\s*"([^"]*)"', html)
    hrefs = re.findall(r'\bhref\s*=\s*"([^"]*)"', html)
    # the charts are inline SVG drawn from the results: no image, no PNG, no xlink to anything
    assert srcs == [] and "<img" not in html and "data:image/png" not in html
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart-svg"') >= 9
    assert "xlink:href" not in html and "<image" not in html
    assert all(h.startswith("#") for h in hrefs), hrefs
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:|//)', html, re.I)
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?(https?:|//)", html)
    assert "<link" not in html.lower()


def test_hostile_kernel_name_is_escaped(page: Path) -> None:
    html = page.read_text(encoding="utf-8")
    # the page's own script, and the timeline's data block (not executable, not in the CSP)
    assert html.count("<script") == 2 and html.count("<script>") == 1, "only the page's own script"
    assert html.count('<script type="application/json" id="ta-timeline-data">') == 1
    assert "<img src=x" not in html and "onerror=\"document" not in html
    assert "&lt;script&gt;document.documentElement.setAttribute(&#x27;data-pwned&#x27;" in html
    assert HOSTILE not in html


def test_escaping_everywhere_in_to_html(report: Any) -> None:
    # the Report's own strings (source path, warnings) are untrusted too
    from dataclasses import replace

    evil = replace(report, source="runs/<b onclick=x>bold<b>.json", warnings=("<i>warn</i> & more",))
    html = to_html(evil, charts=[])
    assert "<b onclick" not in html and "&lt;b onclick=x&gt;bold&lt;b&gt;.json" in html
    assert "<i>warn</i>" not in html and "&lt;i&gt;warn&lt;/i&gt; &amp; more" in html


def test_csp_allows_exactly_the_inline_script(page: Path) -> None:
    html = page.read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    assert csp and f"script-src &#x27;sha256-{digest}&#x27;" in csp.group(1)
    assert "default-src &#x27;none&#x27;" in csp.group(1)
    assert f"<script>{JS}</script>" in html


def test_structure_and_size(page: Path, report: Any) -> None:
    html = page.read_text(encoding="utf-8")
    assert len(html.encode()) < 3 * 1024 * 1024
    order = [html.index(s) for s in ('id="sec-run"', 'id="sec-findings"', 'id="sec-timeline"',
                                      'id="sec-run-details"', 'id="sec-overview"', 'id="sec-steps"',
                                      'id="sec-gpu_time"', 'id="sec-idle_gaps"', 'id="sec-kernels"')]
    assert order == sorted(order), "run line and verdict, findings, timeline, run details, then analyses in order"
    for name, title, _ in report.sections():
        if name != "timeline_view":  # drawn as the timeline card
            assert f'id="sec-{name}"' in html and title.replace("&", "&amp;") in html
    for chart in ("steps", "gpu_time", "timeline", "idle_gaps", "kernels", "launches", "copies", "syncs",
                  "memory_steps"):
        assert f'id="chart-{chart}"' in html
    assert 'class="sortable"' in html
    # run metadata in the header
    for fact in ("NVIDIA A100 80GB PCIe", "Rank", "0 of 1", "record_shapes=on", "3 (#1–#3)", "cuda runtime version"):
        assert fact in html, fact


def test_long_tables_collapse_behind_a_button() -> None:
    import polars as pl

    from traceanalyzer.report.html import _Ids, table_html

    df = pl.DataFrame({"name": [f"k<{i}>" for i in range(40)], "total_ns": list(range(40)), "flag": [True] * 40})
    html = table_html(df, _Ids(), caption="Long")
    assert 'data-collapse="12"' in html and "Show all 40 rows" in html
    assert html.count("<tr>") == 41 and "k&lt;39&gt;" in html
    assert 'data-v="39"' in html and ">39<" in html and ">total (ns)<" in html  # the unit once, in the header
    short = table_html(df.head(5), _Ids())
    assert 'data-collapse="0"' in short and "<button" not in short
    capped = table_html(df, _Ids(), max_rows=10)
    assert capped.count("<tr>") == 11 and "first 10 shown" in capped


def test_analyze_open_launches_the_html(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.cli import cli

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "pt113_sync_bound.json.gz"
    if not sample.exists():
        pytest.skip("sample trace not present")
    launched: list[str] = []

    def launch(url: str, *a: Any, **k: Any) -> int:
        launched.append(url)
        return 0

    monkeypatch.setattr("click.launch", launch)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["analyze", str(sample), "-o", str(out), "--format", "md", "--open", "-q"])
    assert res.exit_code == 0, res.output
    assert res.output == ""  # --quiet: no summary, no progress
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]
    assert launched == [str((out / "report.html").resolve())]


# ---------------------------------------------------------------------------------------------
# In a real headless browser
# ---------------------------------------------------------------------------------------------


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
    ]
    return subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=90)


def _console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines()
            if "CONSOLE" in ln and re.search(r"ERROR|Uncaught|violates|Refused", ln)]


@needs_browser
def test_report_in_headless_browser(page: Path, tmp_path: Path) -> None:
    url = page.resolve().as_uri()
    dom_run = _chromium(["--dump-dom", url + "#ta-selftest"], tmp_path / "profile-dom")
    dom = dom_run.stdout
    assert dom.strip(), f"chromium printed no DOM: {dom_run.stderr[-2000:]}"
    root = re.search(r"<html\b[^>]*>", dom)
    assert root, dom[:500]
    tag = root.group(0)
    assert 'data-js-ready="1"' in tag, f"the page's script did not run: {tag}"
    assert "data-js-errors" not in tag, tag
    assert "data-csp-violations" not in tag, tag
    assert "data-pwned" not in tag, "a planted script ran"
    assert 'data-selftest="ok"' in tag, tag
    assert not _console_errors(dom_run.stderr), _console_errors(dom_run.stderr)
    # the self-test clicked a finding's "show its gaps" button: its gaps are highlighted
    holder = re.search(r'<div id="ta-timeline"[^>]*>', dom)
    assert holder and 'data-highlighted="0"' not in holder.group(0), holder
    assert re.search(r'<div class="finding[^"]*tl-active"', dom), "the clicked finding is marked"

    shot = tmp_path / "shot.png"
    shot_run = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", url], tmp_path / "profile-shot")
    assert shot.exists(), shot_run.stderr[-2000:]
    assert not _console_errors(shot_run.stderr), _console_errors(shot_run.stderr)
    import numpy as np
    from PIL import Image

    img = Image.open(shot)
    assert img.size == (1280, 2000)
    px = np.asarray(img.convert("L"), dtype=float)
    assert px.std() > 25, "screenshot looks blank"
    assert (px < 128).mean() > 0.02, "almost no dark pixels: text and charts missing?"


def test_findings_are_ranked_escaped_and_show_evidence(report: Any) -> None:
    from report_support import with_findings

    html = to_html(with_findings(report), charts=[])
    assert html.count("<script>") == 1 and "<img src=x" not in html
    start, end = html.index('id="sec-findings"'), html.index('id="sec-overview"')
    section = html[start:end]
    assert section.index("pageable memory") < section.index("is slow") < section.index("40 % unused")
    assert "2.16 ms/step (25.4 % of median step)" in section and "400.00 MiB" in section
    assert "badge sev-critical" in section and "confidence 60%" in section
    assert "DataLoader(pin_memory=True)" in section and "<pre>loader = DataLoader" in section
    assert "<details><summary>Code and evidence</summary>" in section
    assert "train.py:36 (to_device)" in section and ">6.481<" in section and ">cpu (ms)<" in section  # evidence table
    assert "18.38 MiB" in section  # bytes_per_step formatted by its unit


# ---------------------------------------------------------------------------------------------
# The first screen and the timeline
# ---------------------------------------------------------------------------------------------


def _timeline_json(html: str) -> dict[str, Any]:
    import json

    m = re.search(r'<script type="application/json" id="ta-timeline-data">(.*?)</script>', html, re.S)
    assert m, "no timeline data"
    assert "<" not in m.group(1), "a < in the data could end its element"
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def test_first_screen_run_line_verdict_and_short_facts(page: Path, report: Any) -> None:
    html = page.read_text(encoding="utf-8")
    first = html[html.index('id="sec-run"'):html.index('id="sec-findings"')]
    assert "<b>File</b> synthetic.json" in first and "<b>Device</b> NVIDIA A100 80GB PCIe" in first
    assert "<b>Steps</b> 3 (#1–#3), median steady step" in first
    verdict = re.search(r'<p class="verdict">([^<]*)</p>', first)
    assert verdict and verdict.group(1) == report.results["diagnosis"].verdict_line()
    assert re.search(r"\d+\.\d %", verdict.group(1)), "the verdict carries its number"
    tiles = re.findall(r'<div class="v">([^<]*)</div>', first)
    assert tiles and all(len(v) <= 40 for v in tiles), tiles  # short facts, not paragraphs
    assert "Evidence" not in first and "What would move it" not in first  # detail moved below


def test_timeline_data_is_embedded_and_findings_point_at_existing_gaps(page: Path, report: Any) -> None:
    html = page.read_text(encoding="utf-8")
    data = _timeline_json(html)
    tv = report.results["timeline_view"]
    n = len(data["items"]["name"])
    assert n == tv.items.height and all(len(v) == n for v in data["items"].values())
    assert {lane["kind"] for lane in data["lanes"]} == {"gpu", "gaps", "cpu"}
    gap_ids = {g["id"] for g in data["gaps"]}
    assert len(data["findings"]) == len(report.findings)
    linked = [f for f in data["findings"] if f["gaps"]]
    assert linked, "at least one finding (the data loader's) points at a gap of the step shown"
    for i, f in enumerate(data["findings"]):
        assert set(f["gaps"]) <= gap_ids
        button = f'<button class="tl-show" type="button" data-finding="{i}" data-gaps="{len(f["gaps"])}">'
        assert (button in html) == bool(f["gaps"])  # a button only where there is something to show
    names = [data["strings"][i] for i in data["items"]["name"]]
    assert any(HOSTILE in name for name in names), "names travel whole, escaped only as JSON"
    assert set(data["cause_colors"]) >= {g["cause"] for g in data["gaps"]}


def test_json_for_html_cannot_end_its_element() -> None:
    import json

    from traceanalyzer.report.html import _json_for_html

    evil = {"name": "</script><script>alert(1)</script><!-- & \u2028"}
    text = _json_for_html(evil)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == evil


def test_tables_have_plain_distinct_headers_and_one_unit_per_quantity() -> None:
    import polars as pl

    from traceanalyzer.report.html import _Ids, table_html

    df = pl.DataFrame({"step": [1, 2], "step_ns": [5_998_000, 13_751_000], "mean_ns": [12_600.0, 148_300.0],
                       "memcpy": [1, 2], "memcpy_bytes": [19_267_584, 1 << 20], "klass": ["gemm", "reduction"]})
    html = table_html(df, _Ids())
    heads = re.findall(r"<th [^>]*>([^<]*)</th>", html)
    assert heads == ["step", "step time (ms)", "mean (ms)", "memcpy", "memcpy size (MiB)", "class"]
    assert len(set(heads)) == len(heads)
    cells = re.findall(r'<td class="num" data-v="[^"]*">([^<]*)</td>', html)
    assert cells[:6] == ["1", "5.998", "0.013", "1", "18.38", "2"]  # µs-sized means in the table's ms
    assert "µs" not in html and " ms<" not in html


def test_every_table_of_a_report_has_distinct_plain_headers(report: Any) -> None:
    from traceanalyzer.analyses import tables_of
    from traceanalyzer.report.text import table_formats

    for _, _, result in report.sections():
        for title, df in tables_of(result).items():
            labels = [f.label for f in table_formats(df).values()]
            assert len(set(labels)) == len(labels), (title, labels)
            assert not any("klass" in label for label in labels), title


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node not installed")
def test_page_script_parses_in_node(tmp_path: Path) -> None:
    # without a browser, at least the script's syntax is checked
    js = tmp_path / "page.js"
    js.write_text(JS, encoding="utf-8")
    assert NODE is not None
    run = subprocess.run([NODE, "--check", str(js)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
