"""JSON output: ``summary.json``, every number the report holds.

The layout is versioned (``schema_version``, see ``docs/json_schema.md`` and the
machine-readable ``docs/summary.schema.json``). Floats are rounded to
:data:`SIGNIFICANT_DIGITS` significant digits so that the file does not change with
the summation order of a platform's float arithmetic (scripts and golden tests can
compare files byte for byte); integers (ns, bytes, counts) are exact. Object keys
are sorted, so the file does not depend on the order in which an analysis happened
to build a mapping.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from traceanalyzer.analyses._rows import FrameRows
from traceanalyzer.report import renderer
from traceanalyzer.report.document import Report
from traceanalyzer.report.fsutil import atomic_write_bytes

#: Significant digits kept in floats (float noise lives in the 15th–17th).
SIGNIFICANT_DIGITS = 10


_LEAVES = (int, str, bool, type(None))
_LEAF_TYPES = frozenset(_LEAVES)


def round_floats(value: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (NaN/inf → None),
    recursing through dicts, lists and tuples (copied); everything else unchanged."""
    t = type(value)
    # Exact-type checks first: a summary holds ~10^5 leaves, mostly ints and strings,
    # and skipping the call for them halves the time (subclasses such as numpy
    # floats still take the isinstance branches below).
    if t in _LEAVES:
        return value
    if t is float or isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value == 0.0:
            return 0.0
        return float(f"{value:.{digits}g}")
    if t is FrameRows:
        # A table's rows: only its float and nested columns need a look.
        out = [row.copy() for row in value]
        for k in value.inexact:
            seen: dict[float, float | None] = {}  # a column repeats its values (rates, shares)
            for row in out:
                v = row[k]
                if type(v) is float:
                    r = seen.get(v)
                    row[k] = r if r is not None else seen.setdefault(v, round_floats(v, digits))
                elif type(v) not in _LEAVES:
                    row[k] = round_floats(v, digits)
        return out
    if t is dict or isinstance(value, dict):
        # Leaves only (one C-level pass over the types): a copy, no per-value call.
        if _LEAF_TYPES.issuperset(map(type, value.values())):
            return dict(value)
        return {k: v if type(v) in _LEAVES else round_floats(v, digits) for k, v in value.items()}
    if t is list or t is tuple or isinstance(value, (list, tuple)):
        if _LEAF_TYPES.issuperset(map(type, value)):
            return list(value)
        return [v if type(v) in _LEAVES else round_floats(v, digits) for v in value]
    return value


def summary(report: Report) -> dict[str, Any]:
    """The JSON document (as Python objects) that ``summary.json`` holds."""
    return round_floats(report.to_json())  # type: ignore[no-any-return]


def dumps(report: Report) -> bytes:
    return orjson.dumps(
        summary(report),
        option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS,
    )


@renderer("json", description="summary.json: every number, versioned schema")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "summary.json"
    atomic_write_bytes(path, dumps(report) + b"\n")
    return [path]
