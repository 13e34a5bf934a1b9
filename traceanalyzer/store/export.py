"""``traceanalyzer export``: a loaded model's tables as Parquet files (docs/export.md).

One ``<table>.parquet`` per table of the model (every table, empty ones included, so a query
never meets a missing file) with the columns and dtypes of the model's schema
(``model.trace.SCHEMAS`` for traces; units in column names: ``ts_ns``, ``dur_ns``, ``bytes``),
and ``meta.json``: the kind, the model's meta (what ``summary.json`` shows under ``meta``), the
load warnings and each table's row count and columns. Every file is written to a temporary
name in the output directory and renamed (:mod:`traceanalyzer.fsutil`), so a reader never sees
half a file.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Final

import orjson
import polars as pl

from traceanalyzer import __version__
from traceanalyzer.fsutil import atomic_write, atomic_write_bytes, make_dir
from traceanalyzer.load.cache_version import LOADER_VERSION
from traceanalyzer.model import Model
from traceanalyzer.store import model_tables, schema_doc

META_FILE = "meta.json"
#: Parquet compression of the exported tables (zstd: small files, fast to read in polars and DuckDB).
PARQUET_COMPRESSION: Final = "zstd"


def _write_parquet(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path, compression=PARQUET_COMPRESSION)


def export_model(model: Model, outdir: str | Path, source: str | None = None) -> list[Path]:
    """Write every table of ``model`` as ``<table>.parquet`` and its ``meta.json`` into
    ``outdir`` (created); returns the files written, ``meta.json`` last."""
    out = Path(outdir)
    make_dir(out)
    written: list[Path] = []
    tables = model_tables(model)
    for name, df in tables.items():
        target = out / f"{name}.parquet"
        atomic_write(target, partial(_write_parquet, df))
        written.append(target)
    doc: dict[str, Any] = {
        "kind": model.kind,
        "source": source,
        "traceanalyzer": __version__,
        "loader_version": LOADER_VERSION,
        "meta": model.meta.to_json(),
        "warnings": list(model.warnings),
        "tables": {name: {"file": f"{name}.parquet", "rows": df.height, "columns": schema_doc(df)}
                   for name, df in tables.items()},
    }
    meta_path = out / META_FILE
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    atomic_write_bytes(meta_path, data)
    written.append(meta_path)
    return written


__all__ = ["META_FILE", "PARQUET_COMPRESSION", "export_model"]
