"""Synchronous memcpy/memset API calls in the step (cudaMemcpy, hipMemcpy, cudaMemset …).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules blocking_copies`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.config import Config
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


@rule("blocking_copies", needs=("steps", "copies", "idle_gaps"), severity=Severity.WARNING,
      params={"min_ms_per_step": 0.05, "critical_pct": 10.0}, uses=("context", "gpu_time", "syncs"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Synchronous memcpy/memset API calls in the step (cudaMemcpy, hipMemcpy, cudaMemset …).

    Signal
        ``copies``: GPU memcpys/memsets issued by a synchronous runtime API (``cudaMemcpy``,
        ``cudaMemset``, ``hipMemcpy``, ``hipMemcpyWithStream`` …: no ``Async`` in the name)
        inside the steady steps; and (``syncs``) the stream/event synchronize a copy op makes
        after its copy (``.cpu()`` / ``.to("cpu")`` / ``copy_`` with ``non_blocking=False``).
        Pageable-memory copies are left to ``pageable_memcpy`` and everything under an op
        implying a sync (``.item()`` …) to ``item_sync`` (not counted twice).
    Threshold
        cost ≥ ``min_ms_per_step`` (0.05) ms per step (Nsight Systems' ``cuda_memcpy_sync`` /
        ``cuda_memset_sync`` flag any occurrence; one-off copies outside the steps do not matter
        for throughput). INFO below 0.5 % of the median step, WARNING from it, CRITICAL from
        ``critical_pct`` (10) %.
    Cost
        GPU time lost, never the CPU's wait: the GPU idle these calls and copy waits cause, per
        steady step — the sync/blocking-copy gaps of the primary device from each call to the
        next blocking event or the end of its step, capped by the time the CPU was blocked in
        it (``docs/costs.md``). A blocking copy behind a busy GPU costs ~0. Confidence 0.8; the
        CPU wait (``cpu_wait_ms_per_step``) is evidence.
    Fix
        Use asynchronous copies on a stream with pinned buffers (``non_blocking=True``); avoid
        ``.cpu()``/``.numpy()``/``.tolist()`` of device tensors inside the loop.
    """
    c = results.need("copies", CopiesResult)
    tr = steady(c.transfers, results, by="step").filter(
        (pl.col("api_mode") == "sync") & (pl.col("host_memory") != "pageable"))
    tr = tr.filter(~pl.col("correlation").is_in(implied_correlations(results)).fill_null(False))
    ev = owned(results, "blocking_copies")
    # copy calls come from ``copies`` (no call site), copy-op waits from ``syncs`` (with one)
    waits_ev = ev.filter(pl.col("site").is_not_null())
    if tr.is_empty() and waits_ev.is_empty():
        return
    n = n_steady(results)
    cost = float(ev["cost_ns"].sum() or 0) / n if ev.height else 0.0
    if cost < params.min_ms_per_step * 1e6:
        return
    cpu = float(tr["cpu_ns"].fill_null(0).sum()) / n
    wait_cpu = float(waits_ev["blocked_ns"].sum() or 0) / n if waits_ev.height else 0.0
    idle = float(ev["idle_ns"].sum() or 0) / n if ev.height else 0.0
    pct = pct_of_step(cost, results)
    by_api = (tr.group_by("api", "activity", "kind").agg(count=pl.len().cast(pl.Int64), cpu_ns=pl.col("cpu_ns").sum(),
                                                           bytes=pl.col("bytes").sum(), gpu_ns=pl.col("gpu_ns").sum())
              .sort(["cpu_ns", "api"], descending=[True, False]).head(5).to_dicts())
    sites = steady(c.copies, results, by="step").filter(
        (pl.col("api_mode") == "sync") & (pl.col("host_memory").fill_null("") != "pageable")
        & ~implied_sync(pl.col("op")))
    top = (sites.group_by("site").agg(count=pl.len().cast(pl.Int64), cpu_ns=pl.col("cpu_ns").sum())
           .sort(["cpu_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    waits = (waits_ev.group_by("site", "cause").agg(count=pl.len().cast(pl.Int64),
                                                   blocked_ns=pl.col("blocked_ns").sum(),
                                                   gpu_idle_ns=pl.col("idle_ns").sum(), cost_ns=pl.col("cost_ns").sum())
             .sort(["cost_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    calls, ops = tr.height / n, waits_ev.height / n
    parts = []
    if tr.height:
        parts.append(f"{fmt_count(calls)} synchronous memcpy/memset {plural(calls, 'call', 'calls')}")
    if waits_ev.height:
        parts.append(f"{fmt_count(ops)} {plural(ops, 'copy', 'copies')} waiting on the stream (non_blocking=False)")
    yield for_engine(results, time_finding(
        "blocking_copies", severity_for(pct, 0.5, params.critical_pct),
        f"{' and '.join(parts)} per step: the GPU idles {ms(cost)} ms/step",
        {"calls_per_step": round(calls, 2), "cpu_wait_ms_per_step": ms(cpu + wait_cpu),
         "gpu_idle_owned_ms_per_step": ms(idle), "by_api": by_api,
         "copy_waits_per_step": round(ops, 2), "copy_waits": waits,
         "top_call_sites": top, "stack_hint": c.stack_hint},
        "Issue copies asynchronously on a stream from pinned buffers (tensor.to(device, non_blocking=True)); "
        "keep results on the device instead of .cpu()/.numpy()/.tolist() inside the loop.",
        "buf = torch.empty_like(x, device='cpu').pin_memory(); buf.copy_(x, non_blocking=True)",
        cost, results, confidence=0.8,
    ))
