"""Unit formatting: durations, sizes, percentages, timestamps and the cost of a finding, as text.

The one place numbers become unit-bearing strings; analyses (``summary()`` lines), rules, the
renderers, compare and the terminal summaries all format through it. Pure formatting, no
computation and no imports from the rest of the package, so every layer may depend on it.
A missing value (``None``) is shown as :data:`MISSING`.
"""

from __future__ import annotations

import functools

#: How an absent number reads in every text output.
MISSING = "–"

_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def fmt_ns(ns: float | None) -> str:
    """A duration in nanoseconds in the most readable unit (ns/µs/ms/s), thousands grouped:
    ``1,234.567 ms``, ``12.3 µs``."""
    if ns is None:
        return MISSING
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:,.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:,.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:,.1f} µs"
    return f"{ns:,.0f} ns"


def fmt_ns_short(ns: float) -> str:
    """A duration in nanoseconds in few characters, for chart labels: ``1.23 ms``, ``456 µs``."""
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float | None) -> str:
    """A size in bytes in binary units (B/KiB/MiB/GiB), two decimals: ``1.50 GiB``."""
    if n is None:
        return MISSING
    a = abs(n)
    for unit, scale in _BYTE_UNITS:
        if a >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def fmt_bytes_short(n: float | None) -> str:
    """A size in bytes in few characters, for chart labels (``None`` reads as 0): ``1.5 GiB``."""
    x = float(n or 0)
    for unit, scale in _BYTE_UNITS:
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def fmt_pct(value: float | None, signed: bool = False) -> str:
    """A percentage with one decimal: ``12.3 %`` (``signed``: ``+12.3 %``, a change). The base
    of the percentage is named by the caller's label."""
    if value is None:
        return MISSING
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def fmt_offset(ns: float, t0: int) -> str:
    """A timestamp (ns) as an offset from the trace start ``t0``: ``+1,234.567 ms``."""
    d = ns - t0
    return ("+" if d >= 0 else "−") + f"{abs(d) / 1e6:,.3f} ms"


def fmt_cost(ms_per_step: float | None, pct_of_step: float | None = None, cost_bytes: float | None = None, *,
             unit: str = "ms/step", grouped: bool = True, missing: str = MISSING) -> str:
    """The cost of a finding as text: a time cost (ms of GPU time per step, two decimals, with
    its share of the median step when ``pct_of_step`` is given), else a memory cost
    (``cost_bytes``, :func:`fmt_bytes`), else ``missing``.

    ``unit`` follows the milliseconds (``ms`` where the column header already says "per step");
    ``grouped`` separates thousands (``1,234.56``); terminal lines print them ungrouped."""
    if ms_per_step is not None:
        text = f"{ms_per_step:,.2f} {unit}" if grouped else f"{ms_per_step:.2f} {unit}"
        if pct_of_step is not None:
            text += f" ({fmt_pct(pct_of_step)} of median step)"
        return text
    if cost_bytes is not None:
        return fmt_bytes(cost_bytes)
    return missing


def fmt_param(v: object) -> str:
    """A parameter value (threshold) as ``traceanalyzer rules`` and docs/rules.md show it:
    whole floats without ``.0``, sizes that are whole MiB also in MiB (``1048576 (1 MiB)``)."""
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    if isinstance(v, int) and v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v} ({v >> 20} MiB)"
    return str(v)


#: Column-name suffixes and names that hold points in time rather than durations.
_TS_SUFFIXES = ("ts_ns", "start_ns", "end_ns")
_TS_NAMES = {"first_ns", "last_ns", "t_ns", "time_ns"}


def is_timestamp_column(column: str) -> bool:
    """True for columns holding points in time (``ts_ns``, ``start_ns``, ``gpu_end_ns`` …)
    rather than durations: they are shown relative to the trace start."""
    return column.endswith(_TS_SUFFIXES) or column in _TS_NAMES


@functools.lru_cache(maxsize=4096)
def _column_unit(column: str) -> tuple[bool, str]:
    """(a timestamp column?, the unit its name gives: ``ns``, ``bytes``, ``pct`` or ""), once per name
    (a table formats each of its cells through :func:`fmt_cell`)."""
    tokens = column.split("_")
    if "ns" in tokens[1:]:  # dur_ns, gpu_ns_per_step
        unit = "ns"
    elif "bytes" in tokens:  # bytes, peak_bytes, bytes_per_step
        unit = "bytes"
    elif "pct" in column:
        unit = "pct"
    else:
        unit = ""
    return is_timestamp_column(column), unit


def fmt_cell(column: str, value: object, t0: int | None = None) -> str:
    """Format one table cell using the unit in its column name (``_ns``, ``bytes``, ``pct``).

    With ``t0`` (the trace start, ns), timestamp columns are shown as offsets from it,
    which reads better than 19-digit epoch nanoseconds and does not vary between runs
    of the same workload.
    """
    if value is None:
        return MISSING
    if isinstance(value, float) and value != value:
        return MISSING
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        timestamp, unit = _column_unit(column)
        if t0 is not None and timestamp:
            return fmt_offset(value, t0)
        if unit == "ns":
            return fmt_ns(value)
        if unit == "bytes":
            return fmt_bytes(value)
        if unit == "pct":
            return fmt_pct(value)
        if isinstance(value, float):
            return f"{value:,.3f}"
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


#: The word a device's name starts with, by the model's ``vendor`` (``TraceMeta.vendor``) or the
#: c10 device kind of a memory record (``cuda``, ``hip`` …): PyTorch calls AMD GPUs ``cuda`` too.
_DEVICE_WORDS = {"nvidia": "GPU", "amd": "GPU", "unknown": "GPU", "cuda": "GPU", "hip": "GPU",
                 "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU", "xla": "XLA", "mps": "MPS", "cpu": "CPU"}


def device_name(index: int | str | None, kind: str | None = None) -> str:
    """The one name of a device in every output: ``GPU 0`` (NVIDIA and AMD GPUs, and whatever
    is not known to be something else), ``XPU 0`` (Intel), ``MTIA 17``; ``CPU`` for host memory.

    ``kind`` is the trace's vendor (``nvidia``, ``amd``, ``xpu``, ``mtia``, ``cpu`` …) or a
    PyTorch device kind (``cuda``, ``hip``); a PyTorch device string as ``index``
    (``cuda:0``, ``hip:2``, ``cpu``) is read as kind and index. ``None`` as index reads ``?``.
    """
    if isinstance(index, str) and not index.lstrip("-").isdigit():
        kind, _, rest = index.partition(":")
        index = rest or None
        if kind == "cpu":
            return "CPU"
    word = _DEVICE_WORDS.get((kind or "").lower(), (kind or "GPU").upper())
    if word == "CPU" and index is None:
        return "CPU"
    return f"{word} {'?' if index is None else index}"
