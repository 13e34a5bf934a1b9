"""``traceanalyzer analyze``: one trace or snapshot → terminal summary + report files."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.analyses import summary_of
from traceanalyzer.commands.options import config_options, make_config
from traceanalyzer.pipeline import build_report, load, resolve_formats, write_outputs
from traceanalyzer.progress import progress
from traceanalyzer.report import registry as renderer_registry
from traceanalyzer.report.document import Report
from traceanalyzer.report.text import clean_text, shorten
from traceanalyzer.rules import Severity
from traceanalyzer.units import fmt_cost


def default_outdir(path: str) -> Path:
    """``./<file name without .json/.gz>.traceanalyzer`` in the current directory
    (the input's own directory may be read-only, e.g. a shared mount)."""
    name = Path(path).name
    for suffix in (".gz", ".json", ".pickle", ".pkl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path.cwd() / f"{name}.traceanalyzer"


def terminal_summary(report: Report, top_findings: int = 5) -> str:
    """The short summary printed after an analysis (key numbers + top findings)."""
    lines = [click.style(f"{report.source}", bold=True) + f"  [{report.kind}]"]
    for w in report.warnings:
        lines.append(click.style(f"  warning: {w}", fg="yellow"))
    # The whole-trace numbers first, then the verdict; the report has the rest.
    wanted = ("overview", "diagnosis", "memory_peak", "memory_oom", "export_timeline")
    shown = [s for s in report.sections() if s[0] in wanted] or report.sections()[:1]
    brief = {"diagnosis": ("Verdict", "What would move it", "Dominant phase")}
    for name, title, result in sorted(shown, key=lambda s: wanted.index(s[0]) if s[0] in wanted else 0):
        summary = [kv for kv in summary_of(result) if name not in brief or kv[0] in brief[name]]
        if not summary:
            continue
        lines.append(f"  {title}")
        width = max(len(k) for k, _ in summary)
        lines += [f"    {k.ljust(width)}  {v}" for k, v in summary]
    overview = report.results.values.get("overview")
    if overview is not None and getattr(overview, "top_kernels", None) is not None and overview.top_kernels.height:
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


@click.command("analyze", epilog="""\b
Examples:
  traceanalyzer analyze rank0.pt.trace.json.gz
  traceanalyzer analyze trace.json -o out/ --format json,md
  traceanalyzer analyze trace.json.gz --open
  traceanalyzer analyze snapshot.pickle --set idle_gaps.long_gap_us=200
""")
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--outdir", type=click.Path(file_okay=False), default=None,
              help="Directory for report files [default: ./<input>.traceanalyzer].")
@click.option("-f", "--format", "formats", multiple=True, metavar="FMT[,FMT…]",
              help="Output formats (comma-separated or repeated) [default: all].")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (no progress, no summary).")
@click.option("--open", "open_report", is_flag=True,
              help="Open report.html in the default browser when done (implies the html format).")
@click.option("--fail-on", "fail_on", type=click.Choice(["info", "warning", "critical"]), default=None,
              help="Exit 1 (after writing the reports) when a finding of this severity or worse exists: "
                   "a CI gate on performance.")
@config_options
def command(path: str, outdir: str | None, formats: tuple[str, ...], quiet: bool, open_report: bool,
            fail_on: str | None, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Analyze one trace (.json/.json.gz) or memory snapshot (.pickle).

    The input kind is recognised by content. Writes the report files into OUTDIR
    and prints a short summary: steps, span, GPU busy %, kernel count, top kernels
    and the top findings. Formats available:
    """
    config = make_config(config_path, assignments)
    fmts = resolve_formats(formats)
    if open_report and "html" not in fmts:
        fmts.append("html")
    show = False if quiet else None  # None: only on a terminal
    with progress(f"Loading {Path(path).name}", enabled=show):
        model = load(path)
    with progress("Analysing", enabled=show):
        report = build_report(model, config, source=str(path))
    out = Path(outdir) if outdir else default_outdir(path)
    with progress(f"Writing {', '.join(fmts)}", total=len(fmts), enabled=show) as bar:
        written: list[Path] = []
        for fmt in fmts:
            written += write_outputs(report, out, [fmt])
            bar.update(1)
    if not quiet:
        click.echo(clean_text(terminal_summary(report)))
        click.echo("  wrote: " + ", ".join(str(p) for p in written))
    if open_report:
        page = out / "report.html"
        if click.launch(str(page.resolve())) != 0 and not quiet:
            click.echo(f"  could not open a browser; the report is {page}", err=True)
    if fail_on:
        gate_on_findings(report, fail_on)


def gate_on_findings(report: Report, fail_on: str) -> None:
    """``--fail-on``: raise exit code 1 with one line on stderr when a finding of severity
    ``fail_on`` or worse exists (called after the reports are written)."""
    threshold = Severity.parse(fail_on)
    tripped = [f for f in report.findings if f.severity >= threshold]
    if tripped:
        worst = max(tripped, key=lambda f: (int(f.severity), f.cost_ms_per_step or 0.0))
        click.echo(f"fail-on {fail_on}: {len(tripped)} finding(s) of severity {fail_on} or worse, e.g. "
                   f"[{worst.severity}] {worst.rule_id}: {shorten(clean_text(worst.title, keep_newlines=False), 100)}",
                   err=True)
        raise click.exceptions.Exit(1)


command.help = (command.help or "") + " " + ", ".join(
    f"{n} ({s.description})" for n, s in sorted(renderer_registry().items())
) + "."
