"""Markdown output: ``report.md``, a concise ticket-ready summary.

Renders in GitHub/GitLab/Jira Markdown: the findings table first, then each
analysis' key numbers and top tables, then what could not be checked and why.
"""

from __future__ import annotations

from pathlib import Path

from traceanalyzer.analyses import summary_of, tables_of
from traceanalyzer.report import renderer
from traceanalyzer.report.document import Report
from traceanalyzer.report.fsutil import atomic_write_text
from traceanalyzer.report.text import fmt_bytes, md_escape, md_table, shorten


def to_markdown(report: Report, max_rows: int = 10) -> str:
    m = report.meta
    name = Path(report.source).name
    lines = [f"# traceanalyzer report: `{md_escape(name)}`", ""]
    facts = [("Input", report.kind)]
    if m.get("vendor"):
        facts.append(("Vendor", str(m["vendor"])))
    devices = [d.get("name") for d in m.get("device_properties") or [] if isinstance(d, dict) and d.get("name")]
    if devices:
        facts.append(("Devices", ", ".join(sorted(set(map(str, devices))))))
    if m.get("rank") is not None:
        facts.append(("Rank", f"{m['rank']} of {m.get('world_size', '?')}"))
    flags = [k for k, v in (m.get("profiler_flags") or {}).items() if v]
    if flags:
        facts.append(("Profiler flags", ", ".join(flags)))
    for k, v in (m.get("versions") or {}).items():
        facts.append((k, str(v)))
    lines += [" · ".join(f"**{md_escape(k)}**: {md_escape(str(v))}" for k, v in facts), ""]

    if report.warnings:
        lines += ["> **Input warnings**", ">"]
        lines += [f"> - {md_escape(w)}" for w in report.warnings]
        lines.append("")

    lines += ["## Findings", ""]
    if report.findings:
        lines += ["| # | Severity | Finding | Cost / step | Fix |", "|---|---|---|---|---|"]
        for i, f in enumerate(report.findings, 1):
            if f.cost_ms_per_step is not None:
                cost = f"{f.cost_ms_per_step:,.2f} ms"
                if f.cost_pct_of_step is not None:
                    cost += f" ({f.cost_pct_of_step:.1f} %)"
            elif f.cost_bytes is not None:
                cost = fmt_bytes(f.cost_bytes)
            else:
                cost = "–"
            lines.append(
                f"| {i} | {f.severity} | {md_escape(shorten(f.title, 120))} (`{f.rule_id}`) | {cost} | "
                f"{md_escape(shorten(f.fix, 140))} |"
            )
    else:
        lines.append("No findings.")
    lines.append("")

    for _, title, result in report.sections():
        lines += [f"## {md_escape(title)}", ""]
        summary = summary_of(result)
        if summary:
            lines += ["| | |", "|---|---|"]
            lines += [f"| {md_escape(k)} | {md_escape(v)} |" for k, v in summary]
            lines.append("")
        for ttitle, df in tables_of(result).items():
            if df.height == 0:
                continue
            lines += [f"**{md_escape(ttitle)}**", ""]
            lines += md_table(df, max_rows=max_rows)
            lines.append("")

    not_done = {**report.results.skipped, **report.not_run}
    if not_done or report.results.failed or report.rule_failures:
        lines += ["## Checks that could not run", ""]
        for k, why in sorted(not_done.items()):
            lines.append(f"- `{md_escape(k)}`: {md_escape(why)}")
        for k, why in sorted({**report.results.failed, **report.rule_failures}.items()):
            lines.append(f"- `{md_escape(k)}` failed (internal error, please report): {md_escape(why)}")
        lines.append("")
    return "\n".join(lines)


@renderer("md", description="report.md: ticket-ready Markdown summary")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "report.md"
    atomic_write_text(path, to_markdown(report))
    return [path]
