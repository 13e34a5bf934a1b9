"""``traceanalyzer analyze``: one trace or snapshot → terminal summary + report files; a run's
directory (or several paths) → one report of its trace and memory snapshot together, or the
multi-rank summary of its ranks."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from traceanalyzer.commands.cache import no_cache_option
from traceanalyzer.commands.options import (
    config_options,
    fail_on_option,
    formats_option,
    make_config,
    outdir_option,
    quiet_option,
)
from traceanalyzer.errors import ConfigError, InputError
from traceanalyzer.pipeline import (
    build_report,
    build_run_report,
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

if TYPE_CHECKING:
    from traceanalyzer.batch.discover import Discovery, Input
    from traceanalyzer.batch.runner import BatchResult
    from traceanalyzer.config import Config
    from traceanalyzer.report.document import Report
    from traceanalyzer.rules import Finding


@click.command("analyze", epilog="""\b
Examples:
  traceanalyzer analyze rank0.pt.trace.json.gz
  traceanalyzer analyze trace.json -o out/ --format json,md
  traceanalyzer analyze trace.json.gz --open
  traceanalyzer analyze snapshot.pickle --set idle_gaps.long_gap_us=200
  traceanalyzer analyze run_dir/            (its trace and snapshot in one report)
  traceanalyzer analyze trace.json.gz snapshot.pickle
  traceanalyzer analyze trace.json.gz -f perfetto --window step:5-7
""")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...", type=click.Path(dir_okay=True, path_type=str))
@outdir_option("Directory for report files [default: ./<input>.traceanalyzer].")
@formats_option("Output formats (comma-separated or repeated) [default: html,md,json; 'all' adds png, the charts "
                "as PNG files].")
@quiet_option("Print nothing but errors (no progress, no summary).")
@click.option("--open", "open_report", is_flag=True,
              help="Open report.html in the default browser when done (implies the html format).")
@click.option("--window", default=None, metavar="START_MS:END_MS|step:N[-M]",
              help="What the perfetto format exports (implies it): milliseconds from the trace start, or "
                   "ProfilerStep numbers [default: the steady steps, at most trace_window.max_steps].")
@fail_on_option()
@no_cache_option
@config_options
def command(paths: tuple[str, ...], outdir: str | None, formats: tuple[str, ...], quiet: bool, open_report: bool,
            window: str | None, fail_on: str | None, no_cache: bool, config_path: str | None,
            assignments: tuple[str, ...]) -> None:
    """Analyze one trace (.json/.json.gz) or memory snapshot (.pickle), or one run.

    The input kind is recognised by content. Writes the report files into OUTDIR
    and prints a short summary: steps, span, GPU busy %, kernel count, top kernels
    and the top findings. A directory or several paths make one run: a trace with
    its memory snapshot (and/or memory-timeline export) gives one report of both,
    the snapshot's peak placed on the trace's steps; the traces of several ranks of
    one run get per-rank reports and the multi-rank summary, as batch writes them
    (there --open opens the summary, index.html, and --fail-on reads the findings of
    every rank and the cross-rank one; it adds the json format, whose summary.json
    holds each rank's findings). Formats available:
    """
    config = make_config(config_path, assignments)
    fmts = resolve_formats(formats)
    if open_report and "html" not in fmts:
        fmts.append("html")
    if window is not None:
        config = _with_window(config, window)
        if "perfetto" not in fmts:
            fmts = resolve_formats([*fmts, "perfetto"])
    path = paths[0]
    out = Path(outdir) if outdir else default_outdir(path)
    show = False if quiet else None  # None: only on a terminal
    if len(paths) > 1 or Path(path).is_dir():
        found = _discover(paths, out)
        traces = [i for i in found.inputs if i.kind == "trace"]
        if len(traces) > 1:
            _analyze_ranks(found, traces, out, config, fmts, quiet, fail_on=fail_on, open_report=open_report)
            return
        report = _run_report(found, config, show, " ".join(paths), use_cache=False if no_cache else None)
    else:
        with progress(f"Loading {Path(path).name}", enabled=show):
            model = load(path, use_cache=False if no_cache else None)
        with progress("Analysing", enabled=show):
            report = build_report(model, config, source=str(path))
    if window is not None and "trace_window" in report.results.skipped:
        raise ConfigError(f"--window: {report.results.skipped['trace_window']}")
    # One unit per chart and per format, so the bar moves while the PNG charts are drawn (most of
    # this step with png; the page's SVG charts are cheap): forked processes rasterise them
    # while this one writes the other formats.
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
        if "perfetto" in fmts and "trace_window" not in report.results.values:
            why = report.results.skipped.get("trace_window", "only a trace has a timeline to export")
            click.echo(clean_text(f"  perfetto: nothing written ({why})"), err=True)
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


def _with_window(config: Config, window: str) -> Config:
    """``config`` with ``--window`` as ``trace_window.window``; a malformed value is refused
    with one line before anything is loaded."""
    from traceanalyzer.analyses.trace_window import parse_window

    try:
        parse_window(window)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return config.with_overrides({"trace_window.window": window})


def _discover(paths: tuple[str, ...], out: Path) -> Discovery:
    """The inputs under ``paths`` (files and directories, searched as ``batch`` does, the
    output directory excluded); one line and exit 2 when there are none."""
    from traceanalyzer.batch.discover import discover

    found = discover(paths, exclude=out)
    if not found.inputs:
        why = f" ({len(found.ignored)} file(s) ignored, e.g. {Path(found.ignored[0][0]).name}: " \
              f"{found.ignored[0][1]})" if found.ignored else ""
        raise InputError(" ".join(paths), f"no trace or memory snapshot found{why}")
    return found


def _run_report(found: Discovery, config: Config, show: bool | None, source: str, *,
                use_cache: bool | None = None) -> Report:
    """One report of a run's inputs: at most one trace, one snapshot and one memory-timeline
    export (see :func:`traceanalyzer.pipeline.build_run_report`)."""
    by_kind: dict[str, list[Input]] = {}
    for inp in found.inputs:
        by_kind.setdefault(inp.kind, []).append(inp)
    for kind, items in by_kind.items():
        if len(items) > 1:
            names = ", ".join(Path(i.path).name for i in items[:3])
            raise InputError(source, f"{len(items)} inputs of kind {kind} ({names}) but no several traces of one "
                                     "run: give one of each kind, or analyse them with 'traceanalyzer batch'")
    reports = []
    for inp in found.inputs:
        with progress(f"Loading {Path(inp.path).name}", enabled=show):
            model = load(inp.path, use_cache=use_cache)
        with progress("Analysing", enabled=show):
            reports.append(build_report(model, config, source=inp.path))
    if len(reports) == 1:
        return reports[0]
    traces = [r for r in reports if r.kind == "trace"]
    if not traces:
        names = ", ".join(Path(r.source).name for r in reports)
        raise InputError(source, f"no trace among {names}: a memory snapshot and a memory-timeline export are "
                                 "analysed one at a time")
    return build_run_report(traces[0], [r for r in reports if r.kind != "trace"], source=source)


def _analyze_ranks(found: Discovery, traces: list[Input], out: Path, config: Config, fmts: list[str],
                   quiet: bool, *, fail_on: str | None = None, open_report: bool = False) -> None:
    """Several traces: the ranks of one run go to ``batch`` (per-rank reports, the index and
    the multi-rank summary); traces of different runs are refused with one line.

    ``open_report`` opens the multi-rank summary (``index.html``). ``fail_on``: exit 1 when a
    finding of that severity or worse exists in any rank's report or across the ranks (the
    ``rank_imbalance`` finding of the multi-rank summary), as for one trace; each rank's
    findings are read from its ``summary.json`` (so the json format is added)."""
    import sys

    from traceanalyzer.batch.runner import make_backend, run_batch
    from traceanalyzer.report.terminal import batch_failure_lines, batch_summary

    runs = {t.run for t in traces}
    ranks = [t.rank for t in traces]
    if len(runs) > 1 or None in ranks or len(set(ranks)) != len(ranks):
        names = ", ".join(Path(t.path).name for t in traces[:4]) + (" …" if len(traces) > 4 else "")
        raise InputError(" ".join(sorted({str(Path(t.path).parent) for t in traces})),
                         f"{len(traces)} traces that are not the ranks of one run ({names}): analyse them one at a "
                         "time, or all with 'traceanalyzer batch'")
    if not quiet:
        click.echo(f"{len(traces)} ranks of one run: per-rank reports and the multi-rank summary in {out}",
                   err=True)
    if fail_on and "json" not in fmts:
        fmts = [*fmts, "json"]
    result = run_batch(found, out, make_backend(), overrides=config.overrides, formats=fmts)
    if not quiet:
        for line in batch_failure_lines(result):
            click.echo(clean_text(line), err=True)
        click.echo(clean_text(batch_summary(result, out)), file=sys.stdout)
    if open_report:
        page = out / "index.html"
        if click.launch(str(page.resolve())) != 0 and not quiet:
            click.echo(f"  could not open a browser; the multi-rank summary is {page}", err=True)
    tripped = _rank_findings_at_or_above(result, fail_on) if fail_on else []
    if fail_on and tripped:
        click.echo(fail_on_line(fail_on, tripped), err=True)
    if result.n_failed or tripped:
        raise click.exceptions.Exit(1)


def _rank_findings_at_or_above(result: BatchResult, severity: str) -> list[Finding]:
    """The findings of ``severity`` or worse of a ranks run: each rank's (from its
    ``summary.json``; the title prefixed with ``rank N:``) and the cross-rank finding of each
    run's multi-rank summary. A rank whose ``summary.json`` cannot be read counts as failed
    already (``n_failed``) or wrote none (no json format): it adds nothing."""
    import orjson

    from traceanalyzer.rules import Finding, Severity

    threshold = Severity.parse(severity)

    def finding(doc: Any, prefix: str) -> Finding | None:
        if not isinstance(doc, dict):
            return None
        try:
            sev = Severity.parse(str(doc.get("severity")))
        except KeyError:
            return None
        if sev < threshold:
            return None
        cost = doc.get("cost_ms_per_step")
        return Finding(rule_id=str(doc.get("rule_id")), severity=sev, title=prefix + str(doc.get("title")),
                       evidence={}, fix=str(doc.get("fix") or ""),
                       cost_ms_per_step=float(cost) if isinstance(cost, (int, float)) else None)

    out: list[Finding] = []
    for row in result.rows:
        if row.get("status") != "ok":
            continue
        for rel in row.get("reports") or []:
            if Path(rel).name != "summary.json":
                continue
            try:
                doc = orjson.loads((result.outdir / rel).read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            prefix = f"rank {row['rank']}: " if row.get("rank") is not None else f"{row.get('file')}: "
            out += [f for f in (finding(d, prefix) for d in doc.get("findings") or []) if f is not None]
    for run in result.runs:
        f = finding((run.get("multirank") or {}).get("finding"), "across ranks: ")
        if f is not None:
            out.append(f)
    return out
