"""``traceanalyzer export``: a loaded model's tables as Parquet files (docs/export.md).

One ``<table>.parquet`` per table of the model (every table, empty ones included, so a query
never meets a missing file) with the columns and dtypes of the model's schema
(``model.trace.SCHEMAS`` for traces; units in column names: ``ts_ns``, ``dur_ns``, ``bytes``),
and ``meta.json``: the kind, the model's meta (what ``summary.json`` shows under ``meta``), the
load warnings and each table's row count and columns. Every file is written to a temporary
name in the output directory and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from traceanalyzer import __version__
from traceanalyzer.errors import OutputError
from traceanalyzer.load.cache_version import LOADER_VERSION
from traceanalyzer.model import Model
from traceanalyzer.store import model_tables, schema_doc

META_FILE = "meta.json"
#: Parquet compression of the exported tables (zstd: small files, fast to read in polars and DuckDB).
PARQUET_COMPRESSION = "zstd"


def _replace_into(path: Path, write: Any) -> None:
    """``write(tmp)`` a temporary file beside ``path``, then rename it onto ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputError.from_os(path.parent, exc) from None
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError.from_os(path, exc) from None
        raise


def export_model(model: Model, outdir: str | Path, source: str | None = None) -> list[Path]:
    """Write every table of ``model`` as ``<table>.parquet`` and its ``meta.json`` into
    ``outdir`` (created); returns the files written, ``meta.json`` last."""
    out = Path(outdir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError.from_os(out, exc) from None
    written: list[Path] = []
    tables = model_tables(model)
    for name, df in tables.items():
        target = out / f"{name}.parquet"
        _replace_into(target, lambda tmp, df=df: df.write_parquet(tmp, compression=PARQUET_COMPRESSION))
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
    _replace_into(meta_path, lambda tmp: tmp.write_bytes(data))
    written.append(meta_path)
    return written


__all__ = ["META_FILE", "PARQUET_COMPRESSION", "export_model"]
