"""The raw tables: what both decoders produce and the assembly consumes.

A raw table has the columns of :data:`_RAW_COLS` (``ts``/``dur`` still float µs, ids
typed), one frame per chunk; :class:`_Stats` carries what the event pass counted besides
rows. Also the value limits and scalar conversions the two decoders share, so that they
skip and convert the same events the same way.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from traceanalyzer.model.trace import SCHEMAS

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
# The largest |ts| and dur (µs) an event may have, and |baseTimeNanoseconds| (ns): with
# all three at their limits ``ts_ns + dur_ns`` (9e18) still fits int64 (9.22e18).
# 3e15 µs after the epoch is the year 2065; a value beyond it (1e308, 2**70, Infinity
# read by a lenient decoder) is damage: the event is skipped with a counted warning
# (the file is not refused: its other events are fine), and both decode paths agree.
MAX_ABS_US = 3e15
MAX_ABS_BASE_NS = 3_000_000_000_000_000_000


def _in_range(ts: float) -> bool:
    """|ts| ≤ MAX_ABS_US (False for NaN and ±inf)."""
    return -MAX_ABS_US <= ts <= MAX_ABS_US


# A numeric string, or the last space-separated word of one (``"stream 7"``): ASCII
# digits only (``str.isdigit`` also accepts ``"²"``, which ``int`` refuses).
_INT_STR = re.compile(r"(?s)(?:.* )?(-?[0-9]+)")


def _int(v: Any) -> int | None:
    """Best-effort int64 from a JSON scalar: ints, floats (truncated), numeric strings,
    and ``"stream 7"``-style legacy ids. Anything else, or outside int64, is None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if _I64_MIN <= v <= _I64_MAX else None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9.2e18 else None
    if isinstance(v, str):
        m = _INT_STR.fullmatch(v.strip())
        if m:
            n = int(m.group(1))
            return n if _I64_MIN <= n <= _I64_MAX else None
    return None


def _json_text(v: Any) -> str | None:
    return None if v is None else orjson.dumps(v).decode()


def _num(v: Any) -> int | None:
    """An int for a byte count or size that may be written as a float or string."""
    return _int(v)


_OUT_OF_RANGE_X = "duration events with ts or dur out of range (non-finite, or beyond 3e15 us)"
_OUT_OF_RANGE_FLOW = "flow events with ts out of range (non-finite, or beyond 3e15 us)"
_OUT_OF_RANGE_MEM = "[memory] events with ts out of range (non-finite, or beyond 3e15 us)"


_RAW_COLS: dict[str, list[str]] = {
    "cpu_ops": [
        "name", "ts", "dur", "pid", "tid", "cat", "external_id", "seq_num", "fwd_thread_id",
        "ev_idx", "input_dims", "input_types", "input_strides", "concrete_inputs", "comm_name", "comm_dtype",
        "comm_in_nelems", "comm_out_nelems", "comm_group_size", "comm_pg_name", "comm_pg_desc", "call_stack",
    ],
    "annotations": ["name", "ts", "dur", "pid", "tid", "external_id"],
    "python_frames": ["name", "ts", "dur", "pid", "tid", "python_id", "python_parent_id"],
    "runtime": ["name", "ts", "dur", "pid", "tid", "cat", "correlation", "external_id", "cbid"],
    "kernels": [
        "name", "ts", "dur", "device", "stream", "correlation", "external_id", "grid", "block",
        "registers_per_thread", "shared_memory", "queued_ns", "graph_id", "comm_name",
        "comm_dtype", "comm_in_nelems", "comm_group_size",
    ],
    # ``kind``: set by the loader where the event says it (MTIA ``args.direction``), else
    # parsed from the name by ``_memcpy_kinds``.
    "memcpy": ["name", "ts", "dur", "device", "stream", "correlation", "external_id", "bytes", "kind"],
    "memset": ["name", "ts", "dur", "device", "stream", "correlation", "external_id", "bytes"],
    "gpu_annotations": ["name", "ts", "dur", "device", "stream"],
    "flows": ["kind", "ph", "id", "ts", "pid", "tid"],
    "memory_events": [
        "ts", "pid", "tid", "device_type", "device_id", "addr", "bytes", "total_allocated",
        "total_reserved", "oom",
    ],
    "other_events": ["cat", "name", "ts", "dur", "pid", "tid", "args", "correlation", "wait_on_stream",
                     "wait_on_cuda_event_record_corr_id"],
    "threads": ["pid", "tid", "name"],
}


def _raw_schema(table: str) -> dict[str, Any]:
    """Column → dtype of a table before unit conversion: ``ts``/``dur`` are float µs."""
    schema = SCHEMAS[table]
    return {c: (pl.Float64 if c in ("ts", "dur") else schema[c]) for c in _RAW_COLS[table]}


_RAW_SCHEMAS = {t: _raw_schema(t) for t in _RAW_COLS}


def _raw_frame(table: str, rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    """Row tuples (columns ``_RAW_COLS[table]``) → a raw frame (µs floats, typed ids)."""
    return pl.DataFrame(rows, schema=_RAW_SCHEMAS[table], orient="row", strict=False)


@dataclass
class _Stats:
    """What the event pass counted besides rows: merged over chunks in file order."""

    skipped: Counter[str] = field(default_factory=Counter)
    unknown_cats: Counter[str] = field(default_factory=Counter)
    counters: int = 0
    n_events: int = 0
    no_ph_head: bool = False  # none of the first 100 items has a "ph" (bare arrays only)

    def merge(self, other: _Stats) -> None:
        self.skipped.update(other.skipped)
        self.unknown_cats.update(other.unknown_cats)
        self.counters += other.counters
        self.n_events += other.n_events
