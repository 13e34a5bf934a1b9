"""Assembly of the model: raw per-chunk frames + the top-level keys → :class:`TraceModel`.

Shared by both paths: unit conversion (µs → int64 ns), derived columns and tables
(memcpy kinds, ``steps``, memory totals of old profilers), :class:`TraceMeta` (layout,
vendor, versions, span), the warnings of what was skipped, and the refusals of a file
with no usable events.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.chrome_trace.raw import _RAW_COLS, MAX_ABS_BASE_NS, _int, _Stats
from traceanalyzer.load.chrome_trace.vocabulary import _XPU_KIND, LEGACY_CATS
from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

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


def _to_ns(col: str, base_ns: int) -> pl.Expr:
    """µs (int or float) → int64 ns without losing ns digits on large absolute values.

    Absolute integer µs (~1.6e15) are exact in float64 but ×1000 is not, so the whole
    and fractional parts are converted separately.
    """
    c = pl.col(col).cast(pl.Float64)
    whole = c.floor()
    return (whole.cast(pl.Int64) * 1000 + ((c - whole) * 1000).round().cast(pl.Int64) + base_ns).alias(col)


def _finish(table: str, frames: list[pl.DataFrame], base_ns: int) -> pl.DataFrame:
    """Concatenate a table's raw frames and convert it to the model schema."""
    schema = SCHEMAS[table]
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_table(table)
    df = pl.concat(frames, how="vertical", rechunk=False) if len(frames) > 1 else frames[0]
    frames.clear()  # ``df`` alone holds the pieces now (see the rechunk below)
    raw_cols = _RAW_COLS[table]
    exprs: list[pl.Expr] = []
    if "ts" in raw_cols:
        exprs.append(_to_ns("ts", base_ns).alias("ts_ns"))
    if "dur" in raw_cols:
        exprs.append((pl.col("dur").cast(pl.Float64) * 1000).round().cast(pl.Int64).alias("dur_ns"))
    df = df.with_columns(exprs).drop([c for c in ("ts", "dur") if c in raw_cols])
    if "end_ns" in schema:
        df = df.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    df = df.select(
        [pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in schema.items()]
    )
    # Rechunked one column at a time: each column's pieces (the regions' frames) are freed as
    # soon as its copy exists, so the transient is one column, not the table (here, not in a
    # helper, so that no caller's reference keeps the pieces). Only the columns in pieces
    # are touched: a column the table lacks is a broadcast null, which polars keeps as one
    # value and a length; taken out as a Series it would be materialised (8 bytes a row for
    # every absent int column: ~7 MB of the model at 4x).
    for name, chunks in zip(df.columns, df.n_chunks("all"), strict=True):
        if chunks > 1:
            df = df.with_columns(df.get_column(name).rechunk())
    return df


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


def _ints(values: Iterable[object]) -> list[int]:
    """The ints among a list of column minima/maxima (None for an all-null column)."""
    return [v for v in values if isinstance(v, int)]


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
    span_start = min(_ints(starts))
    span_end = max(_ints(ends))

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
