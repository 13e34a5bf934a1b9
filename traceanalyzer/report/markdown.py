"""Markdown output: ``report.md``, a ticket comment.

Renders in GitHub, GitLab and Jira (Markdown paste) alike: headings, paragraphs, one pipe
table, no HTML. In order: the run line (file, device, steps), the verdict (one sentence with
its number, from ``diagnosis``), the findings ranked by cost (each: title, cost, fix, its code
hint, the one evidence line that matters), a compact table of the top kernels, and the names
of the checks that could not run. Everything else (every analysis' numbers and tables, the
charts, the timeline) is in ``report.html`` and ``summary.json``.

Nothing is cut: titles and fixes are written whole (never ``…``). Trace-provided text that
could be read as Markdown or HTML goes into code spans (:func:`~traceanalyzer.report.text.md_text`),
so the file holds no HTML entity and no backslash escape but the ``\\|`` a table cell needs.

Output is deterministic for a given report (fixed precision, no clock, no absolute path).
"""

from __future__ import annotations

from pathlib import Path

from traceanalyzer import __version__
from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.report import renderer
from traceanalyzer.report.document import JSON_SCHEMA_VERSION, Report, key_evidence
from traceanalyzer.report.fsutil import atomic_write_text
from traceanalyzer.report.text import clean_text, fmt_column_value, md_cell, md_code, md_text, table_formats
from traceanalyzer.rules import Finding
from traceanalyzer.units import fmt_cost

#: Rows of the top-kernels table.
TOP_ROWS = 5

# Several rules may price the same idle time from different angles (e.g. host-bound gaps and
# launch-bound kernels); summing the costs would double count, so the report says so.
OVERLAP_NOTE = ("Ranked by cost: GPU time per step a fix could win back (GPU idle it would fill or GPU work it "
                "would remove; % of the median step), never a CPU wait on a busy GPU. Each cost is what fixing "
                "that finding alone could buy; costs may overlap and do not add up (docs/costs.md).")


def _finding(i: int, f: Finding) -> list[str]:
    cost = fmt_cost(f.cost_ms_per_step, f.cost_pct_of_step, f.cost_bytes, missing="not priced")
    conf = f" · confidence {f.confidence:.0%}" if f.confidence < 1 else ""
    lines = [f"### {i}. {md_text(f.title)}", "",
             f"**{f.severity}** · {md_code(f.rule_id)} · cost {cost}{conf}", "",
             f"**Fix**: {md_text(f.fix)}", ""]
    if f.code_hint:
        hint = clean_text(f.code_hint).strip("\n")
        longest = max((len(r) for r in hint.split("\n") if r and set(r) == {"`"}), default=0)
        fence = "`" * max(3, longest + 1)
        lines += [f"{fence}python", hint, fence, ""]
    ev = key_evidence(f)
    if ev is not None:
        lines += [f"Evidence: {md_text(ev[0])}: {md_text(ev[1])}", ""]
    return lines


def _top_kernels(report: Report, rows: int) -> list[str]:
    k = report.results.values.get("kernels")
    if not isinstance(k, KernelsResult) or k.by_name.is_empty():
        return []
    df = k.by_name.head(rows).select("name", "count", "total_ns", "mean_ns", "pct_of_kernel_time")
    fmts = table_formats(df)  # one unit for the table's times, named in the header
    heads = ["kernel", "calls", fmts["total_ns"].label, fmts["mean_ns"].label, fmts["pct_of_kernel_time"].label]
    lines = [f"## Top kernels (of {k.by_name.height:,} distinct names, {k.n_kernels:,} launches)", "",
             "| " + " | ".join(heads) + " |", "|---|---:|---:|---:|---:|"]
    for r in df.iter_rows(named=True):
        cells = [fmt_column_value(fmts[c], c, r[c]) for c in ("count", "total_ns", "mean_ns", "pct_of_kernel_time")]
        lines.append(f"| {md_cell(str(r['name']), code=True)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


#: Rows of the kernel-efficiency table in report.md (the HTML and summary.json have them all).
EFFICIENCY_ROWS = 5


def _efficiency(report: Report) -> list[str]:
    """The heaviest modelled operations against the device's peaks (the efficiency analysis'
    ``by_op``, in its order: kernel time)."""
    e = report.results.values.get("efficiency")
    if not isinstance(e, EfficiencyResult) or e.by_op.is_empty():
        return []
    cols = ["kernel_ns", "tflops", "pct_of_peak", "gb_per_s", "pct_of_bandwidth", "pct_of_roofline"]
    df = e.by_op.head(EFFICIENCY_ROWS).select("op", "precision", "bound", *cols)
    fmts = table_formats(df)
    device = e.peaks.get("device") or "unknown device"
    cov = e.coverage.get("pct_of_kernel_time")
    scope = f"; these ops hold {cov:.0f} % of kernel time" if cov is not None else ""
    heads = ["op", "precision", fmts["kernel_ns"].label, "TFLOP/s", "% of its precision's peak", "GB/s",
             "% of bandwidth", "% of roofline", "bound"]
    lines = [f"## Kernel efficiency (against {md_text(str(device))} peaks{scope})", "",
             "| " + " | ".join(heads) + " |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in df.iter_rows(named=True):
        cells = [fmt_column_value(fmts[c], c, r[c]) if r[c] is not None else "n/a" for c in cols]
        kernel, tflops, peak, gbs, bw, roof = cells
        lines.append(f"| {md_cell(str(r['op']), code=True)} | {md_cell(str(r['precision']))} | {kernel} | {tflops} | "
                     f"{peak} | {gbs} | {bw} | {roof} | {md_cell(str(r['bound']))} |")
    return [*lines, ""]


def to_markdown(report: Report, top_rows: int = TOP_ROWS) -> str:
    facts = report.run_line()
    name = facts[0][1]
    lines = [f"# traceanalyzer report: {md_code(name)}", ""]
    lines += [" · ".join(f"**{k}**: {md_text(v)}" for k, v in facts[1:]) or f"**Input**: {report.kind}", ""]
    lines += [f"**Verdict**: {md_text(report.verdict().rstrip('.'))}.", ""]

    if report.warnings:
        lines += ["**Input warnings**:", ""]
        lines += [f"- {md_text(w)}" for w in report.warnings]
        lines.append("")

    lines += ["## Findings", ""]
    if report.findings:
        if len(report.findings) > 1:
            lines += [OVERLAP_NOTE, ""]
        for i, f in enumerate(report.findings, 1):
            lines += _finding(i, f)
    else:
        lines += ["No findings: none of the checks that could run found a problem.", ""]
    floor = report.floor_line()
    if floor:
        lines += [f"{md_text(floor)}.", ""]

    lines += _top_kernels(report, top_rows)
    lines += _efficiency(report)

    not_done = sorted({**report.results.skipped, **report.not_run})
    if not_done:  # many on an input of another kind (trace rules on a snapshot): named only when few
        names = (": " + ", ".join(md_code(k) for k in not_done)) if len(not_done) <= 8 else ""
        lines += [f"**{len(not_done)} checks could not run** on this input (why: `report.html`){names}.", ""]
    failed = {**report.results.failed, **report.rule_failures}
    for k, why in sorted(failed.items()):  # rare, and a bug to report: with its message
        lines.append(f"- {md_code(k)} failed (internal error, please report): {md_text(why)}")
    if failed:
        lines.append("")

    lines += [
        "---",
        f"_traceanalyzer {md_text(__version__)}: the timeline, charts and every table in `report.html`, every number "
        f"in `summary.json` (schema {JSON_SCHEMA_VERSION})._",
        "",
    ]
    return "\n".join(lines)


@renderer("md", description="report.md: a ticket comment (run, verdict, findings with fixes, top kernels)")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "report.md"
    atomic_write_text(path, clean_text(to_markdown(report)))
    return [path]
