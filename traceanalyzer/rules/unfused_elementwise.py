"""Unfused elementwise kernels take a large share of GPU time: fusion (torch.compile) pays.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules unfused_elementwise`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.kernel_sequences import KernelSequencesResult
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, is_compiled, withhold_on_capture
from traceanalyzer.rules._util import fmt_count, ms, n_steady, time_finding, top_rows


@rule("unfused_elementwise", needs=("steps", "ops", "kernels"), severity=Severity.INFO,
      params={"min_pct_of_kernel_time": 30.0, "min_pct_of_count": 50.0, "min_kernels_per_step": 100.0,
              "warning_pct": 50.0, "fusion_savings": 0.5}, uses=("context", "kernel_sequences"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Unfused elementwise kernels take a large share of GPU time: fusion (torch.compile) pays.

    Signal
        ``ops``: kernels classed ``elementwise`` by name (vectorized/unrolled elementwise,
        pointwise functors, fills, copies, activations …) excluding generated ``triton_*``
        kernels (already fused), as a share of kernel time and of kernel count over the steady
        steps.
    Threshold
        elementwise ≥ ``min_pct_of_kernel_time`` (30) % of kernel time, or ≥
        ``min_pct_of_count`` (50) % of kernels with ≥ ``min_kernels_per_step`` (100) per step
        (peers' suggested defaults; the tuning guide says "fuse pointwise ops"). WARNING from
        ``warning_pct`` (50) % of kernel time.
    Cost
        ``fusion_savings`` (0.5) × elementwise time per steady step: fusing a chain of n memory-bound
        kernels reads and writes memory once instead of n times (confidence 0.4).
    Fix
        ``torch.compile(model)``; fused layers (fused LayerNorm/RMSNorm, SDPA, fused optimizers).
        A compiled run (``context``) is told instead that these kernels run eagerly outside its
        compiled regions (graph breaks, fallbacks). Not run on a capture-only trace. The evidence
        cites the largest fusion candidates of ``kernel_sequences`` (memory-bound kernel sequences
        recurring in every step, with the ops that launch them) where it ran.
    """
    withhold_on_capture(results, "the steady kernel mix")
    o = results.need("ops", OpsResult)
    kc = o.kernel_classes
    total, count = float(kc["steady_ns"].sum() or 0), float(kc["steady_count"].sum() or 0)
    if total <= 0:
        return
    ew = kc.filter((pl.col("klass") == "elementwise") & ~pl.col("name").str.starts_with("triton_")
                   & (pl.col("steady_count") > 0))
    e_ns, e_n = float(ew["steady_ns"].sum() or 0), float(ew["steady_count"].sum() or 0)
    n = n_steady(results)
    t_pct, c_pct = e_ns * 100.0 / total, e_n * 100.0 / max(count, 1.0)
    by_count = c_pct >= params.min_pct_of_count and e_n / n >= params.min_kernels_per_step
    if t_pct < params.min_pct_of_kernel_time and not by_count:
        return
    sev = Severity.WARNING if t_pct >= params.warning_pct else Severity.INFO
    ctx = context_of(results)
    if is_compiled(ctx):
        # The triton_* kernels are already left out: these ran eagerly despite compilation.
        fix = ("The code is already compiled, yet these elementwise kernels run eagerly: they sit outside the "
               "compiled regions (graph breaks, uncompiled functions) or in ops Inductor falls back on. Remove the "
               "graph breaks (TORCH_LOGS=graph_breaks), compile the code around them too, and use fused layers "
               "(fused LayerNorm/RMSNorm, scaled_dot_product_attention) and fused/foreach optimizers.")
        hint = "TORCH_LOGS=graph_breaks python train.py  # then compile what runs eagerly"
    else:
        fix = ("Fuse chains of elementwise ops: torch.compile(model) generates one kernel per chain; use fused "
               "layers (fused LayerNorm/RMSNorm, scaled_dot_product_attention) and fused/foreach optimizers.")
        hint = "model = torch.compile(model)"
    evidence = {"elementwise_ms_per_step": ms(e_ns / n), "pct_of_kernel_time": round(t_pct, 1),
                "pct_of_kernels": round(c_pct, 1), "kernels_per_step": round(e_n / n, 1),
                "compiled": o.compiled if ctx is None else bool(ctx.compiled),
                "top_kernels": top_rows(ew.sort("steady_ns", descending=True), 5,
                                        ("name", "steady_count", "steady_ns"))}
    seq = results.typed("kernel_sequences", KernelSequencesResult)
    if seq is not None and seq.fusion_candidates().height:
        evidence["fusion_candidates"] = top_rows(seq.fusion_candidates(), 3, ("ops", "count_per_step", "ns_per_step"))
    yield time_finding(
        "unfused_elementwise", sev,
        f"Elementwise kernels are {t_pct:.0f} % of kernel time and {c_pct:.0f} % of kernels "
        f"({fmt_count(e_n / n)} per step): fuse them",
        evidence, fix, hint,
        params.fusion_savings * e_ns / n, results, confidence=0.4,
    )
