"""``traceanalyzer memory``: why did I OOM? A snapshot (or trace / memory timeline) →
memory report files + a memory-focused terminal summary."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.analyses import run_analyses, summary_of
from traceanalyzer.commands.analyze import default_outdir
from traceanalyzer.commands.options import config_options, make_config
from traceanalyzer.pipeline import load, resolve_formats, write_outputs
from traceanalyzer.report.document import Report
from traceanalyzer.report.text import clean_text
from traceanalyzer.rules import registry as rule_registry
from traceanalyzer.rules import run_rules

# For a chrome trace only the memory analyses run; snapshots and timelines run all theirs.
_TRACE_MEMORY = ("trace_memory",)


def build_memory_report(path: str, config_path: str | None = None, assignments: tuple[str, ...] = ()) -> Report:
    """Load ``path`` (any kind, by content) and run its memory analyses and rules."""
    config = make_config(config_path, assignments)
    model = load(path)
    only = _TRACE_MEMORY if model.kind == "trace" else None
    results = run_analyses(model, config, only=only)
    outcome = run_rules(results, config)
    # Rules about other signals (kernels, steps …) would only say "could not run" here.
    not_run = outcome.not_run
    if model.kind == "trace":
        specs = rule_registry()
        not_run = {k: v for k, v in not_run.items()
                   if k in specs and set(specs[k].needs + specs[k].needs_any) & set(_TRACE_MEMORY)}
    return Report(
        source=path, kind=model.kind, meta=model.meta.to_json(), results=results,
        findings=outcome.findings, below_floor=outcome.below_floor, not_run=not_run, rule_failures=outcome.failed,
        warnings=tuple(getattr(model, "warnings", ())),
    )


def memory_summary(report: Report) -> str:
    """Every memory section's key numbers, then the findings."""
    lines = [click.style(report.source, bold=True) + f"  [{report.kind}]"]
    for w in report.warnings:
        lines.append(click.style(f"  warning: {w}", fg="yellow"))
    for _, title, result in report.sections():
        summary = summary_of(result)
        if not summary:
            continue
        lines.append(f"  {title}")
        width = max(len(k) for k, _ in summary)
        lines += [f"    {k.ljust(width)}  {v}" for k, v in summary]
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


@click.command("memory", epilog="""\b
Examples:
  traceanalyzer memory snapshot.pickle
  traceanalyzer memory oom_snapshot.pickle.gz -o out/ --format json,md
  traceanalyzer memory trace.json            # [memory] events of a profile_memory=True trace
  traceanalyzer memory timeline.raw.json.gz  # export_memory_timeline output
""")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--outdir", type=click.Path(file_okay=False), default=None,
              help="Directory for report files [default: ./<input>.traceanalyzer].")
@click.option("-f", "--format", "formats", multiple=True, metavar="FMT[,FMT…]",
              help="Output formats (comma-separated or repeated); 'all' for every default format.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@config_options
def command(path: str, outdir: str | None, formats: tuple[str, ...], quiet: bool,
            config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Memory report: peak and what is live then, fragmentation, leaks, OOM.

    PATH is a CUDA memory snapshot pickle (from torch.cuda.memory._dump_snapshot,
    any release, gzip ok; loaded without running any code from the file), a chrome
    trace recorded with profile_memory=True, or an export_memory_timeline file.
    """
    fmts = resolve_formats(formats)
    report = build_memory_report(path, config_path, assignments)
    out = Path(outdir) if outdir else default_outdir(path)
    written = write_outputs(report, out, fmts)
    if not quiet:
        click.echo(clean_text(memory_summary(report)))
        click.echo("  wrote: " + ", ".join(str(p) for p in written))
