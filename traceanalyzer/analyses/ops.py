"""Ops: the facts about a trace that recommendation rules need and no other analysis gives.

Pure bookkeeping, no verdicts (the rules in :mod:`traceanalyzer.rules` judge):

* **Run facts**: ``vendor``; ``devices`` from ``deviceProperties`` (id, name, memory
  ``total_bytes``, ``compute_major``) with ``used`` = the device ran kernels/copies;
  ``profiler_flags`` (``with_stack``, ``record_shapes``, ``profile_memory`` …);
  ``event_counts`` (events per table, ``overhead`` = Kineto/CUPTI ``overhead`` events and
  their total ``overhead_ns``).
* **Op counts**: every CPU op and user annotation name with count and summed duration
  (``op_counts``, largest first); ``data_parallel`` = number of ``DataParallel.forward``
  ops/annotations or ``nn.Module: DataParallel_*`` frames (``DistributedDataParallel`` is
  not DataParallel).
* **Data loading per step window**: union of ``enumerate(DataLoader)#…`` /
  ``enumerate(DataPipe)#…`` ranges inside each window (``dataloader``), and the iterator
  names seen (``dataloader_iters``; ``_SingleProcessDataLoaderIter`` = ``num_workers=0``).
* **Kernels by class** (``kernel_classes``, per normalised name and precision): ``klass``
  from :func:`~traceanalyzer.analyses.diagnosis.kernel_class` plus ``layout_transpose``
  (cuDNN ``nchwToNhwc``/``nhwcToNchw``, MIOpen ``batched_transpose_*``); for GEMM/conv
  kernels ``name_precision`` (see :func:`gemm_name_precision`, vendor-aware) and
  ``op_dtype``: the first input dtype of the innermost GEMM/conv CPU op around the launching
  call (``record_shapes`` traces; vendor-neutral; most frequent per row). ``count``/``total_ns``
  over the whole trace, ``steady_count``/``steady_ns`` for kernels starting in steady step
  windows (warm-up and truncated last step left out) — what per-step costs divide.
* **Optimizer per step window** (``optimizer``): union CPU time of ``Optimizer.step#…``
  ranges, kernels/copies/memsets launched inside them (count and GPU time); the same for
  ``Optimizer.zero_grad#…`` with ``zero_grad_fills`` = memsets and fill/zero kernels.
  ``optimizer_impl``: ``fused`` (``aten::_fused_adam*``/``_fused_sgd_``/``_fused_adagrad_``
  anywhere, or any ``aten::_fused_*`` inside an ``Optimizer.step`` range), ``foreach``
  (``aten::_foreach_*`` inside one), ``for-loop`` (optimizer ranges without either),
  ``unknown`` (no optimizer range). Ops outside the ranges (``_fused_sdp_choice``, foreach grad
  clipping, AMP unscaling) do not count.
* **Compilation / graphs**: ``compiled`` (Torch-Compiled Region, CompiledFxGraph,
  CompiledFunction, Dynamo ranges or ``triton_*`` kernels) and ``graph_launches``
  (``cudaGraphLaunch``/``hipGraphLaunch`` calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.analyses._copysync import containing, outermost
from traceanalyzer.analyses._intervals import (
    DATALOADER_RE,
    FOREACH_PREFIX,
    FUSED_OPTIMIZER_RE,
    OPTIMIZER_STEP_RE,
    OPTIMIZER_ZERO_RE,
    window_union_lengths,
)
from traceanalyzer.analyses._kernels import GEMM_OPS_RE, kernel_class, kernel_norms, on_distinct
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, deepest_at, gpu_activity, launch_calls, launches

#: cuDNN / MIOpen layout conversion kernels (NCHW <-> NHWC around convolutions).
LAYOUT_TRANSPOSE_RE = r"(?i)nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw|batched_transpose|transpose_nchw|transpose_nhwc"
#: Names that say the code ran compiled (torch.compile) or generated (Triton).
COMPILED_RE = r"Torch-Compiled Region|CompiledFxGraph|CompiledFunction|TorchDynamo|^triton_"
_FILL_KERNEL_RE = r"(?i)fill|zero"
_TYPE_MAP = {
    "float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8",
}

# NVIDIA kernel-name precision classes (cuBLAS/cuDNN/CUTLASS naming). Applied to NVIDIA only.
_NV_LOWP_RE = r"(?i)bf16|fp16|f16|h884|h1688|h16816|hmma|half|hgemm|e4m3|e5m2|fp8|i8816|imma|int8"
_NV_TF32_RE = r"(?i)tf32|tensorop_s1688|tensorop_s16816|_s1688gemm|tensorop_sgemm"
_NV_FP32_RE = r"(?i)sgemm|simt|scudnn|implicit_convolve_sgemm|f32f32_f32|_fp32_|fp32"
# Vendor-neutral dtype tokens spelled out in a kernel name (MIOpen igemm_*_fp32_…, oneDNN).
# (low-precision tokens may run on: "bf16bf16_bf16f32" names inputs then accumulator)
_GENERIC_LOWP_RE = r"(?i)(^|_)(bf16|fp16|f16|half|fp8|int8)"
_GENERIC_FP32_RE = r"(?i)(^|_)(fp32|f32)(_|$)"


def gemm_name_precision(name: pl.Expr, vendor: str) -> pl.Expr:
    """Precision a GEMM/conv kernel name reveals: ``low`` (fp16/bf16/fp8/int8 tensor/matrix
    cores), ``tf32`` (fp32 tensors on tensor cores), ``fp32`` (SIMT fp32, no tensor cores) or
    ``unknown``. NVIDIA names are read with cuBLAS/cuDNN/CUTLASS conventions; other vendors only
    by dtype tokens spelled out in the name (``igemm_fwd_…_fp32_…``): no NVIDIA list is applied
    to AMD or Intel kernels."""
    if vendor == "nvidia":
        return (
            pl.when(name.str.contains(_NV_LOWP_RE)).then(pl.lit("low"))
            .when(name.str.contains(_NV_TF32_RE)).then(pl.lit("tf32"))
            .when(name.str.contains(_NV_FP32_RE)).then(pl.lit("fp32"))
            .otherwise(pl.lit("unknown"))
        )
    return (
        pl.when(name.str.contains(_GENERIC_LOWP_RE)).then(pl.lit("low"))
        .when(name.str.contains(_GENERIC_FP32_RE)).then(pl.lit("fp32"))
        .otherwise(pl.lit("unknown"))
    )


@dataclass(frozen=True)
class OpsResult:
    """See the module docstring for each field."""

    vendor: str
    devices: tuple[dict[str, Any], ...]
    profiler_flags: dict[str, bool]
    event_counts: dict[str, int]
    op_counts: pl.DataFrame  # name, source, count, total_ns
    data_parallel: int
    dataloader: pl.DataFrame  # window, step, dataloader_ns, dur_ns
    dataloader_iters: tuple[str, ...]
    kernel_classes: pl.DataFrame  # name, klass, name_precision, op_dtype, count, total_ns
    # window, step, opt_ns, opt_kernels, opt_gpu_ns, zero_grad_ns, zero_grad_fills, zero_grad_gpu_ns
    optimizer: pl.DataFrame
    optimizer_impl: str
    optimizer_names: tuple[str, ...]
    compiled: bool
    graph_launches: int

    def device(self, device_id: int | None) -> dict[str, Any] | None:
        for d in self.devices:
            if d.get("id") == device_id:
                return d
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "devices": list(self.devices),
            "profiler_flags": self.profiler_flags,
            "event_counts": self.event_counts,
            "op_counts": self.op_counts.head(200).to_dicts(),
            "data_parallel": self.data_parallel,
            "dataloader": self.dataloader.to_dicts(),
            "dataloader_iters": list(self.dataloader_iters),
            "kernel_classes": self.kernel_classes.head(200).to_dicts(),
            "optimizer": self.optimizer.to_dicts(),
            "optimizer_impl": self.optimizer_impl,
            "optimizer_names": list(self.optimizer_names),
            "compiled": self.compiled,
            "graph_launches": self.graph_launches,
        }

    def summary(self) -> list[tuple[str, str]]:
        cls = self.kernel_classes.group_by("klass").agg(pl.col("total_ns").sum()).sort("total_ns", descending=True)
        total = max(int(self.kernel_classes["total_ns"].sum() or 0), 1)
        out = [
            ("Vendor", self.vendor),
            ("Profiler flags", ", ".join(k for k, v in sorted(self.profiler_flags.items()) if v) or "none"),
            ("Optimizer", f"{', '.join(self.optimizer_names) or 'none seen'} ({self.optimizer_impl})"),
            ("Compiled / CUDA graphs", f"{'yes' if self.compiled else 'no'} / {self.graph_launches:,} graph launches"),
        ]
        if cls.height:
            out.append(("Kernel time by class", ", ".join(
                f"{r['klass']} {r['total_ns'] * 100.0 / total:.1f} %" for r in cls.head(5).iter_rows(named=True))
                + " of kernel time"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Kernel time by class": self.kernel_classes.head(30), "Optimizer per step": self.optimizer}


def _named(model: TraceModel) -> pl.DataFrame:
    """User annotations and CPU ops (``name, pid, tid, ts_ns, end_ns``): where :func:`_ranges`
    looks (PyTorch 1.8/1.9 exported ``Optimizer.step#…`` and ``enumerate(DataLoader)#…``
    ranges as ops)."""
    cols = ["name", "pid", "tid", "ts_ns", "end_ns"]
    return pl.concat([model.annotations.select(cols), model.cpu_ops.select(cols)])


def _ranges(named: pl.DataFrame, pattern: str) -> pl.DataFrame:
    """The rows of ``named`` (:func:`_named`) named like ``pattern``."""
    return named.filter(contains_by_name(named, pattern))


def _dtype_of(types: pl.Expr) -> pl.Expr:
    first = types.str.extract(r'^\[\s*"([^"]*)"', 1)
    return first.replace_strict(_TYPE_MAP, default=first, return_dtype=pl.String)


def _kernel_classes(t: TraceTables, windows: pl.DataFrame, steady: list[int]) -> pl.DataFrame:
    model = t.model
    k = model.kernels
    schema = {"name": pl.String, "klass": pl.String, "name_precision": pl.String, "op_dtype": pl.String,
              "count": pl.Int64, "total_ns": pl.Int64, "steady_count": pl.Int64, "steady_ns": pl.Int64}
    if k.is_empty():
        return pl.DataFrame(schema=schema)
    # Communication as every analysis counts it (_comm: metadata, launching op, name).
    klass = (
        pl.when(pl.col("is_comm")).then(pl.lit("communication"))
        .when(pl.col("name").str.contains(LAYOUT_TRANSPOSE_RE)).then(pl.lit("layout_transpose"))
        .otherwise(kernel_class(pl.col("name")))
    )
    k = on_distinct(
        k.select("name", "ts_ns", "dur_ns", "correlation").with_columns(is_comm=comm_classes(t)["is_comm"],
                                                                        norm=kernel_norms(t)),
        ["name", "is_comm"],
        klass=klass,
        name_precision=pl.when(klass == "gemm").then(gemm_name_precision(pl.col("name"), model.meta.vendor))
        .otherwise(None),
    )
    # In a steady step window: by the kernel's GPU start (windows extend to their GPU tail).
    k = assign_steps(k, windows, "ts_ns").with_columns(
        _steady=pl.col("window").is_in(steady).fill_null(False)).drop("window", "step")
    # op dtype: the innermost GEMM/conv CPU op around the launching runtime call. Innermost, not
    # outermost: under autocast aten::linear receives fp32 tensors and casts them before the
    # aten::addmm/mm that launches the kernel with bf16 inputs.
    gemm_ops = model.cpu_ops.filter(contains_by_name(model.cpu_ops, GEMM_OPS_RE) & pl.col("input_types").is_not_null())
    k = k.with_columns(op_dtype=pl.lit(None, pl.String))
    if gemm_ops.height:
        ops = gemm_ops.select("pid", "tid", "ts_ns", "end_ns", _dtype_of(pl.col("input_types")).alias("_dt")
                              ).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        rt = launch_calls(model)
        rt = rt.with_columns(id=deepest_at(ops.select("id", "pid", "tid", "ts_ns", "end_ns"), rt))
        rt = rt.with_columns(_dt=ops["_dt"].gather(rt["id"]))  # ids are row numbers of ops
        k = k.drop("op_dtype").join(rt.select("correlation", pl.col("_dt").alias("op_dtype")), on="correlation",
                                    how="left")
    # Grouped by precision too: normalisation drops template arguments, so one CUTLASS/xmma
    # name can hold fp32 and bf16 instances.
    return (
        k.group_by("norm", "klass", "name_precision")
        .agg(
            op_dtype=pl.col("op_dtype").drop_nulls().mode().sort().first(),
            count=pl.len().cast(pl.Int64),
            total_ns=pl.col("dur_ns").sum().cast(pl.Int64),
            steady_count=pl.col("_steady").sum().cast(pl.Int64),
            steady_ns=pl.col("dur_ns").filter(pl.col("_steady")).sum().cast(pl.Int64),
        )
        .rename({"norm": "name"})
        .sort(["total_ns", "name", "name_precision"], descending=[True, False, False], nulls_last=True)
        .select(list(schema))
    )


def _optimizer_impl(model: TraceModel, rng: pl.DataFrame) -> str:
    """``fused`` / ``foreach`` / ``for-loop`` / ``unknown``, from the ops run inside ``Optimizer.step``
    ranges. Only inside them: ``aten::_fused_sdp_choice``/``_fused_dropout`` (attention, dropout),
    foreach grad clipping and AMP unscaling run outside the optimizer and say nothing about it.
    A fused optimizer kernel op anywhere (``aten::_fused_adamw_`` …) still counts as fused.
    ``rng``: the ``Optimizer.step`` ranges (:func:`_ranges`)."""
    ops = model.cpu_ops
    if ops.filter(contains_by_name(ops, FUSED_OPTIMIZER_RE)).height:
        return "fused"
    if rng.is_empty():
        return "unknown"
    outer = outermost(rng.select("pid", "tid", "ts_ns", "end_ns").with_row_index("ev_order").with_columns(
        pl.col("ev_order").cast(pl.Int64))).with_row_index("rid").with_columns(pl.col("rid").cast(pl.Int64))
    inside = ops.filter(pl.col("name").str.starts_with("aten::_fused_") | pl.col("name").str.starts_with(
        FOREACH_PREFIX)).select("name", "pid", "tid", "ts_ns")
    inside = inside.filter(containing(inside, outer, "ts_ns", "rid").is_not_null())
    names = inside["name"]
    if names.str.starts_with("aten::_fused_").any():
        return "fused"
    if names.str.starts_with(FOREACH_PREFIX).any():
        return "foreach"
    return "for-loop"


def _optimizer(t: TraceTables, windows: pl.DataFrame, ranges: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Optimizer work per window; ``ranges``: ``opt`` and ``zero_grad`` ranges (:func:`_ranges`)."""
    w = windows.select("window", "step", "start_ns", "end_ns")
    out = w.select("window", "step")
    # The columns read below, then the rows: a filter copies every column it is given.
    lj = launches(t).select("pid", "tid", "cpu_ts_ns", "gpu_ts_ns", "gpu_dur_ns", "gpu_name", "activity").filter(
        pl.col("gpu_ts_ns").is_not_null()
    )
    for key in ("opt", "zero_grad"):
        rng = ranges[key].select("pid", "tid", "ts_ns", "end_ns")
        length = window_union_lengths(rng, w) if rng.height else pl.DataFrame(
            schema={"window": pl.Int64, "length_ns": pl.Int64})
        out = out.join(length.rename({"length_ns": f"{key}_ns"}), on="window", how="left")
        if rng.height and lj.height:
            outer = outermost(rng.with_row_index("ev_order").with_columns(pl.col("ev_order").cast(pl.Int64)))
            outer = outer.with_row_index("rid").with_columns(pl.col("rid").cast(pl.Int64))
            inside = lj.with_columns(rid=containing(lj.rename({"cpu_ts_ns": "ts_ns"}), outer, "ts_ns", "rid")).filter(
                pl.col("rid").is_not_null())
            inside = inside.join(outer.select("rid", pl.col("ts_ns").alias("_rs")), on="rid")
            inside = assign_steps(inside.with_columns(_t=pl.col("_rs")), w, "_t")
            fills = (pl.col("activity") == "memset") | (
                (pl.col("activity") == "kernel") & pl.col("gpu_name").str.contains(_FILL_KERNEL_RE))
            agg = inside.filter(pl.col("window").is_not_null()).group_by("window").agg(
                pl.len().cast(pl.Int64).alias(f"{key}_kernels"),
                pl.col("gpu_dur_ns").sum().cast(pl.Int64).alias(f"{key}_gpu_ns"),
                fills.sum().cast(pl.Int64).alias(f"{key}_fills"),
            )
            out = out.join(agg, on="window", how="left")
        else:
            out = out.with_columns(pl.lit(0, pl.Int64).alias(f"{key}_kernels"),
                                   pl.lit(0, pl.Int64).alias(f"{key}_gpu_ns"),
                                   pl.lit(0, pl.Int64).alias(f"{key}_fills"))
    out = out.with_columns(pl.exclude("window", "step").fill_null(0).cast(pl.Int64))
    return out.select(
        "window", "step", "opt_ns", "opt_kernels", "opt_gpu_ns",
        pl.col("zero_grad_ns"), pl.col("zero_grad_fills"), pl.col("zero_grad_kernels"), pl.col("zero_grad_gpu_ns"),
    ).sort("window")


@analysis(
    "ops", depends_on=("steps",), after=("context",), title="Ops, kernel classes and run facts", order=90,
    shared=("gpu_activity", "launches", "comm_classes", "op_nesting", "kernel_norms"),
)
def ops(ctx: AnalysisContext[TraceModel]) -> OpsResult:
    """Run facts (vendor, devices, profiler flags), op counts, data loading, kernel classes and
    GEMM precision, optimizer work per step: the inputs of the recommendation rules."""
    model = ctx.model
    sr = ctx.need("steps", StepsResult)
    windows = sr.table.select("window", "step", "start_ns", "end_ns", "dur_ns")
    gpu = gpu_activity(ctx.tables)
    used = {int(d) for d in gpu["device"].drop_nulls().unique().to_list()}
    devices = []
    for i, p in enumerate(model.meta.device_properties):
        did = p.get("id", i)
        devices.append({
            "id": did, "name": p.get("name"), "total_bytes": p.get("totalGlobalMem"),
            "compute_major": p.get("computeMajor"), "used": did in used,
        })
    overhead = model.other_events.filter(pl.col("cat").str.to_lowercase() == "overhead")
    counts = {t: model.table(t).height for t in ("cpu_ops", "annotations", "python_frames", "runtime", "kernels",
                                                 "memcpy", "memset", "memory_events", "other_events")}
    counts["total"] = sum(counts.values())
    counts["overhead"] = overhead.height
    counts["overhead_ns"] = int(overhead["dur_ns"].sum() or 0)

    both = pl.concat([
        model.cpu_ops.select("name", "dur_ns").with_columns(source=pl.lit("cpu_op")),
        model.annotations.select("name", "dur_ns").with_columns(source=pl.lit("annotation")),
    ])
    op_counts = both.group_by("name", "source").agg(
        count=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum()).sort(
        ["count", "name"], descending=[True, False])
    dp = int(both.filter(pl.col("name") == "DataParallel.forward").height) + int(
        model.python_frames.filter(pl.col("name").str.starts_with("nn.Module: DataParallel_")).height)

    named = _named(model)
    dl = _ranges(named, DATALOADER_RE)
    dl_len = window_union_lengths(dl, windows) if dl.height else pl.DataFrame(
        schema={"window": pl.Int64, "length_ns": pl.Int64})
    dataloader = windows.select("window", "step", "dur_ns").join(
        dl_len.rename({"length_ns": "dataloader_ns"}), on="window", how="left").with_columns(
        pl.col("dataloader_ns").fill_null(0)).select("window", "step", "dataloader_ns", "dur_ns")
    iters = tuple(sorted(set(dl["name"].to_list())))

    opt = _ranges(named, OPTIMIZER_STEP_RE)
    impl = _optimizer_impl(model, opt)
    opt_names = tuple(sorted({
        n.split("#", 1)[1].split(".")[0] for n in opt["name"].unique().to_list() if "#" in n}))
    graph_launches = int(model.runtime.filter(contains_by_name(model.runtime, "GraphLaunch")).height)
    run_ctx = ctx.typed("context", ContextResult)
    if run_ctx is not None:  # one fact, one value: the context analysis decides what "compiled" means
        compiled = bool(run_ctx.compiled)
    else:
        compiled = bool(
            named.filter(contains_by_name(named, COMPILED_RE)).height
            or model.kernels.filter(pl.col("name").str.starts_with("triton_")).height
        )
    return OpsResult(
        vendor=model.meta.vendor,
        devices=tuple(devices),
        profiler_flags=dict(model.meta.profiler_flags),
        event_counts=counts,
        op_counts=op_counts,
        data_parallel=dp,
        dataloader=dataloader,
        dataloader_iters=iters,
        kernel_classes=_kernel_classes(ctx.tables, windows, sr.steady_windows()),
        optimizer=_optimizer(ctx.tables, windows, {"opt": opt, "zero_grad": _ranges(named, OPTIMIZER_ZERO_RE)}),
        optimizer_impl=impl,
        optimizer_names=opt_names,
        compiled=compiled,
        graph_launches=graph_launches,
    )
