"""Text helpers shared by the text renderers (Markdown, terminal): formatting of
numbers by column unit and safe cell text. Pure formatting, no computation."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

# Terminal escape sequences a trace could carry in a name (kernel names are free text):
# CSI (``ESC [ … final``: colours, cursor moves, screen clears), OSC (``ESC ] … BEL/ST``:
# window title, clipboard writes with ``52;``, hyperlinks), DCS/SOS/PM/APC string
# commands (``ESC P|X|^|_ … ST``), the 8-bit C1 forms of CSI/OSC/DCS, and the remaining
# two-byte ``ESC x`` sequences. An unterminated string command runs to the end of the
# text, as a terminal would read it.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# What is left after the sequences: C0/C1 controls (but tab and newline), DEL, and the
# Unicode bidirectional overrides/isolates that reorder how a line reads ("Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: str, keep_newlines: bool = True) -> str:
    """``text`` made safe to print in a terminal or write to a text report: terminal escape
    sequences (CSI, OSC, DCS, …) removed, other control characters and bidi overrides
    removed, tabs kept, newlines kept (``keep_newlines``) or turned into spaces.

    The one sanitiser of every text output (terminal summaries, error lines, report.md,
    compare's Markdown); HTML is escaped by its own renderers."""
    if not text or (text.isprintable() and text.isascii()):
        return text
    out = _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))
    return out if keep_newlines else out.replace("\n", " ")


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


_TS_SUFFIXES = ("ts_ns", "start_ns", "end_ns")
_TS_NAMES = {"first_ns", "last_ns", "t_ns", "time_ns"}


def is_timestamp_column(column: str) -> bool:
    """True for columns holding points in time (``ts_ns``, ``start_ns``, ``gpu_end_ns`` …)
    rather than durations: they are shown relative to the trace start."""
    return column.endswith(_TS_SUFFIXES) or column in _TS_NAMES


def fmt_offset(ns: float | int, t0: int) -> str:
    """A timestamp as an offset from the trace start ``t0``: ``+1,234.567 ms``."""
    d = ns - t0
    return ("+" if d >= 0 else "−") + f"{abs(d) / 1e6:,.3f} ms"


def fmt_cell(column: str, value: Any, t0: int | None = None) -> str:
    """Format one table cell using the unit in its column name (``_ns``, ``bytes``, ``pct``).

    With ``t0`` (the trace start, ns), timestamp columns are shown as offsets from it,
    which reads better than 19-digit epoch nanoseconds and does not vary between runs
    of the same workload.
    """
    if value is None:
        return "–"
    if isinstance(value, float) and value != value:
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if t0 is not None and is_timestamp_column(column):
            return fmt_offset(value, t0)
        tokens = column.split("_")
        if "ns" in tokens[1:]:  # dur_ns, gpu_ns_per_step
            return fmt_ns(value)
        if "bytes" in tokens:  # bytes, peak_bytes, bytes_per_step
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
    """Make trace-provided text inert in Markdown table cells (pipes, HTML, backticks,
    terminal escape sequences: :func:`clean_text`)."""
    return (
        clean_text(text, keep_newlines=False).replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("`", "\\`")
        .replace("\n", " ")
    )


def column_label(column: str) -> str:
    """A readable header for a column: units dropped (cells carry them), ``pct`` → ``%``."""
    c = column
    for suffix in ("_ns", "_bytes"):
        if c.endswith(suffix) and len(c) > len(suffix):
            c = c[: -len(suffix)]
    c = c.replace("pct_of_", "% of ").replace("_pct", " %").replace("pct_", "% ")
    return c.replace("_", " ")


def md_table(df: pl.DataFrame, max_rows: int = 15, width: int = 90, t0: int | None = None,
             columns: list[str] | None = None, more_note: bool = True) -> list[str]:
    """A GitHub/GitLab-flavoured Markdown table of the first ``max_rows`` rows
    (``columns``: the subset to show, in order; default all)."""
    cols = [c for c in columns if c in df.columns] if columns else df.columns
    lines = ["| " + " | ".join(md_escape(column_label(c)) for c in cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.head(max_rows).iter_rows(named=True):
        lines.append("| " + " | ".join(md_escape(shorten(fmt_cell(c, row[c], t0), width)) for c in cols) + " |")
    if more_note and df.height > max_rows:
        lines.append(f"\n_{df.height - max_rows:,} more rows in summary.json_")
    return lines
