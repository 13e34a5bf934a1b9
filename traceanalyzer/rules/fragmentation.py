"""Reserved memory far above what tensors use: fragmentation or allocator caching waste.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules fragmentation`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.memory_fragmentation import MemoryFragmentationResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIX = ("Let the allocator grow segments instead of splitting them: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
        "do not call torch.cuda.empty_cache() in the loop; pad variable-length batches to a few bucket sizes and "
        "run the largest shape first so later ones reuse its blocks.")
_HINT = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@rule("fragmentation", needs_any=("memory_fragmentation", "trace_memory"), severity=Severity.WARNING,
      params={"min_unused_bytes": 1 << 30, "min_unused_pct": 33.0, "min_churn": 10})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Reserved memory far above what tensors use: fragmentation or allocator caching waste.

    Signal
        Snapshot (``memory_fragmentation``): unused = reserved − allocated, taken where it is
        largest: at dump (cached free bytes over the reserved segments) or, with history, the
        maximum over the run (against reserved at that event). Also the largest free block and
        the fragmentation of free memory at dump (1 − largest / free), and ``empty_cache``-style
        churn: cudaMalloc of a segment after a segment was freed. Trace (``trace_memory``), per
        device: peak reserved − peak allocated, memory the allocator held that even the
        allocation peak never used.
    Threshold
        unused ≥ ``min_unused_bytes`` (1 GiB) and ≥ ``min_unused_pct`` (33) % of reserved
        (reserved ≥ 1.5 × allocated; PyTorch's OOM message hint "reserved but unallocated
        memory is large"); or (snapshot) ≥ ``min_churn`` (10) segment allocations after a
        segment free. WARNING.
    Cost
        The unused reserved bytes (confidence 0.8 from a snapshot, 0.6 from a trace, whose two
        peaks need not coincide). Churn alone has no byte cost (its price is cudaMalloc/cudaFree
        time, which a snapshot does not record): no cost, confidence 0.7.
    Fix
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; no ``torch.cuda.empty_cache()``
        in the loop; pad variable shapes to a few sizes; run the largest shape first.
    """
    fr = results.typed("memory_fragmentation", MemoryFragmentationResult)
    if fr is not None:
        # The analysis' shares (one figure per fact in the report), never recomputed here.
        unused, pct, source = fr.free_bytes, fr.free_pct_of_reserved or 0.0, "at dump"
        if fr.max_unused_reserved_bytes is not None and fr.max_unused_reserved_bytes > unused:
            unused, source = fr.max_unused_reserved_bytes, "max over the history"
            pct = fr.max_unused_pct_of_reserved or 0.0
        big = unused >= params.min_unused_bytes and pct >= params.min_unused_pct
        churn = fr.churn_reallocs >= params.min_churn
        if not big and not churn:
            return
        if big:
            title = (f"{_gib(unused)} reserved but unused ({pct:.0f} % of reserved, {source}); at dump the largest "
                     f"free block is {fr.largest_free_block_bytes / 2**20:,.0f} MiB, fragmentation "
                     f"{fr.fragmentation_pct or 0:.0f} %")
            if churn:
                title += f"; {fr.churn_reallocs:,} cudaMalloc calls after segment frees"
        else:
            title = f"{fr.churn_reallocs:,} cudaMalloc calls after segment frees (empty_cache churn)"
        yield Finding(
            rule_id="fragmentation", severity=Severity.WARNING, title=title,
            evidence={"unused_bytes": unused, "unused_pct_of_reserved": pct, "measured": source,
                      "reserved_bytes": fr.reserved_bytes, "allocated_bytes": fr.allocated_bytes,
                      "free_bytes": fr.free_bytes, "max_unused_reserved_bytes": fr.max_unused_reserved_bytes,
                      "reserved_at_max_unused_bytes": fr.reserved_at_max_unused_bytes,
                      "largest_free_block_bytes": fr.largest_free_block_bytes,
                      "fragmentation_pct": fr.fragmentation_pct, "inactive_split_blocks": fr.inactive_split_blocks,
                      "churn_reallocs": fr.churn_reallocs, "churn_realloc_bytes": fr.churn_realloc_bytes,
                      "expandable_segments": fr.expandable_segments,
                      "non_default_settings": fr.non_default_settings},
            fix=_FIX, code_hint=_HINT,
            cost_bytes=int(unused) if big else None, confidence=0.8 if big else 0.7,
        )
        return
    tm = results.need("trace_memory", TraceMemoryResult)
    for r in tm.per_device.iter_rows(named=True):
        if str(r["device"]) == "cpu":
            continue
        res, alloc = int(r["peak_reserved_bytes"] or 0), int(r["peak_allocated_bytes"] or 0)
        unused = res - alloc
        pct = unused * 100.0 / res if res > 0 else 0.0
        if unused < params.min_unused_bytes or pct < params.min_unused_pct:
            continue
        yield Finding(
            rule_id="fragmentation", severity=Severity.WARNING,
            title=f"{r['device']}: {_gib(unused)} reserved that even the allocation peak never used "
                  f"(peak reserved {_gib(res)} vs peak allocated {_gib(alloc)}, {pct:.0f} % unused)",
            evidence={"device": r["device"], "peak_reserved_bytes": res, "peak_allocated_bytes": alloc,
                      "unused_bytes": unused, "unused_pct_of_reserved": round(pct, 2)},
            fix=_FIX, code_hint=_HINT, cost_bytes=unused, confidence=0.6,
        )
