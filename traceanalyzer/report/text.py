"""Text helpers shared by the text renderers (Markdown, terminal): sanitising of trace-provided
text, shortening, Markdown escaping and tables. Numbers are formatted by :mod:`traceanalyzer.units`."""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from traceanalyzer.units import fmt_cell, is_timestamp_column

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


# --- Markdown for tickets (report.md) ---------------------------------------------------------------------------
# report.md neither shortens nor escapes with entities or backslashes: trace-provided text that could be
# read as Markdown or HTML goes into a code span, where renderers (GitHub, GitLab, Jira) show it verbatim.

#: A word that can be read as markup: HTML tags/autolinks (``<`` then a letter, ``/``, ``!``, ``?``),
#: entities (``&amp;``), emphasis (``*``, ``_``, ``~``), links (``[``, ``]``), code (`````), math
#: (``$``) and backslash escapes.
_MD_ACTIVE = re.compile(r"<[A-Za-z/!?]|&#?\w+;|[*_~\[\]`$\\]")
#: Punctuation a word may carry around it that stays outside its code span (``(num_workers),``).
_MD_WORD = re.compile(r"^([(\"']*)(.*?)([)\"',.;:!?]*)$", re.S)


def md_code(text: str) -> str:
    """``text`` as one inline code span, verbatim: a fence of one backtick more than the longest
    run inside it, padded with spaces when the text starts or ends with a backtick. Control
    characters and newlines are removed (:func:`clean_text`)."""
    t = clean_text(text, keep_newlines=False)
    if not t:
        return ""
    longest = max((len(m) for m in re.findall(r"`+", t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or (t.startswith(" ") and t.endswith(" ")) else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def md_text(text: str) -> str:
    """Prose for report.md, whole and readable: words that could be read as Markdown or HTML
    (identifiers with ``_``, ``<tag>``, backticks …) become inline code, the rest stays plain.
    No entity (``&lt;``) and no backslash escape is ever written."""
    t = clean_text(text, keep_newlines=False)
    out = []
    for word in t.split(" "):
        if not _MD_ACTIVE.search(word):
            out.append(word)
            continue
        m = _MD_WORD.match(word)
        lead, core, tail = (m.group(1), m.group(2), m.group(3)) if m else ("", word, "")
        # a closing parenthesis or quote stays inside when the word opened it: `f('x')`, not `f('x`')
        while tail and ((tail[0] == ")" and core.count("(") > core.count(")"))
                        or (tail[0] in "'\"" and core.count(tail[0]) % 2 == 1)):
            core, tail = core + tail[0], tail[1:]
        if not core or _MD_ACTIVE.search(lead + tail):
            lead, core, tail = "", word, ""
        out.append(f"{lead}{md_code(core)}{tail}")
    return " ".join(out)


def md_cell(text: str, code: bool = False) -> str:
    """A Markdown table cell: :func:`md_text` (or, with ``code``, one code span); a ``|`` is
    written ``\\|``, the one escape GFM tables need (it is read before the cell's code span)."""
    return (md_code(text) if code else md_text(text)).replace("|", "\\|")


# --- Table columns: plain names, one unit per quantity ----------------------------------------------------------

#: Column names that are not words (``klass``: a Python keyword dodge).
_PLAIN_NAMES = {"klass": "class"}
#: The units of a table's durations and sizes: (name, scale, decimals), largest first.
_TIME_UNITS = (("s", 1e9, 3), ("ms", 1e6, 3), ("µs", 1e3, 1), ("ns", 1.0, 0))
_SIZE_UNITS = (("GiB", float(1 << 30), 2), ("MiB", float(1 << 20), 2), ("KiB", float(1 << 10), 2), ("B", 1.0, 0))


@dataclass(frozen=True)
class ColumnFormat:
    """How one column of a table reads: its header (with the unit the whole column is written
    in) and, for durations, sizes and timestamps, that unit's scale and decimals."""

    label: str
    quantity: str | None = None  # "time", "size", "timestamp" or None (counts, %, text: units.fmt_cell)
    scale: float = 1.0
    decimals: int = 0


def _quantity(column: str) -> str | None:
    if is_timestamp_column(column):
        return "timestamp"
    tokens = column.split("_")
    if "ns" in tokens[1:]:
        return "time"
    if "bytes" in tokens:
        return "size"
    return None


def _unit_for(values: list[float], units: tuple[tuple[str, float, int], ...]) -> tuple[str, float, int]:
    """The unit the median of the non-zero magnitudes reads best in (≥ 1 of it)."""
    mags = sorted(abs(v) for v in values if v)
    if not mags:
        return units[-1]
    median = mags[len(mags) // 2]
    return next((u for u in units if median >= u[1]), units[-1])


def table_formats(df: pl.DataFrame, t0: int | None = None) -> dict[str, ColumnFormat]:
    """Headers and units of a table: plain names (``klass`` → ``class``; a unit suffix dropped
    unless that would give two columns one name: ``step`` and ``step_ns`` read ``step`` and
    ``step time``), and **one unit per quantity**: every duration column in the unit its values'
    median reads best in (``ms``, ``µs`` …), every size column likewise (``MiB`` …), named in the
    header (``total (ms)``); timestamps relative to the trace start in ms when ``t0`` is given."""
    cols = df.columns
    numeric = {c for c, t in zip(cols, df.dtypes) if t.is_numeric()}
    q = {c: _quantity(c) if c in numeric else None for c in cols}
    per: dict[str, tuple[str, float, int]] = {}
    for kind, units in (("time", _TIME_UNITS), ("size", _SIZE_UNITS)):
        members = [c for c in cols if q[c] == kind]
        if members:
            # ``to_list`` and a Python filter: ``drop_nulls`` is a polars query per column, which
            # on report-sized tables costs more than the values themselves.
            values = [float(v) for c in members for v in df.get_column(c).to_list() if v is not None]
            per[kind] = _unit_for(values, units)
    base = {c: column_label(_PLAIN_NAMES.get(c, c)) for c in cols}
    counts: dict[str, int] = {}
    for b in base.values():
        counts[b] = counts.get(b, 0) + 1
    out: dict[str, ColumnFormat] = {}
    for c in cols:
        label = base[c]
        if counts[label] > 1 and q[c] in ("time", "size"):
            label += " time" if q[c] == "time" else " size"
        quantity = q[c]
        if quantity is not None and quantity in per:
            unit, scale, decimals = per[quantity]
            out[c] = ColumnFormat(f"{label} ({unit})", quantity, scale, decimals)
        elif quantity == "timestamp" and t0 is not None:
            out[c] = ColumnFormat(f"{label} (ms from trace start)", quantity, 1e6, 3)
        else:
            out[c] = ColumnFormat(label)
    return out


def fmt_column_value(fmt: ColumnFormat, column: str, value: object, t0: int | None = None) -> str:
    """One cell in its column's unit (:func:`table_formats`); other cells as :func:`fmt_cell`."""
    if fmt.quantity is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt_cell(column, value, t0)
    if value != value:  # NaN
        return fmt_cell(column, None)
    if fmt.quantity == "timestamp":
        if t0 is None:
            return fmt_cell(column, value, t0)
        d = (value - t0) / fmt.scale
        return ("+" if d >= 0 else "−") + f"{abs(d):,.{fmt.decimals}f}"
    return f"{value / fmt.scale:,.{fmt.decimals}f}"
