"""Communication not hidden behind compute, or dominating the step.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules comm_exposed`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, pct_of_step, per_step_ns, severity_for, steady, time_finding, top_rows


@rule("comm_exposed", needs=("steps", "gpu_time", "kernels"), severity=Severity.WARNING,
      params={"max_exposed_pct": 5.0, "max_comm_pct": 10.0, "critical_pct": 30.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Communication not hidden behind compute, or dominating the step.

    Signal
        ``gpu_time``: exposed communication per steady step (collective kernels not overlapped
        by any compute kernel, per device; the device where it is largest); ``kernels``: total
        collective kernel time per window (overlapped or not).
    Thresholds
        exposed ≥ ``max_exposed_pct`` (5) % of the step → "not overlapped" (TraceLens: exposed
        comm > 5 % of GPU time, overlap < 70 %); otherwise total communication ≥
        ``max_comm_pct`` (10) % of the step → "dominant" (tb_plugin's 10 %), INFO.
        WARNING from 5 %, CRITICAL from ``critical_pct`` (30) %.
    Cost
        The exposed communication per step (confidence 0.6: it includes time waiting inside
        NCCL for slower ranks — check the rank-imbalance finding of ``traceanalyzer batch``).
    Fix
        Overlap: DDP ``bucket_cap_mb``, FSDP prefetch, ``no_sync()`` during gradient
        accumulation; reduce volume: bf16 gradients / compression hooks, larger batch.
    """
    k = results["kernels"]
    comm = k.by_name.filter(pl.col("is_comm"))
    if comm.is_empty():
        return
    n_windows = max(results["steps"].n_windows, 1)
    comm_ns = float(comm["total_ns"].sum()) / n_windows
    per = steady(results["gpu_time"].per_step, results)
    exposed, dev = 0.0, None
    for d in per["device"].unique().sort().to_list():
        v = per_step_ns(per.filter(pl.col("device") == d), "communication_ns", results)
        if v > exposed:
            exposed, dev = v, d
    exp_pct = pct_of_step(exposed, results) or 0.0
    comm_pct = pct_of_step(comm_ns, results) or 0.0
    overlap = round(100.0 * (1 - exposed / comm_ns), 1) if comm_ns > 0 else None
    ev = {"device": dev, "exposed_ms_per_step": ms(exposed), "comm_ms_per_step": ms(comm_ns),
          "exposed_pct_of_step": exp_pct, "comm_pct_of_step": comm_pct, "overlap_pct": overlap,
          "top_collectives": top_rows(comm, 5, ("name", "count", "total_ns", "mean_ns"))}
    fix = ("Overlap communication with backward compute: tune DDP bucket_cap_mb, enable FSDP "
           "forward/backward prefetch, use no_sync() during gradient accumulation; reduce the volume "
           "(bf16 gradients, a compression comm hook) or communicate less often (larger batch).")
    hint = "model = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=True)"
    if exp_pct >= params.max_exposed_pct:
        yield time_finding(
            "comm_exposed", severity_for(exp_pct, params.max_exposed_pct, params.critical_pct, Severity.WARNING),
            f"Communication not overlapped: {ms(exposed)} ms/step of collectives with no compute under them "
            f"({exp_pct:.1f} % of the step, overlap {overlap} %)",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
    elif comm_pct >= params.max_comm_pct:
        yield time_finding(
            "comm_exposed", Severity.INFO,
            f"Communication is {comm_pct:.1f} % of the step ({ms(comm_ns)} ms/step), mostly overlapped",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
