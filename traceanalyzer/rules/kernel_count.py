"""Too many kernels per step: per-launch overhead adds up, fusion would cut it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules kernel_count`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.analyses.launches import LaunchesResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, fewer_launches, fewer_launches_hint, vendor_of, withhold_on_capture
from traceanalyzer.rules._util import n_steady, per_step_ns, steady, time_finding, top_rows


@rule("kernel_count", needs=("steps", "kernels"), severity=Severity.INFO,
      params={"max_kernels_per_step": 1000, "min_short_pct": 50.0}, uses=("context", "gpu_time", "launches", "ops"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Too many kernels per step: per-launch overhead adds up, fusion would cut it.

    Signal
        ``kernels``: kernels per steady step (Σ over the steady windows / steady steps) and
        the share shorter than ``kernels.short_kernel_us`` (10 µs). Kernels replayed from
        CUDA/HIP graphs (``launches``) are not counted: they cost no launch each.
        ``launches``: median CPU time of an eager kernel launch call.
    Threshold
        eagerly launched kernels per step ≥ ``max_kernels_per_step`` (1000) and at least
        ``min_short_pct`` (50) % of the steady steps' kernels short. TraceLens's "> 1000
        invocations of similar ops → batch or fuse"; short kernels are where the per-launch
        cost (~5–20 µs of CPU, HTA) dominates. INFO.
    Cost
        min(eager kernels per step × median launch CPU time, idle per step of the least busy
        device): the launch overhead that can no longer hide behind GPU work, i.e. GPU idle
        that fewer launches would fill (confidence 0.3: an estimate, the fusion ratio is
        unknown). The same idle as ``host_bound_gaps`` / ``launch_bound_kernels`` (not
        additive). None without launch times.
    Fix
        torch.compile (fuses elementwise chains), foreach/fused optimizers, fused layers;
        CUDA/HIP graphs on NVIDIA/AMD; a compiled run or one replaying graphs is told what it
        still lacks instead (``context``). Not run on a capture-only trace.
    """
    withhold_on_capture(results, "kernels per step")
    k = results.need("kernels", KernelsResult)
    per = steady(k.per_step, results)
    if per.is_empty():
        return
    steps = n_steady(results)
    total = float(per["n_kernels"].sum() or 0)
    la = results.typed("launches", LaunchesResult)
    graph_k = 0.0
    eager_calls = None
    if la is not None:
        t = steady(la.table, results).filter(pl.col("activity") == "kernel")
        graph_k = float(t.filter(pl.col("is_graph")).height)
        eager_calls = t.filter(~pl.col("is_graph")).unique("correlation")
    n = max(total - graph_k, 0.0) / steps
    short = float(per["n_short"].sum() or 0) * 100.0 / max(total, 1.0)
    if n < params.max_kernels_per_step or short < params.min_short_pct:
        return
    cost = None
    launch_us = None
    if eager_calls is not None and eager_calls.height:
        med = float(eager_calls.select(pl.col("cpu_dur_ns").median()).item() or 0)
        launch_us = round(med / 1e3, 2)
        cost = n * med
        gt = results.typed("gpu_time", GpuTimeResult)
        if gt is not None:
            idle = steady(gt.per_step, results).group_by("window").agg(pl.col("idle_ns").max())
            cost = min(cost, per_step_ns(idle, "idle_ns", results))
    vendor = vendor_of(results)
    yield time_finding(
        "kernel_count", Severity.INFO,
        f"{n:,.0f} kernels launched per step, {short:.0f} % shorter than {k.short_kernel_ns / 1000:g} µs: "
        "launch overhead adds up",
        {"kernels_per_step": round(n, 1), "graph_replayed_kernels_per_step": round(graph_k / steps, 1),
         "pct_short": round(short, 1), "median_launch_cpu_us": launch_us,
         "top_kernels_by_count_in_trace": top_rows(k.by_name.sort(["count", "name"], descending=[True, False]), 5,
                                                   ("name", "count", "mean_ns", "pct_of_kernel_time")),
         "top_launching_ops_in_trace": top_rows(k.by_cpu_op.sort(["n_kernels", "cpu_op"], descending=[True, False]),
                                                5, ("cpu_op", "n_kernels", "mean_ns"))},
        f"Launch fewer, larger kernels: {fewer_launches(vendor, context_of(results))}; use foreach/fused optimizers "
        "and fused layers (SDPA, fused norms).",
        fewer_launches_hint(vendor, context_of(results)),
        cost, results, confidence=0.3,
    )
