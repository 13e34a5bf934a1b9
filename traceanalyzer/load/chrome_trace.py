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

The per-event loop only sorts events into row tuples; every conversion (µs → ns,
name parsing, step extraction) is a polars expression over whole columns.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.jsonio import parse_json, read_bytes
from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

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


def _int(v: Any) -> int | None:
    """Best-effort int from a JSON scalar: ints, integral floats, numeric strings,
    and ``"stream 7"``-style legacy ids. Anything else is None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9.2e18 else None
    if isinstance(v, str):
        s = v.strip()
        if s.lstrip("-").isdigit():
            return int(s)
        tail = s.rsplit(" ", 1)[-1]
        if tail.lstrip("-").isdigit():
            return int(tail)
    return None


def _json_text(v: Any) -> str | None:
    return None if v is None else orjson.dumps(v).decode()


def _num(v: Any) -> int | None:
    """An int for a byte count or size that may be written as a float or string."""
    return _int(v)


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
                if not isinstance(name, str):
                    name = "" if name is None else str(name)
                cat = e.get("cat")
                table = CAT_TABLE.get(cat) if isinstance(cat, str) else None
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
                elif table == "memcpy" or table == "memset":
                    (memcpy if table == "memcpy" else memset).append(
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
                flows.append((kind, ph, _int(e.get("id")), ts, _int(e.get("pid")), _int(e.get("tid"))))
            elif ph == "i" or ph == "I":
                name = e.get("name")
                if name == "[memory]" or name == "[OutOfMemory]":
                    a = e.get("args") or {}
                    ts = e.get("ts")
                    if not isinstance(ts, (int, float)) or not isinstance(a, dict):
                        skipped["[memory] events without ts or args"] += 1
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


def _frame(table: str, rows: list[tuple[Any, ...]], base_ns: int, raw_cols: list[str]) -> pl.DataFrame:
    """Build a model table from row tuples whose columns are ``raw_cols``.

    ``raw_cols`` has ``ts``/``dur`` (µs) where the schema has ``ts_ns``/``dur_ns``/``end_ns``.
    """
    schema = SCHEMAS[table]
    if not rows:
        return empty_table(table)
    raw_schema: dict[str, Any] = {}
    for c in raw_cols:
        if c in ("ts", "dur"):
            raw_schema[c] = pl.Float64
        else:
            raw_schema[c] = schema[c]
    df = pl.DataFrame(rows, schema=raw_schema, orient="row", strict=False)
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
    )


_RAW_COLS: dict[str, list[str]] = {
    "cpu_ops": [
        "name", "ts", "dur", "pid", "tid", "cat", "external_id", "seq_num", "fwd_thread_id",
        "ev_idx", "input_dims", "input_types", "comm_name", "comm_dtype", "comm_in_nelems",
        "comm_out_nelems", "comm_group_size",
    ],
    "annotations": ["name", "ts", "dur", "pid", "tid", "external_id"],
    "python_frames": ["name", "ts", "dur", "pid", "tid", "python_id", "python_parent_id"],
    "runtime": ["name", "ts", "dur", "pid", "tid", "cat", "correlation", "external_id", "cbid"],
    "kernels": [
        "name", "ts", "dur", "device", "stream", "correlation", "external_id", "grid", "block",
        "registers_per_thread", "shared_memory", "queued_ns", "graph_id", "comm_name",
        "comm_dtype", "comm_in_nelems", "comm_group_size",
    ],
    "memcpy": ["name", "ts", "dur", "device", "stream", "correlation", "external_id", "bytes"],
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

# XPU PTI memcpy kinds: M = user ("Memory", pageable host), H = USM host (pinned),
# D = device, S = shared. Normalised to the CUDA vocabulary.
_XPU_KIND = {
    "M2D": "HtoD", "H2D": "HtoD", "S2D": "HtoD",
    "D2M": "DtoH", "D2H": "DtoH", "D2S": "DtoH",
    "D2D": "DtoD", "M2M": "HtoH", "H2H": "HtoH", "M2H": "HtoH", "H2M": "HtoH",
    "P2P": "PtoP",
}


def _memcpy_kinds(df: pl.DataFrame) -> pl.DataFrame:
    """Parse ``Memcpy <kind> (<src> -> <dst>)`` into kind/src/dst columns."""
    if df.is_empty():
        return df
    parsed = df.select(
        pl.col("name").str.extract(r"Memcpy\s+(\w+)", 1).alias("k"),
        pl.col("name").str.extract(r"\((\w+)\s*->", 1).alias("src_"),
        pl.col("name").str.extract(r"->\s*(\w+)\)", 1).alias("dst_"),
    )
    kind = (
        pl.col("k")
        .replace(_XPU_KIND)
        .fill_null("unknown")
    )
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


def load_chrome_trace(path: str | Path) -> TraceModel:
    """Load one chrome-trace file (``.json``, ``.json.gz``, any supported layout).

    Raises :class:`InputError` with a one-line reason when the file is not a usable
    trace; recoverable damage becomes ``TraceModel.warnings``.
    """
    p = Path(path)
    data, warnings = read_bytes(p)
    parsed = parse_json(p, data)
    del data
    warnings.extend(parsed.warnings)
    return build_model(p, parsed.doc, warnings)


def build_model(path: Path, doc: Any, warnings: list[str] | None = None) -> TraceModel:
    """Build the model from an already-decoded document (dict or bare array)."""
    warnings = list(warnings or [])
    autograd_array = False
    if isinstance(doc, list):
        events = doc
        top: dict[str, Any] = {}
        autograd_array = True
        if events and not any(isinstance(e, dict) and "ph" in e for e in events[:100]):
            raise InputError(path, "a JSON array whose items are not trace events (no 'ph' fields)")
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            if "nodes" in doc and "schema" in doc:
                raise InputError(
                    path,
                    "is a PyTorch Execution Trace (nodes/schema), not a torch.profiler chrome trace",
                )
            if "segments" in doc or "device_traces" in doc:
                raise InputError(path, "is a memory snapshot in JSON form, not a chrome trace")
            keys = ", ".join(list(doc)[:6]) or "none"
            raise InputError(path, f"not a chrome trace: JSON object without 'traceEvents' (keys: {keys})")
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise InputError(path, "not a chrome trace: 'traceEvents' is not an array")
        top = {k: v for k, v in doc.items() if k != "traceEvents"}
    else:
        raise InputError(path, f"not a chrome trace: top-level JSON {type(doc).__name__}")

    col = _Collector()
    col.add(events, autograd_array)
    n_events = len(events)
    del events

    base_ns = _int(top.get("baseTimeNanoseconds")) or 0
    tables: dict[str, pl.DataFrame] = {}
    for table, raw in _RAW_COLS.items():
        tables[table] = _frame(table, col.rows[table], base_ns, raw)
        col.rows[table] = []
    tables["memcpy"] = _memcpy_kinds(tables["memcpy"])
    tables["threads"] = tables["threads"].unique(maintain_order=True)
    tables["steps"] = _steps(tables["annotations"], tables["cpu_ops"])

    for what, n in sorted(col.skipped.items()):
        warnings.append(f"skipped {n:,} {what}")
    if col.unknown_cats:
        cats = ", ".join(f"{c} ({n:,})" for c, n in col.unknown_cats.most_common(8))
        warnings.append(f"kept aside {sum(col.unknown_cats.values()):,} events of unrecognised categories: {cats}")
    if col.counters:
        warnings.append(f"ignored {col.counters:,} counter ('C') events (GPU metrics / hardware counters)")
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
        vendor=_vendor(device_props, top, col.runtime_names, runtime_cats, has_gpu),
        span_start_ns=span_start,
        span_end_ns=span_end,
        trace_name=top.get("traceName") if isinstance(top.get("traceName"), str) else None,
        extra=extra,
    )
    return TraceModel(meta=meta, warnings=tuple(warnings), **tables)
