"""``traceanalyzer compare``: baseline vs candidate (traces or run directories)."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.commands.options import FiniteFloat, config_options, make_config
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
@click.option("-o", "--outdir", type=click.Path(file_okay=False), default=None,
              help="Directory for compare.md/.json/.html [default: ./compare.traceanalyzer].")
@click.option("-f", "--format", "formats", multiple=True, metavar="FMT[,FMT…]",
              help="md, json, html (comma-separated or repeated) [default: all three].")
@click.option("--fail-if-slower", "fail_pct", type=FiniteFloat(min=0), default=None, metavar="PCT",
              help="Exit 1 when the candidate's median step time is more than PCT % slower and the 95 % "
                   "confidence interval excludes no change.")
@click.option("--allow-mismatch", is_flag=True,
              help="Let --fail-if-slower gate across different hardware (device model or count, vendor, "
                   "world size). Without it such a gate exits 2; the mismatch is stated either way.")
@click.option("--top", type=click.IntRange(min=1, max=1_000_000, clamp=True), default=10, show_default=True,
              help="Kernel changes printed on the terminal.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors and the gate's verdict.")
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
    from traceanalyzer.compare.render import resolve, terminal_summary, write
    from traceanalyzer.progress import progress

    config = make_config(config_path, assignments)
    fmts = resolve(formats)
    with progress("Analysing both sides", enabled=False if quiet else None):
        cmp = compare_paths(baseline, candidate, config)
    out = Path(outdir) if outdir else Path.cwd() / "compare.traceanalyzer"
    written = write(cmp, out, fmts)
    if not quiet:
        click.echo(clean_text(terminal_summary(cmp, top)))
        click.echo("  wrote: " + ", ".join(str(p) for p in written))
    elif cmp.comparability.headline():  # -q still states a mismatch (on stderr, with the errors)
        click.echo(cmp.comparability.headline(), err=True)
    if fail_pct is None:
        return
    refusal = cmp.gate_refusal(allow_mismatch)
    if refusal:  # a usage-like refusal (exit 2): the gate cannot judge code across hardware
        click.echo(f"error: {refusal}", err=True)
        raise click.exceptions.Exit(2)
    if cmp.slower_than(fail_pct):
        across = "" if cmp.comparability.comparable else " (across different hardware: --allow-mismatch)"
        caution = f"; caution: {cmp.step_time.power_sentence()}" if cmp.step_time.low_power else ""
        click.echo(f"regression: median step time {cmp.step_time.diff_pct:+.1f} % (limit {fail_pct:g} %){across}"
                   f"{caution}", err=True)
        raise click.exceptions.Exit(1)
    if cmp.step_time.low_power:
        click.echo(f"gate passed, but {cmp.step_time.power_sentence()}", err=True)
