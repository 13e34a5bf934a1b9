"""Reserved memory far above what tensors use: fragmentation or allocator caching waste.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules fragmentation`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIX = ("Let the allocator grow segments instead of splitting them: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
        "do not call torch.cuda.empty_cache() in the loop; pad variable-length batches to a few bucket sizes and "
        "run the largest shape first so later ones reuse its blocks.")
_HINT = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py"


@rule("fragmentation", needs=(), severity=Severity.WARNING,
      params={"min_unused_bytes": 1 << 30, "min_unused_pct": 33.0, "min_churn": 10})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Reserved memory far above what tensors use: fragmentation or allocator caching waste.

    Signal
        Snapshot (``memory_fragmentation``): at dump, cached free bytes (reserved − allocated),
        the largest free block, the fragmentation of free memory (1 − largest / free) and
        ``empty_cache``-style churn (cudaMalloc after a segment free); with history, the max of
        reserved − allocated over the run. Trace (``trace_memory``): peak reserved − peak
        allocated per device (memory the allocator held that even the peak never used).
    Threshold
        unused ≥ ``min_unused_bytes`` (1 GiB) and ≥ ``min_unused_pct`` (33) % of reserved (i.e.
        reserved ≥ 1.5 × allocated; PyTorch's OOM message "reserved but unallocated memory is
        large"); or ≥ ``min_churn`` (10) segment re-allocations after frees. WARNING.
    Cost
        The unused reserved bytes.
    Fix
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; no ``torch.cuda.empty_cache()``
        in the loop; pad variable shapes to a few sizes; preallocate the largest shape first.
    """
    fr = results.get("memory_fragmentation")
    if fr is not None:
        unused = fr.free_bytes
        source = "at dump"
        if fr.max_unused_reserved_bytes is not None and fr.max_unused_reserved_bytes > unused:
            unused, source = fr.max_unused_reserved_bytes, "max over the history"
        reserved = max(fr.reserved_bytes, 1)
        big = unused >= params.min_unused_bytes and fr.free_bytes * 100.0 / reserved >= params.min_unused_pct
        churn = fr.churn_reallocs >= params.min_churn
        if not big and not churn:
            return
        title = (f"{unused / 2**30:.2f} GiB reserved but unused ({source}); largest free block "
                 f"{fr.largest_free_block_bytes / 2**20:,.0f} MiB, fragmentation {fr.fragmentation_pct or 0:.0f} %")
        if churn and not big:
            title = f"{fr.churn_reallocs:,} cudaMalloc calls after segment frees (empty_cache churn)"
        yield Finding(
            rule_id="fragmentation", severity=Severity.WARNING, title=title,
            evidence={"reserved_bytes": fr.reserved_bytes, "allocated_bytes": fr.allocated_bytes,
                      "free_bytes": fr.free_bytes, "max_unused_reserved_bytes": fr.max_unused_reserved_bytes,
                      "largest_free_block_bytes": fr.largest_free_block_bytes,
                      "fragmentation_pct": fr.fragmentation_pct, "inactive_split_blocks": fr.inactive_split_blocks,
                      "churn_reallocs": fr.churn_reallocs, "expandable_segments": fr.expandable_segments,
                      "non_default_settings": fr.non_default_settings},
            fix=_FIX, code_hint=_HINT, cost_bytes=int(unused), confidence=0.8,
        )
        return
    tm = results.get("trace_memory")
    if tm is None:
        skipped = getattr(results, "skipped", {})
        raise NotApplicable(skipped.get("trace_memory") or skipped.get("memory_fragmentation")
                            or "no memory data: profile with profile_memory=True or record a memory snapshot")
    for r in tm.per_device.iter_rows(named=True):
        if str(r["device"]).startswith("cpu"):
            continue
        res, alloc = int(r["peak_reserved_bytes"] or 0), int(r["peak_allocated_bytes"] or 0)
        unused = res - alloc
        if unused < params.min_unused_bytes or unused * 100.0 / max(res, 1) < params.min_unused_pct:
            continue
        yield Finding(
            rule_id="fragmentation", severity=Severity.WARNING,
            title=f"{r['device']}: {unused / 2**30:.2f} GiB reserved that even the peak never used "
                  f"(reserved {res / 2**30:.2f} GiB vs peak allocated {alloc / 2**30:.2f} GiB)",
            evidence={"device": r["device"], "peak_reserved_bytes": res, "peak_allocated_bytes": alloc,
                      "unused_bytes": unused},
            fix=_FIX, code_hint=_HINT, cost_bytes=unused, confidence=0.6,
        )
