"""Attention calls that ran PyTorch's math path (unfused bmm + softmax kernels) instead of a fused kernel.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules attention_math_fallback`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import withhold_on_capture
from traceanalyzer.rules._util import ms, pct_of_step, time_finding


@rule("attention_math_fallback", needs=("steps", "efficiency"), uses=("context",), severity=Severity.WARNING,
      params={"target_pct_of_roofline": 50.0, "min_pct_of_step": 1.0})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """``scaled_dot_product_attention`` calls that ran the math path: no fused attention kernel.

    Signal
        ``efficiency``: attention calls (``aten::scaled_dot_product_attention``,
        ``_scaled_dot_product_attention_math`` …) of the steady steps none of whose kernels is a
        fused attention kernel (``fused_kernel``: FlashAttention, memory-efficient/CUTLASS FMHA,
        cuDNN SDPA, CK/AOTriton, FlashInfer names): PyTorch fell back to the math backend, which
        writes the N_q × N_kv scores to memory and runs bmm, softmax and bmm separately. (Attention
        written by hand as bmm + softmax, with no SDPA call at all, is ``unfused_attention``'s.)
        Withheld on a capture-only trace (``context.capture_only``): kernels recorded under
        stream capture did not run.
    Threshold
        The saving below ≥ ``min_pct_of_step`` (1) % of the median step.
    Cost
        The time per steady step that the same attention at ``target_pct_of_roofline`` (50) % of
        its roofline would take less: Σ max(0, time − roof time ÷ 0.5) ÷ steady steps; the roofline
        counts the fused kernel's FLOPs and its minimum traffic (Q, K, V read, O written); fused
        kernels reach 50–70 % of the tensor-core peak. Confidence 0.6.
    Fix
        Find why SDPA fell back (``torch.backends.cuda.flash_sdp_enabled()``; run once under
        ``with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):`` to get the reason as
        an error): fp32 inputs (use bf16/fp16 autocast), an explicit ``attn_mask`` where
        ``is_causal=True`` would do, a head dimension the kernels do not support (> 256, not a
        multiple of 8), non-contiguous q/k/v, or a GPU/ROCm build without flash kernels.
    """
    withhold_on_capture(results, "attention efficiency")  # kernels recorded under capture did not run
    e = results.need("efficiency", EfficiencyResult)
    rows = e.ops.filter((pl.col("family") == "attention") & pl.col("steady") & ~pl.col("fused_kernel")
                        & pl.col("roof_ns").is_not_null())
    if rows.is_empty():
        return
    frac = max(float(params.target_pct_of_roofline), 1.0) / 100.0
    rows = rows.with_columns(saving_ns=(pl.col("kernel_ns") - pl.col("roof_ns") / frac).clip(lower_bound=0))
    n = e.n_steady
    saving = float(rows["saving_ns"].sum()) / n
    pct = pct_of_step(saving, results)
    if pct is None or pct < params.min_pct_of_step:
        return
    by = rows.group_by("op", "precision").agg(
        calls=pl.len(), kernel_ns=pl.col("kernel_ns").sum(), kernels=pl.col("kernels").sum(),
        saving_ns=pl.col("saving_ns").sum(), tflops=pl.col("flops").sum() / pl.col("kernel_ns").sum() / 1e3,
        main_kernel=pl.col("main_kernel").mode().first(),
    ).sort("saving_ns", descending=True)
    top = by.row(0, named=True)
    yield time_finding(
        "attention_math_fallback", Severity.WARNING,
        f"{top['op']} ran the unfused math path ({top['precision']}, no fused attention kernel): "
        f"{ms(float(by['kernel_ns'].sum()) / n)} ms/step; a fused kernel at {frac * 100:.0f} % of the roofline "
        f"would save {ms(saving)} ms/step",
        {"device": e.peaks.get("device"), "target_pct_of_roofline": frac * 100,
         "ops": [{"op": r["op"], "precision": r["precision"], "calls_per_step": round(r["calls"] / n, 2),
                  "kernels_per_call": round(r["kernels"] / max(r["calls"], 1), 1),
                  "ms_per_step": ms(r["kernel_ns"] / n), "tflops": round(float(r["tflops"]), 2),
                  "heaviest_kernel": r["main_kernel"], "saving_ms_per_step": ms(r["saving_ns"] / n)}
                 for r in by.head(5).iter_rows(named=True)]},
        "Make SDPA pick a fused kernel: bf16/fp16 inputs (autocast), is_causal=True instead of an explicit "
        "causal mask, contiguous q/k/v, a head dimension ≤ 256 and a multiple of 8. Run once under "
        "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) to see why it is refused.",
        "from torch.nn.attention import sdpa_kernel, SDPBackend\n"
        "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises with the reason when flash cannot run\n"
        "    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        saving, results, confidence=0.6,
    )
