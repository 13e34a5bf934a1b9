"""Text helpers shared by the text renderers (Markdown, terminal): sanitising of trace-provided
text, shortening, Markdown escaping and tables. Numbers are formatted by :mod:`traceanalyzer.units`."""

from __future__ import annotations

import re

import polars as pl

from traceanalyzer.units import fmt_cell

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
