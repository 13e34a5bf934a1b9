"""GEMMs far below their precision's peak, with the likely reason read from their shapes.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules gemm_efficiency`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, withhold_on_capture
from traceanalyzer.rules._util import ms, pct_of_step, time_finding


def shape_reason(b: int | None, m: int | None, n: int | None, k: int | None, tiny: int, skinny: int) -> str:
    """The likely reason a GEMM of these dims runs below peak ("" when the shapes look fine)."""
    if m is None or n is None or k is None:
        return ""
    dims = {"M": m, "N": n, "K": k}
    small = [f"{d}={v}" for d, v in dims.items() if v < tiny]
    if small:
        return "tiny dimension (" + ", ".join(small) + "): too little work to fill the GPU"
    if (b or 1) > 1 and min(m, n) < skinny:
        return f"batch of {b} skinny GEMMs (min(M, N) = {min(m, n)})"
    odd = [f"{d}={v}" for d, v in dims.items() if v % 8]
    if odd:
        return "dimension not a multiple of 8 (" + ", ".join(odd) + "): tensor cores need padded tiles"
    if any(v % 64 for v in dims.values()):
        return "dimensions not multiples of 64: partial tiles waste part of each wave"
    return ""


@rule("gemm_efficiency", needs=("steps", "efficiency"), uses=("context",), severity=Severity.WARNING,
      params={"max_pct_of_peak": 30.0, "target_pct_of_roofline": 60.0, "min_pct_of_step": 2.0,
              "min_kernel_us": 3.0, "tiny_dim": 64, "skinny_dim": 128})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """GEMMs (``mm``/``addmm``/``bmm``/``baddbmm``/``_scaled_mm``) far below their precision's peak.

    Signal
        ``efficiency``: per GEMM op name and precision over the steady steps, achieved TFLOP/s
        against the device's dense tensor-core peak for that precision (``pct_of_peak``), and the
        roofline time (``roof_ns``: the least time the device could take for those FLOPs and bytes).
        The likely reason is read from the shapes of the calls holding the most time: a tiny M, N
        or K (< ``tiny_dim``, 64), a batch of skinny GEMMs (min(M, N) < ``skinny_dim``, 128), a
        dimension not a multiple of 8 (no full tensor-core tiles), or not a multiple of 64.
        Withheld on a capture-only trace (``context.capture_only``): kernels recorded under
        stream capture did not run.
    Threshold
        ``pct_of_peak`` < ``max_pct_of_peak`` (30) % and the saving below ≥ ``min_pct_of_step``
        (2) % of the median step.
    Cost
        The GEMM time per steady step that running at ``target_pct_of_roofline`` (60) % of the
        roofline would save: Σ over calls of max(0, time − max(roof time ÷ 0.6, kernels ×
        ``min_kernel_us`` (3 µs))), ÷ steady steps. 60 % is what well-shaped cuBLAS/hipBLASLt GEMMs
        reach; no kernel runs in less than a few µs, so tiny GEMMs are held to that floor, not to
        their roof. Confidence 0.5: the roofline ignores wave quantisation.
    Fix
        Pad M/N/K to multiples of 8 (better 64): vocabulary and hidden sizes, batch × sequence;
        batch small GEMMs together (one bmm or a grouped GEMM instead of many skinny ones);
        run larger batches. A compiled run (``context.compiled``) can try
        ``torch.compile(mode="max-autotune")`` for its GEMM templates.
    """
    withhold_on_capture(results, "GEMM efficiency")  # kernels recorded under capture did not run
    e = results.need("efficiency", EfficiencyResult)
    if not e.peaks.get("bf16_tensor") and not e.peaks.get("fp32"):
        return  # no device peaks: nothing to hold the GEMMs to
    gemms = e.ops.filter((pl.col("family") == "gemm") & pl.col("steady") & pl.col("peak_tflops").is_not_null())
    if gemms.is_empty():
        return
    frac = max(float(params.target_pct_of_roofline), 1.0) / 100.0
    floor = pl.col("kernels") * float(params.min_kernel_us) * 1e3  # no kernel runs in less than a few µs
    target = pl.max_horizontal(pl.col("roof_ns") / frac, floor)
    gemms = gemms.with_columns(saving_ns=(pl.col("kernel_ns") - target).clip(lower_bound=0))
    by = gemms.group_by("op", "precision").agg(
        calls=pl.len(), kernel_ns=pl.col("kernel_ns").sum(), flops=pl.col("flops").sum(),
        peak=pl.col("peak_tflops").first(), saving_ns=pl.col("saving_ns").sum(),
    ).with_columns(pct_of_peak=pl.col("flops") / pl.col("kernel_ns") / 1e3 / pl.col("peak") * 100).sort(
        "saving_ns", descending=True)
    low = by.filter(pl.col("pct_of_peak") < params.max_pct_of_peak)
    if low.is_empty():
        return
    n = e.n_steady
    saving = float(low["saving_ns"].sum()) / n
    pct = pct_of_step(saving, results)
    if pct is None or pct < params.min_pct_of_step:
        return
    # The reason from the heaviest shapes of the worst ops.
    worst = gemms.join(low.select("op", "precision"), on=["op", "precision"]).group_by(
        "op", "gemm_b", "gemm_m", "gemm_n", "gemm_k").agg(saving_ns=pl.col("saving_ns").sum(),
                                                            kernel_ns=pl.col("kernel_ns").sum(), calls=pl.len(),
                                                            tflops=(pl.col("flops").sum() / pl.col("kernel_ns").sum()
                                                                    / 1e3)).sort("saving_ns", descending=True)
    shapes = []
    for r in worst.head(5).iter_rows(named=True):
        shapes.append({"op": r["op"], "batch": r["gemm_b"], "M": r["gemm_m"], "N": r["gemm_n"], "K": r["gemm_k"],
                       "calls": r["calls"], "ms_per_step": ms(r["kernel_ns"] / n),
                       "tflops": round(float(r["tflops"]), 2),
                       "likely_reason": shape_reason(r["gemm_b"], r["gemm_m"], r["gemm_n"], r["gemm_k"],
                                                     int(params.tiny_dim), int(params.skinny_dim))
                       or "shapes look fine: check the kernel choice and launch overhead"})
    ctx = context_of(results)
    compiled = bool(ctx is not None and ctx.compiled)
    top = low.row(0, named=True)
    fix = ("Pad GEMM dimensions to multiples of 8 (better 64) — vocabulary, hidden and batch × sequence sizes —, "
           "batch many small GEMMs into one bmm or a grouped GEMM, and run larger batches.")
    fix += (" The run is compiled: torch.compile(mode=\"max-autotune\") autotunes the GEMM templates."
            if compiled else " torch.compile can fuse the small GEMMs' neighbours and pad shapes for you.")
    yield time_finding(
        "gemm_efficiency", Severity.WARNING,
        f"GEMMs run at {top['pct_of_peak']:.0f} % of the {top['precision']} peak ({top['op']}); reaching "
        f"{frac * 100:.0f} % of the roofline would save {ms(saving)} ms/step",
        {"device": e.peaks.get("device"),
         "ops": [{"op": r["op"], "precision": r["precision"], "calls_per_step": round(r["calls"] / n, 2),
                  "ms_per_step": ms(r["kernel_ns"] / n), "pct_of_peak": round(float(r["pct_of_peak"]), 2),
                  "peak_tflops": r["peak"], "saving_ms_per_step": ms(r["saving_ns"] / n)}
                 for r in low.head(5).iter_rows(named=True)],
         "heaviest_shapes": shapes, "target_pct_of_roofline": frac * 100, "compiled": compiled},
        fix,
        "# pad: nn.Linear(4097, 1000) -> nn.Linear(4104, 1024); tokens per batch a multiple of 64",
        saving, results, confidence=0.5,
    )
