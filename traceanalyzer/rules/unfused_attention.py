"""Attention computed unfused (bmm → masked_fill → softmax → bmm) takes a large share of kernel time: SDPA pays.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules unfused_attention`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, n_steady, time_finding


@rule("unfused_attention", needs=("steps", "context"), severity=Severity.WARNING,
      params={"min_pct_of_kernel_time": 10.0, "warning_pct": 20.0, "fusion_savings": 0.5})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Attention computed unfused (bmm → masked_fill → softmax → bmm) takes a large share of kernel time: SDPA pays.

    Signal
        ``context.attention_pattern``: over the steady steps, the GPU time of the kernels
        launched inside ``aten::bmm``/``aten::baddbmm`` (the innermost such op around the
        launch call), inside softmax ops (``aten::_softmax``/``softmax``/``_masked_softmax``) or
        named ``softmax``, and inside ``aten::masked_fill``. The pattern needs both the batched
        matmuls and the softmax. Silent when the run already uses fused attention
        (``context.fused_attention``: flash/fmha/sdpa/efficient/paged attention kernels or
        ``aten::_scaled_dot_product_*`` ops): the rest is then something else's softmax.
    Threshold
        pattern ≥ ``min_pct_of_kernel_time`` (10) % of the steady kernel time → INFO;
        WARNING from ``warning_pct`` (20) %.
    Cost
        ``fusion_savings`` (0.5) × the pattern's GPU time per steady step: a fused kernel never
        writes the seq × seq score matrix to memory and reads it back for the mask, the softmax
        and the second bmm; FlashAttention-style kernels typically run attention 2–4× faster
        than the unfused chain (0.5 is the conservative end). Confidence 0.4: the bmm/softmax
        may belong to something other than attention.
    Fix
        ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=…,
        is_causal=…)`` (dispatches to FlashAttention / memory-efficient kernels), or
        ``attn_implementation="sdpa"``/``"flash_attention_2"`` in Hugging Face models.
    """
    ctx = results.need("context", ContextResult)
    p = ctx.attention_pattern or {}
    if ctx.fused_attention or not p.get("present"):
        return
    pct = float(p.get("pct_of_kernel_time") or 0.0)
    if pct < params.min_pct_of_kernel_time:
        return
    ns = float(p.get("pattern_ns_per_step") or 0.0)
    yield time_finding(
        "unfused_attention", Severity.WARNING if pct >= params.warning_pct else Severity.INFO,
        f"Unfused attention (bmm + softmax{' + masked_fill' if p.get('masked_fill_ns_per_step') else ''}) is "
        f"{pct:.0f} % of kernel time ({ms(ns)} ms/step) and no fused attention kernel runs",
        {"pattern_ms_per_step": ms(ns), "pct_of_kernel_time": pct,
         "bmm_ms_per_step": ms(p.get("bmm_ns_per_step")), "softmax_ms_per_step": ms(p.get("softmax_ns_per_step")),
         "masked_fill_ms_per_step": ms(p.get("masked_fill_ns_per_step")),
         "kernels_per_step": p.get("kernels_per_step"), "steady_steps_counted": n_steady(results),
         "fusion_savings": params.fusion_savings},
        "Compute attention with one fused kernel: torch.nn.functional.scaled_dot_product_attention(q, k, v, "
        "attn_mask=mask, is_causal=...) dispatches to FlashAttention / memory-efficient kernels that never "
        "materialise the seq × seq scores; in Hugging Face models set attn_implementation=\"sdpa\" (or "
        "\"flash_attention_2\").",
        "out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
        params.fusion_savings * ns, results, confidence=0.4,
    )
