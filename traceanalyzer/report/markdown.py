"""Markdown output: ``report.md``, a concise ticket-ready summary.

Renders in GitHub, GitLab and Jira (Markdown paste) alike: plain pipe tables, no HTML,
no footnotes. In order: what was analysed, the ranked findings, the key numbers of
every analysis in one table, the top offenders (a few rows of the tables that name
culprits: kernels, gaps, call sites), and what could not be checked. The full
tables are in ``report.html`` and every number is in ``summary.json``.

Output is deterministic for a given report: numbers are formatted with fixed
precision and timestamps are shown relative to the trace start, so the same trace
gives the same text on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from traceanalyzer import __version__
from traceanalyzer.analyses import summary_of, tables_of
from traceanalyzer.report import renderer
from traceanalyzer.report.document import JSON_SCHEMA_VERSION, Report
from traceanalyzer.report.fsutil import atomic_write_text
from traceanalyzer.report.text import clean_text, md_escape, md_table, shorten
from traceanalyzer.units import fmt_cost, fmt_ns

#: Rows per "top offenders" table.
TOP_ROWS = 5
#: Columns shown when an analysis' table is not in :data:`OFFENDERS`.
GENERIC_COLUMNS = 7

#: Tables that name culprits, per analysis: (table title, columns to show; None = all).
#: Analyses mapped to ``()`` have no offender table (their key numbers say it all);
#: analyses not listed show their first table, first :data:`GENERIC_COLUMNS` columns.
OFFENDERS: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "overview": (),  # its top kernels repeat the kernels analysis
    "steps": (),
    "baseline": (),  # its statistics are in the key numbers
    "phases": (),
    "gpu_time": (),
    "kernels": (("Top kernels (normalised name)", ("name", "count", "total_ns", "mean_ns", "pct_of_kernel_time")),),
    "idle_gaps": (
        ("Longest gaps", ("step", "device", "dur_ns", "cause", "cpu_context", "next_name")),
        ("What the CPU was doing during long gaps", ("cpu_context", "source", "n_gaps", "idle_ns", "pct_of_idle")),
    ),
    "launches": (("Launches per API", None),),
    "copies": (
        ("Copy hotspots by call site", ("site", "directions", "count", "per_step", "bytes", "gpu_ns", "cpu_ns",
                                        "blocking")),
    ),
}


# Several rules may price the same idle time from different angles (e.g. host-bound gaps and
# launch-bound kernels); summing the column would double count, so the report says so.
OVERLAP_NOTE = ("Ranked by estimated cost. A time cost is GPU time lost per step (GPU idle the fix would fill, "
                "or GPU work it would remove; % of the median step), never a CPU wait on a busy GPU. Each cost is "
                "what fixing that finding alone could buy; the host-sync, copy, data-loader and host-bound "
                "findings price disjoint idle, the others may price the same time from another angle, so the "
                "costs do not add up (docs/costs.md).")


def _facts(report: Report) -> list[tuple[str, str]]:
    m = report.meta
    facts = [("Input", report.kind)]
    devices = [d.get("name") for d in m.get("device_properties") or [] if isinstance(d, Mapping) and d.get("name")]
    if devices:
        facts.append(("Devices", ", ".join(sorted(set(map(str, devices))))))
    elif m.get("vendor"):
        facts.append(("Vendor", str(m["vendor"])))
    if m.get("rank") is not None:
        facts.append(("Rank", f"{m['rank']} of {m.get('world_size') if m.get('world_size') is not None else '?'}"))
    for k, v in (m.get("versions") or {}).items():
        facts.append((k.replace("_", " "), str(v)))
    flags = [k for k, v in (m.get("profiler_flags") or {}).items() if v]
    if flags:
        facts.append(("Profiler flags", ", ".join(flags)))
    steps = report.results.values.get("steps")
    table = getattr(steps, "table", None)
    if getattr(steps, "has_steps", False) and table is not None and table.height:
        nums = table["step"].to_list()
        facts.append(("Steps", f"{len(nums)} (#{nums[0]}–#{nums[-1]})"))
    if m.get("span_ns"):
        facts.append(("Trace span", fmt_ns(m["span_ns"])))
    return facts


def to_markdown(report: Report, top_rows: int = TOP_ROWS) -> str:
    name = Path(report.source).name or report.source
    t0 = report.meta.get("span_start_ns") if isinstance(report.meta.get("span_start_ns"), int) else None
    lines = [f"# traceanalyzer report: `{md_escape(name)}`", ""]
    lines += [" · ".join(f"**{md_escape(k)}**: {md_escape(v)}" for k, v in _facts(report)), ""]

    if report.warnings:
        lines += ["> **Input warnings**", ">"]
        lines += [f"> - {md_escape(w)}" for w in report.warnings]
        lines.append("")

    lines += ["## Findings", ""]
    if report.findings:
        if len(report.findings) > 1:
            lines += [OVERLAP_NOTE, ""]
        lines += ["| # | Severity | Finding | Cost / step | Fix |", "|---|---|---|---|---|"]
        for i, f in enumerate(report.findings, 1):
            cost = fmt_cost(f.cost_ms_per_step, f.cost_pct_of_step, f.cost_bytes, unit="ms")
            lines.append(
                f"| {i} | {f.severity} | {md_escape(shorten(f.title, 120))} (`{md_escape(f.rule_id)}`) | "
                f"{cost} | {md_escape(shorten(f.fix, 160))} |"
            )
    else:
        lines.append("No findings: none of the checks that could run found a problem.")
    floor = report.floor_line()
    if floor:
        lines += ["", f"_{md_escape(floor)}._"]
    lines.append("")

    sections = report.sections()
    key_rows: list[str] = []
    for _, title, result in sections:
        for j, (k, v) in enumerate(summary_of(result)):
            area = f"**{md_escape(title)}**" if j == 0 else ""
            key_rows.append(f"| {area} | {md_escape(k)} | {md_escape(shorten(v, 200))} |")
    if key_rows:
        lines += ["## Key numbers", "", "| Area | Metric | Value |", "|---|---|---|", *key_rows, ""]

    offenders: list[str] = []
    for sname, title, result in sections:
        tables = {t: df for t, df in tables_of(result).items() if df is not None and df.height}
        if sname in OFFENDERS:
            picks = [(t, cols) for t, cols in OFFENDERS[sname] if t in tables]
        else:
            first = next(iter(tables), None)
            picks = [(first, tuple(tables[first].columns[:GENERIC_COLUMNS]))] if first else []
        for ttitle, cols in picks:
            df = tables[ttitle]
            offenders += [f"**{md_escape(title)}: {md_escape(ttitle)}**"
                          + (f" (top {top_rows} of {df.height:,})" if df.height > top_rows else ""), ""]
            offenders += md_table(df, max_rows=top_rows, width=80, t0=t0, columns=list(cols) if cols else None,
                                  more_note=False)
            offenders.append("")
    if offenders:
        lines += ["## Top offenders", "", *offenders]

    not_done = {**report.results.skipped, **report.not_run}
    failed = {**report.results.failed, **report.rule_failures}
    if not_done or failed:
        lines += ["## Checks that could not run", ""]
        for k, why in sorted(not_done.items()):
            lines.append(f"- `{md_escape(k)}`: {md_escape(why)}")
        for k, why in sorted(failed.items()):
            lines.append(f"- `{md_escape(k)}` failed (internal error, please report): {md_escape(why)}")
        lines.append("")

    lines += [
        "---",
        f"_traceanalyzer {md_escape(__version__)}: charts and full tables in `report.html`, every number in "
        f"`summary.json` (schema {JSON_SCHEMA_VERSION})._",
        "",
    ]
    return "\n".join(lines)


@renderer("md", description="report.md: ticket-ready Markdown summary")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "report.md"
    atomic_write_text(path, clean_text(to_markdown(report)))
    return [path]
