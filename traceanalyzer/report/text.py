"""Text helpers shared by the text renderers (Markdown, terminal): formatting of
numbers by column unit and safe cell text. Pure formatting, no computation."""

from __future__ import annotations

from typing import Any

import polars as pl


def fmt_ns(ns: float | int | None) -> str:
    """A duration in the most readable unit (ns/µs/ms/s)."""
    if ns is None:
        return "–"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:,.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:,.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:,.1f} µs"
    return f"{ns:,.0f} ns"


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "–"
    a = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if a >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def fmt_cell(column: str, value: Any) -> str:
    """Format one table cell using the unit in its column name (``_ns``, ``bytes``, ``pct``)."""
    if value is None:
        return "–"
    if isinstance(value, float) and value != value:
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if column.endswith("_ns"):
            return fmt_ns(value)
        if column == "bytes" or column.endswith("_bytes"):
            return fmt_bytes(value)
        if "pct" in column:
            return f"{value:.1f} %"
        if isinstance(value, float):
            return f"{value:,.3f}"
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def shorten(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def md_escape(text: str) -> str:
    """Make trace-provided text inert in Markdown table cells (pipes, HTML, backticks)."""
    return (
        text.replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("`", "\\`")
        .replace("\n", " ")
    )


def md_table(df: pl.DataFrame, max_rows: int = 15, width: int = 90) -> list[str]:
    """A GitHub/GitLab-flavoured Markdown table of the first ``max_rows`` rows."""
    cols = df.columns
    lines = ["| " + " | ".join(md_escape(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.head(max_rows).iter_rows(named=True):
        lines.append("| " + " | ".join(md_escape(shorten(fmt_cell(c, row[c]), width)) for c in cols) + " |")
    if df.height > max_rows:
        lines.append(f"\n_{df.height - max_rows:,} more rows in summary.json_")
    return lines
