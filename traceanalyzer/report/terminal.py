"""Terminal summaries: the short text each sub-command prints after its files are written.

Like the file renderers, these format what the pipeline computed and never recompute. The
caller passes the text through :func:`traceanalyzer.report.text.clean_text` before printing
(trace-provided names can carry terminal escape sequences). Compare's summary is rendered
with its other outputs in :mod:`traceanalyzer.compare.render`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.analyses import summary_of
from traceanalyzer.analyses.overview import OverviewResult
from traceanalyzer.config import Config, Params
from traceanalyzer.report.document import Report
from traceanalyzer.report.text import clean_text, shorten
from traceanalyzer.rules import Finding, RuleSpec
from traceanalyzer.units import fmt_cost, fmt_param

if TYPE_CHECKING:  # batch runs above the report layer: its result type is only named here
    from traceanalyzer.batch.discover import Discovery
    from traceanalyzer.batch.runner import BatchResult

#: Sections of the ``analyze`` summary, in order: the whole-trace numbers first, then the verdict.
_ANALYZE_SECTIONS = ("overview", "diagnosis", "critical_path", "efficiency", "memory_peak", "run_memory",
                     "memory_oom", "export_timeline")
#: Of these sections, the only lines shown (the report has the rest).
_BRIEF = {"diagnosis": ("Verdict", "What would move it", "Dominant phase"),
          "critical_path": ("Critical path (steady step, median)",)}


def _section_lines(title: str, summary: Sequence[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in summary)
    return [f"  {title}"] + [f"    {k.ljust(width)}  {v}" for k, v in summary]


def _header(report: Report) -> list[str]:
    lines = [click.style(f"{report.source}", bold=True) + f"  [{report.kind}]"]
    lines += [click.style(f"  warning: {w}", fg="yellow") for w in report.warnings]
    return lines


def analyze_summary(report: Report, top_findings: int = 5) -> str:
    """The ``analyze`` summary: key numbers, the verdict, the top kernels and the top
    ``top_findings`` findings with their cost (ms of GPU time per step, or bytes)."""
    lines = _header(report)
    shown = [s for s in report.sections() if s[0] in _ANALYZE_SECTIONS] or report.sections()[:1]
    order = {name: i for i, name in enumerate(_ANALYZE_SECTIONS)}
    for name, title, result in sorted(shown, key=lambda s: order.get(s[0], 0)):
        summary = [kv for kv in summary_of(result) if name not in _BRIEF or kv[0] in _BRIEF[name]]
        if summary:
            lines += _section_lines(title, summary)
    overview = report.results.values.get("overview")
    if isinstance(overview, OverviewResult) and overview.top_kernels.height:
        lines.append("  Top kernels (total GPU time)")
        for row in overview.top_kernels.head(5).iter_rows(named=True):
            lines.append(
                f"    {row['total_ns'] / 1e6:9.3f} ms  {row['pct_of_kernel_time']:5.1f} %  "
                f"{row['count']:>6}×  {shorten(row['name'], 70)}"
            )
    if report.findings:
        lines.append(f"  Findings ({len(report.findings)})")
        for f in report.findings[:top_findings]:
            cost = fmt_cost(f.cost_ms_per_step, None, f.cost_bytes, grouped=False, missing="")
            lines.append(f"    [{f.severity}] {shorten(f.title, 80)}  {cost}")
    if report.below_floor:
        lines.append(f"  {len(report.below_floor)} more finding(s) under the reporting floor (rules.min_cost_pct): "
                     + ", ".join(dict.fromkeys(f.rule_id for f in report.below_floor)))
    for name, why in sorted({**report.results.failed, **report.rule_failures}.items()):
        lines.append(click.style(f"  warning: check {name} failed (internal error, please report): "
                                 f"{shorten(why, 100)}", fg="yellow"))
    n_skip = (len(report.results.skipped) + len(report.not_run) + len(report.results.failed)
              + len(report.rule_failures))
    if n_skip:
        lines.append(f"  {n_skip} checks could not run (see the report for why)")
    return "\n".join(lines)


def memory_summary(report: Report) -> str:
    """The ``memory`` summary: every memory section's key numbers, what could not run, then
    the top five findings."""
    lines = _header(report)
    for _, title, result in report.sections():
        summary = summary_of(result)
        if summary:
            lines += _section_lines(title, summary)
    specs = analysis_registry()
    for name, why in sorted(report.results.skipped.items()):
        title = specs[name].title if name in specs else name
        lines.append(click.style(f"  {title}: not applicable — {why}", dim=True))
    for name, why in sorted(report.results.failed.items()):
        lines.append(click.style(f"  {name}: failed — {why}", fg="red"))
    if report.findings:
        lines.append(f"  Findings ({len(report.findings)})")
        for f in report.findings[:5]:
            lines.append(f"    [{f.severity}] {f.title}")
    return "\n".join(lines)


def written_line(paths: Sequence[Path]) -> str:
    """``  wrote: a, b``: the files an output step wrote."""
    return "  wrote: " + ", ".join(str(p) for p in paths)


def fail_on_line(fail_on: str, tripped: Sequence[Finding]) -> str:
    """The ``--fail-on`` line on stderr: how many findings tripped the gate, and the worst
    (highest severity, then highest time cost)."""
    worst = max(tripped, key=lambda f: (int(f.severity), f.cost_ms_per_step or 0.0))
    return (f"fail-on {fail_on}: {len(tripped)} finding(s) of severity {fail_on} or worse, e.g. "
            f"[{worst.severity}] {worst.rule_id}: {shorten(clean_text(worst.title, keep_newlines=False), 100)}")


# ---------------------------------------------------------------------------------------------
# ``rules``: the registry, with the thresholds in effect
# ---------------------------------------------------------------------------------------------


def rule_docs(rule_ids: Sequence[str], rules: Mapping[str, RuleSpec], config: Config) -> str:
    """The full documentation of each rule in ``rule_ids`` (known ids), with its parameters:
    default, and the value in effect where ``config`` overrides it."""
    blocks: list[str] = []
    for rid in rule_ids:
        spec = rules[rid]
        lines = [click.style(rid, bold=True) + f"  [{spec.severity}]  needs: {spec.needs_text}", "", spec.doc]
        values = Params(rid, spec.params, config).as_dict()
        if values:
            lines += ["", "Parameters (default → in effect):"]
            for k, v in spec.params.items():
                now = values[k]
                mark = "" if now == v else f" → {fmt_param(now)}"
                lines.append(f"  {rid}.{k} = {fmt_param(v)}{mark}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def rules_listing(rules: Mapping[str, RuleSpec], config: Config) -> str:
    """Every rule: id, severity, summary, inputs and the parameter values in effect."""
    width = max(len(r) for r in rules)
    lines: list[str] = []
    for rid, spec in sorted(rules.items()):
        lines.append(f"{click.style(rid.ljust(width), bold=True)}  {str(spec.severity):8}  {spec.summary}")
        values = Params(rid, spec.params, config).as_dict()
        extra = [f"needs: {spec.needs_text}" if spec.needs or spec.needs_any else "needs: (decides itself)"]
        if values:
            extra.append("params: " + ", ".join(f"{k}={fmt_param(v)}" for k, v in values.items()))
        lines += [" " * (width + 2) + line for line in extra]
    lines.append(f"\n{len(rules)} rules. `traceanalyzer rules RULE_ID` prints one rule's documentation; "
                 "override a threshold with --set RULE_ID.PARAM=VALUE.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# ``batch``: start, end and interruption lines
# ---------------------------------------------------------------------------------------------


def batch_start_line(found: Discovery, where: str) -> str:
    """How many files and runs were found, how many ignored, and where they are analysed."""
    runs = len({i.run for i in found.inputs})
    return f"{len(found.inputs)} files in {runs} runs ({len(found.ignored)} ignored); analysing on {where}"


def batch_failure_lines(result: BatchResult) -> list[str]:
    """One red line per file that could not be analysed, with its error (for stderr)."""
    return [click.style(clean_text(f"  failed: {r['file']}: {r['error']}", keep_newlines=False), fg="red")
            for r in result.rows if r.get("status") != "ok"]


def batch_summary(result: BatchResult, out: Path) -> str:
    """Each run's cross-rank finding, the totals, and where the index is."""
    lines = []
    for run in result.runs:
        mr = run.get("multirank") or {}
        if mr.get("finding"):
            lines.append(clean_text(f"  {run['run']}: {mr['finding']['title']}", keep_newlines=False))
    lines.append(f"{len(result.rows)} files ({result.n_cached} from cache), {result.n_failed} failed, "
                 f"{len(result.runs)} runs, {result.wall_s:.1f} s")
    lines.append(f"  index: {out / 'index.html'}")
    return "\n".join(lines)


def batch_interrupted_line(done: BatchResult, n: int, out: Path, use_cache: bool) -> str:
    """What Ctrl-C kept of a batch of ``n`` files, and how to resume it."""
    resume = ("run the same command again to resume: finished files are taken from the cache" if use_cache
              else "run the same command without --no-cache to resume from the finished files")
    return (f"interrupted: {len(done.rows)} of {n} files finished and kept ({done.n_failed} failed), "
            f"index written to {out / 'index.html'}; {resume}")
