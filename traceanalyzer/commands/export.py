"""``traceanalyzer export``: one input's model tables → Parquet files for polars or DuckDB."""

from __future__ import annotations

import click

from traceanalyzer.commands.cache import no_cache_option
from traceanalyzer.commands.options import outdir_option, quiet_option
from traceanalyzer.pipeline import load
from traceanalyzer.report.text import clean_text
from traceanalyzer.store.export import export_model


@click.command("export", epilog="""\b
Examples:
  traceanalyzer export rank0.pt.trace.json.gz -o tables/
  duckdb -c "select name, sum(dur_ns)/1e6 as ms from 'tables/kernels.parquet' group by 1 order by 2 desc limit 10"
  python -c "import polars as pl; print(pl.read_parquet('tables/kernels.parquet').head())"
""")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@outdir_option("Directory for the Parquet files and meta.json.", required=True)
@quiet_option()
@no_cache_option
def command(path: str, outdir: str, quiet: bool, no_cache: bool) -> None:
    """Write the tables of one trace (or memory snapshot, memory timeline) as Parquet.

    One TABLE.parquet per table of the loaded model (kernels, cpu_ops, runtime, memcpy,
    steps … for a trace), empty tables included, plus meta.json (the trace's metadata, the
    load warnings, each table's rows and columns). Times are int64 nanoseconds, sizes bytes;
    the columns are documented in docs/export.md.
    """
    model = load(path, use_cache=False if no_cache else None)
    written = export_model(model, outdir, source=path)
    if not quiet:
        for w in model.warnings:
            click.echo(clean_text(f"  warning: {w}"), err=True)
        click.echo(f"  wrote: {len(written) - 1} tables as Parquet and {written[-1].name} in {outdir}")
