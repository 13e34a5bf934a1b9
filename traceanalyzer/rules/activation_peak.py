"""Activations dominate the memory peak: checkpointing or a smaller micro-batch would lower it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules activation_peak`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule


@rule("activation_peak", needs=(), severity=Severity.INFO, params={"min_pct_of_peak": 50.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Activations dominate the memory peak: checkpointing or a smaller micro-batch would lower it.

    Signal
        ``export_timeline`` (``prof.export_memory_timeline``): bytes per category at the peak
        (the profiler's own ``ACTIVATION`` category). Snapshot (``memory_peak``): live bytes by
        inferred category at the peak (allocated in forward and still live = activation; see
        ``memory_timeline``). Plain traces do not categorise memory.
    Threshold
        activations ≥ ``min_pct_of_peak`` (50) % of the peak (peers' suggested default). INFO;
        WARNING when ``memory_capacity``/OOM pressure is also there is left to those rules.
    Cost
        The activation bytes at the peak (checkpointing trades most of them for recompute).
        Confidence 0.9 from the export, 0.6 from a snapshot (categories inferred from stacks).
    Fix
        Activation checkpointing, smaller micro-batch/sequence, bf16 autocast, fused attention
        (SDPA/FlashAttention) which stores no attention matrix.
    """
    if "export_timeline" in results:
        et = results["export_timeline"]
        cats, peak, conf, src = et.at_peak, et.peak_total_bytes, 0.9, "export_memory_timeline"
    elif "memory_peak" in results:
        mp = results["memory_peak"]
        cats, peak, conf, src = mp.categories, mp.peak_allocated_bytes, 0.6, "snapshot (inferred categories)"
    else:
        raise NotApplicable("memory categories need prof.export_memory_timeline() or a memory snapshot "
                            "with stacks")
    act = cats.filter(pl.col("category") == "activation")
    if act.is_empty() or peak <= 0:
        return
    b = int(act["bytes"].sum())
    pct = b * 100.0 / peak
    if pct < params.min_pct_of_peak:
        return
    yield Finding(
        rule_id="activation_peak", severity=Severity.INFO,
        title=f"Activations are {pct:.0f} % of the memory peak ({b / 2**20:,.0f} MiB of {peak / 2**20:,.0f} MiB)",
        evidence={"source": src, "activation_bytes": b, "peak_bytes": peak, "pct_of_peak": round(pct, 1),
                  "categories": cats.to_dicts()},
        fix="Trade memory for recompute with activation checkpointing on the largest blocks; or lower the "
            "micro-batch/sequence length (with gradient accumulation), use bf16 autocast and fused attention.",
        code_hint="from torch.utils.checkpoint import checkpoint\nh = checkpoint(layer, h, use_reentrant=False)",
        cost_bytes=b, confidence=conf,
    )
