"""Explicit synchronize calls inside the step (torch.cuda.synchronize, stream/event syncs).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules explicit_sync`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import (
    implied_sync, ms, n_steady, pct_of_step, severity_for, steady, sync_cost, time_finding,
)


@rule("explicit_sync", needs=("steps", "syncs"), severity=Severity.WARNING,
      params={"min_ms_per_step": 0.02, "critical_pct": 10.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Explicit synchronize calls inside the step (torch.cuda.synchronize, stream/event syncs).

    Signal
        ``syncs``: sync points whose calls include an explicit stream/device/event
        synchronisation (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
        ``cudaEventSynchronize``, ``hip*``/XPU equivalents) and whose cause is not an op that
        implies a sync (``.item()``, ``nonzero`` …: the ``item_sync`` rule), inside steady steps.
    Threshold
        cost ≥ ``min_ms_per_step`` (0.02) ms per step. Nsight Systems' ``cuda_api_sync`` flags
        any call; a sync that leaves the GPU busy (another stream) costs nothing and is not
        reported. INFO below 1 % of the step, WARNING from it, CRITICAL from ``critical_pct`` (10) %.
    Cost
        Per sync, min(GPU idle after it, CPU blocked in it), summed per step: without the sync
        the CPU would have run that far ahead and covered at most that much of the idle that
        followed (idle caused by later CPU work, e.g. data loading, is not the sync's fault).
        Confidence 0.7.
    Fix
        Remove ``torch.cuda.synchronize()`` from the loop (time with CUDA events), use
        ``non_blocking`` copies, wait on events (``stream.wait_event``) instead of the host.
    """
    s = results["syncs"]
    pts = steady(s.points, results, by="step").filter(
        pl.col("kinds").str.contains("stream|device|event") & ~implied_sync(pl.col("cause")))
    if pts.is_empty():
        return
    n = n_steady(results)
    pts = pts.with_columns(cost_ns=sync_cost(pl.col("idle_after_ns"), pl.col("blocked_ns")))
    idle = float(pts["idle_after_ns"].fill_null(0).sum()) / n
    cost = float(pts["cost_ns"].sum()) / n
    blocked = float(pts["blocked_ns"].fill_null(0).sum()) / n
    if cost < params.min_ms_per_step * 1e6:
        return
    pct = pct_of_step(cost, results)
    top = (pts.group_by("site", "apis").agg(count=pl.len().cast(pl.Int64), blocked_ns=pl.col("blocked_ns").sum(),
                                           idle_after_ns=pl.col("idle_after_ns").sum(), cost_ns=pl.col("cost_ns").sum())
           .sort(["cost_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    yield time_finding(
        "explicit_sync", severity_for(pct, 1.0, params.critical_pct),
        f"{pts.height / n:.1f} explicit synchronize calls per step cost {ms(cost)} ms/step",
        {"syncs_per_step": round(pts.height / n, 2), "cpu_blocked_ms_per_step": ms(blocked),
         "gpu_idle_after_ms_per_step": ms(idle), "cost_ms_per_step": ms(cost), "top_call_sites": top, "stack_hint": s.stack_hint},
        "Remove torch.cuda.synchronize()/stream.synchronize() from the training loop: time with CUDA events "
        "(elapsed_time after the loop), order work across streams with stream.wait_event(), and let copies "
        "run non_blocking.",
        "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)",
        cost, results, confidence=0.7,
    )
