"""A frame's rows as JSON objects, for the results' ``to_json`` (private: shared by the analyses).

``summary.json`` rounds every float it holds (:func:`traceanalyzer.report.json_report.round_floats`),
which means visiting every value of the document. Most of a table's values are integers and
strings that the rounding leaves as they are; :func:`rows` records which columns can hold
anything else (floats, nested values), so that the rounding visits only those.
"""

from __future__ import annotations

from typing import Any

import polars as pl


class FrameRows(list[dict[str, Any]]):
    """``df.to_dicts()``, plus ``inexact``: the columns whose values may hold a float (float,
    nested, decimal, object … columns). Every other column holds integers, strings, booleans,
    temporal values or nulls only.

    The rows go into a ``to_json`` document as they are: a row changed or added afterwards
    would not match ``inexact`` (build a plain list for rows that are edited)."""

    __slots__ = ("inexact",)

    inexact: tuple[str, ...]


def _exact(dtype: pl.DataType) -> bool:
    """True for the dtypes whose Python values are never a float nor hold one."""
    return (dtype.is_integer() or dtype.is_temporal() or dtype in (pl.String, pl.Boolean, pl.Null)
            or isinstance(dtype, (pl.Categorical, pl.Enum)))


def rows(df: pl.DataFrame) -> FrameRows:
    """The rows of ``df`` as dicts (``df.to_dicts()``), with their :attr:`FrameRows.inexact` columns."""
    out = FrameRows(df.to_dicts())
    out.inexact = tuple(c for c, t in df.schema.items() if not _exact(t))
    return out
