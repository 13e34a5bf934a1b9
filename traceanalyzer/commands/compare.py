"""``traceanalyzer compare``: baseline vs candidate (traces or run directories)."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.commands.options import (
    FiniteFloat,
    config_options,
    formats_option,
    make_config,
    outdir_option,
    quiet_option,
    top_option,
)
from traceanalyzer.report.terminal import written_line
from traceanalyzer.report.text import clean_text


@click.command("compare", epilog="""\b
Examples:
  traceanalyzer compare baseline.json.gz candidate.json.gz
  traceanalyzer compare runs/nightly-41/ runs/nightly-42/ -o diff/ --format md,json
  traceanalyzer compare main.json.gz pr.json.gz --fail-if-slower 3   # CI gate
  traceanalyzer compare h100.json.gz mi300.json.gz --fail-if-slower 3 --allow-mismatch
""")
@click.argument("baseline", type=click.Path(exists=True, path_type=str))
@click.argument("candidate", type=click.Path(exists=True, path_type=str))
@outdir_option("Directory for compare.md/.json/.html [default: ./compare.traceanalyzer].")
@formats_option("md, json, html (comma-separated or repeated) [default: all three].")
@click.option("--fail-if-slower", "fail_pct", type=FiniteFloat(min=0), default=None, metavar="PCT",
              help="Exit 1 when the candidate's median step time is more than PCT % slower and the 95 % "
                   "confidence interval excludes no change.")
@click.option("--allow-mismatch", is_flag=True,
              help="Let --fail-if-slower gate across different hardware (device model or count, vendor, "
                   "world size). Without it such a gate exits 2; the mismatch is stated either way.")
@top_option(10, "Kernel changes printed on the terminal.")
@quiet_option("Print nothing but errors and the gate's verdict.")
@config_options
def command(baseline: str, candidate: str, outdir: str | None, formats: tuple[str, ...], fail_pct: float | None,
            allow_mismatch: bool, top: int, quiet: bool, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Compare a CANDIDATE trace (or run directory) against a BASELINE.

    First checks that both ran on the same hardware and software (device model and
    count, vendor, world size, versions, batch size) and states any mismatch at the top.
    Reports the step-time change with a bootstrap confidence interval and a
    Mann-Whitney U test ("no significant change" when the interval spans zero and lies
    within ±5 %; "too few steps to tell" when the test has little power), GPU
    busy/idle and communication changes, per-kernel and per-op time and count deltas
    ranked by impact, new/vanished kernels and the memory-peak change. A directory side
    pools all its traces (e.g. the ranks of a run).
    """
    from traceanalyzer.compare.diff import compare_paths
    from traceanalyzer.compare.render import gate_verdict, resolve, terminal_summary, write
    from traceanalyzer.progress import progress

    config = make_config(config_path, assignments)
    fmts = resolve(formats)
    with progress("Analysing both sides", enabled=False if quiet else None):
        cmp = compare_paths(baseline, candidate, config)
    out = Path(outdir) if outdir else Path.cwd() / "compare.traceanalyzer"
    written = write(cmp, out, fmts)
    if not quiet:
        click.echo(clean_text(terminal_summary(cmp, top)))
        click.echo(written_line(written))
    elif cmp.comparability.headline():  # -q still states a mismatch (on stderr, with the errors)
        click.echo(cmp.comparability.headline(), err=True)
    if fail_pct is None:
        return
    code, line = gate_verdict(cmp, fail_pct, allow_mismatch)
    if line:
        click.echo(line, err=True)
    if code:
        raise click.exceptions.Exit(code)
