"""GPU counters: CUPTI range-profiler metrics per kernel, joined to the ops that launched them
(HTA's CUPTI counter analysis).

Input
-----
A trace made in CUPTI range-profiler mode (``torch.profiler`` with
``experimental_config=_ExperimentalConfig(profiler_metrics=[...], profiler_measure_per_kernel=True)``)
holds one ``cuda_profiler_range`` event per kernel, its counters in ``args`` (the loader keeps
them as JSON text in ``other_events.args``); the kernels themselves are not recorded as kernel
events (``n_kernel_events`` 0: the GPU-time analyses see no device activity), and the events carry
no correlation id.

Definitions
-----------
* **Join to the launch** (HTA's): the k-th counter event (by start) belongs to the k-th kernel
  launch call (runtime/driver calls named ``*LaunchKernel*``, by start). When the two counts
  differ the join would be a guess: the counters are reported without launching ops
  (``aligned`` false, ``note`` says why).
* ``cpu_op``: the deepest CPU op around the launch call (HTA's bottom-level op); ``top_op``: the
  outermost one on that thread (HTA's top-level op).
* **Named metrics**, from the first counter present among the Nsight Compute names for each
  (all percentages of the device's peak, as CUPTI reports them):
  ``sm_efficiency_pct`` (``smsp__cycles_active.avg.pct_of_peak_sustained_elapsed``: % of time
  the SMs had work), ``achieved_occupancy_pct``
  (``sm__warps_active.avg.pct_of_peak_sustained_active``: active warps as % of the SM's
  maximum), ``dram_throughput_pct`` (``dram__throughput.avg.pct_of_peak_sustained_elapsed``),
  ``tensor_pipe_pct`` (``sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active``:
  tensor-core pipe busy). See :data:`NAMED` for every accepted spelling.
* **FLOPs** from the SASS instruction counters
  (``smsp__sass_thread_inst_executed_op_{h,f,d}{add,mul,fma}_pred_on.sum``): add + mul + 2 × fma,
  per precision (``flops_fp16``, ``flops_fp32``, ``flops_fp64``) and in all (``flops``). Tensor-core
  (HMMA) work is not in these counters. No FLOP rate is derived: ``range_dur_ns``, the range's
  duration, includes the profiler's kernel replays.
* ``per_kernel``: one row per counter event (normalised kernel name, ops, named metrics, FLOPs;
  every raw counter in ``counters``); ``by_op``: per ``cpu_op``, kernels, FLOPs summed and the named
  metrics averaged over its kernels (unweighted: durations are replay-inflated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._kernels import normalize_kernel_names
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import cover_index, op_index, op_top_level

COUNTER_CAT = "cuda_profiler_range"
#: Named metric → the counter names that give it, in order of preference.
NAMED: dict[str, tuple[str, ...]] = {
    "sm_efficiency_pct": ("smsp__cycles_active.avg.pct_of_peak_sustained_elapsed",
                          "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "dram_throughput_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "tensor_pipe_pct": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                        "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active"),
}
_PRECISIONS = {"h": "flops_fp16", "f": "flops_fp32", "d": "flops_fp64"}
_SASS = "smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
_PER_KERNEL_JSON_CAP = 5000  # rows of per_kernel in to_json (range profiling is used on short runs)


@dataclass(frozen=True)
class CountersResult:
    """Per-kernel CUPTI counters joined to their launching ops. See the module docstring."""

    metrics: tuple[str, ...]  # raw counter names present
    named: tuple[str, ...]  # named metrics available (NAMED keys, then flops columns)
    per_kernel: pl.DataFrame  # k, name, cpu_op, top_op, range_dur_ns, <named>, <raw counters>
    by_op: pl.DataFrame
    aligned: bool
    n_launches: int
    note: str | None
    n_kernel_events: int = 0  # kernel events of the trace (none in range-profiler mode)

    def to_json(self) -> dict[str, Any]:
        raw = [m for m in self.metrics if m in self.per_kernel.columns]
        base = self.per_kernel.drop(raw).head(_PER_KERNEL_JSON_CAP)
        counters = self.per_kernel.select(raw).head(_PER_KERNEL_JSON_CAP).to_dicts() if raw else []
        rows = [dict(r, counters=c) for r, c in zip(base.to_dicts(), counters or [{}] * base.height)]
        return {"metrics": list(self.metrics), "named": list(self.named), "n_kernels": self.per_kernel.height,
                "n_launches": self.n_launches, "aligned": self.aligned, "note": self.note,
                "n_kernel_events": self.n_kernel_events,
                "per_kernel": rows, "by_op": self.by_op.to_dicts()}

    def summary(self) -> list[tuple[str, str]]:
        out = [("Kernels with counters", f"{self.per_kernel.height:,} ({len(self.metrics)} counters each)")]
        if self.note:
            out.append(("Join to launches", self.note))
        if not self.n_kernel_events:
            out.append(("Kernel events", "none: in range-profiler mode the kernels are recorded only as counter "
                                         "ranges, so the GPU-time analyses see no device activity"))
        for m in self.named:
            col = self.per_kernel[m].drop_nulls()
            if col.len() and m.endswith("_pct"):
                out.append((m.removesuffix("_pct").replace("_", " "),
                            f"mean {float(col.mean()):.1f} % of peak over kernels"))  # type: ignore[arg-type]
        if "flops" in self.named:
            out.append(("FLOPs counted (SASS, no tensor cores)", f"{int(self.per_kernel['flops'].sum()):,}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        raw = [m for m in self.metrics if m in self.per_kernel.columns]
        return {"Counters per launching op": self.by_op, "Counters per kernel": self.per_kernel.drop(raw).head(50)}


def _launch_ops(ctx: AnalysisContext[TraceModel], calls: pl.DataFrame) -> pl.DataFrame:
    """``cpu_op`` (deepest) and ``top_op`` (outermost) around each call (``pid, tid, ts_ns``)."""
    ops = ctx.model.cpu_ops
    if ops.is_empty():
        return calls.select(cpu_op=pl.lit(None, pl.String), top_op=pl.lit(None, pl.String))
    pts = calls.select("pid", "tid", "ts_ns")
    deepest = ops["name"].gather(op_index(ctx.tables).lookup(pts))
    top = ops.select("name", "pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(
        pl.col("id").cast(pl.Int64)).filter(op_top_level(ctx.tables))
    top_id = cover_index(top.select("id", "ts_ns", "end_ns", "pid", "tid")).lookup(pts) if top.height else None
    top_name = (ops["name"].gather(top_id) if top_id is not None
                else pl.Series("top_op", [None] * calls.height, pl.String))
    return pl.DataFrame({"cpu_op": deepest, "top_op": top_name})


@analysis("counters", input="trace", title="GPU counters (CUPTI)", order=45, shared=("op_nesting", "op_top_level"))
def counters(ctx: AnalysisContext[TraceModel]) -> CountersResult:
    """CUPTI range-profiler counters per kernel (SM efficiency, occupancy, DRAM, tensor pipe, FLOPs) by op."""
    model = ctx.model
    ev = model.other_events.filter((pl.col("cat") == COUNTER_CAT) & pl.col("args").is_not_null()).sort(
        "ts_ns", maintain_order=True)
    if ev.is_empty():
        raise NotApplicable("no CUPTI counter events (cuda_profiler_range): profile with "
                            "_ExperimentalConfig(profiler_metrics=[...], profiler_measure_per_kernel=True)")
    decoded = ev["args"].str.json_decode(infer_schema_length=None)
    raw = decoded.struct.unnest() if isinstance(decoded.dtype, pl.Struct) else pl.DataFrame()
    numeric = [c for c, t in raw.schema.items() if t.is_numeric()]
    raw = raw.select(pl.col(numeric).cast(pl.Float64))
    metrics = tuple(sorted(numeric))
    named_cols: list[pl.Expr] = []
    named: list[str] = []
    for name, sources in NAMED.items():
        src = next((s for s in sources if s in numeric), None)
        if src is not None:
            named_cols.append(pl.col(src).round(3).alias(name))
            named.append(name)
    flop_cols: list[str] = []
    for p, col in _PRECISIONS.items():
        parts = [_SASS.format(p=p, op=op) for op in ("add", "mul", "fma")]
        if any(c in numeric for c in parts):
            add, mul, fma = (pl.col(c).fill_null(0) if c in numeric else pl.lit(0.0) for c in parts)
            named_cols.append((add + mul + 2 * fma).cast(pl.Int64).alias(col))
            flop_cols.append(col)
    base = ev.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("k"),
                     normalize_kernel_names(pl.col("name")).alias("name"), pl.col("dur_ns").alias("range_dur_ns"))
    per_kernel = pl.concat([base, raw], how="horizontal")
    per_kernel = per_kernel.with_columns(named_cols) if named_cols else per_kernel
    if flop_cols:
        per_kernel = per_kernel.with_columns(flops=pl.sum_horizontal(flop_cols))
    named += flop_cols + (["flops"] if flop_cols else [])

    calls = model.runtime.filter(pl.col("name").str.contains("LaunchKernel")).sort("ts_ns", maintain_order=True)
    aligned = calls.height == ev.height
    note = None
    if aligned:
        ops = _launch_ops(ctx, calls)
    else:
        ops = pl.DataFrame({"cpu_op": [None] * ev.height, "top_op": [None] * ev.height},
                           schema={"cpu_op": pl.String, "top_op": pl.String})
        note = (f"{ev.height:,} counter events but {calls.height:,} kernel launch calls: the k-th event cannot be "
                "matched to the k-th launch, launching ops left out")
    per_kernel = pl.concat([per_kernel.select("k", "name"), ops, per_kernel.drop("k", "name")], how="horizontal")
    by_op = (
        per_kernel.with_columns(pl.col("cpu_op").fill_null("<no launching CPU op>"))
        .group_by("cpu_op")
        .agg([pl.len().cast(pl.Int64).alias("kernels"), pl.col("name").mode().sort().first().alias("top_kernel"),
              *[pl.col(c).sum().alias(c) for c in named if c.startswith("flops")],
              *[pl.col(c).mean().round(3).alias(c) for c in named if c.endswith("_pct")]])
        .sort(["flops" if "flops" in named else "kernels", "cpu_op"], descending=[True, False])
    )
    return CountersResult(metrics=metrics, named=tuple(named), per_kernel=per_kernel, by_op=by_op, aligned=aligned,
                          n_launches=calls.height, note=note, n_kernel_events=model.kernels.height)
