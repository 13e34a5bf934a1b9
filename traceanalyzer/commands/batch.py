"""``traceanalyzer batch``: many traces/snapshots → per-file reports + an index."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from traceanalyzer.commands.options import (
    FiniteFloat,
    config_options,
    formats_option,
    make_config,
    outdir_option,
    quiet_option,
)
from traceanalyzer.errors import ConfigError
from traceanalyzer.progress import progress
from traceanalyzer.report.terminal import batch_failure_lines, batch_interrupted_line, batch_start_line, batch_summary
from traceanalyzer.supervise import ENV_MAX_MEMORY

if TYPE_CHECKING:
    from traceanalyzer.batch.discover import Discovery
    from traceanalyzer.batch.runner import BatchResult, DaskBackend, LocalBackend


@click.command("batch", epilog="""\b
Examples:
  traceanalyzer batch runs/ -o nightly-report/
  traceanalyzer batch 'runs/2024-*/' -o out/ --jobs 8 --format json,md,html
  traceanalyzer batch s3://bucket/traces/ -o out/ --scheduler tcp://scheduler:8786
""")
@click.argument("inputs", nargs=-1, required=True, metavar="DIR_OR_GLOB...")
@outdir_option("Directory for the per-file reports and the index (index.html, index.csv, runs.csv, index.json).",
               required=True)
@click.option("-j", "--jobs", type=click.IntRange(min=0, max=4096), default=0, show_default="all cores",
              help="Worker processes (0: one per core; 1: no subprocesses).")
@formats_option("Per-file report formats [default: json,md]; png (matplotlib charts) is the slow one.")
@click.option("--no-cache", is_flag=True, help="Re-analyse every file even when its content is unchanged, "
              "parsing it (the model cache is neither read nor written).")
@click.option("--scheduler", metavar="tcp://HOST:PORT", default=None,
              help="Run on an existing Dask distributed cluster (needs traceanalyzer[dask]).")
@click.option("--dask", "use_dask", is_flag=True,
              help="Run on a local Dask cluster of --jobs workers (needs traceanalyzer[dask]).")
@click.option("--file-timeout", type=FiniteFloat(min=0), default=1800.0, show_default=True, metavar="SECONDS",
              help="Wall-clock limit per file (local workers); a file past it fails, the batch goes on. 0: none.")
@click.option("--file-memory", type=FiniteFloat(min=0, max=1 << 20), default=None, metavar="GIB",
              show_default="--max-memory, else 80 % of physical memory",
              help="Resident-memory limit per file in GiB (local workers; the address space is capped at 4x). "
                   "A file past it fails, the batch goes on. 0: none.")
@click.option("--in-process", is_flag=True,
              help="Analyse in this process, one file at a time, without per-file limits (debugging).")
@quiet_option()
@config_options
def command(inputs: tuple[str, ...], outdir: str, jobs: int, formats: tuple[str, ...], no_cache: bool,
            scheduler: str | None, use_dask: bool, file_timeout: float, file_memory: float | None, in_process: bool,
            quiet: bool, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Analyse every trace and snapshot under DIR_OR_GLOB... in parallel.

    Inputs are directories (searched recursively), files, globs or fsspec URLs;
    files named *.json, *.pickle, *.pkl (each also .gz) are recognised by content. Files of
    one run (same directory, ranks from distributedInfo) are grouped: the index gets
    one row per file and per run, with a straggler/imbalance check across ranks.
    Unchanged files (same bytes, tool version and settings) are taken from the cache
    in OUTDIR. A file that cannot be analysed is listed with its error and the batch
    goes on; the exit code is then 1. Each file is analysed in a worker process under
    a time and memory limit (--file-timeout, --file-memory). Ctrl-C lets the files in
    progress finish, writes the index and exits 130; the same command resumes.
    One batch at a time per OUTDIR (a second one refuses, exit 2).
    """
    from traceanalyzer.batch.discover import discover_some
    from traceanalyzer.batch.runner import BatchInterrupted, backend_text, make_backend
    from traceanalyzer.pipeline import resolve_formats

    config = make_config(config_path, assignments)
    if no_cache:  # the model cache too, in this process and the local workers it starts
        from traceanalyzer.store.cache import ENV_NO_CACHE

        os.environ[ENV_NO_CACHE] = "1"
    fmts = resolve_formats(formats) if formats else ["json", "md"]
    if scheduler and not scheduler.strip():
        raise ConfigError("--scheduler: expected an address like tcp://host:8786")
    out = Path(outdir)
    found = discover_some(inputs, exclude=out)
    if file_memory is None and os.environ.get(ENV_MAX_MEMORY):
        file_memory = int(os.environ[ENV_MAX_MEMORY]) / (1 << 30)  # --max-memory: the limit per file
    backend = make_backend(jobs=jobs, scheduler=scheduler, use_dask=use_dask, in_process=in_process,
                           timeout_s=file_timeout, memory_gib=file_memory)
    n = len(found.inputs)
    if not quiet:
        click.echo(batch_start_line(found, backend_text(backend)), err=True)
    try:
        result = _run(found, out, backend, config.overrides, fmts, not no_cache, not quiet and sys.stderr.isatty(), n)
    except BatchInterrupted as exc:
        click.echo(batch_interrupted_line(exc.result, n, out, use_cache=not no_cache), err=True)
        raise click.exceptions.Exit(130) from None
    if not quiet:
        for line in batch_failure_lines(result):
            click.echo(line, err=True)
        click.echo(batch_summary(result, out))
    if result.n_failed:
        raise click.exceptions.Exit(1)


def _run(found: Discovery, out: Path, backend: LocalBackend | DaskBackend, overrides: dict[str, Any],
         fmts: list[str], use_cache: bool, show: bool, n: int) -> BatchResult:
    """:func:`run_batch`, with a progress bar on a terminal."""
    from traceanalyzer.batch.runner import run_batch

    if show:  # the one progress display, as analyze's
        with progress("Analysing", total=n, enabled=True) as bar:
            def step(row: dict[str, Any]) -> None:
                bar.update(1, note=os.path.basename(str(row["file"])) if row else "")

            return run_batch(found, out, backend, overrides=overrides, formats=fmts, use_cache=use_cache,
                             on_result=step)
    return run_batch(found, out, backend, overrides=overrides, formats=fmts, use_cache=use_cache)
