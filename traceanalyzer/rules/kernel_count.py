"""Too many kernels per step: per-launch overhead adds up, fusion would cut it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules kernel_count`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import per_step_ns, steady, time_finding, top_rows


@rule("kernel_count", needs=("steps", "kernels"), severity=Severity.INFO,
      params={"max_kernels_per_step": 1000, "min_short_pct": 50.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Too many kernels per step: per-launch overhead adds up, fusion would cut it.

    Signal
        ``kernels``: kernels launched per steady step (``per_step.n_kernels``) and the share
        shorter than ``kernels.short_kernel_us`` (10 µs); ``launches``: median CPU time of a
        launch call (when the trace has runtime events).
    Threshold
        mean kernels per step ≥ ``max_kernels_per_step`` (1000) and at least
        ``min_short_pct`` (50) % of them short. TraceLens's "> 1000 invocations of similar ops →
        batch or fuse"; short kernels are where per-launch cost (~5–20 µs CPU, HTA) dominates.
    Cost
        min(kernels per step × median launch CPU time, idle per step of the least busy device)
        — the launch overhead that can no longer hide behind GPU work (confidence 0.3: an
        estimate, fusion ratio unknown). None when no launch times are known.
    Fix
        torch.compile (fuses elementwise chains), foreach/fused optimizers, CUDA graphs.
    """
    k = results["kernels"]
    per = steady(k.per_step, results)
    if per.is_empty():
        return
    n = float(per["n_kernels"].mean() or 0)
    short = float(per["n_short"].sum() or 0) * 100.0 / max(float(per["n_kernels"].sum() or 0), 1.0)
    if n < params.max_kernels_per_step or short < params.min_short_pct:
        return
    cost = None
    la = results.get("launches")
    if la is not None and la.cpu_dur_ns.get("median"):
        cost = n * float(la.cpu_dur_ns["median"])
        gt = results.get("gpu_time")
        if gt is not None:
            idle = steady(gt.per_step, results).group_by("window").agg(pl.col("idle_ns").max())
            cost = min(cost, per_step_ns(idle, "idle_ns", results))
    yield time_finding(
        "kernel_count", Severity.INFO,
        f"{n:,.0f} kernels per step, {short:.0f} % shorter than {k.short_kernel_ns / 1000:g} µs: "
        "launch overhead adds up",
        {"kernels_per_step": round(n, 1), "pct_short": round(short, 1),
         "top_kernels_by_count": top_rows(k.by_name.sort("count", descending=True), 5,
                                          ("name", "count", "mean_ns", "pct_of_kernel_time")),
         "top_launching_ops": top_rows(k.by_cpu_op.sort("n_kernels", descending=True), 5,
                                       ("cpu_op", "n_kernels", "mean_ns"))},
        "Fuse: torch.compile merges elementwise chains into one kernel; use foreach/fused optimizers and "
        "fused layers (SDPA, fused norms); capture static parts in CUDA graphs.",
        "model = torch.compile(model)",
        cost, results, confidence=0.3,
    )
