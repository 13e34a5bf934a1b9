"""``traceanalyzer compare``: baseline vs candidate (traces or run directories)."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.commands.options import config_options, make_config


@click.command("compare", epilog="""\b
Examples:
  traceanalyzer compare baseline.json.gz candidate.json.gz
  traceanalyzer compare runs/nightly-41/ runs/nightly-42/ -o diff/ --format md,json
  traceanalyzer compare main.json.gz pr.json.gz --fail-if-slower 3   # CI gate
""")
@click.argument("baseline", type=click.Path(exists=True, path_type=str))
@click.argument("candidate", type=click.Path(exists=True, path_type=str))
@click.option("-o", "--outdir", type=click.Path(file_okay=False), default=None,
              help="Directory for compare.md/.json/.html [default: ./compare.traceanalyzer].")
@click.option("-f", "--format", "formats", multiple=True, metavar="FMT[,FMT…]",
              help="md, json, html (comma-separated or repeated) [default: all three].")
@click.option("--fail-if-slower", "fail_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Exit 1 when the candidate's median step time is more than PCT % slower and the 95 % "
                   "confidence interval excludes no change.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Kernel changes printed on the terminal.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and the gate's verdict.")
@config_options
def command(baseline: str, candidate: str, outdir: str | None, formats: tuple[str, ...], fail_pct: float | None,
            top: int, quiet: bool, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Compare a CANDIDATE trace (or run directory) against a BASELINE.

    Reports the step-time change with a bootstrap confidence interval and a
    Mann-Whitney U test ("no significant change" when the interval spans zero), GPU
    busy/idle and communication changes, per-kernel and per-op time and count deltas
    ranked by impact, new/vanished kernels and the memory-peak change. A directory side
    pools all its traces (e.g. the ranks of a run).
    """
    from traceanalyzer.compare.diff import compare_paths
    from traceanalyzer.compare.render import resolve, terminal_summary, write
    from traceanalyzer.progress import progress

    config = make_config(config_path, assignments)
    fmts = resolve(formats)
    with progress("Analysing both sides", enabled=False if quiet else None):
        cmp = compare_paths(baseline, candidate, config)
    out = Path(outdir) if outdir else Path.cwd() / "compare.traceanalyzer"
    written = write(cmp, out, fmts)
    if not quiet:
        click.echo(terminal_summary(cmp, top))
        click.echo("  wrote: " + ", ".join(str(p) for p in written))
    if fail_pct is not None and cmp.slower_than(fail_pct):
        click.echo(f"regression: median step time {cmp.step_time.diff_pct:+.1f} % (limit {fail_pct:g} %)", err=True)
        raise click.exceptions.Exit(1)
