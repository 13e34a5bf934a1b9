"""``.item()`` / ``nonzero`` / boolean-mask syncs: data-dependent reads stall the GPU queue.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules item_sync`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.syncs import SyncsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import for_engine
from traceanalyzer.rules._hostsync import owned
from traceanalyzer.rules._util import fmt_count, ms, n_steady, pct_of_step, plural, severity_for, time_finding


@rule("item_sync", needs=("steps", "syncs", "idle_gaps"), severity=Severity.WARNING,
      params={"min_ms_per_step": 0.02, "critical_pct": 10.0}, uses=("context", "copies", "gpu_time"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """``.item()`` / ``nonzero`` / boolean-mask syncs: data-dependent reads stall the GPU queue.

    Signal
        ``syncs``: sync points caused by an op that needs a device value on the host —
        ``aten::item``/``_local_scalar_dense`` (``.item()``, ``float(t)``, ``if t``),
        ``aten::nonzero``, ``masked_select``, ``unique``, boolean-mask ``index`` …
        — inside steady steps, grouped by cause and call site. Every blocking call under such an
        op (its DtoH copy included) belongs to this rule, not to ``pageable_memcpy`` /
        ``blocking_copies`` / ``explicit_sync``.
    Threshold
        cost ≥ ``min_ms_per_step`` (0.02) ms per step (the tuning guide: any in the hot loop).
        INFO below 1 % of the median step, WARNING from it, CRITICAL from ``critical_pct`` (10) %.
    Cost
        GPU time lost, never the CPU's wait: the GPU idle these points cause, per steady step.
        The idle owned is that of the ``idle_gaps`` gaps caused by a sync or blocking copy on
        the primary device, from each point's start to the next blocking event (any thread) or
        the end of its step (``docs/costs.md``); a point's share is capped by the time the CPU
        was blocked in it (the lead it would gain; consecutive ``item_sync`` points on one thread
        pool their lead). A ``.item()`` while the GPU still has queued work costs ~0 however long
        the CPU waited. Confidence 0.7; the CPU wait (``cpu_wait_ms_per_step``) and the owned
        idle are evidence.
    Fix
        Keep metrics on the device and read them every N steps; replace data-dependent shapes
        (``nonzero``, boolean masks) by ``torch.where``/masking with static shapes.
    """
    pts = owned(results, "item_sync")
    if pts.is_empty():
        return
    n = n_steady(results)
    idle = float(pts["idle_ns"].fill_null(0).sum()) / n
    cost = float(pts["cost_ns"].sum()) / n
    blocked = float(pts["blocked_ns"].fill_null(0).sum()) / n
    if cost < params.min_ms_per_step * 1e6:
        return
    pct = pct_of_step(cost, results)
    by_cause = (pts.group_by("cause").agg(count=pl.len().cast(pl.Int64), blocked_ns=pl.col("blocked_ns").sum(),
                                         gpu_idle_ns=pl.col("idle_ns").sum(), cost_ns=pl.col("cost_ns").sum())
                .sort(["cost_ns", "cause"], descending=[True, False], nulls_last=True).to_dicts())
    top = (pts.group_by("site", "cause").agg(count=pl.len().cast(pl.Int64), blocked_ns=pl.col("blocked_ns").sum(),
                                            gpu_idle_ns=pl.col("idle_ns").sum(), cost_ns=pl.col("cost_ns").sum())
           .sort(["cost_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    main = by_cause[0]["cause"]
    nonzero = any(not str(c["cause"]).startswith(("aten::item", "aten::_local_scalar_dense")) for c in by_cause)
    fix = ("Keep running metrics on the device (loss_sum += loss.detach()) and call .item() every N steps; "
           "avoid `if tensor:` / float(tensor) on device tensors in the loop.")
    if nonzero:
        fix += (" For nonzero/boolean masks/unique, keep shapes static: torch.where(mask, x, 0) or "
                "masked multiplication instead of x[mask], and pass output_size= where the op accepts it.")
    per = pts.height / n
    yield for_engine(results, time_finding(
        "item_sync", severity_for(pct, 1.0, params.critical_pct),
        f"{fmt_count(per)} host {plural(per, 'read', 'reads')} of device values per step ({main}) "
        f"{plural(per, 'stalls', 'stall')} the GPU queue: {ms(cost)} ms/step of GPU idle",
        {"sync_points_per_step": round(per, 2), "cpu_wait_ms_per_step": ms(blocked),
         "gpu_idle_owned_ms_per_step": ms(idle), "cost_ms_per_step": ms(cost), "by_cause": by_cause,
         "top_call_sites": top, "stack_hint": results.need("syncs", SyncsResult).stack_hint},
        fix, "running += loss.detach()\nif step % 100 == 0: print(running.item() / 100)",
        cost, results, confidence=0.7,
    ))
