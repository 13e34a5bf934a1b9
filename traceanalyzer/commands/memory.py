"""``traceanalyzer memory``: why did I OOM? A snapshot (or trace / memory timeline) →
memory report files + a memory-focused terminal summary."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.commands.cache import no_cache_option
from traceanalyzer.commands.options import config_options, formats_option, make_config, outdir_option, quiet_option
from traceanalyzer.pipeline import build_memory_report, default_outdir, load, resolve_formats, write_outputs
from traceanalyzer.report.terminal import memory_summary, written_line
from traceanalyzer.report.text import clean_text


@click.command("memory", epilog="""\b
Examples:
  traceanalyzer memory snapshot.pickle
  traceanalyzer memory oom_snapshot.pickle.gz -o out/ --format json,md
  traceanalyzer memory trace.json            # [memory] events of a profile_memory=True trace
  traceanalyzer memory timeline.raw.json.gz  # export_memory_timeline output
""")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@outdir_option("Directory for report files [default: ./<input>.traceanalyzer].")
@formats_option("Output formats (comma-separated or repeated) [default: html,md,json; 'all' adds png].")
@quiet_option()
@no_cache_option
@config_options
def command(path: str, outdir: str | None, formats: tuple[str, ...], quiet: bool, no_cache: bool,
            config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Memory report: peak and what is live then, fragmentation, leaks, OOM.

    PATH is a CUDA memory snapshot pickle (from torch.cuda.memory._dump_snapshot,
    any release, gzip ok; loaded without running any code from the file), a chrome
    trace recorded with profile_memory=True, or an export_memory_timeline file.
    """
    fmts = resolve_formats(formats)
    config = make_config(config_path, assignments)
    report = build_memory_report(load(path, use_cache=False if no_cache else None), config, source=path)
    out = Path(outdir) if outdir else default_outdir(path)
    written = write_outputs(report, out, fmts)
    if not quiet:
        click.echo(clean_text(memory_summary(report)))
        click.echo(written_line(written))
