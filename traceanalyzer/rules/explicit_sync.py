"""Explicit synchronize calls inside the step (torch.cuda.synchronize, stream/event syncs).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules explicit_sync`` prints.
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


@rule("explicit_sync", needs=("steps", "syncs", "idle_gaps"), severity=Severity.WARNING,
      params={"min_ms_per_step": 0.02, "critical_pct": 10.0}, uses=("context", "copies", "gpu_time"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Explicit synchronize calls inside the step (torch.cuda.synchronize, stream/event syncs).

    Signal
        ``syncs``: stream/device/event synchronisations (``cudaStreamSynchronize``,
        ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, ``hip*``/XPU equivalents) inside
        steady steps, grouped by sync point, except those under an op that implies a sync
        (``.item()``, ``nonzero`` …: ``item_sync``) and those a copy op makes after its copy
        (``.cpu()``, ``copy_`` with ``non_blocking=False``: ``blocking_copies``). Memcpy calls in
        the same point are priced by the copy rules, not here.
    Threshold
        cost ≥ ``min_ms_per_step`` (0.02) ms per step. Nsight Systems' ``cuda_api_sync`` flags
        any call; a sync that leaves the GPU busy (another stream) costs nothing and is not
        reported. INFO below 1 % of the median step, WARNING from it, CRITICAL from
        ``critical_pct`` (10) %.
    Cost
        GPU time lost, never the CPU's wait: the GPU idle these points cause, per steady step
        (as ``item_sync``: the sync/blocking-copy gaps of the primary device from each point to
        the next blocking event or the end of its step, capped by the time blocked in its
        synchronize calls; ``docs/costs.md``). A ``cudaStreamSynchronize`` on a GPU that stays
        busy costs ~0 however long the CPU waited. Confidence 0.7; the CPU wait is evidence.
    Fix
        Remove ``torch.cuda.synchronize()`` from the loop (time with CUDA events), use
        ``non_blocking`` copies, wait on events (``stream.wait_event``) instead of the host.
    """
    pts = owned(results, "explicit_sync")
    if pts.is_empty():
        return
    n = n_steady(results)
    idle = float(pts["idle_ns"].fill_null(0).sum()) / n
    cost = float(pts["cost_ns"].sum()) / n
    blocked = float(pts["blocked_ns"].fill_null(0).sum()) / n
    if cost < params.min_ms_per_step * 1e6:
        return
    pct = pct_of_step(cost, results)
    top = (pts.group_by("site", "apis").agg(count=pl.len().cast(pl.Int64),
                                           blocked_ns=pl.col("blocked_ns").sum(),
                                           gpu_idle_ns=pl.col("idle_ns").sum(), cost_ns=pl.col("cost_ns").sum())
           .sort(["cost_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    per = pts.height / n
    yield for_engine(results, time_finding(
        "explicit_sync", severity_for(pct, 1.0, params.critical_pct),
        f"{fmt_count(per)} explicit synchronize {plural(per, 'call', 'calls')} per step "
        f"{plural(per, 'costs', 'cost')} {ms(cost)} ms/step of GPU idle",
        {"syncs_per_step": round(per, 2), "cpu_wait_ms_per_step": ms(blocked),
         "gpu_idle_owned_ms_per_step": ms(idle), "cost_ms_per_step": ms(cost), "top_call_sites": top,
         "stack_hint": results.need("syncs", SyncsResult).stack_hint},
        "Remove torch.cuda.synchronize()/stream.synchronize() from the training loop: time with CUDA events "
        "(elapsed_time after the loop), order work across streams with stream.wait_event(), and let copies "
        "run non_blocking.",
        "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)",
        cost, results, confidence=0.7,
    ))
