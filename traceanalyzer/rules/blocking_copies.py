"""Synchronous memcpy/memset API calls in the step (cudaMemcpy, hipMemcpy, cudaMemset …).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules blocking_copies`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import implied_sync_correlations, ms, n_steady, pct_of_step, severity_for, steady, time_finding


@rule("blocking_copies", needs=("steps", "copies"), severity=Severity.WARNING,
      params={"min_ms_per_step": 0.05, "critical_pct": 10.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Synchronous memcpy/memset API calls in the step (cudaMemcpy, hipMemcpy, cudaMemset …).

    Signal
        ``copies``: GPU memcpys/memsets issued by a synchronous runtime API (``cudaMemcpy``,
        ``cudaMemset``, ``hipMemcpy``, ``hipMemcpyWithStream`` …: no ``Async`` in the name)
        inside the steady steps. Pageable-memory copies are left to ``pageable_memcpy`` (not
        counted twice).
    Threshold
        ≥ ``min_ms_per_step`` (0.05) ms of CPU blocked per step (Nsight Systems'
        ``cuda_memcpy_sync`` / ``cuda_memset_sync`` flag any occurrence; one-off copies outside the
        steps do not matter for throughput). INFO below 0.5 % of the step, WARNING from it,
        CRITICAL from ``critical_pct`` (10) %.
    Cost
        The CPU time of those calls per step (confidence 0.8).
    Fix
        Use asynchronous copies on a stream with pinned buffers (``non_blocking=True``); avoid
        ``.cpu()``/``.numpy()``/``.tolist()`` of device tensors inside the loop.
    """
    c = results["copies"]
    tr = steady(c.transfers, results, by="step").filter(
        (pl.col("api_mode") == "sync") & (pl.col("host_memory") != "pageable"))
    tr = tr.filter(~pl.col("correlation").is_in(implied_sync_correlations(results)).fill_null(False))
    if tr.is_empty():
        return
    n = n_steady(results)
    cpu = float(tr["cpu_ns"].fill_null(0).sum()) / n
    if cpu < params.min_ms_per_step * 1e6:
        return
    pct = pct_of_step(cpu, results)
    by_api = (tr.group_by("api", "activity", "kind").agg(count=pl.len().cast(pl.Int64), cpu_ns=pl.col("cpu_ns").sum(),
                                                           bytes=pl.col("bytes").sum())
              .sort(["cpu_ns", "api"], descending=[True, False]).head(5).to_dicts())
    corr = tr["correlation"].drop_nulls().to_list()
    sites = c.copies.filter(pl.col("api_mode").str.contains("sync").fill_null(False)
                            & ~pl.col("api_mode").str.contains("async").fill_null(False))
    top = (sites.group_by("site").agg(count=pl.len().cast(pl.Int64), cpu_ns=pl.col("cpu_ns").sum())
           .sort(["cpu_ns", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    yield time_finding(
        "blocking_copies", severity_for(pct, 0.5, params.critical_pct),
        f"{tr.height / n:.1f} synchronous memcpy/memset calls per step block the CPU for {ms(cpu)} ms/step",
        {"calls_per_step": round(tr.height / n, 2), "cpu_blocked_ms_per_step": ms(cpu), "by_api": by_api,
         "top_call_sites": top, "n_correlations": len(corr), "stack_hint": c.stack_hint},
        "Issue copies asynchronously on a stream from pinned buffers (tensor.to(device, non_blocking=True)); "
        "keep results on the device instead of .cpu()/.numpy()/.tolist() inside the loop.",
        "buf = torch.empty_like(x, device='cpu').pin_memory(); buf.copy_(x, non_blocking=True)",
        cpu, results, confidence=0.8,
    )
