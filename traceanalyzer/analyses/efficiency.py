"""Efficiency: FLOPs and bytes of each operation against the GPU time of its kernels and the
device's peaks (achieved TFLOP/s, GB/s, % of peak, the roof it sits under).

What one row measures
---------------------
* **Operation** (one call): a CPU op with a FLOP/byte model (:mod:`traceanalyzer.analyses._flops`:
  GEMM, convolution, attention, normalisation, softmax, elementwise/reduction, embedding,
  copy) that is not inside another modelled op. Its **work** comes from its own arguments
  (``Input Dims``/``Input type``/``Concrete Inputs``/``Input Strides``), or, when modelled ops of its family
  nest inside it (``scaled_dot_product_attention`` → ``_scaled_dot_product_flash_attention`` →
  ``_flash_attention_forward``), from the innermost ones (under autocast the outer op records
  the fp32 tensors it casts before the inner one runs in bf16). Modelled ops of other families
  inside it (the bmm and softmax of attention's math path, a convolution's bias add) are part
  of it: their kernels count in its time, their work does not count twice.
* **Its time**: the summed duration of the kernels launched inside it (launch call → CPU op by
  correlation and time on the launching thread). Memcpy/memset activity is not counted (a
  host↔device copy is not HBM traffic); an operation without kernels (CPU only, or replayed
  from a CUDA graph, whose launches have no op) has no efficiency figure.
* **Achieved**: TFLOP/s = FLOPs / time; GB/s = bytes / time; arithmetic intensity = FLOPs / byte.
* **Peaks** (:mod:`traceanalyzer.analyses._peaks`): the device from ``deviceProperties`` (or the
  ``device`` setting), its dense peak for the op's unit and precision (matrix work: the tensor
  core peak of its input dtype; fp32 matrix work the TF32 peak when its kernel is a TF32 kernel,
  else the FP32 matrix/SIMT peak; vector work: the FP32 vector peak, FP64 for double) and its
  memory bandwidth. ``pct_of_peak`` = achieved TFLOP/s ÷ that peak; ``pct_of_bandwidth`` =
  achieved GB/s ÷ bandwidth (both % of the device's peak, 100 % = the datasheet figure).
* **Roofline**: the least time the device could take, ``roof_ns = max(FLOPs ÷ peak, bytes ÷
  bandwidth)``; ``bound`` = ``compute`` when the first term is the larger, else ``memory``;
  ``pct_of_roofline`` = roof_ns ÷ time (100 % = at the roof).

Aggregates: per op name and precision (``by_op``), per kernel name for the operations that
launched exactly one kernel (``by_kernel``: a multi-kernel operation's work cannot be split
between its kernels without guessing), per step window (``per_step``), and ``coverage``: the
share of kernel time (whole trace and steady steps) inside modelled operations. Operations
with no model, by the launching op's name and their kernel time (``no_model``), are listed,
never estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._copysync import containing, outermost
from traceanalyzer.analyses._flops import MODELS, work_of_signatures
from traceanalyzer.analyses._kernels import normalize_kernel_names
from traceanalyzer.analyses._peaks import PEAK_KEYS, device_peaks, peak_key, resolve_peak
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import join_unique, launch_calls, op_index

#: NVIDIA kernel names of fp32 GEMMs on TF32 tensor cores (cuBLAS/CUTLASS/cuDNN naming).
TF32_KERNEL_RE = r"(?i)tf32|tensorop_s1688|tensorop_s16816|_s1688gemm|_s16816gemm|xmma.*_tf32"
#: Kernel names of fused attention (FlashAttention, memory-efficient/CUTLASS FMHA, cuDNN SDPA, CK/AOTriton
#: on ROCm, FlashInfer): the ``context`` analysis' list. An attention call with none of them ran the math path.
FUSED_ATTENTION_KERNEL_RE = (r"(?i)flash|fmha|sdpa|efficient_attention|mem_eff|paged_attention|unified_attention"
                             r"|attention_fwd|attn_fwd|attn_bwd|attention_bwd|fused_attn|flashinfer|cudnn.*mha")
_SIG = ["name", "input_dims", "input_types", "concrete_inputs", "input_strides"]
_OP_COLS = ["op", "family", "precision", "unit", "peak_key", "peak_tflops", "calls", "kernels", "kernel_ns",
            "steady_kernel_ns", "flops", "bytes", "tflops", "gb_per_s", "intensity", "pct_of_peak",
            "pct_of_bandwidth", "roof_ns", "steady_roof_ns", "pct_of_roofline", "bound"]


@dataclass(frozen=True)
class EfficiencyResult:
    """See the module docstring. ``ops``: one row per operation (call) with kernels and work
    (``op, family, precision, unit, peak_key, peak_tflops, pid, tid, ts_ns, kernels, kernel_ns,
    main_kernel`` (the longest), ``fused_kernel`` (a fused-attention kernel name among them),
    ``window, steady, flops, bytes, gemm_b/m/n/k, note`` and the achieved columns);
    ``by_op``/``by_kernel``/``per_step``: its aggregates; ``peaks``: the device and the peaks
    used; ``coverage``; ``no_model``; ``n_steady``: steady steps the per-step figures divide by."""

    peaks: dict[str, Any]
    ops: pl.DataFrame
    by_op: pl.DataFrame
    by_kernel: pl.DataFrame
    per_step: pl.DataFrame
    no_model: pl.DataFrame
    coverage: dict[str, Any]
    n_steady: int
    unparsed_calls: int = 0
    no_kernel_calls: int = 0
    top_n: int = 20
    totals: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": {k: self.peaks.get(k) for k in ("device", "trace_name", "matched", "source", "note", "scale",
                                                      "sms")},
            "peaks": {k: self.peaks.get(k) for k in PEAK_KEYS},
            "coverage": self.coverage,
            "totals": self.totals,
            "n_steady": self.n_steady,
            "unparsed_calls": self.unparsed_calls,
            "no_kernel_calls": self.no_kernel_calls,
            "by_op": _records(self.by_op.head(self.top_n)),
            "by_kernel": _records(self.by_kernel.head(self.top_n)),
            "per_step": _records(self.per_step),
            "no_model": _records(self.no_model.head(self.top_n)),
        }

    def summary(self) -> list[tuple[str, str]]:
        p = self.peaks
        dev = p.get("device") or "unknown device"
        out = [("Device peaks", f"{dev} ({p.get('matched')}); bandwidth "
                f"{_fmt(p.get('mem_bw_tbs'), ' TB/s')}, bf16 tensor {_fmt(p.get('bf16_tensor'), ' TFLOP/s')}")]
        cov = self.coverage.get("pct_of_kernel_time")
        out.append(("Modelled kernel time", f"{cov:.0f} % of kernel time is inside ops with a FLOP/byte model"
                    if cov is not None else "no kernel time"))
        t = self.totals
        if t.get("tflops") is not None:
            out.append(("Achieved (modelled ops)", f"{t['tflops']:.1f} TFLOP/s, {t['gb_per_s']:.0f} GB/s over "
                        f"{t['kernel_ns'] / 1e6:.1f} ms of kernel time; {_fmt(t.get('pct_of_roofline'), ' %')} "
                        "of the roofline (time at the roof ÷ time taken)"))
        for r in self.by_op.head(3).iter_rows(named=True):
            out.append((f"  {r['op']} ({r['precision']})",
                        f"{_fmt(r['tflops'], ' TFLOP/s')}, {_fmt(r['pct_of_peak'], ' % of peak')}, "
                        f"{_fmt(r['pct_of_bandwidth'], ' % of bandwidth')}, {r['bound']}-bound"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        # The first seven columns are what the Markdown report has room for.
        shown = ["op", "precision", "kernel_ns", "tflops", "pct_of_peak", "pct_of_bandwidth", "bound", "gb_per_s",
                 "calls", "pct_of_roofline", "peak_key"]
        return {"Efficiency by op": self.by_op.head(self.top_n).select(shown),
                "Efficiency by kernel (single-kernel ops)": self.by_kernel.head(self.top_n).select(["kernel", *shown]),
                "Kernel time with no FLOP/byte model": self.no_model.head(self.top_n)}


def _fmt(v: float | None, unit: str) -> str:
    return "n/a" if v is None else f"{v:,.1f}{unit}"


def _records(df: pl.DataFrame) -> list[dict[str, Any]]:
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in df.iter_rows(named=True)]


def _metrics(df: pl.DataFrame, bw_tbs: float | None) -> pl.DataFrame:
    """Achieved columns of rows with ``flops, bytes, kernel_ns, peak_tflops`` (and ``roof_ns``)."""
    t = pl.col("kernel_ns").cast(pl.Float64)
    bw = pl.lit(bw_tbs, pl.Float64)
    return df.with_columns(
        tflops=pl.when(t > 0).then(pl.col("flops") / t / 1e3),
        gb_per_s=pl.when(t > 0).then(pl.col("bytes") / t),
        intensity=pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")),
    ).with_columns(
        pct_of_peak=pl.when(pl.col("peak_tflops") > 0).then(pl.col("tflops") / pl.col("peak_tflops") * 100),
        pct_of_bandwidth=(pl.col("gb_per_s") / (bw * 1e3) * 100) if bw_tbs else pl.lit(None, pl.Float64),
        pct_of_roofline=pl.when(t > 0).then(pl.col("roof_ns") / t * 100),
    )


def _roof(peak: pl.Expr, bw_tbs: float | None) -> tuple[pl.Expr, pl.Expr]:
    """(roof_ns, bound) of rows with ``flops, bytes``: peak TFLOP/s = 1e3 FLOP/ns, TB/s = 1e3 B/ns."""
    t_c = pl.when(peak > 0).then(pl.col("flops") / (peak * 1e3))
    t_m = (pl.col("bytes") / (bw_tbs * 1e3)) if bw_tbs else pl.lit(None, pl.Float64)
    roof = pl.max_horizontal(t_c, t_m)
    bound = (pl.when(t_c.is_null() & t_m.is_null()).then(pl.lit(None, pl.String))
             .when(t_c.fill_null(0) >= t_m.fill_null(0)).then(pl.lit("compute")).otherwise(pl.lit("memory")))
    return roof, bound


def _leaves(mod: pl.DataFrame) -> pl.Series:
    """True per row of ``mod`` (``id, family, pid, tid, ts_ns, end_ns``) for an op with no modelled op of
    its own family inside it (ops of a family nest as a chain, so the next one to start is the test)."""
    s = mod.select("id", "family", "pid", "tid", "ts_ns", "end_ns").sort(
        ["family", "pid", "tid", "ts_ns", "end_ns", "id"], descending=[False, False, False, False, True, False])
    nxt = pl.col("ts_ns").shift(-1).over(["family", "pid", "tid"])
    nxt_id_later = nxt.is_not_null() & (nxt < pl.col("end_ns")) & (pl.col("end_ns") > pl.col("ts_ns"))
    flags = s.select("id", leaf=~nxt_id_later.fill_null(False))
    return mod.select("id").join(flags, on="id", how="left", maintain_order="left")["leaf"].fill_null(True)


@analysis(
    "efficiency", depends_on=("steps",), title="Kernel efficiency (FLOPs, bytes, roofline)", order=95,
    shared=("op_nesting",),
    params={"device": "", "top_n": 20, **{k: 0.0 for k in PEAK_KEYS}},
)
def efficiency(ctx: AnalysisContext[TraceModel]) -> EfficiencyResult:
    """Achieved TFLOP/s and GB/s of each modelled operation against the device's peaks."""
    model = ctx.model
    sr = ctx.need("steps", StepsResult)
    if model.kernels.is_empty():
        raise NotApplicable("the trace has no kernels")
    ops = model.cpu_ops.select("name", "pid", "tid", "ts_ns", "end_ns", *_SIG[1:]).with_row_index("id").with_columns(
        pl.col("id").cast(pl.Int64))
    mod = ops.filter(pl.col("name").is_in(list(MODELS)))
    if mod.is_empty() or mod["input_dims"].null_count() == mod.height:
        raise NotApplicable("no operation with recorded shapes and a FLOP/byte model (profile with "
                            "record_shapes=True)")
    props = _busiest_device_props(model)
    overrides = {k: float(getattr(ctx.params, k)) for k in PEAK_KEYS}
    peaks = device_peaks(props, str(ctx.params.device), overrides)
    bw = peaks.get("mem_bw_tbs")

    # Work per distinct signature, then per op.
    sigs = work_of_signatures(mod.select(_SIG).unique(maintain_order=True))
    mod = mod.join(sigs, on=_SIG, how="left", nulls_equal=True, maintain_order="left")
    mod = mod.with_columns(leaf=_leaves(mod))
    # Operations: the outermost modelled ops.
    groups = outermost(mod.select("id", "pid", "tid", "ts_ns", "end_ns").with_columns(ev_order=pl.col("id")))
    groups = mod.filter(pl.col("id").is_in(groups["id"].implode()))
    leaves = mod.filter(pl.col("leaf"))
    leaves = leaves.with_columns(gid=containing(leaves, groups.rename({"id": "gid"}), "ts_ns", "gid"))
    gfam = groups.select(pl.col("id").alias("gid"), pl.col("family").alias("gfam"), pl.col("name").alias("op"))
    leaves = leaves.join(gfam, on="gid", how="inner").filter(pl.col("family") == pl.col("gfam"))
    gwork = leaves.sort("flops", descending=True, nulls_last=True).group_by("gid").agg(
        flops=pl.col("flops").sum(), bytes=pl.col("bytes").sum(), unparsed=pl.col("flops").is_null().any(),
        precision=pl.col("precision").first(), unit=pl.col("unit").first(),
        note=pl.col("note").filter(pl.col("note") != "").first(),
        gemm_b=pl.col("gemm_b").first(), gemm_m=pl.col("gemm_m").first(), gemm_n=pl.col("gemm_n").first(),
        gemm_k=pl.col("gemm_k").first(),
    )

    # Kernels → the operation around their launch call.
    rt = launch_calls(model).rename({"ts_ns": "launch_ns"})
    k = join_unique(model.kernels.select("name", "ts_ns", "dur_ns", "correlation"), rt, "correlation")
    k = k.with_columns(gid=containing(k, groups.select(pl.col("id").alias("gid"), "pid", "tid", "ts_ns", "end_ns"),
                                      "launch_ns", "gid"))
    k = assign_steps(k, sr, "ts_ns")
    steady_ids = sr.steady_windows()
    k = k.with_columns(steady=pl.col("window").is_in(steady_ids).fill_null(False))
    total_ns = int(k["dur_ns"].sum() or 0)
    steady_total = int(k.filter(pl.col("steady"))["dur_ns"].sum() or 0)

    per_group = k.filter(pl.col("gid").is_not_null()).sort("dur_ns", descending=True).group_by("gid").agg(
        kernels=pl.len().cast(pl.Int64), kernel_ns=pl.col("dur_ns").sum().cast(pl.Int64),
        main_kernel=pl.col("name").first(), first_ns=pl.col("ts_ns").min(),
        fused_kernel=pl.col("name").str.contains(FUSED_ATTENTION_KERNEL_RE).any(),
    )
    first = k.filter(pl.col("gid").is_not_null()).sort("ts_ns").group_by("gid").agg(
        window=pl.col("window").first(), step=pl.col("step").first(), steady=pl.col("steady").first())
    rows = (groups.select(pl.col("id").alias("gid"), pl.col("name").alias("op"), "family", "pid", "tid", "ts_ns")
            .join(gwork, on="gid", how="left").join(per_group, on="gid", how="left").join(first, on="gid", how="left"))
    modelled_ns = int(rows["kernel_ns"].fill_null(0).sum() or 0)
    unparsed = int(rows.filter(pl.col("unparsed").fill_null(True) & pl.col("kernel_ns").is_not_null()).height)
    no_kernel = int(rows.filter(pl.col("kernel_ns").is_null() & pl.col("flops").is_not_null()).height)
    rows = rows.filter(pl.col("kernel_ns").is_not_null() & (pl.col("kernel_ns") > 0) & pl.col("flops").is_not_null()
                       & ~pl.col("unparsed"))
    rows = _with_peaks(rows, peaks, model.meta.vendor).with_columns(pl.col("bytes").round().cast(pl.Int64))
    roof, bound = _roof(pl.col("peak_tflops"), bw)
    rows = _metrics(rows.with_columns(roof_ns=roof.round().cast(pl.Int64), bound=bound), bw)

    by_op = _by_op(rows, bw)
    by_kernel = _by_kernel(rows, bw)
    per_step = _per_step(rows, k, bw)
    no_model = _no_model(ctx, model, k)
    steady_modelled = int(k.filter(pl.col("steady") & pl.col("gid").is_not_null())["dur_ns"].sum() or 0)
    coverage = {
        "kernel_ns": total_ns, "modelled_kernel_ns": modelled_ns,
        "pct_of_kernel_time": round(100.0 * modelled_ns / total_ns, 2) if total_ns else None,
        "steady_kernel_ns": steady_total, "steady_modelled_kernel_ns": steady_modelled,
        "steady_pct_of_kernel_time": round(100.0 * steady_modelled / steady_total, 2) if steady_total else None,
    }
    tot = rows.select(flops=pl.col("flops").sum(), bytes=pl.col("bytes").sum(), kernel_ns=pl.col("kernel_ns").sum(),
                      roof_ns=pl.col("roof_ns").sum()).row(0, named=True)
    kns = float(tot["kernel_ns"] or 0)
    totals = {
        "ops": rows.height, "flops": float(tot["flops"] or 0), "bytes": int(tot["bytes"] or 0),
        "kernel_ns": int(kns),
        "tflops": round(float(tot["flops"] or 0) / kns / 1e3, 3) if kns else None,
        "gb_per_s": round(float(tot["bytes"] or 0) / kns, 3) if kns else None,
        "pct_of_roofline": round(100.0 * float(tot["roof_ns"] or 0) / kns, 2) if kns and tot["roof_ns"] else None,
    }
    return EfficiencyResult(
        peaks=peaks, ops=rows, by_op=by_op, by_kernel=by_kernel, per_step=per_step, no_model=no_model,
        coverage=coverage, n_steady=max(len(steady_ids), 1), unparsed_calls=unparsed, no_kernel_calls=no_kernel,
        top_n=int(ctx.params.top_n), totals=totals,
    )


def _busiest_device_props(model: TraceModel) -> dict[str, Any] | None:
    """``deviceProperties`` of the device with the most kernel time (the first listed when none matches)."""
    props = list(model.meta.device_properties)
    if not props:
        return None
    busy = model.kernels.group_by("device").agg(ns=pl.col("dur_ns").sum()).sort("ns", descending=True)
    for dev in busy["device"].to_list():
        for i, p in enumerate(props):
            if p.get("id", i) == dev:
                return p
    return props[0]


def _with_peaks(rows: pl.DataFrame, peaks: dict[str, Any], vendor: str) -> pl.DataFrame:
    """``peak_key``/``peak_tflops`` per operation (distinct unit, precision and TF32-ness)."""
    tf32 = (pl.lit(vendor == "nvidia") & (pl.col("precision") == "fp32") & (pl.col("unit") == "matrix")
            & pl.col("main_kernel").str.contains(TF32_KERNEL_RE))
    rows = rows.with_columns(_tf32=tf32.fill_null(False))
    combos = rows.select("unit", "precision", "_tf32").unique()
    keyed = [(u, p, t, *resolve_peak(peaks, peak_key(u, p, t))) for u, p, t in combos.iter_rows()]
    table = pl.DataFrame(keyed, schema={"unit": pl.String, "precision": pl.String, "_tf32": pl.Boolean,
                                        "peak_key": pl.String, "peak_tflops": pl.Float64}, orient="row")
    return rows.join(table, on=["unit", "precision", "_tf32"], how="left", nulls_equal=True).drop("_tf32")


def _agg(df: pl.DataFrame, keys: list[str], bw: float | None) -> pl.DataFrame:
    roof, bound = _roof(pl.col("peak_tflops"), bw)
    out = df.group_by(keys).agg(
        calls=pl.len().cast(pl.Int64), kernels=pl.col("kernels").sum().cast(pl.Int64),
        kernel_ns=pl.col("kernel_ns").sum().cast(pl.Int64),
        steady_kernel_ns=pl.col("kernel_ns").filter(pl.col("steady")).sum().cast(pl.Int64),
        flops=pl.col("flops").sum(), bytes=pl.col("bytes").sum().cast(pl.Int64),
        roof_ns=pl.col("roof_ns").sum().cast(pl.Int64),
        steady_roof_ns=pl.col("roof_ns").filter(pl.col("steady")).sum().cast(pl.Int64),
    ).with_columns(bound=bound.alias("bound"))
    return _metrics(out, bw).sort(["kernel_ns", *keys], descending=[True, *([False] * len(keys))])


def _by_op(rows: pl.DataFrame, bw: float | None) -> pl.DataFrame:
    return _agg(rows, ["op", "family", "precision", "unit", "peak_key", "peak_tflops"], bw).select(_OP_COLS)


def _by_kernel(rows: pl.DataFrame, bw: float | None) -> pl.DataFrame:
    single = rows.filter(pl.col("kernels") == 1).with_columns(kernel=normalize_kernel_names(pl.col("main_kernel")))
    cols = ["kernel", *_OP_COLS]
    return _agg(single, ["kernel", "op", "family", "precision", "unit", "peak_key", "peak_tflops"], bw).select(cols)


def _per_step(rows: pl.DataFrame, k: pl.DataFrame, bw: float | None) -> pl.DataFrame:
    """Per step window: modelled work and time, achieved rates, kernel time of the window."""
    total = k.filter(pl.col("window").is_not_null()).group_by("window", "step").agg(
        window_kernel_ns=pl.col("dur_ns").sum().cast(pl.Int64))
    per = rows.filter(pl.col("window").is_not_null()).group_by("window").agg(
        steady=pl.col("steady").first(), ops=pl.len().cast(pl.Int64), flops=pl.col("flops").sum(),
        bytes=pl.col("bytes").sum().cast(pl.Int64), kernel_ns=pl.col("kernel_ns").sum().cast(pl.Int64),
        roof_ns=pl.col("roof_ns").sum().cast(pl.Int64))
    out = total.join(per, on="window", how="left").with_columns(peak_tflops=pl.lit(None, pl.Float64))
    out = _metrics(out, bw).drop("peak_tflops", "pct_of_peak")
    return out.sort("window").select("window", "step", "steady", "ops", "window_kernel_ns", "kernel_ns", "flops",
                                     "bytes", "tflops", "gb_per_s", "pct_of_bandwidth", "roof_ns", "pct_of_roofline")


def _no_model(ctx: AnalysisContext[TraceModel], model: TraceModel, k: pl.DataFrame) -> pl.DataFrame:
    """Kernel time launched outside every modelled op, by the innermost CPU op around the launch."""
    rest = k.filter(pl.col("gid").is_null())
    schema = {"op": pl.String, "kernels": pl.Int64, "kernel_ns": pl.Int64, "steady_kernel_ns": pl.Int64}
    if rest.is_empty():
        return pl.DataFrame(schema=schema)
    launched = rest.filter(pl.col("launch_ns").is_not_null())
    ids = op_index(ctx.tables).lookup(launched.select("pid", "tid", pl.col("launch_ns").alias("ts_ns")))
    names = model.cpu_ops["name"]
    op = pl.Series("op", [None] * launched.height, dtype=pl.String)
    if launched.height:
        inside = ids.is_not_null()
        op = pl.select(pl.when(inside).then(names.gather(ids.fill_null(0))).otherwise(
            pl.lit("(launched outside any CPU op)"))).to_series()
    named = pl.concat([
        launched.select("dur_ns", "steady").with_columns(op=op),
        rest.filter(pl.col("launch_ns").is_null()).select("dur_ns", "steady").with_columns(
            op=pl.lit("(no launch call: graph replay or not captured)")),
    ])
    return named.group_by("op").agg(
        kernels=pl.len().cast(pl.Int64), kernel_ns=pl.col("dur_ns").sum().cast(pl.Int64),
        steady_kernel_ns=pl.col("dur_ns").filter(pl.col("steady")).sum().cast(pl.Int64),
    ).sort(["kernel_ns", "op"], descending=[True, False]).select(list(schema))
