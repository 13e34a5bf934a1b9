"""Outputs of ``compare``: ``compare.md``, ``compare.json``, ``compare.html`` and a
terminal summary. Formatting only: every number comes from the
:class:`~traceanalyzer.compare.diff.Comparison`. The HTML page is self-contained (inline
CSS, no script) and escapes every trace-derived string with :func:`html.escape`.

Every output opens with the comparability check
(:mod:`~traceanalyzer.compare.comparability`): a hardware mismatch ("not comparable") or
a software/batch-size warning is the first thing stated, before the verdict.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceanalyzer import __version__
from traceanalyzer.compare.diff import Comparison
from traceanalyzer.errors import ConfigError
from traceanalyzer.report.fsutil import atomic_write_bytes, atomic_write_text
from traceanalyzer.report.text import clean_text, md_escape, shorten
from traceanalyzer.units import fmt_bytes, fmt_pct

FORMATS = ("md", "json", "html")


def _v(value: Any, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.2f} %"
    return f"{value:,.3f} {unit}"


def _d(value: Any, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "bytes":
        return ("+" if value >= 0 else "−") + fmt_bytes(abs(value))
    if unit == "%":
        return f"{value:+.2f} pt"
    if unit == "count":
        return f"{value:+,.0f}"
    return f"{value:+,.3f} {unit}"


#: Input warnings listed in the Markdown/HTML/terminal outputs (all are in compare.json).
MAX_WARNINGS_SHOWN = 20


def _delta_rows(df: pl.DataFrame, n: int) -> list[dict[str, Any]]:
    return df.filter(pl.col("status") != "unchanged").head(n).to_dicts()


def to_json(cmp: Comparison) -> dict[str, Any]:
    return {"tool": {"name": "traceanalyzer", "version": __version__}, **cmp.to_json()}


def to_markdown(cmp: Comparison, top: int = 20) -> str:
    b, c = cmp.baseline, cmp.candidate
    st = cmp.step_time
    per = "per step and rank" if cmp.per == "step" else "per trace (no ProfilerStep on a side)"
    lines = ["# traceanalyzer compare", ""]
    head = cmp.comparability.headline()
    if head:
        lines += [f"> **{md_escape(head)}**", ""]
    warn = cmp.input_warnings()
    if warn:
        lines += [f"> **Input warnings** ({len(warn)}): the loader repaired or cut short an input, so kernels "
                  "and steps it lost show up as new, vanished or changed below.", ">"]
        lines += [f"> - {md_escape(w)}" for w in warn[:MAX_WARNINGS_SHOWN]]
        if len(warn) > MAX_WARNINGS_SHOWN:
            lines.append(f"> - … {len(warn) - MAX_WARNINGS_SHOWN} more in compare.json")
        lines.append("")
    lines += [
        f"**Baseline**: `{md_escape(b.label)}` ({b.n_ranks} file(s), {len(b.step_samples_ms)} steady steps) · "
        f"**Candidate**: `{md_escape(c.label)}` ({c.n_ranks} file(s), {len(c.step_samples_ms)} steady steps)",
        "",
        f"> **Verdict: {st.verdict}** — {md_escape(st.sentence())}",
        "",
        "## Comparability",
        "",
        f"Status: **{cmp.comparability.status}** (hardware: device model, devices per trace, vendor, world size; "
        "software: versions; workload: batch size).",
        "",
        "| Fact | Baseline | Candidate | Status |",
        "|---|---|---|---|",
    ]
    for f in cmp.comparability.fields:
        if f.baseline is None and f.candidate is None:
            continue
        lines.append(f"| {f.label} | {md_escape(f.baseline or '–')} | {md_escape(f.candidate or '–')} | "
                     f"{'**mismatch**' if f.status == 'mismatch' else f.status} |")
    lines += [
        "",
        "## Key numbers",
        "",
        "| Metric | Baseline | Candidate | Δ | Δ % |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in cmp.metrics:
        lines.append(f"| {m['metric']} | {_v(m['baseline'], m['unit'])} | {_v(m['candidate'], m['unit'])} | "
                     f"{_d(m['delta'], m['unit'])} | {fmt_pct(m['delta_pct'], signed=True)} |")
    lines.append("")
    for title, df in ((f"Kernels: biggest changes ({per})", cmp.kernels),
                      (f"CPU ops: biggest changes (inclusive time, {per})", cmp.ops)):
        rows = _delta_rows(df, top)
        lines += [f"## {title}", ""]
        if not rows:
            lines += ["No change.", ""]
            continue
        lines += ["| # | Name | Status | Calls (base → cand) | Time ms (base → cand) | Δ ms | Δ % |",
                  "|---:|---|---|---:|---:|---:|---:|"]
        for i, r in enumerate(rows, 1):
            lines.append(
                f"| {i} | `{md_escape(shorten(r['name'], 90))}` | {r['status']} | {r['base_count']:g} → "
                f"{r['cand_count']:g} | {r['base_ms']:.3f} → {r['cand_ms']:.3f} | {r['delta_ms']:+.3f} | "
                f"{fmt_pct(r['delta_pct'], signed=True)} |")
        lines.append("")
    new, gone = cmp.new_kernels()["name"].to_list(), cmp.vanished_kernels()["name"].to_list()
    lines += ["## New and vanished kernels", ""]
    lines.append(f"- New ({len(new)}): " + (", ".join(f"`{md_escape(shorten(n, 80))}`" for n in new[:30]) or "none"))
    lines.append(f"- Vanished ({len(gone)}): "
                 + (", ".join(f"`{md_escape(shorten(n, 80))}`" for n in gone[:30]) or "none"))
    lines.append("")
    errs = [(s, f, e) for s in (b, c) for f, e in s.errors]
    if errs:
        lines += ["## Files that could not be analysed", ""]
        lines += [f"- `{md_escape(f)}`: {md_escape(e)}" for _, f, e in errs]
        lines.append("")
    lines += ["Statistics: difference of median step times with a 95 % percentile-bootstrap interval "
              "(10,000 resamples, seed 0) and a two-sided Mann–Whitney U test over steady steps; "
              "see docs/batch.md.", ""]
    return "\n".join(lines)


_CSS = """
body{margin:0;font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;
color:#1f2328;background:#f6f8fa}
header{background:#1d2b3a;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header p{margin:0;color:#c9d4e0}main{padding:8px 28px 40px}h2{font-size:17px;margin:24px 0 8px}
.verdict{background:#fff;border:1px solid #d1d9e0;border-left:5px solid #2f5d9b;padding:10px 14px;margin:16px 0}
.verdict.slower{border-left-color:#b42318}.verdict.faster{border-left-color:#1a7f37}
.mismatch{background:#fff4e5;border:1px solid #f0b429;border-left:5px solid #b42318;padding:10px 14px;margin:16px 0}
table{border-collapse:collapse;background:#fff;border:1px solid #d1d9e0;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid #e6eaef;text-align:left;vertical-align:top}
th{background:#eef2f6}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.up{color:#b42318}td.down{color:#1a7f37}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}.muted{color:#59636e}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _html_deltas(df: pl.DataFrame, n: int) -> str:
    rows = _delta_rows(df, n)
    if not rows:
        return "<p>No change.</p>"
    out = ["<table><thead><tr><th>#</th><th>Name</th><th>Status</th><th>Calls base</th><th>Calls cand</th>"
           "<th>ms base</th><th>ms cand</th><th>Δ ms</th><th>Δ %</th></tr></thead><tbody>"]
    for i, r in enumerate(rows, 1):
        cls = "up" if r["delta_ms"] > 0 else "down" if r["delta_ms"] < 0 else ""
        out.append(
            f"<tr><td class=num>{i}</td><td><code title=\"{_e(r['name'])}\">{_e(shorten(r['name'], 120))}</code></td>"
            f"<td>{_e(r['status'])}</td><td class=num>{r['base_count']:g}</td><td class=num>{r['cand_count']:g}</td>"
            f"<td class=num>{r['base_ms']:.3f}</td><td class=num>{r['cand_ms']:.3f}</td>"
            f"<td class='num {cls}'>{r['delta_ms']:+.3f}</td>"
            f"<td class=num>{_e(fmt_pct(r['delta_pct'], signed=True))}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def to_html(cmp: Comparison, top: int = 50) -> str:
    b, c = cmp.baseline, cmp.candidate
    st = cmp.step_time
    csp = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
    per = "per step and rank" if cmp.per == "step" else "per trace"
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        "<title>traceanalyzer compare</title>", f"<style>{_CSS}</style></head><body>",
        "<header><h1>traceanalyzer compare</h1>",
        f"<p>baseline <code>{_e(b.label)}</code> ({b.n_ranks} file(s)) vs candidate <code>{_e(c.label)}</code> "
        f"({c.n_ranks} file(s)) · traceanalyzer {_e(__version__)}</p></header><main>",
        (f"<div class=mismatch><b>{_e(cmp.comparability.headline())}</b></div>"
         if cmp.comparability.headline() else ""),
        (f"<div class=mismatch><b>Input warnings ({len(cmp.input_warnings())})</b>: the loader repaired or cut "
         "short an input, so kernels and steps it lost show up as new, vanished or changed below.<ul>"
         + "".join(f"<li>{_e(w)}</li>" for w in cmp.input_warnings()[:MAX_WARNINGS_SHOWN]) + "</ul></div>"
         if cmp.input_warnings() else ""),
        f"<div class='verdict {_e(st.verdict.split()[0])}'><b>Verdict: {_e(st.verdict)}</b>"
        f"<br>{_e(st.sentence())}</div>",
        f"<h2>Comparability: {_e(cmp.comparability.status)}</h2><table><thead><tr><th>Fact</th><th>Baseline</th>"
        "<th>Candidate</th><th>Status</th></tr></thead><tbody>",
        *(f"<tr><td>{_e(f.label)}</td><td>{_e(f.baseline or '–')}</td><td>{_e(f.candidate or '–')}</td>"
          f"<td>{'<b>mismatch</b>' if f.status == 'mismatch' else _e(f.status)}</td></tr>"
          for f in cmp.comparability.fields if f.baseline is not None or f.candidate is not None),
        "</tbody></table>",
        "<h2>Key numbers</h2><table><thead><tr><th>Metric</th><th>Baseline</th><th>Candidate</th><th>Δ</th>"
        "<th>Δ %</th></tr></thead><tbody>",
    ]
    for m in cmp.metrics:
        parts.append(f"<tr><td>{_e(m['metric'])}</td><td class=num>{_e(_v(m['baseline'], m['unit']))}</td>"
                     f"<td class=num>{_e(_v(m['candidate'], m['unit']))}</td>"
                     f"<td class=num>{_e(_d(m['delta'], m['unit']))}</td>"
                     f"<td class=num>{_e(fmt_pct(m['delta_pct'], signed=True))}</td></tr>")
    parts.append("</tbody></table>")
    parts.append(f"<h2>Kernels: biggest changes ({_e(per)})</h2>" + _html_deltas(cmp.kernels, top))
    parts.append(f"<h2>CPU ops: biggest changes (inclusive time, {_e(per)})</h2>" + _html_deltas(cmp.ops, top))
    for title, names in (("New kernels", cmp.new_kernels()["name"].to_list()),
                         ("Vanished kernels", cmp.vanished_kernels()["name"].to_list())):
        parts.append(f"<h2>{title} ({len(names)})</h2>")
        parts.append("<ul>" + "".join(f"<li><code>{_e(n)}</code></li>" for n in names[:100]) + "</ul>"
                     if names else "<p>None.</p>")
    errs = [(f, e) for s in (b, c) for f, e in s.errors]
    if errs:
        parts.append("<h2>Files that could not be analysed</h2><ul>"
                     + "".join(f"<li><code>{_e(f)}</code>: {_e(e)}</li>" for f, e in errs) + "</ul>")
    parts.append("<p class=muted>Median step-time difference with a 95 % percentile-bootstrap interval (10,000 "
                 "resamples, seed 0) and a two-sided Mann–Whitney U test over steady steps.</p></main></body></html>\n")
    return "".join(parts)


def terminal_summary(cmp: Comparison, top: int = 10) -> str:
    st = cmp.step_time
    lines = []
    head = cmp.comparability.headline()
    if head:
        lines.append(head)
    lines += [f"warning: {w}" for w in cmp.input_warnings()[:MAX_WARNINGS_SHOWN]]
    lines += [f"{cmp.baseline.label}  →  {cmp.candidate.label}", f"  {st.sentence()}"]
    for m in cmp.metrics[1:4]:
        if m["delta"] is not None:
            lines.append(f"  {m['metric']}: {_v(m['baseline'], m['unit'])} → {_v(m['candidate'], m['unit'])}")
    rows = _delta_rows(cmp.kernels, top)
    if rows:
        lines.append(f"  Top kernel changes ({'ms per step' if cmp.per == 'step' else 'ms per trace'}):")
        for r in rows:
            lines.append(f"    {r['delta_ms']:+9.3f}  {r['status']:<9} {shorten(r['name'], 80)}")
    return "\n".join(lines)


def gate_verdict(cmp: Comparison, fail_pct: float, allow_mismatch: bool = False) -> tuple[int, str | None]:
    """The ``--fail-if-slower fail_pct`` gate: its exit code (0 passed, 1 regression, 2 refused:
    different hardware without ``allow_mismatch``) and the line it prints on stderr (``None``:
    nothing to say)."""
    refusal = cmp.gate_refusal(allow_mismatch)
    if refusal:  # a usage-like refusal: the gate cannot judge code across hardware
        return 2, f"error: {refusal}"
    st = cmp.step_time
    if cmp.slower_than(fail_pct):
        across = "" if cmp.comparability.comparable else " (across different hardware: --allow-mismatch)"
        caution = f"; caution: {st.power_sentence()}" if st.low_power else ""
        return 1, f"regression: median step time {st.diff_pct:+.1f} % (limit {fail_pct:g} %){across}{caution}"
    if st.low_power:
        return 0, f"gate passed, but {st.power_sentence()}"
    return 0, None


def resolve(formats: Iterable[str] | None) -> list[str]:
    out: list[str] = []
    for f in formats or ():
        for name in (p.strip() for p in f.split(",")):
            if not name:
                continue
            if name == "all":
                out.extend(FORMATS)
            elif name not in FORMATS:
                raise ConfigError(f"unknown compare format {name!r}; choose from: {', '.join(FORMATS)}")
            else:
                out.append(name)
    return list(dict.fromkeys(out)) or list(FORMATS)


def write(cmp: Comparison, outdir: Path, formats: Iterable[str] | None = None) -> list[Path]:
    """Write ``compare.{md,json,html}`` (atomically) into ``outdir``."""
    written = []
    for fmt in resolve(formats):
        path = Path(outdir) / f"compare.{fmt}"
        if fmt == "json":
            atomic_write_bytes(path, orjson.dumps(to_json(cmp), option=orjson.OPT_INDENT_2) + b"\n")
        elif fmt == "md":
            atomic_write_text(path, clean_text(to_markdown(cmp)))
        else:
            atomic_write_text(path, to_html(cmp))
        written.append(path)
    return written
