"""Helpers shared by the ``copies`` and ``syncs`` analyses (private module).

* step windows (from the ``steps`` result when it ran, else CPU ``ProfilerStep#N`` ranges,
  else the whole trace) and the as-of assignment of timestamps to them;
* classification of copy APIs (sync/async) and of memcpy host memory (pinned/pageable);
* the GPU transfers frame: every memcpy/memset joined to the runtime call that issued it.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.analyses._intervals import asof_rows
from traceanalyzer.analyses._steps import StepWindows
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, gpu_activity, join_unique, trace_tables

#: CPU ops that copy tensors (outermost one of a nest counts once: aten::to > _to_copy > copy_).
COPY_OPS: tuple[str, ...] = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone")

#: Memcpy/memset APIs that are synchronous with respect to the host (no ``Async``).
SYNC_COPY_APIS: frozenset[str] = frozenset(
    {
        "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
        "cudaMemcpyPeer", "cudaMemcpyToArray", "cudaMemcpyFromArray", "cudaMemset", "cudaMemset2D",
        "cudaMemset3D", "cuMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD", "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2", "cuMemcpyPeer", "cuMemsetD8", "cuMemsetD32",
        "cuMemsetD8_v2", "cuMemsetD32_v2",
        "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D", "hipMemcpy3D", "hipMemcpyHtoD", "hipMemcpyDtoH",
        "hipMemcpyDtoD", "hipMemcpyPeer", "hipMemcpyToSymbol", "hipMemcpyFromSymbol", "hipMemset",
        "hipMemsetD8", "hipMemsetD32",
    }
)

_KIND_FROM_API_RE = r"(?i)memcpy\w*?(HtoD|DtoH|DtoD|PtoP|HtoH)"


def api_mode(api: pl.Expr) -> pl.Expr:
    """``"sync"`` / ``"async"`` / ``"unknown"`` (null API, or an API whose blocking flag is not in the name)."""
    return (
        pl.when(api.is_null())
        .then(pl.lit("unknown"))
        .when(api.is_in(list(SYNC_COPY_APIS)))
        .then(pl.lit("sync"))
        .when(api.str.contains("(?i)async"))
        .then(pl.lit("async"))
        .otherwise(pl.lit("unknown"))
    )


def kind_from_api(api: pl.Expr) -> pl.Expr:
    """Copy direction spelled in a runtime call name (``enqueueCommand memcpyHtoDAsync``), else null."""
    return api.str.extract(_KIND_FROM_API_RE, 1)


def _side(mem: pl.Expr, vendor: str) -> pl.Expr:
    low = mem.str.to_lowercase()
    host_is = "pinned" if vendor == "xpu" else "unknown"  # XPU "Host" = USM host; ROCm "Host" says nothing
    return (
        pl.when(low == "pageable")
        .then(pl.lit("pageable"))
        .when(low == "pinned")
        .then(pl.lit("pinned"))
        .when(low == "managed")
        .then(pl.lit("managed"))
        .when(low == "host")
        .then(pl.lit(host_is))
        .otherwise(pl.lit("unknown"))
    )


def host_memory(name: pl.Expr, kind: pl.Expr, src: pl.Expr, dst: pl.Expr, vendor: str) -> pl.Expr:
    """Host memory of a memcpy: ``pinned``/``pageable``/``managed``/``shared``/``unknown``; ``n/a`` on-device.

    CUDA names say ``Pageable``/``Pinned``; ROCm names only ``Host`` → ``unknown`` (never
    guessed); XPU kind codes say it (``M`` user memory = pageable, ``H`` USM host = pinned,
    ``S`` shared).
    """
    xpu_code = name.str.extract(r"Memcpy\s+([MHDS])2([MHDS])\b", 1)
    xpu_code_dst = name.str.extract(r"Memcpy\s+([MHDS])2([MHDS])\b", 2)
    xpu_host = pl.when(kind == "DtoH").then(xpu_code_dst).otherwise(xpu_code)
    xpu_mem = xpu_host.replace_strict({"M": "pageable", "H": "pinned", "S": "shared"}, default="unknown")
    cuda_mem = pl.when(kind == "DtoH").then(_side(dst, vendor)).otherwise(_side(src, vendor))
    return (
        pl.when(kind.is_in(["DtoD", "PtoP"]))
        .then(pl.lit("n/a"))
        .when(xpu_code.is_not_null())
        .then(xpu_mem)
        .when(kind.is_in(["HtoD", "DtoH", "HtoH"]))
        .then(cuda_mem)
        .otherwise(pl.lit("unknown"))
    )


def runtime_by_correlation(src: TraceModel | TraceTables) -> pl.DataFrame:
    """One runtime row per correlation id (the first), renamed ``api*`` for joining to GPU rows
    (built once per run, read-only). Only correlation ids that some GPU activity carries
    are kept: every reader joins it to GPU rows, and the calls without GPU work (syncs,
    event records …) are about half of a trace's runtime rows."""
    t = trace_tables(src)
    return t.get("runtime_by_correlation", lambda: _runtime_by_correlation(t))


def _runtime_by_correlation(t: TraceTables) -> pl.DataFrame:
    on_gpu = gpu_activity(t)["correlation"].drop_nulls().unique()
    return (
        t.model.runtime.select("correlation", "name", "ts_ns", "dur_ns", "end_ns", "pid", "tid")
        # Filtered before the sort (the filter keeps or drops every row of a correlation
        # alike): half the rows to sort. A stable sort: among calls of one correlation at
        # one instant, the first in the file.
        .filter(pl.col("correlation").is_in(on_gpu.implode()))
        .sort("ts_ns", maintain_order=True)
        .unique("correlation", keep="first", maintain_order=True)
        .select(
            "correlation",
            pl.col("name").alias("api"),
            pl.col("ts_ns").alias("api_ts_ns"),
            pl.col("dur_ns").alias("api_dur_ns"),
            pl.col("end_ns").alias("api_end_ns"),
            "pid",
            "tid",
        )
    )


def transfers(src: TraceModel | TraceTables) -> pl.DataFrame:
    """Every GPU memcpy and memset with its issuing runtime call and classification.

    Columns: ``activity`` (memcpy/memset), ``name, kind`` (HtoD/DtoH/DtoD/PtoP/HtoH/
    unknown, ``Memset`` for memsets), ``host_memory, bytes, ts_ns, dur_ns, end_ns,
    device, stream, correlation, api, api_mode, api_ts_ns, api_dur_ns, api_end_ns, pid,
    tid, gbps`` (bytes per ns = GB/s, null when the duration is 0 or bytes unknown),
    ``host_blocking`` (sync API, or pageable host memory: an async copy from/to pageable
    memory is staged synchronously) and ``t_ns`` (the call's start, or the GPU start
    when no call is known: the time used to assign the transfer to a step). Built once per
    run (read-only).
    """
    t = trace_tables(src)
    return t.get("transfers", lambda: _transfers(t))


def _transfers(t: TraceTables) -> pl.DataFrame:
    model = t.model
    vendor = model.meta.vendor
    mc = model.memcpy.with_columns(
        activity=pl.lit("memcpy"),
        host_memory=host_memory(pl.col("name"), pl.col("kind"), pl.col("src"), pl.col("dst"), vendor),
    )
    ms = model.memset.with_columns(
        activity=pl.lit("memset"), kind=pl.lit("Memset"), src=pl.lit(None, pl.String),
        dst=pl.lit(None, pl.String), host_memory=pl.lit("n/a"),
    )
    cols = ["activity", "name", "kind", "src", "dst", "host_memory", "bytes", "ts_ns", "dur_ns", "end_ns",
            "device", "stream", "correlation"]
    gpu = pl.concat([mc.select(cols), ms.select(cols)])
    rt = runtime_by_correlation(t)
    out = join_unique(gpu, rt, "correlation")
    return out.with_columns(
        api_mode=api_mode(pl.col("api")),
        gbps=pl.when((pl.col("dur_ns") > 0) & pl.col("bytes").is_not_null())
        .then(pl.col("bytes") / pl.col("dur_ns"))
        .otherwise(None),
        t_ns=pl.coalesce("api_ts_ns", "ts_ns"),
    ).with_columns(
        host_blocking=(pl.col("api_mode") == "sync") | (pl.col("host_memory") == "pageable"),
    )


def outermost(ops: pl.DataFrame) -> pl.DataFrame:
    """Rows of ``ops`` (``pid, tid, ts_ns, end_ns, ev_order``) not nested in another row of the
    same thread. Zero-length aware: of two rows with the same start, the longer (then the
    earlier ``ev_order``) is the outer one."""
    s = ops.sort(["pid", "tid", "ts_ns", "end_ns", "ev_order"], descending=[False, False, False, True, False])
    prev_end = pl.col("end_ns").cum_max().shift(1).over(["pid", "tid"])
    same_ts_prev = (pl.col("ts_ns").shift(1).over(["pid", "tid"]) == pl.col("ts_ns")).fill_null(False)
    nested = (prev_end >= pl.col("end_ns")) & ((prev_end > pl.col("ts_ns")) | same_ts_prev)
    return s.filter(~nested.fill_null(False))


def containing(df: pl.DataFrame, outer: pl.DataFrame, ts_col: str, id_col: str = "copy_id") -> pl.Series:
    """``id_col`` of the row of ``outer`` (disjoint per thread) whose ``[ts_ns, end_ns)`` holds each
    row's ``ts_col`` on the same ``pid, tid``; a zero-length outer row holds its own instant."""
    if df.is_empty() or outer.is_empty():
        return pl.Series(id_col, [None] * df.height, dtype=pl.Int64)
    fast = _containing_np(df, outer, ts_col, id_col)
    if fast is not None:
        return fast
    o = outer.select(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col(id_col).alias("_id"),
        pl.col("ts_ns").alias("_cs"), pl.col("end_ns").alias("_ce"),
    ).sort("_cs")
    j = (
        df.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col(ts_col).alias("_t"))
        .with_row_index("_row")
        .sort("_t")
        .join_asof(o, left_on="_t", right_on="_cs", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .sort("_row")
    )
    inside = (pl.col("_t") < pl.col("_ce")) | ((pl.col("_ce") == pl.col("_cs")) & (pl.col("_t") == pl.col("_cs")))
    return j.select(pl.when(inside).then(pl.col("_id")).otherwise(None).alias(id_col))[id_col]


def _containing_np(df: pl.DataFrame, outer: pl.DataFrame, ts_col: str, id_col: str) -> pl.Series | None:
    """:func:`containing` by the numpy as-of search (:func:`asof_rows`: the last outer row of the
    thread starting at or before each point); None (the caller joins) where it gives none (a
    null thread or time, two outer rows of a thread starting at one instant …)."""
    rows = asof_rows(df, outer, ["pid", "tid"], ts_col, "ts_ns")
    if rows is None:
        return None
    t, cs, ce = df[ts_col], outer["ts_ns"].gather(rows), outer["end_ns"].gather(rows)
    inside = (t < ce) | ((ce == cs) & (t == cs))
    return pl.select(pl.when(pl.lit(inside)).then(pl.lit(outer[id_col].gather(rows))).alias(id_col)).to_series()


# ---------------------------------------------------------------------------------------------
# Step windows
# ---------------------------------------------------------------------------------------------

def step_windows(res: StepWindows) -> tuple[pl.DataFrame, bool]:
    """``(windows, has_steps)``: ``window, step, start_ns, end_ns, dur_ns`` of the ``steps``
    result (CPU step extended to its GPU tail; one whole-trace window without steps)."""
    w = res.windows()
    return w.with_columns(dur_ns=pl.col("end_ns") - pl.col("start_ns")), bool(res.has_steps)


def csv_setting(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]
