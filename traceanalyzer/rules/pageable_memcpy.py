"""Copies from/to pageable host memory: an "async" copy that blocks the CPU.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules pageable_memcpy`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import for_engine
from traceanalyzer.rules._hostsync import implied_correlations, owned
from traceanalyzer.rules._util import (
    fmt_count,
    implied_sync,
    ms,
    n_steady,
    pct_of_step,
    plural,
    severity_for,
    steady,
    time_finding,
)


@rule("pageable_memcpy", needs=("steps", "copies", "idle_gaps"), severity=Severity.WARNING,
      params={"min_count_per_step": 1.0, "min_ms_per_step": 0.02, "critical_pct": 10.0},
      uses=("context", "gpu_time", "syncs"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Copies from/to pageable host memory: an "async" copy that blocks the CPU.

    Signal
        ``copies``: GPU memcpys whose host side is ``pageable`` (CUDA names say
        ``Pageable``; XPU kind code ``M``) inside the steady steps, with the CPU time of the
        runtime calls that issued them (the driver stages pageable memory synchronously). Copies
        under an op implying a sync (``.item()`` …) are left to ``item_sync``. ROCm names only say
        ``Host``: the rule cannot decide there and says so.
    Threshold
        ≥ ``min_count_per_step`` (1) such copy per step and a cost ≥ ``min_ms_per_step`` (0.02)
        ms per step (Nsight Systems' ``cuda_memcpy_async`` flags any occurrence; TraceLens:
        H2D/D2H > 5 % of time or > 10 transfers). INFO below 0.5 % of the median step, WARNING
        from it, CRITICAL from ``critical_pct`` (10) %.
    Cost
        GPU time lost, never the CPU's wait: the GPU idle these blocking calls cause, per steady
        step — the sync/blocking-copy gaps of the primary device from each call to the next
        blocking event or the end of its step, capped by the time the CPU was blocked in the call
        (``docs/costs.md``). Pageable copies behind a busy GPU cost ~0 (confidence 0.7: with
        pinned memory and ``non_blocking=True`` the copy overlaps compute instead). The CPU wait
        (``cpu_wait_ms_per_step``) and the copies' GPU time are evidence.
    Fix
        ``DataLoader(pin_memory=True)`` / ``tensor.pin_memory()`` and
        ``.to(device, non_blocking=True)``; for DtoH, copy into a pinned buffer.
    """
    c = results.need("copies", CopiesResult)
    t = c.totals
    if not t["pageable_count"] and not t["pinned_count"] and t["unknown_memory_count"]:
        raise NotApplicable("the trace does not say whether host memory was pinned or pageable "
                            "(ROCm copy names only say 'Host')")
    tr = steady(c.transfers, results, by="step").filter(
        (pl.col("activity") == "memcpy") & (pl.col("host_memory") == "pageable"))
    tr = tr.filter(~pl.col("correlation").is_in(implied_correlations(results)).fill_null(False))
    if tr.is_empty():
        return
    n = n_steady(results)
    count = tr.height / n
    cpu = float(tr["cpu_ns"].fill_null(0).sum()) / n
    ev = owned(results, "pageable_memcpy")
    cost = float(ev["cost_ns"].sum() or 0) / n if ev.height else 0.0
    idle = float(ev["idle_ns"].sum() or 0) / n if ev.height else 0.0
    if count < params.min_count_per_step or cost < params.min_ms_per_step * 1e6:
        return
    pct = pct_of_step(cost, results)
    sites = steady(c.copies, results, by="step").filter(
        pl.col("host_memory").str.contains("pageable").fill_null(False) & ~implied_sync(pl.col("op")))
    top = (sites.group_by("site", "direction").agg(count=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum(),
                                                   cpu_ns=pl.col("cpu_ns").sum())
           .sort(["cpu_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    by_kind = tr.group_by("kind").agg(count=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum(),
                                      cpu_ns=pl.col("cpu_ns").sum()).sort("kind").to_dicts()
    yield for_engine(results, time_finding(
        "pageable_memcpy", severity_for(pct, 0.5, params.critical_pct),
        f"{fmt_count(count)} {plural(count, 'copy', 'copies')} per step {plural(count, 'uses', 'use')} pageable "
        f"host memory: the GPU idles {ms(cost)} ms/step while the CPU stages {plural(count, 'it', 'them')}",
        {"copies_per_step": round(count, 2), "bytes_per_step": int(float(tr["bytes"].sum() or 0) / n),
         "cpu_wait_ms_per_step": ms(cpu), "gpu_idle_owned_ms_per_step": ms(idle),
         "copy_gpu_ms_per_step": ms(float(tr["gpu_ns"].fill_null(0).sum()) / n), "by_kind": by_kind,
         "top_call_sites": top,
         "stack_hint": c.stack_hint},
        "Pin the host memory so the copy is truly asynchronous: DataLoader(pin_memory=True) or "
        "tensor.pin_memory(), then .to(device, non_blocking=True); for device-to-host results, copy into "
        "a preallocated pinned buffer.",
        "loader = DataLoader(ds, pin_memory=True); x = x.to('cuda', non_blocking=True)",
        cost, results, confidence=0.7,
    ))
