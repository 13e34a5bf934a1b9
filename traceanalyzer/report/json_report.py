"""JSON output: ``summary.json``, every number the report holds (schema in docs/json_schema.md)."""

from __future__ import annotations

from pathlib import Path

import orjson

from traceanalyzer.report import renderer
from traceanalyzer.report.document import Report
from traceanalyzer.report.fsutil import atomic_write_bytes


def dumps(report: Report) -> bytes:
    return orjson.dumps(
        report.to_json(),
        option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY,
    )


@renderer("json", description="summary.json: every number, versioned schema")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "summary.json"
    atomic_write_bytes(path, dumps(report) + b"\n")
    return [path]
