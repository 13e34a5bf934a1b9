"""Activations dominate the memory peak: checkpointing or a smaller micro-batch would lower it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules activation_peak`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.export_timeline import ExportTimelineResult
from traceanalyzer.analyses.memory_peak import MemoryPeakResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

# Snapshot categories that say nothing about what the memory is (no stack, or allocated
# before recording): a peak made only of these cannot be judged.
_UNINFORMED = ("unknown", "pre_recording")


@rule("activation_peak", needs_any=("export_timeline", "memory_peak"), severity=Severity.INFO,
      params={"min_pct_of_peak": 50.0})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Activations dominate the memory peak: checkpointing or a smaller micro-batch would lower it.

    Signal
        ``export_timeline`` (a ``prof.export_memory_timeline`` file): bytes per category at the
        peak, with the profiler's own ``ACTIVATION`` category. Snapshot (``memory_peak``): live
        bytes by inferred category at the peak (allocated in forward and still live =
        activation; see ``memory_timeline``). Cannot decide (not run) from a plain trace (no
        categories) nor from a snapshot whose live memory at the peak has no stacks to infer a
        category from (all ``unknown`` / ``pre_recording``).
    Threshold
        activation bytes ≥ ``min_pct_of_peak`` (50) % of the peak (the peers' default); the
        share is the analysis' ``pct_of_peak`` of the ``activation`` category (the figure its
        table shows), never recomputed here. INFO:
        activations are the normal make-up of a training peak; it matters when memory is short,
        which ``memory_capacity`` and ``oom`` report.
    Cost
        The activation bytes at the peak (checkpointing trades most of them for recompute).
        Confidence 0.9 from the export, 0.6 from a snapshot (categories inferred from stacks).
    Fix
        Activation checkpointing on the largest blocks, a smaller micro-batch/sequence with
        gradient accumulation, bf16 autocast, fused attention (SDPA/FlashAttention) which
        stores no attention matrix.
    """
    et = results.typed("export_timeline", ExportTimelineResult)
    if et is not None:
        cats, peak, conf, src = et.at_peak, et.peak_total_bytes, 0.9, "export_memory_timeline"
    else:
        mp = results.need("memory_peak", MemoryPeakResult)
        cats, peak, conf, src = mp.categories, mp.peak_allocated_bytes, 0.6, "snapshot (inferred categories)"
        if cats.filter(~pl.col("category").is_in(_UNINFORMED) & (pl.col("bytes") > 0)).is_empty():
            raise NotApplicable("the memory live at the snapshot's peak has no stacks to infer categories from: "
                                "record with torch.cuda.memory._record_memory_history(stacks='python') before "
                                "the model is built")
    if peak <= 0:
        return
    act = cats.filter(pl.col("category") == "activation")
    if act.is_empty():
        return
    # The analysis' own share (its category table): one figure for the fact in the report.
    b, pct = int(act["bytes"][0]), float(act["pct_of_peak"][0])
    if pct < params.min_pct_of_peak:
        return
    yield Finding(
        rule_id="activation_peak", severity=Severity.INFO,
        title=f"Activations are {pct:.0f} % of the memory peak ({b / 2**20:,.0f} MiB of {peak / 2**20:,.0f} MiB)",
        evidence={"source": src, "activation_bytes": b, "peak_bytes": peak, "pct_of_peak": pct,
                  "categories": cats.to_dicts()},
        fix="Trade memory for recompute with activation checkpointing on the largest blocks; or lower the "
            "micro-batch/sequence length (with gradient accumulation), use bf16 autocast and fused attention.",
        code_hint="from torch.utils.checkpoint import checkpoint\nh = checkpoint(layer, h, use_reentrant=False)",
        cost_bytes=b, confidence=conf,
    )
