"""torch.profiler / Kineto chrome-trace JSON → :class:`~traceanalyzer.model.TraceModel`.

Handles every layout from PyTorch 1.8 to today (see
``../shared/reference/TRACE_FORMAT_AND_RULES.md`` part B):

* JSON object with ``traceEvents`` (Kineto) or a bare event array (autograd exporter);
* capitalised legacy categories (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``,
  ``Memset``) and the modern ones; ``gpu_user_Annotation`` typo;
* flow names of every era (``async``/``launch``, ``async_cpu_to_gpu``/``async_gpu``,
  ``forward_backward``/``fwd_bwd``, ``ac2g``/``fwdbwd``);
* timestamps as integer absolute µs, fractional µs (ns resolution) relative to
  ``baseTimeNanoseconds``, or floats relative to the profiler start;
* string pids/tids (``"stream 7"``, ``"Spans"``, numeric strings);
* NVIDIA (cuda*/cu*), AMD ROCm (hip* under ``cuda_runtime``), Intel XPU
  (``xpu_runtime``/``xpu_driver``), MTIA runtimes.

Two paths give the same model (``tests/test_chunked_loader.py`` checks every table,
dtype, meta field and warning on every shared/sample trace and on hand-made edge
cases, with chunks down to one event).

* The simple path (:func:`load_chrome_trace_simple`, :func:`build_model`) reads the
  whole file, decodes it with orjson and sorts events into row tuples in a Python
  loop. It defines the semantics. Its memory is the decoded document: ~8× the file
  (426 MB for the 49 MB df_index_resolver trace, 1.5 GB for 198 MB), so a 2 GB trace
  needs ~16 GB.
* The chunked path (:func:`load_chrome_trace`, the default) streams the
  ``traceEvents`` array (gzip decompressed on the fly by
  :class:`~traceanalyzer.load.jsonio.ByteStream`, never whole) in chunks of
  ``CHUNK_BYTES`` cut at event boundaries. Each chunk becomes newline-delimited JSON
  that polars' reader (Rust) decodes into typed columns of only the fields the model
  needs, in two passes (events with ``args`` as text, then the ``args`` texts: the
  reader is 2–3× slower on a wide struct); polars expressions sort the rows into
  tables. No Python object per event. Two chunks are decoded at once where polars
  has two threads (:class:`_ChunkedLoader`: the reader keeps two cores busy, the rest
  of a chunk's work one), in chunks of ``PARALLEL_CHUNK_BYTES`` (2 MiB). Memory: the
  model's columns plus the chunks' transients, each ~15–35× the chunk (the reader's
  parse buffers, the NDJSON copies), plus the pages the allocator has not returned yet:
  one 4 MiB chunk at a time or two 2 MiB chunks peak alike (on the 54 MB trace, 8 MiB
  chunks peaked 80–140 MB higher at the same CPU time).

Measured (``scripts/bench.py``, docs/performance.md; df_index_resolver and its
replicas by ``scripts/make_big_trace.py``; 2 cores; peak RSS of the whole process,
interpreter and imports included; commit f6f6e35): ``load()`` of the 54 MB trace takes
0.91 s and peaks at 208 MB, where ``orjson.loads`` alone takes 0.61 s and 382 MB; the
198 MB 4x file loads at 1.11× the time of ``orjson.loads`` and 363 MB (orjson: 1,442
MB); the 2 GB 40x file in 32–35 s, with or without gzip, where the simple path would
need ~16 GB.

Exactness: the reader blurs some JSON types (it reads ``1.0`` into a string column as
"1", a string where a list is expected as the list's text, …), so each chunk is
screened for such values (``_SUSPECT_ARGS``…) and any chunk it cannot take exactly (odd
types, NaN/inf tokens, control characters, a non-object item, a backslash in
``args``…) is decoded by the simple path's per-event loop with the same repairs.
Known, accepted difference: an event object with a duplicate key (the reader keeps
the first value, orjson the last; RFC 8259 leaves it undefined). Damage in the
middle of a file (not a truncation) is refused by the chunked path with its byte
position, where the simple path recovers the events before it when the damage lies
within the last 64 events.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.jsonio import (
    ByteStream,
    Repaired,
    decode_repairing,
    describe_error,
    fix_tokens,
    parse_json,
    read_bytes,
    recover_members,
    repair_warnings,
    truncation_warning,
)
from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

if TYPE_CHECKING:
    import numpy as np

# Category → model table, for duration ("X") events.
CAT_TABLE: dict[str, str] = {
    "cpu_op": "cpu_ops",
    "Operator": "cpu_ops",
    "user_annotation": "annotations",
    "python_function": "python_frames",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    "kernel": "kernels",
    "Kernel": "kernels",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "gpu_user_annotation": "gpu_annotations",
    "gpu_user_Annotation": "gpu_annotations",
}
LEGACY_CATS = frozenset({"Operator", "Runtime", "Kernel", "Memcpy", "Memset"})

# Categories we know and deliberately keep aside in ``other_events`` without a
# warning: they carry no information the analyses use today.
KNOWN_OTHER_CATS = frozenset(
    {
        "Trace",
        "overhead",
        "cuda_sync",
        "cuda_event",
        "xpu_sync",
        "cuda_profiler_range",
        "mtia_ccp_events",
        "hpu_op",
        "glow_runtime",
        "collective_comm",
        "critical_path",
        "cpu_instant_event",
    }
)

# MTIA device events (``mtia_ccp_events``; pid = the device id, ``args.stream``): the
# category holds three kinds of record, told apart by name. ``dma_request`` is a DMA
# transfer (``args.size`` bytes, ``args.direction``) → memcpy. ``event_record`` and
# ``event_wait`` (a stream waiting on another stream's event) are markers, not work: a
# waiting stream is not busy, so they stay in ``other_events`` (the category is in
# KNOWN_OTHER_CATS: no warning). Every other name is processing-element execution
# (``pe_exe``, or the executable or op name: ``remote``, ``add-dtype_Float``,
# ``hccl::…``) → kernels.
MTIA_CCP_CAT = "mtia_ccp_events"
MTIA_DMA = "dma_request"
MTIA_NOT_BUSY = ("event_record", "event_wait")
# ``args.direction`` → the memcpy ``kind`` vocabulary (the CUDA spelling).
MTIA_DIRECTION: dict[str, str] = {
    "HOST_TO_DEVICE": "HtoD",
    "DEVICE_TO_HOST": "DtoH",
    "DEVICE_TO_DEVICE": "DtoD",
    "HOST_TO_HOST": "HtoH",
}

FLOW_KIND: dict[str, str] = {
    "ac2g": "ac2g",
    "async": "ac2g",
    "launch": "ac2g",
    "async_cpu_to_gpu": "ac2g",
    "async_gpu": "ac2g",
    "cpu_to_cuda": "ac2g",
    "fwdbwd": "fwdbwd",
    "forward_backward": "fwdbwd",
    "fwd_bwd": "fwdbwd",
}

_PROFILER_FLAGS = ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops")
_VERSION_KEYS = (
    "cupti_version",
    "cuda_runtime_version",
    "cuda_driver_version",
    "roctracer_version",
    "rocprofiler-sdk_version",
    "hip_runtime_version",
    "hip_driver_version",
    "pytorch_version",
    "torch_version",
)


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


class _Collector:
    """Sorts decoded events into per-table row lists, counting what it skips."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in SCHEMAS}
        self.skipped: Counter[str] = Counter()
        self.unknown_cats: Counter[str] = Counter()
        self.runtime_names: set[str] = set()
        self.counters = 0
        self.record_window_end = False

    def add(self, events: list[Any], autograd_array: bool) -> None:
        rows = self.rows
        cpu_ops = rows["cpu_ops"]
        annotations = rows["annotations"]
        pyframes = rows["python_frames"]
        runtime = rows["runtime"]
        kernels = rows["kernels"]
        memcpy = rows["memcpy"]
        memset = rows["memset"]
        gpu_ann = rows["gpu_annotations"]
        flows = rows["flows"]
        mem = rows["memory_events"]
        other = rows["other_events"]
        threads = rows["threads"]
        skipped = self.skipped
        for e in events:
            if not isinstance(e, dict):
                skipped["items that are not JSON objects"] += 1
                continue
            ph = e.get("ph")
            if ph == "X":
                ts = e.get("ts")
                dur = e.get("dur")
                name = e.get("name")
                if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                    skipped["duration events without a numeric ts"] += 1
                    continue
                if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur != dur:
                    skipped["duration events without dur"] += 1
                    continue
                if dur < 0:
                    skipped["duration events with negative dur"] += 1
                    continue
                if not (_in_range(ts) and dur <= MAX_ABS_US):
                    skipped[_OUT_OF_RANGE_X] += 1
                    continue
                if not isinstance(name, str):
                    name = "" if name is None else str(name)
                cat = e.get("cat")
                table = CAT_TABLE.get(cat) if isinstance(cat, str) else None
                if cat == MTIA_CCP_CAT:
                    table = "memcpy" if name == MTIA_DMA else None if name in MTIA_NOT_BUSY else "kernels"
                if table is None and autograd_array and cat is None:
                    table = "kernels" if str(e.get("pid", "")).startswith("CUDA") else "cpu_ops"
                    cat = "Kernel" if table == "kernels" else "Operator"
                a = e.get("args") or {}
                if not isinstance(a, dict):
                    a = {}
                pid = e.get("pid")
                tid = e.get("tid")
                if table == "cpu_ops":
                    cpu_ops.append(
                        (
                            name, ts, dur, _int(pid), _int(tid), cat,
                            _int(a.get("External id", a.get("external id"))),
                            _int(a.get("Sequence number")),
                            _int(a.get("Fwd thread id")),
                            _int(a.get("Ev Idx", a.get("Profiler Event Index"))),
                            _json_text(a.get("Input Dims")),
                            _json_text(a.get("Input type")),
                            a.get("Collective name"),
                            a.get("dtype") if "Collective name" in a else None,
                            _num(a.get("In msg nelems")),
                            _num(a.get("Out msg nelems")),
                            _num(a.get("Group size")),
                            a.get("Process Group Name"),
                            a.get("Process Group Description"),
                        )
                    )
                elif table == "python_frames":
                    pyframes.append(
                        (name, ts, dur, _int(pid), _int(tid), _int(a.get("Python id")), _int(a.get("Python parent id")))
                    )
                elif table == "runtime":
                    self.runtime_names.add(name)
                    runtime.append(
                        (
                            name, ts, dur, _int(pid), _int(tid), cat,
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _int(a.get("cbid", a.get("cid"))),
                        )
                    )
                elif table == "kernels":
                    kernels.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _json_text(a.get("grid")),
                            _json_text(a.get("block")),
                            _num(a.get("registers per thread")),
                            _num(a.get("shared memory")),
                            _num(a.get("queued")),
                            _int(a.get("graph id")),
                            a.get("Collective name"),
                            a.get("dtype") if "Collective name" in a else None,
                            _num(a.get("In msg nelems")),
                            _num(a.get("Group size")),
                        )
                    )
                elif table == "memcpy":
                    kind = None
                    if cat == MTIA_CCP_CAT:
                        d = a.get("direction")
                        kind = MTIA_DIRECTION.get(d) if isinstance(d, str) else None
                    memcpy.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _num(a.get("size") if cat == MTIA_CCP_CAT else a.get("bytes")),
                            kind,
                        )
                    )
                elif table == "memset":
                    memset.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _num(a.get("bytes")),
                        )
                    )
                elif table == "annotations":
                    annotations.append(
                        (name, ts, dur, _int(pid), _int(tid), _int(a.get("External id", a.get("external id"))))
                    )
                elif table == "gpu_annotations":
                    gpu_ann.append((name, ts, dur, _int(a.get("device", pid)), _int(a.get("stream", tid))))
                else:
                    scat = str(cat) if cat is not None else "<no category>"
                    if scat not in KNOWN_OTHER_CATS:
                        self.unknown_cats[scat] += 1
                    other.append((scat, name, ts, dur, str(pid), str(tid)))
            elif ph in ("s", "f", "t"):
                cat = e.get("cat")
                kind = FLOW_KIND.get(cat) if isinstance(cat, str) else None
                if kind is None:
                    kind = str(cat)
                ts = e.get("ts")
                if not isinstance(ts, (int, float)):
                    skipped["flow events without a numeric ts"] += 1
                    continue
                if not _in_range(ts):
                    skipped[_OUT_OF_RANGE_FLOW] += 1
                    continue
                flows.append((kind, ph, _int(e.get("id")), ts, _int(e.get("pid")), _int(e.get("tid"))))
            elif ph == "i" or ph == "I":
                name = e.get("name")
                if name == "[memory]" or name == "[OutOfMemory]":
                    a = e.get("args") or {}
                    ts = e.get("ts")
                    if not isinstance(ts, (int, float)) or not isinstance(a, dict):
                        skipped["[memory] events without ts or args"] += 1
                        continue
                    if not _in_range(ts):
                        skipped[_OUT_OF_RANGE_MEM] += 1
                        continue
                    mem.append(
                        (
                            ts, _int(e.get("pid")), _int(e.get("tid")),
                            _int(a.get("Device Type")), _int(a.get("Device Id")),
                            _int(a.get("Addr")), _int(a.get("Bytes")),
                            _int(a.get("Total Allocated")), _int(a.get("Total Reserved")),
                            name == "[OutOfMemory]",
                        )
                    )
                elif name == "Record Window End":
                    self.record_window_end = True
            elif ph == "M":
                if e.get("name") == "thread_name":
                    a = e.get("args") or {}
                    tname = a.get("name") if isinstance(a, dict) else None
                    threads.append((_int(e.get("pid")), _int(e.get("tid")), str(tname)))
            elif ph == "C":
                self.counters += 1
            elif ph is None:
                skipped["events without a phase (ph)"] += 1
            # Other phases (B/E pairs, async b/e, etc.) are not emitted by torch.profiler.
            else:
                skipped[f"events of phase {ph!r}"] += 1


def _to_ns(col: str, base_ns: int) -> pl.Expr:
    """µs (int or float) → int64 ns without losing ns digits on large absolute values.

    Absolute integer µs (~1.6e15) are exact in float64 but ×1000 is not, so the whole
    and fractional parts are converted separately.
    """
    c = pl.col(col).cast(pl.Float64)
    whole = c.floor()
    return (whole.cast(pl.Int64) * 1000 + ((c - whole) * 1000).round().cast(pl.Int64) + base_ns).alias(col)


_RAW_COLS: dict[str, list[str]] = {
    "cpu_ops": [
        "name", "ts", "dur", "pid", "tid", "cat", "external_id", "seq_num", "fwd_thread_id",
        "ev_idx", "input_dims", "input_types", "comm_name", "comm_dtype", "comm_in_nelems",
        "comm_out_nelems", "comm_group_size", "comm_pg_name", "comm_pg_desc",
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
    "other_events": ["cat", "name", "ts", "dur", "pid", "tid"],
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


def _finish(table: str, frames: list[pl.DataFrame], base_ns: int) -> pl.DataFrame:
    """Concatenate a table's raw frames and convert it to the model schema."""
    schema = SCHEMAS[table]
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_table(table)
    df = pl.concat(frames, how="vertical", rechunk=False) if len(frames) > 1 else frames[0]
    raw_cols = _RAW_COLS[table]
    exprs: list[pl.Expr] = []
    if "ts" in raw_cols:
        exprs.append(_to_ns("ts", base_ns).alias("ts_ns"))
    if "dur" in raw_cols:
        exprs.append((pl.col("dur").cast(pl.Float64) * 1000).round().cast(pl.Int64).alias("dur_ns"))
    df = df.with_columns(exprs).drop([c for c in ("ts", "dur") if c in raw_cols])
    if "end_ns" in schema:
        df = df.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    return df.select(
        [pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in schema.items()]
    ).rechunk()


# XPU PTI memcpy kinds: M = user ("Memory", pageable host), H = USM host (pinned),
# D = device, S = shared. Normalised to the CUDA vocabulary.
_XPU_KIND = {
    "M2D": "HtoD", "H2D": "HtoD", "S2D": "HtoD",
    "D2M": "DtoH", "D2H": "DtoH", "D2S": "DtoH",
    "D2D": "DtoD", "M2M": "HtoH", "H2H": "HtoH", "M2H": "HtoH", "H2M": "HtoH",
    "P2P": "PtoP",
}


def _memcpy_kinds(df: pl.DataFrame) -> pl.DataFrame:
    """Parse ``Memcpy <kind> (<src> -> <dst>)`` into kind/src/dst columns (a kind the
    loader already set, MTIA's DMA direction, is kept)."""
    if df.is_empty():
        return df
    parsed = df.select(
        pl.col("name").str.extract(r"Memcpy\s+(\w+)", 1).alias("k"),
        "kind",
        pl.col("name").str.extract(r"\((\w+)\s*->", 1).alias("src_"),
        pl.col("name").str.extract(r"->\s*(\w+)\)", 1).alias("dst_"),
    )
    kind = pl.coalesce(pl.col("kind"), pl.col("k").replace(_XPU_KIND)).fill_null("unknown")
    # XPU "Memory" is user-allocated host memory: pageable in CUDA terms.
    src = pl.col("src_").replace({"Memory": "Pageable"})
    dst = pl.col("dst_").replace({"Memory": "Pageable"})
    return df.with_columns(parsed.select(kind.alias("kind"), src.alias("src"), dst.alias("dst")))


def _steps(annotations: pl.DataFrame, cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """CPU-side ``ProfilerStep#N`` ranges, one row per step number.

    PyTorch 1.8/1.9 recorded the step as an ``Operator``; later as a user annotation.
    The GPU-side ``gpu_user_annotation`` copy is a projection, never a step. If a
    step number appears twice (nested or repeated schedules), the longest wins.
    """
    cols = ["name", "ts_ns", "dur_ns", "end_ns", "pid", "tid"]
    cand = pl.concat([annotations.select(cols), cpu_ops.select(cols)]).filter(
        pl.col("name").str.starts_with("ProfilerStep#")
    )
    if cand.is_empty():
        return empty_table("steps")
    return (
        cand.with_columns(step=pl.col("name").str.extract(r"^ProfilerStep#(\d+)$", 1).cast(pl.Int64))
        .drop_nulls("step")
        .sort("dur_ns", descending=True)
        .unique("step", keep="first")
        .sort("ts_ns")
        .select(list(SCHEMAS["steps"]))
    )


def _vendor(
    device_props: tuple[dict[str, Any], ...],
    top: dict[str, Any],
    runtime_names: set[str],
    runtime_cats: set[str],
    has_gpu: bool,
) -> str:
    if "xpu_runtime" in runtime_cats or "xpu_driver" in runtime_cats:
        return "xpu"
    if "mtia_runtime" in runtime_cats:
        return "mtia"
    if any(k in top for k in ("roctracer_version", "hip_runtime_version", "rocprofiler-sdk_version")):
        return "amd"
    if any(n.startswith("hip") for n in runtime_names):
        return "amd"
    if any(k in top for k in ("cupti_version", "cuda_runtime_version")):
        return "nvidia"
    if any(n.startswith(("cuda", "cu")) for n in runtime_names):
        return "nvidia"
    for p in device_props:
        if p.get("warpSize") == 64:
            return "amd"
        if p.get("warpSize") == 32:
            return "nvidia"
    if not has_gpu and not runtime_names:
        return "cpu"
    return "unknown"


def _flag(v: Any) -> bool:
    return v not in (None, 0, False, "0", "false", "False", "")


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


def _collect_events(events: list[Any], autograd_array: bool) -> tuple[dict[str, pl.DataFrame], _Stats]:
    """The simple (reference) event pass: a Python loop over decoded events."""
    col = _Collector()
    col.add(events, autograd_array)
    frames = {t: _raw_frame(t, col.rows[t]) for t in _RAW_COLS}
    stats = _Stats(col.skipped, col.unknown_cats, col.counters, len(events))
    stats.no_ph_head = not any(isinstance(e, dict) and "ph" in e for e in events[:100])
    return frames, stats


def load_chrome_trace(path: str | Path) -> TraceModel:
    """Load one chrome-trace file (``.json``, ``.json.gz``, any supported layout).

    Streams the ``traceEvents`` array in chunks (the chunked path, see the module
    docstring and this module's lower half): memory holds one chunk of text plus the
    model's columns, never the whole decoded document. Files whose framing is unusual (no
    ``traceEvents`` near the top, a byte-order mark, not an object or array) go
    through :func:`load_chrome_trace_simple`, which gives the same model.

    Raises :class:`InputError` with a one-line reason when the file is not a usable
    trace; recoverable damage becomes ``TraceModel.warnings``.
    """
    p = Path(path)
    try:
        return _ChunkedLoader(p).load()
    except _Unframed:
        return load_chrome_trace_simple(p)


def load_chrome_trace_simple(path: str | Path) -> TraceModel:
    """The simple path: read the whole file, decode it, one Python loop over events.

    The reference semantics of the loader (the chunked path must give the same
    model); also the path for files the chunked reader cannot frame.
    """
    p = Path(path)
    data, warnings = read_bytes(p)
    parsed = parse_json(p, data)
    del data
    warnings.extend(parsed.warnings)
    return build_model(p, parsed.doc, warnings)


def build_model(path: Path, doc: Any, warnings: list[str] | None = None) -> TraceModel:
    """Build the model from an already-decoded document (dict or bare array)."""
    autograd_array = False
    if isinstance(doc, list):
        events = doc
        top: dict[str, Any] = {}
        autograd_array = True
        if events and not any(isinstance(e, dict) and "ph" in e for e in events[:100]):
            raise InputError(path, "a JSON array whose items are not trace events (no 'ph' fields)")
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            _refuse_object(path, doc)
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise InputError(path, "not a chrome trace: 'traceEvents' is not an array")
        top = {k: v for k, v in doc.items() if k != "traceEvents"}
    else:
        raise InputError(path, f"not a chrome trace: top-level JSON {type(doc).__name__}")
    frames, stats = _collect_events(events, autograd_array)
    del events
    return _assemble(path, top, autograd_array, {t: [f] for t, f in frames.items()}, stats, list(warnings or []))


def _reconstruct_memory_totals(mem: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """Fill ``total_allocated`` where the profiler did not write it.

    Profilers of 2021 (torch ≤ 1.9) wrote ``[memory]`` events with only ``Bytes`` (the
    signed change) and ``Addr``: no ``Total Allocated``/``Total Reserved``. For each
    device (``device_type``, ``device_id``) whose events carry no total at all, the
    total allocated after each event is rebuilt as the running sum of ``Bytes`` in time
    order (ties in file order), raised by the deepest deficit so it never goes below 0
    (memory allocated before profiling started and freed during it). It is therefore
    a lower bound: what was allocated before profiling and still held is not seen.
    ``total_reserved`` stays null (the caching allocator's cache is not in the events).
    Devices with recorded totals are untouched. Both decode paths share this step.
    """
    if mem.is_empty() or mem["total_allocated"].null_count() == 0:
        return mem, None
    key = ["device_type", "device_id"]
    mem = mem.with_row_index("_row")
    plain = pl.col("total_allocated").is_null().all().over(key)
    run = pl.when(pl.col("oom")).then(0).otherwise(pl.col("bytes").fill_null(0)).cum_sum().over(
        key, order_by=["ts_ns", "_row"])
    rebuilt = mem.with_columns(_plain=plain, _run=run).with_columns(
        _run=pl.col("_run") - pl.min_horizontal(pl.col("_run").min().over(key), pl.lit(0)))
    devs = rebuilt.filter(pl.col("_plain")).select(key).unique().sort(key).height
    if devs == 0:
        return mem.drop("_row"), None
    out = rebuilt.with_columns(
        total_allocated=pl.when(pl.col("_plain") & ~pl.col("oom")).then(pl.col("_run"))
        .otherwise(pl.col("total_allocated")).cast(pl.Int64)
    ).drop("_row", "_plain", "_run")
    return out, (f"[memory] events of {devs} device(s) carry only 'Bytes' (profiler of torch <= 1.9): total "
                 "allocated reconstructed as the running sum of Bytes from the profiler's start (a lower bound: "
                 "memory held before profiling is not seen); total reserved unknown")


def _refuse_object(path: Path, doc: dict[str, Any]) -> None:
    if "nodes" in doc and "schema" in doc:
        raise InputError(path, "is a PyTorch Execution Trace (nodes/schema), not a torch.profiler chrome trace")
    if "segments" in doc or "device_traces" in doc:
        raise InputError(path, "is a memory snapshot in JSON form, not a chrome trace")
    keys = ", ".join(list(doc)[:6]) or "none"
    raise InputError(path, f"not a chrome trace: JSON object without 'traceEvents' (keys: {keys})")


def _assemble(
    path: Path,
    top: dict[str, Any],
    autograd_array: bool,
    frames: dict[str, list[pl.DataFrame]],
    stats: _Stats,
    warnings: list[str],
) -> TraceModel:
    """Raw per-chunk frames + top-level metadata → the model (shared by both paths)."""
    n_events = stats.n_events
    base_ns = _int(top.get("baseTimeNanoseconds")) or 0
    if abs(base_ns) > MAX_ABS_BASE_NS:
        warnings.append(f"ignored baseTimeNanoseconds {base_ns:,}: out of range (beyond 3e18 ns)")
        base_ns = 0
    tables: dict[str, pl.DataFrame] = {}
    for table in _RAW_COLS:
        tables[table] = _finish(table, frames.pop(table, []), base_ns)
    tables["memcpy"] = _memcpy_kinds(tables["memcpy"])
    tables["threads"] = tables["threads"].unique(maintain_order=True)
    tables["steps"] = _steps(tables["annotations"], tables["cpu_ops"])
    tables["memory_events"], note = _reconstruct_memory_totals(tables["memory_events"])
    if note:
        warnings.append(note)

    for what, n in sorted(stats.skipped.items()):
        warnings.append(f"skipped {n:,} {what}")
    if stats.unknown_cats:
        cats = ", ".join(f"{c} ({n:,})" for c, n in stats.unknown_cats.most_common(8))
        warnings.append(f"kept aside {sum(stats.unknown_cats.values()):,} events of unrecognised categories: {cats}")
    if stats.counters:
        warnings.append(f"ignored {stats.counters:,} counter ('C') events (GPU metrics / hardware counters)")
    interesting = sum(
        tables[t].height for t in ("cpu_ops", "annotations", "python_frames", "runtime", "kernels", "memcpy", "memset")
    )
    if n_events and interesting == 0 and tables["memory_events"].is_empty():
        raise InputError(path, f"no usable events: none of the {n_events:,} events is a profiler op, call or kernel")
    if not n_events:
        raise InputError(path, "trace has no events ('traceEvents' is empty)")

    # Trace span over every duration event.
    starts = [tables[t]["ts_ns"].min() for t in _RAW_COLS if "dur" in _RAW_COLS[t] and tables[t].height]
    ends = [tables[t]["end_ns"].max() for t in _RAW_COLS if "dur" in _RAW_COLS[t] and tables[t].height]
    if tables["memory_events"].height:
        starts.append(tables["memory_events"]["ts_ns"].min())
        ends.append(tables["memory_events"]["ts_ns"].max())
    span_start = int(min(s for s in starts if s is not None))  # type: ignore[type-var]
    span_end = int(max(e for e in ends if e is not None))  # type: ignore[type-var]

    dev_props_raw = top.get("deviceProperties") or top.get("computeProperties") or []
    device_props = tuple(d for d in dev_props_raw if isinstance(d, dict)) if isinstance(dev_props_raw, list) else ()
    dist = top.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else None
    rank = _int(dist.get("rank")) if dist else None
    world = _int(dist.get("world_size")) if dist else None
    runtime_cats = set(tables["runtime"]["cat"].unique().to_list()) if tables["runtime"].height else set()
    runtime_names = set(tables["runtime"]["name"].unique().to_list()) if tables["runtime"].height else set()
    has_gpu = tables["kernels"].height + tables["memcpy"].height + tables["memset"].height > 0
    cats_seen = set(tables["cpu_ops"]["cat"].unique().to_list()) | runtime_cats
    if autograd_array:
        layout = "autograd-array"
    elif cats_seen & LEGACY_CATS:
        layout = "kineto-legacy"
    else:
        layout = "kineto"
    skip_keys = {"deviceProperties", "computeProperties", "distributedInfo", "traceName", "schemaVersion",
                 "displayTimeUnit", "baseTimeNanoseconds", *_PROFILER_FLAGS, *_VERSION_KEYS}
    extra = {k: v for k, v in top.items() if k not in skip_keys and isinstance(v, (str, int, float, bool))}
    meta = TraceMeta(
        path=str(path),
        layout=layout,
        schema_version=_int(top.get("schemaVersion")),
        base_time_ns=base_ns,
        display_time_unit=top.get("displayTimeUnit") if isinstance(top.get("displayTimeUnit"), str) else None,
        device_properties=device_props,
        distributed_info=dist,
        rank=rank,
        world_size=world,
        profiler_flags={k: _flag(top.get(k)) for k in _PROFILER_FLAGS if k in top},
        versions={k: str(top[k]) for k in _VERSION_KEYS if k in top},
        vendor=_vendor(device_props, top, runtime_names, runtime_cats, has_gpu),
        span_start_ns=span_start,
        span_end_ns=span_end,
        trace_name=top.get("traceName") if isinstance(top.get("traceName"), str) else None,
        extra=extra,
    )
    return TraceModel(meta=meta, warnings=tuple(warnings), **tables)


# ---------------------------------------------------------------------------
# The chunked path
#
# The ``traceEvents`` array is cut into chunks of about ``CHUNK_BYTES`` at event
# boundaries, as the bytes stream in (gzip included). Each chunk becomes
# newline-delimited JSON (one event a line) and polars' own JSON reader (Rust,
# multi-threaded) decodes it straight into typed columns of only the fields the
# model needs; polars expressions then sort the rows into tables. No Python object
# per event is created.
#
# Exactness: the reader is strict about types (an int column refuses a float or a
# string), so any chunk it cannot take exactly (odd types, bad tokens, control
# characters, a non-object item …) is decoded again by the simple path's per-event
# loop, with the same repairs. A cut is only a *candidate* boundary (a separator
# found by ``rfind``): a chunk that decodes is proof that it was right; one that does
# not is re-framed exactly by a string-aware bracket scan (numpy) before the slow
# path takes it. The end of the file (array end, keys after the array, truncation)
# always goes through the exact scan, on a small piece.
# ---------------------------------------------------------------------------

CHUNK_BYTES = 4 << 20
# Regions when two are decoded at once (see _ChunkedLoader): the same peak as one region
# of CHUNK_BYTES at a time.
PARALLEL_CHUNK_BYTES = 2 << 20

# LF/CR → TAB: both are whitespace between tokens, so the text keeps its meaning, and
# a raw LF inside a string (not strict JSON) becomes a raw TAB, which the strict
# reader refuses: that chunk then takes the slow path and gets the simple path's
# "not strict JSON" treatment.
_NL_TO_TAB = bytes.maketrans(b"\n\r", b"\t\t")
_WS = b" \t\r\n"

# JSON strings (skipped whole), brackets, and a string the buffer cuts off (a lone
# ``"``: everything after it is inside that string).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]|"', re.S)
_OPEN = frozenset(b"[{")

# args fields read as integers (``_int``/``_num`` in the simple path).
_INT_ARGS = (
    "External id", "external id", "Sequence number", "Fwd thread id", "Ev Idx", "Profiler Event Index",
    "In msg nelems", "Out msg nelems", "Group size", "Python id", "Python parent id", "correlation",
    "cbid", "cid", "device", "stream", "registers per thread", "shared memory", "queued", "graph id",
    "bytes", "Device Type", "Device Id", "Addr", "Bytes", "Total Allocated", "Total Reserved", "size",
)
# ``direction`` (MTIA DMA) is only looked up in MTIA_DIRECTION: a non-string value that
# the reader turns into text matches no key, as in the simple path, so it needs no screen.
_STR_ARGS = ("Collective name", "dtype", "name", "Process Group Name", "Process Group Description", "direction")
_DIMS_ARGS = ("Input Dims", "grid", "block")  # JSON text; lists of ints
_ARG_NAMES = (*_INT_ARGS, *_STR_ARGS, *_DIMS_ARGS, "Input type")
_INT_TEXT = r"(?s)^(?:.* )?(-?[0-9]+)$"  # ``_int`` on a string: the number, or the last word's
_FLOAT_TEXT = r"^-?(?:[0-9]+\.[0-9]*|\.[0-9]+)$"
_DIMS_TEXT = r"^[\[\]0-9, \-]*$"
_KNOWN_PH = ("X", "s", "f", "t", "i", "I", "M", "C")
_COLON = re.compile(rb"\s*:\s*")
_COMMA = re.compile(rb"\s*,?")
_SEP = re.compile(rb"\}\s*,\s*\{")
# Values the reader would turn into the same text as a different JSON value, so that
# the simple path's result depends on a type the columnar frame no longer knows:
# a non-string where a string is read (``1.0`` → "1" where ``str`` gives "1.0",
# ``true`` → "true" where ``str`` gives "True"), a string where a list of ints is read
# (``"[1,1,1]"`` is text, ``_json_text`` quotes it), a float in a list of ints
# (``[1.0]`` → "[1]"), a non-string in "Input type", a string ``args`` (its text could
# read as an object). Any match sends the chunk to the slow path; a false match (the
# pattern inside a string) costs only speed. The patterns run as one alternation in
# polars' (Rust) regex engine over the chunk's text: its literal prefilter and DFA
# scan ~1 GB/s with no per-match cost, where Python's ``re`` took 7 scans (one per
# key, each ~25 ms per 54 MB) and ~140 ms for the pid/tid pattern that starts at
# every event. ``\s`` is Unicode-aware there, which only matters outside JSON's own
# whitespace, where the reader refuses the chunk anyway.
_SUSPECT_ARGS = (
    # A string args: its text (unescaped) could read as an object.
    r'"args"\s*:\s*"',
    r'"Collective name"\s*:\s*[^"n\s]',
    r'"dtype"\s*:\s*[^"n\s]',
    r'"Process Group (?:Name|Description)"\s*:\s*[^"n\s]',
    r'"grid"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"block"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"Input Dims"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"Input type"\s*:\s*(?:[^\[n\s]|\[(?:\s*"(?:[^"\\]|\\.)*"\s*,)*\s*[^"\s\]])',
)
# Keys in every event: their columns are screened first (a value that *could* have
# been a non-string: starts with a digit, ``-``, ``[``, ``{``, or is true/false), and
# only a chunk the screen flags pays for the raw scan.
_SUSPECT_TOP = (
    r'"name"\s*:\s*[^"n\s]',
    r'"cat"\s*:\s*[^"n\s]',
    r'"ph"\s*:\s*[^"n\s]',
)
# A float or non-scalar pid/tid: ``other_events`` keeps ``str(pid)`` ("1.0", "True"),
# which the reader's text ("1", "true") does not give back (elsewhere ``_int`` reads
# "1" and 1.0 alike, but the screen does not tell the rows apart: see _fast_chunk).
_SUSPECT_IDS = (
    r'"pid"\s*:\s*(?:[^"n\s0-9-]|-?[0-9]+[.eE])',
    r'"tid"\s*:\s*(?:[^"n\s0-9-]|-?[0-9]+[.eE])',
)


def _any_of(patterns: tuple[str, ...]) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


_RX_ARGS_IDS = _any_of(_SUSPECT_ARGS + _SUSPECT_IDS)
_RX_TOP = _any_of(_SUSPECT_TOP)
_NON_STRING_TEXT = r"^(?:[-0-9\[{]|true$|false$)"


class _Unframed(Exception):
    """The chunked reader cannot frame this file: the simple path takes it."""


class _NotFast(Exception):
    """A chunk the columnar reader cannot take exactly."""


def _args_schema(ints_as_text: bool) -> dict[str, Any]:
    it: Any = pl.String if ints_as_text else pl.Int64
    args: dict[str, Any] = {k: it for k in _INT_ARGS}
    args.update({k: pl.String for k in (*_STR_ARGS, *_DIMS_ARGS)})
    args["Input type"] = pl.List(pl.String)
    return args


def _nd_schema(args: Any) -> dict[str, Any]:
    return {
        "ph": pl.String, "cat": pl.String, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
        "pid": pl.String, "tid": pl.String, "id": pl.String, "args": args,
    }


_ARGS_SCHEMAS = (_args_schema(False), _args_schema(True))
# One pass: ``args`` as a struct of the fields the model reads.
_ND_SCHEMAS = tuple(_nd_schema(pl.Struct(a)) for a in _ARGS_SCHEMAS)
# Two passes: ``args`` as the reader's JSON text, then those texts as NDJSON of their own.
_ND_TOP_SCHEMA = _nd_schema(pl.String)
_ARG_COLS = ["a." + k for k in _ARG_NAMES]


def _int_text(e: pl.Expr) -> pl.Expr:
    """``_int`` of a value the reader gave as text (a JSON number or string)."""
    return e.str.strip_chars().str.extract(_INT_TEXT, 1).cast(pl.Int64, strict=False)


def _int_column(s: pl.Series) -> pl.Series:
    """``_int_text`` of a column: a plain cast, and the regex only on the rows the cast
    does not take (the common case has none: 10× faster than the regex on all rows).
    ``cast`` alone would also read ``"+7"`` (``_int`` gives None) and refuses
    ``"stream 7"``. A fractional number as text could have been a JSON float (``_int``
    truncates it) or a string (``_int`` gives None): only the slow path can tell, and
    such text never casts, so only those rows need the check."""
    c = s.cast(pl.Int64, strict=False)
    odd = (c.is_null() & s.is_not_null()) | s.str.starts_with("+")
    if not odd.any():
        return c
    idx = odd.arg_true()
    rows = s.gather(idx)
    if rows.str.strip_chars().str.contains(_FLOAT_TEXT).any():
        raise _NotFast("fractional number as an id")
    fixed = rows.to_frame().select(_int_text(pl.col(s.name))).to_series()
    return c.scatter(idx, fixed)


def _matches(nd: bytes, pattern: str) -> bool:
    """Whether ``pattern`` occurs in the chunk's text (invalid UTF-8: the slow path words
    it, as the reader would refuse the chunk anyway)."""
    try:
        text = pl.Series([nd]).cast(pl.String)
    except Exception:  # noqa: BLE001
        raise _NotFast("not UTF-8") from None
    return bool(text.str.contains(pattern).item())


def _A(k: str) -> pl.Expr:
    return pl.col("a." + k)


def _fast_chunk(nd: bytes, autograd_array: bool) -> tuple[dict[str, pl.DataFrame], _Stats]:
    """Newline-delimited events → raw table frames and counts, or :class:`_NotFast`."""
    # Screened before the read (scanned after it, with the frames alive, the same
    # chunk peaked ~60 MB higher at 8 MiB). The pid/tid patterns matter only for
    # other_events rows, but a float pid is rare enough that it may cost the chunk
    # the slow path wherever it occurs.
    if _matches(nd, _RX_ARGS_IDS):
        raise _NotFast("a value of a type the reader would blur")
    df, ints_as_text = _read_two_passes(nd)
    try:
        return _fast_tables(df, ints_as_text, autograd_array)
    except _NotFast:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _NotFast(str(exc)) from None


def _read_one_pass(nd: bytes) -> tuple[pl.DataFrame, bool]:
    """The events with ``args`` read as a struct, flattened to ``a.<key>`` columns."""
    for ints_as_text, schema in enumerate(_ND_SCHEMAS):
        try:
            df = pl.read_ndjson(nd, schema=schema)
        except Exception:  # noqa: BLE001 - any refusal sends the chunk to the slow path
            continue
        return df.with_columns(pl.col("args").struct.rename_fields(_ARG_COLS)).unnest("args"), bool(ints_as_text)
    raise _NotFast("reader refused the chunk")


def _read_two_passes(nd: bytes) -> tuple[pl.DataFrame, bool]:
    r"""As :func:`_read_one_pass`, 2–3× faster: the reader looks each struct field up
    in every object (cost ∝ fields × keys), but reads a flat row quickly, so ``args``
    is first read as text (the reader re-serialises the object) and those texts are
    then read as NDJSON rows of their own. The re-serialisation does not escape
    backslashes or control characters, so a chunk whose ``args`` text has a ``\``
    takes one pass."""
    try:
        top = pl.read_ndjson(nd, schema=_ND_TOP_SCHEMA)
    except Exception:  # noqa: BLE001
        raise _NotFast("reader refused the chunk") from None
    args = top.get_column("args")
    if args.str.contains("\\", literal=True).any():
        del top, args
        return _read_one_pass(nd)
    name = pl.col("name")
    flagged = top.select(
        (name.str.contains(_NON_STRING_TEXT) & ~name.is_in(["[memory]", "[OutOfMemory]"])).any()
        | pl.col("cat").str.contains(_NON_STRING_TEXT).any()
        | pl.col("ph").str.contains(_NON_STRING_TEXT).any()
    ).item()
    if flagged and _matches(nd, _RX_TOP):
        raise _NotFast("a value of a type the reader would blur")
    # Non-object args (null, a list, a number) read as {} in the simple path too.
    lines = pl.when(pl.col("args").str.starts_with("{")).then(pl.col("args")).otherwise(pl.lit("{}"))
    nd2 = top.select(lines.str.join("\n")).item().encode()
    top = top.drop("args")
    del args
    for ints_as_text, schema in enumerate(_ARGS_SCHEMAS):
        try:
            a = pl.read_ndjson(nd2, schema=schema)
        except Exception:  # noqa: BLE001
            continue
        if a.height != top.height:
            break
        return top.hstack([c.alias(new) for c, new in zip(a.get_columns(), _ARG_COLS)]), bool(ints_as_text)
    del nd2
    return _read_one_pass(nd)


def _fast_tables(
    df: pl.DataFrame, ints_as_text: bool, autograd_array: bool
) -> tuple[dict[str, pl.DataFrame], _Stats]:
    stats = _Stats(n_events=df.height)
    int_cols = ["pid", "tid", "id"] + (["a." + k for k in _INT_ARGS] if ints_as_text else [])
    df = df.with_columns(pid_s=pl.col("pid"), tid_s=pl.col("tid"))
    df = df.with_columns(_int_column(df.get_column(c)) for c in int_cols)
    ph_counts = dict(df.group_by("ph", maintain_order=True).len().iter_rows())
    n_null = ph_counts.pop(None, 0)
    if n_null:
        stats.skipped["events without a phase (ph)"] += n_null
    stats.no_ph_head = bool(df["ph"].head(100).is_null().all())
    for ph, n in ph_counts.items():
        if ph not in _KNOWN_PH:
            stats.skipped[f"events of phase {ph!r}"] += n
    stats.counters = ph_counts.get("C", 0)
    frames: dict[str, pl.DataFrame] = {}
    ph = pl.col("ph")
    ts, dur = pl.col("ts"), pl.col("dur")

    # Duration events.
    x = df.filter(ph == "X")
    if x.height:
        no_ts = x["ts"].null_count()
        no_dur = x.filter(ts.is_not_null() & dur.is_null()).height
        neg = x.filter(ts.is_not_null() & (dur < 0)).height
        in_range = (ts.abs() <= MAX_ABS_US) & (dur <= MAX_ABS_US)
        far = x.filter(ts.is_not_null() & (dur >= 0) & ~in_range).height
        for what, n in (("duration events without a numeric ts", no_ts), ("duration events without dur", no_dur),
                        ("duration events with negative dur", neg), (_OUT_OF_RANGE_X, far)):
            if n:
                stats.skipped[what] += n
        table = pl.col("cat").replace_strict(CAT_TABLE, default=None, return_dtype=pl.String)
        cat = pl.col("cat")
        if autograd_array:
            bare = table.is_null() & cat.is_null()
            cuda = pl.col("pid_s").str.starts_with("CUDA").fill_null(False)
            table = pl.when(bare).then(pl.when(cuda).then(pl.lit("kernels")).otherwise(pl.lit("cpu_ops"))).otherwise(table)
            cat = pl.when(bare).then(pl.when(cuda).then(pl.lit("Kernel")).otherwise(pl.lit("Operator"))).otherwise(cat)
        xname = pl.col("name").fill_null("")
        table = (
            pl.when(pl.col("cat") == MTIA_CCP_CAT)
            .then(
                pl.when(xname == MTIA_DMA).then(pl.lit("memcpy"))
                .when(xname.is_in(MTIA_NOT_BUSY)).then(pl.lit(None, pl.String))
                .otherwise(pl.lit("kernels"))
            )
            .otherwise(table)
        )
        x = x.filter(ts.is_not_null() & dur.is_not_null() & (dur >= 0) & in_range).with_columns(
            _table=table, cat=cat, name=pl.col("name").fill_null("")
        )
        parts = x.partition_by("_table", as_dict=True, include_key=False)
        for (t,), part in parts.items():
            if t is None:
                frames["other_events"] = _other_frame(part, stats)
            else:
                frames[t] = _x_frame(t, part)
    # Flow endpoints.
    fl = df.filter(ph.is_in(["s", "f", "t"]))
    if fl.height:
        n = fl["ts"].null_count()
        if n:
            stats.skipped["flow events without a numeric ts"] += n
        fl = fl.filter(ts.is_not_null())
        far = fl.filter(~(ts.abs() <= MAX_ABS_US)).height
        if far:
            stats.skipped[_OUT_OF_RANGE_FLOW] += far
            fl = fl.filter(ts.abs() <= MAX_ABS_US)
        kind = pl.col("cat").replace_strict(FLOW_KIND, default=pl.col("cat"), return_dtype=pl.String).fill_null("None")
        frames["flows"] = _typed("flows", fl.select(kind.alias("kind"), "ph", "id", "ts", "pid", "tid"))
    # Allocator instant events.
    mem = df.filter(ph.is_in(["i", "I"]) & pl.col("name").is_in(["[memory]", "[OutOfMemory]"]))
    if mem.height:
        n = mem["ts"].null_count()
        if n:
            stats.skipped["[memory] events without ts or args"] += n
        mem = mem.filter(ts.is_not_null())
        far = mem.filter(~(ts.abs() <= MAX_ABS_US)).height
        if far:
            stats.skipped[_OUT_OF_RANGE_MEM] += far
            mem = mem.filter(ts.abs() <= MAX_ABS_US)
        frames["memory_events"] = _typed("memory_events", mem.select(
            "ts", "pid", "tid", _A("Device Type"), _A("Device Id"), _A("Addr"), _A("Bytes"),
            _A("Total Allocated"), _A("Total Reserved"), (pl.col("name") == "[OutOfMemory]").alias("oom"),
        ))
    th = df.filter((ph == "M") & (pl.col("name") == "thread_name"))
    if th.height:
        frames["threads"] = _typed("threads", th.select("pid", "tid", _A("name").fill_null("None").alias("name")))
    return frames, stats


def _typed(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """Rename a selection positionally to the raw columns of ``table`` and cast."""
    schema = _RAW_SCHEMAS[table]
    return df.select(pl.col(old).cast(dtype).alias(new) for old, (new, dtype) in zip(df.columns, schema.items()))


def _json_dims(k: str, part: pl.DataFrame) -> pl.Expr:
    """``_json_text`` of a list of ints the reader gave as text (``[[2, 3], [4]]``)."""
    col = part["a." + k]
    if not col.is_null().all() and not col.drop_nulls().str.contains(_DIMS_TEXT).all():
        raise _NotFast(f"{k} is not a list of ints")
    return _A(k).str.replace_all(" ", "", literal=True)


def _json_strings(k: str) -> pl.Expr:
    """``_json_text`` of a list of strings (compact, escaped as orjson does)."""
    enc = pl.struct(_A(k).alias("x")).struct.json_encode().str.slice(5).str.head(-1)
    return pl.when(_A(k).is_null()).then(pl.lit(None, pl.String)).otherwise(enc)


def _x_frame(t: str, p: pl.DataFrame) -> pl.DataFrame:
    ext = pl.coalesce(_A("External id"), _A("external id"))
    comm_dtype = pl.when(_A("Collective name").is_not_null()).then(_A("dtype"))
    device = pl.coalesce(_A("device"), pl.col("pid"))
    stream = pl.coalesce(_A("stream"), pl.col("tid"))
    base = ["name", "ts", "dur"]
    cols: list[Any]
    if t == "cpu_ops":
        cols = [*base, "pid", "tid", "cat", ext, _A("Sequence number"), _A("Fwd thread id"),
                pl.coalesce(_A("Ev Idx"), _A("Profiler Event Index")), _json_dims("Input Dims", p),
                _json_strings("Input type"), _A("Collective name"), comm_dtype, _A("In msg nelems"),
                _A("Out msg nelems"), _A("Group size"), _A("Process Group Name"),
                _A("Process Group Description")]
    elif t == "python_frames":
        cols = [*base, "pid", "tid", _A("Python id"), _A("Python parent id")]
    elif t == "runtime":
        cols = [*base, "pid", "tid", "cat", _A("correlation"), ext, pl.coalesce(_A("cbid"), _A("cid"))]
    elif t == "kernels":
        cols = [*base, device, stream, _A("correlation"), ext, _json_dims("grid", p), _json_dims("block", p),
                _A("registers per thread"), _A("shared memory"), _A("queued"), _A("graph id"),
                _A("Collective name"), comm_dtype, _A("In msg nelems"), _A("Group size")]
    elif t == "memcpy":
        mtia = pl.col("cat") == MTIA_CCP_CAT
        kind = pl.when(mtia).then(_A("direction").replace_strict(MTIA_DIRECTION, default=None, return_dtype=pl.String))
        cols = [*base, device, stream, _A("correlation"), ext, pl.when(mtia).then(_A("size")).otherwise(_A("bytes")), kind]
    elif t == "memset":
        cols = [*base, device, stream, _A("correlation"), ext, _A("bytes")]
    elif t == "annotations":
        cols = [*base, "pid", "tid", ext]
    elif t == "gpu_annotations":
        cols = [*base, device, stream]
    else:  # pragma: no cover - CAT_TABLE names only the tables above
        raise _NotFast(f"table {t}")
    schema = _RAW_SCHEMAS[t]
    exprs = [(pl.col(c) if isinstance(c, str) else c).cast(dtype).alias(new) for c, (new, dtype) in zip(cols, schema.items())]
    return p.select(exprs)


def _other_frame(p: pl.DataFrame, stats: _Stats) -> pl.DataFrame:
    scat = pl.col("cat").fill_null("<no category>")
    p = p.with_columns(scat=scat)
    unknown = p.filter(~pl.col("scat").is_in(list(KNOWN_OTHER_CATS)))
    if unknown.height:
        for c, n in unknown.group_by("scat", maintain_order=True).len().iter_rows():
            stats.unknown_cats[c] += n
    return _typed("other_events", p.select(
        "scat", "name", "ts", "dur", pl.col("pid_s").fill_null("None"), pl.col("tid_s").fill_null("None"),
    ))


def _structure(buf: bytes | memoryview, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The brackets of ``buf`` outside strings: (positions, byte, depth after each).

    ``buf`` must start outside a string, at nesting depth ``depth0``. Escaped quotes
    are told apart by the parity of the backslash run before them. For whole chunks
    (the exact path); the small framing jobs use :func:`_brackets`, which stops early
    and needs no numpy (whose import, 0.14 s, a plain trace run then never pays).
    """
    import numpy as np

    a = np.frombuffer(buf, np.uint8)
    q = np.flatnonzero(a == 0x22)
    if q.size:
        prev = a[np.maximum(q - 1, 0)] == 0x5C
        prev[q == 0] = False
        cand = np.flatnonzero(prev)
        if cand.size:
            escaped = np.zeros(q.size, bool)
            for i in cand.tolist():
                j = int(q[i]) - 1
                n = 0
                while j >= 0 and a[j] == 0x5C:
                    n += 1
                    j -= 1
                escaped[i] = bool(n & 1)
            q = q[~escaped]
    kind = np.zeros(256, np.int8)
    kind[[ord("{"), ord("[")]] = 1
    kind[[ord("}"), ord("]")]] = -1
    kind = kind[a]
    br = np.flatnonzero(kind)
    if q.size:
        br = br[(np.searchsorted(q, br) & 1) == 0]
    step = kind[br]
    return br, a[br], depth0 + np.cumsum(step, dtype=np.int64)


def _brackets(buf: bytes | memoryview, depth0: int) -> Iterator[tuple[int, int, int]]:
    """:func:`_structure` as a lazy scan: (position, byte, depth after it) for each
    bracket outside strings, in order, so a caller that needs the first few stops
    there. Same answer for any ``buf`` that starts outside a string; on invalid JSON
    (a backslash outside a string) the two may differ, and every caller then fails to
    decode and re-frames with :func:`_structure`."""
    depth = depth0
    for m in _TOKENS.finditer(buf):
        start = m.start()
        ch = buf[start]
        if ch == 0x22:
            if m.end() - start == 1:
                return  # a string the buffer cuts off
            continue
        depth += 1 if ch in _OPEN else -1
        yield start, ch, depth


def _decode_region(region: bytes, sep_nd: bytes, sep_nl: bytes,
                   autograd: bool) -> tuple[dict[str, pl.DataFrame], _Stats] | None:
    """A region of whole events (cut at separators) → raw frames and counts, or None when
    the columnar reader cannot take it exactly (the caller frames it exactly)."""
    try:
        nd = region.translate(_NL_TO_TAB).replace(sep_nd, sep_nl)
        return _fast_chunk(nd, autograd)
    except _NotFast:
        return None


@dataclass
class _Pending:
    """A region being decoded on the pool, and what undoes the assumption that it decodes:
    where it started (``carry[:nxt]`` is its text up to the next region) and the loader's
    position before it."""

    future: Future[tuple[dict[str, pl.DataFrame], _Stats] | None]
    carry: bytes
    nxt: int
    offset: int
    last_end: int | None


class _Rollback(Exception):
    """A region decoded ahead did not decode: ``carry`` is the text from its start on."""

    def __init__(self, carry: bytes) -> None:
        super().__init__()
        self.carry = carry


class _ChunkedLoader:
    """Streams one file through the chunked path (see the comment above).

    With ``workers`` ≥ 2 (the default where polars has two threads or more), two regions
    are decoded at once on a thread pool: the reader keeps two cores busy, but the rest of
    a region's work (the screen, the separator rewrite, the split into tables: ~60 % of
    it) runs on one, so on 2 cores one region's tables are built while the next one is
    read. Two regions in flight hold two working sets, hence regions of
    :data:`PARALLEL_CHUNK_BYTES` (2 MiB) then: the same peak as one 4 MiB region at a
    time (203–217 MB at 1x), where two 4 MiB regions peaked at 262–273 MB. Measured,
    interleaved, fresh processes: ``load()`` of the 54 MB trace 0.92–1.02 s → 0.80–0.81 s,
    of the 795 MB 16x trace 14.6–16.0 s → 12.8–14.9 s (3 runs each; the box is noisy:
    one more pair went the other way, 14.5 vs 15.4 s). Regions are cut assuming the one
    before decodes; where one does not (a value the reader would blur, a separator inside
    a string), the regions cut after it are dropped, the loader goes back to its start
    and carries on one region at a time, exactly as with ``workers=1``. Frames are added
    in file order either way.
    """

    def __init__(self, path: Path, chunk_bytes: int | None = None, workers: int | None = None) -> None:
        self.path = path
        if workers is None:
            workers = 2 if pl.thread_pool_size() >= 2 else 1
        self.workers = workers
        if chunk_bytes is None:
            chunk_bytes = PARALLEL_CHUNK_BYTES if workers > 1 else CHUNK_BYTES
        self.chunk = max(1, chunk_bytes)
        self.pool: ThreadPoolExecutor | None = None
        self.pending: deque[_Pending] = deque()
        self.stream = ByteStream(path)
        self.frames: dict[str, list[pl.DataFrame]] = {t: [] for t in _RAW_COLS}
        self.stats = _Stats()
        self.n_tokens = 0
        self.n_ctrl = 0
        self.not_strict = False
        self.autograd = False
        self.top: dict[str, Any] = {}
        self.sep: bytes | None = None  # raw bytes between two events, learned from the file
        self.sep_nd: bytes = b""
        self.sep_nl: bytes = b""  # sep_nd with its ``,`` made a newline: same length, so
        # ``bytes.replace`` substitutes in place (35 % faster than ``}\n{``)
        self.offset = 0  # position in the (decompressed) file of the current buffer's first byte
        self.truncated_at: int | None = None
        self.last_end: int | None = None  # file position just after the last complete event
        self.expect_comma = False  # the buffer starts before the ``,`` that follows an event

    # -- driver -----------------------------------------------------------------

    def load(self) -> TraceModel:
        try:
            return self._load()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = None

    def _load(self) -> TraceModel:
        blocks = self._blocks = self.stream.blocks(self.chunk)
        carry = self._header(blocks)
        tail_parts: list[bytes] | None = None
        parts, n = [carry], len(carry)
        wait = self.chunk
        # The empty block first: what the header left may already fill a chunk (appending
        # the next block before cutting made the first chunk twice the others).
        for block in chain((b"",), blocks):
            if tail_parts is not None:
                tail_parts.append(block)
                continue
            if block:
                parts.append(block)
                n += len(block)
            if n < wait:
                continue
            carry = b"".join(parts) if len(parts) > 1 else parts[0]
            before = len(carry)
            try:
                carry, tail = self._step(carry)
            except _Rollback as rb:  # from here on one region at a time
                carry, tail = self._step(rb.carry)
            if tail is not None:
                tail_parts = [tail]
                parts, n = [], 0
                continue
            parts, n = [carry], len(carry)
            # A step that consumed nothing (one event, or the whitespace between two,
            # longer than the buffer) is retried once the buffer has doubled: O(n) copies
            # and scans for n such bytes, not O(n²) (whitespace bombs inside the events
            # array, one endless string).
            wait = 2 * n if n >= before else self.chunk
        carry = b"".join(parts)
        del parts
        if tail_parts is None:
            try:
                self._drain(carry)
            except _Rollback as rb:
                carry = rb.carry
            tail = self._final(carry)
        else:
            tail = b"".join(tail_parts)
        del carry
        if tail is not None:
            self._tail(tail)
        total = self.stream.nbytes
        if self.truncated_at is not None and not self.stats.n_events and tail is None:
            # Not one complete event before the cut: the file is a fragment, small by
            # construction; the simple path's decoder words the error.
            raise _Unframed
        warnings = list(self.stream.warnings)
        warnings += repair_warnings(self.n_tokens, self.n_ctrl, self.not_strict)
        if self.truncated_at is not None:
            warnings.append(truncation_warning(self.truncated_at, total))
        if self.autograd and self.stats.n_events and self._first_ph_missing:
            raise InputError(self.path, "a JSON array whose items are not trace events (no 'ph' fields)")
        return _assemble(self.path, self.top, self.autograd, self.frames, self.stats, warnings)

    _first_ph_missing = False

    def _header(self, blocks: Iterator[bytes]) -> bytes:
        """Consume blocks up to the ``[`` that opens the events; return what follows."""
        buf = b""
        for block in blocks:
            buf += block
            start = self._events_start(buf, final=False)
            if start is not None:
                self.offset = start
                return buf[start:]
        start = self._events_start(buf, final=True)
        assert start is not None
        self.offset = start
        return buf[start:]

    def _events_start(self, buf: bytes, final: bool) -> int | None:
        body = buf.lstrip(_WS)
        if not body:
            if final:
                raise _Unframed
            return None
        i = len(buf) - len(body)
        if body[:1] == b"[":
            self.autograd = True
            return i + 1
        if body[:1] != b"{":
            raise _Unframed
        limit = 1 << 16
        while True:
            window = buf[:limit]
            k = window.find(b'"traceEvents"')
            while k >= 0:
                depth = 0
                for _, _, depth in _brackets(memoryview(window)[:k], 0):
                    pass
                if depth == 1 and _outside_string(window[:k]):
                    m = _COLON.match(buf, k + 13)
                    if m is None or m.end() >= len(buf):
                        if final:
                            raise _Unframed
                        return None
                    if buf[m.end():m.end() + 1] != b"[":
                        raise _Unframed
                    head = buf[:k].rstrip(_WS)
                    if head.endswith(b","):
                        head = head[:-1]
                    try:
                        top = orjson.loads(head + b"}")
                    except orjson.JSONDecodeError:
                        raise _Unframed from None
                    if not isinstance(top, dict):
                        raise _Unframed
                    self.top = top
                    return m.end() + 1
                k = window.find(b'"traceEvents"', k + 1)
            if limit >= len(buf):
                if final or len(buf) >= (64 << 20):
                    raise _Unframed
                return None
            if limit >= (64 << 20):
                raise _Unframed
            limit *= 16

    # -- chunks -----------------------------------------------------------------

    def _learn_sep(self, buf: bytes) -> None:
        """The bytes between the first two events (``},\\n  {`` for Kineto's own writer)."""
        end = -1
        starts: list[int] = []
        for pos, ch, depth in _brackets(memoryview(buf)[: 16 << 20], 1):
            if depth == 1 and ch == 0x7D and end < 0:
                end = pos
            elif depth == 2 and ch == 0x7B:
                starts.append(pos)
            if end >= 0 and len(starts) > 1:
                break
        if end >= 0 and len(starts) > 1 and starts[1] > end:
            sep = buf[end:starts[1] + 1]
            if _SEP.fullmatch(sep):
                self.sep = sep
                self.sep_nd = sep.translate(_NL_TO_TAB)
                self.sep_nl = self.sep_nd.replace(b",", b"\n")

    def _total(self) -> int:
        """The file's (decompressed) size, for error messages: reads the rest of the stream."""
        for _ in self._blocks:
            pass
        return self.stream.nbytes

    def _skip_comma(self, carry: bytes, final: bool) -> bytes | None:
        """Drop the ``,`` that separates the last processed event from the next one
        when the previous buffer ended before it; None when more bytes are needed."""
        rest = carry.lstrip(_WS)
        if not rest and not final:
            return None
        self.expect_comma = False
        if rest[:1] not in (b",", b"]", b""):
            at = self.offset + len(carry) - len(rest)
            raise InputError(self.path, "not valid JSON (unexpected character, expected ',' or ']' "
                                        f"at byte {at:,} of {self._total():,})")
        if rest[:1] != b",":
            return carry  # the array's ``]``, or the end of a cut-off file
        n = len(carry) - len(rest) + 1
        self.offset += n
        return carry[n:]

    def _step(self, carry: bytes) -> tuple[bytes, bytes | None]:
        """Process the complete events of a full buffer; return (rest, tail-or-None)."""
        if self.expect_comma:
            skipped = self._skip_comma(carry, final=False)
            if skipped is None:
                return carry, None
            carry = skipped
        if self.sep is None:
            self._learn_sep(carry)
        p = -1
        if self.sep:
            # The last boundary within one chunk, so that a region (whose decode working
            # set is 15-35x its size) is never much more than CHUNK_BYTES; the whole
            # buffer only when one event is longer than that.
            p = carry.rfind(self.sep, 0, self.chunk + len(self.sep))
            if p <= 0:
                p = carry.rfind(self.sep)
        if p > 0:
            nxt = p + len(self.sep) - 1  # type: ignore[arg-type]
            if self.workers > 1:
                return self._ahead(carry, p, nxt), None
            if self._fast(carry[: p + 1]):
                self.last_end = self.offset + p + 1
                self.offset += nxt
                return carry[nxt:], None
            resume, end = self._exact(carry, p + 1, final=False)
        elif len(carry) < 4 * self.chunk:
            return carry, None  # no boundary yet: read on
        else:
            self._drain(carry)
            resume, end = self._exact(carry, len(carry), final=False)
        if end >= 0:
            return b"", carry[end + 1:]
        self.offset += resume
        return carry[resume:], None

    def _final(self, carry: bytes) -> bytes | None:
        """The last buffer: events, the array's end and what follows (or a truncation).

        The bulk goes through the columnar reader; only the last event and what follows
        it are framed exactly (a bracket scan of the whole buffer would cost more than
        decoding it).
        """
        if self.expect_comma:
            carry = self._skip_comma(carry, final=True)  # type: ignore[assignment]
        if self.sep is None:
            self._learn_sep(carry)
        p = carry.rfind(self.sep) if self.sep else -1
        if p > 0:
            q = p + len(self.sep) - 1  # type: ignore[arg-type]
            closed = next((pos for pos, _, depth in _brackets(memoryview(carry)[q:], 1) if depth <= 0), -1)
            if closed >= 0:
                end = q + closed
                events = carry[:end].rstrip(_WS)
                if self._fast(events):
                    self.last_end = self.offset + len(events)
                    self.offset += end + 1
                    return carry[end + 1:]
            elif self._fast(carry[: p + 1]):
                self.last_end = self.offset + p + 1
                self.offset += q
                carry = carry[q:]
        resume, end = self._exact(carry, len(carry), final=True)
        return carry[end + 1:] if end >= 0 else None

    def _fast(self, region: bytes) -> bool:
        got = _decode_region(region, self.sep_nd, self.sep_nl, self.autograd)
        if got is None:
            return False
        self._add(*got)
        return True

    def _ahead(self, carry: bytes, p: int, nxt: int) -> bytes:
        """Send ``carry[:p + 1]`` to the pool and move on as if it decodes (see the class);
        with two regions in flight, first settle the older one. Returns the rest."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="traceanalyzer-load")
        future = self.pool.submit(_decode_region, carry[: p + 1], self.sep_nd, self.sep_nl, self.autograd)
        self.pending.append(_Pending(future, carry, nxt, self.offset, self.last_end))
        self.last_end = self.offset + p + 1
        self.offset += nxt
        rest = carry[nxt:]
        while len(self.pending) >= self.workers:
            self._settle_oldest(rest)
        return rest

    def _drain(self, carry: bytes) -> None:
        """Settle every region in flight (``carry``: the text after the last one)."""
        while self.pending:
            self._settle_oldest(carry)

    def _settle_oldest(self, carry: bytes) -> None:
        """Add the oldest region's frames, or, where it did not decode, drop every region
        in flight, go back to its start and raise :class:`_Rollback` with the text from
        there on (``carry``: the text after the newest region)."""
        first = self.pending.popleft()
        got = first.future.result()
        if got is not None:
            self._add(*got)
            return
        later = list(self.pending)
        self.pending.clear()
        for q in later:
            if not q.future.cancel():
                q.future.result()  # let it finish: its working set goes with it
        self.offset, self.last_end = first.offset, first.last_end
        self.workers = 1
        parts = [first.carry[: first.nxt], *(q.carry[: q.nxt] for q in later), carry]
        del first, later
        raise _Rollback(b"".join(parts))

    def _exact(self, buf: bytes, upto: int, final: bool) -> tuple[int, int]:
        """Frame ``buf[:upto]`` exactly and process its complete events.

        Returns (where the unprocessed text resumes, array end or -1).
        """
        view = memoryview(buf)[:upto]
        import numpy as np

        br, ch, depth = _structure(view, 1)
        closed = np.flatnonzero(depth <= 0)
        array_end = int(br[closed[0]]) if closed.size else -1
        if closed.size:
            br, ch, depth = br[: closed[0]], ch[: closed[0]], depth[: closed[0]]
        opens = (depth == 2) & ((ch == ord("{")) | (ch == ord("[")))
        ends = br[(depth == 1) & ((ch == ord("}")) | (ch == ord("]")))]
        starts = br[opens]
        starts_ch = ch[opens]
        n = int(ends.size)
        if array_end >= 0:
            content_end = array_end
            resume = array_end + 1
        else:
            content_end = int(ends[-1]) + 1 if n else 0
            if final:
                # A cut-off file: the simple path counts the repairs in the lost text too.
                _, n_tokens, n_ctrl = fix_tokens(bytes(view[content_end:]))
                self.n_tokens += n_tokens
                self.n_ctrl += n_ctrl
                resume = upto
            elif n:
                m = _COMMA.match(buf, content_end)
                resume = m.end() if m else content_end
                self.expect_comma = not buf[content_end:resume].count(b",")
            else:
                resume = 0
        content = bytes(view[:content_end])
        del view
        if content.strip(_WS):
            self._exact_content(content, starts[:n], ends, starts_ch[:n])
        if n:
            self.last_end = self.offset + int(ends[-1]) + 1
        if final and array_end < 0:
            self.truncated_at = self.last_end if self.last_end is not None else self.offset + content_end
        return resume, array_end

    def _exact_content(self, content: bytes, starts: np.ndarray, ends: np.ndarray, starts_ch: np.ndarray) -> None:
        """Complete events, exactly framed: columnar when every item is a plain object, else slow."""
        if starts.size and (starts_ch == ord("{")).all():
            t = content.translate(_NL_TO_TAB)
            s_list, e_list = starts.tolist(), ends.tolist()
            gaps = b"".join(t[e + 1:s] for e, s in zip(e_list[:-1], s_list[1:]))
            outer = t[: s_list[0]] + t[e_list[-1] + 1:]
            if (gaps.count(b",") == len(s_list) - 1 and not gaps.translate(None, b" \t,")
                    and not outer.translate(None, b" \t")):
                nd = b"\n".join(t[s:e + 1] for s, e in zip(s_list, e_list))
                try:
                    frames, stats = _fast_chunk(nd, self.autograd)
                except _NotFast:
                    pass
                else:
                    self._add(frames, stats)
                    return
        self._slow(content)

    def _slow(self, content: bytes) -> None:
        """The simple path's decoding (with its repairs) and event loop, on one chunk."""
        repaired = decode_repairing(b"[" + content + b"]")
        if not isinstance(repaired, Repaired):
            error = describe_error(repaired.error, self.offset - 1, self._total())
            raise InputError(self.path, f"not valid JSON ({error})")
        self.n_tokens += repaired.n_tokens
        self.n_ctrl += repaired.n_ctrl
        self.not_strict |= repaired.not_strict
        events = repaired.doc
        frames, stats = _collect_events(events, self.autograd)
        del events
        self._add(frames, stats)

    def _add(self, frames: dict[str, pl.DataFrame], stats: _Stats) -> None:
        if not self.stats.n_events and stats.n_events:
            self._first_ph_missing = stats.no_ph_head
        for t, f in frames.items():
            if f.height:
                self.frames[t].append(f)
        self.stats.merge(stats)

    def _tail(self, tail: bytes) -> None:
        """Top-level keys after the events array (Kineto writes ``traceName``,
        ``displayTimeUnit`` and ``baseTimeNanoseconds`` there), or a damaged end: the
        keys before the damage are kept, as the simple path's recovery does."""
        start = self.stream.nbytes - len(tail)  # file position just after the array's ``]``
        if self.autograd:
            if tail.strip(_WS) and self.truncated_at is None:
                self.truncated_at = start
            return
        fixed, n_tokens, n_ctrl = fix_tokens(tail)
        members, kept, complete, not_strict = recover_members(fixed)
        self.n_tokens += n_tokens
        self.n_ctrl += n_ctrl
        self.not_strict |= not_strict
        self.top.update(members)
        if not complete and self.truncated_at is None:
            self.truncated_at = start + kept


def _outside_string(before: bytes) -> bool:
    """Whether the position after ``before`` (which starts outside strings) is outside a string."""
    n = 0
    i = before.find(b'"')
    while i >= 0:
        j = i - 1
        k = 0
        while j >= 0 and before[j] == 0x5C:
            k += 1
            j -= 1
        if not k & 1:
            n += 1
        i = before.find(b'"', i + 1)
    return not n & 1
