"""``traceanalyzer analyze``: one trace or snapshot → terminal summary + report files."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from traceanalyzer.commands.options import (
    config_options,
    fail_on_option,
    formats_option,
    make_config,
    outdir_option,
    quiet_option,
)
from traceanalyzer.pipeline import (
    build_report,
    default_outdir,
    findings_at_or_above,
    load,
    resolve_formats,
    write_outputs,
)
from traceanalyzer.progress import progress
from traceanalyzer.report import registry as renderer_registry
from traceanalyzer.report.charts import CHART_FORMATS, ChartDrawing, charts_for
from traceanalyzer.report.terminal import analyze_summary, fail_on_line, written_line
from traceanalyzer.report.text import clean_text


@click.command("analyze", epilog="""\b
Examples:
  traceanalyzer analyze rank0.pt.trace.json.gz
  traceanalyzer analyze trace.json -o out/ --format json,md
  traceanalyzer analyze trace.json.gz --open
  traceanalyzer analyze snapshot.pickle --set idle_gaps.long_gap_us=200
""")
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@outdir_option("Directory for report files [default: ./<input>.traceanalyzer].")
@formats_option("Output formats (comma-separated or repeated) [default: all].")
@quiet_option("Print nothing but errors (no progress, no summary).")
@click.option("--open", "open_report", is_flag=True,
              help="Open report.html in the default browser when done (implies the html format).")
@fail_on_option()
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
    # One unit per chart and per format, so the bar moves while the charts are drawn (most of
    # this step). The charts are drawn once, for the png and html renderers both: forked
    # processes rasterise them while this one writes the formats without charts.
    charts = charts_for(report.results) if CHART_FORMATS & set(fmts) else []
    with progress(f"Writing {', '.join(fmts)}", total=len(charts) + len(fmts), enabled=show) as bar:
        by_format: dict[str, list[Path]] = {}
        with contextlib.ExitStack() as stack:
            drawing = None
            if charts:
                bar.update(0, note="charts")
                drawing = stack.enter_context(
                    ChartDrawing(report.results, on_drawn=lambda d: bar.update(1, note=f"chart {d.spec.name}")))
            for fmt in sorted(fmts, key=lambda f: f in CHART_FORMATS):  # those without charts first
                if drawing is not None and fmt in CHART_FORMATS:
                    drawing.finish()
                bar.update(0, note=fmt)
                by_format[fmt] = write_outputs(report, out, [fmt])
                bar.update(1)
                if drawing is not None:
                    drawing.poll()
        written = [p for fmt in fmts for p in by_format[fmt]]
    if not quiet:
        click.echo(clean_text(analyze_summary(report)))
        click.echo(written_line(written))
    if open_report:
        page = out / "report.html"
        if click.launch(str(page.resolve())) != 0 and not quiet:
            click.echo(f"  could not open a browser; the report is {page}", err=True)
    tripped = findings_at_or_above(report, fail_on) if fail_on else []
    if fail_on and tripped:
        click.echo(fail_on_line(fail_on, tripped), err=True)
        raise click.exceptions.Exit(1)


command.help = (command.help or "") + " " + ", ".join(
    f"{n} ({s.description})" for n, s in sorted(renderer_registry().items())
) + "."
