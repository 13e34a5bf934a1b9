"""Launch-bound: kernels shorter than their launch, the CPU cannot keep the GPU fed.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules launch_bound_kernels`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, n_steady, severity_for, steady, pct_of_step, time_finding


@rule("launch_bound_kernels", needs=("steps", "launches", "gpu_time"), severity=Severity.WARNING,
      params={"min_steps_pct": 50.0, "warning_pct": 5.0, "critical_pct": 30.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Launch-bound: kernels shorter than their launch, the CPU cannot keep the GPU fed.

    Signal
        ``launches``: per steady step, the launch-bound verdict (CPU time in launch calls ≥
        GPU time of what they launched, and the least busy device < 80 % busy; see the
        ``launches`` analysis) and the share of kernels shorter than their launch call.
    Threshold
        at least ``min_steps_pct`` (50) % of the steady steps are launch-bound. (TraceLens counts
        kernels < 10 µs; HTA flags kernels shorter than their launch; a per-kernel majority alone
        flips on real traces, so we need the per-step CPU ≥ GPU test.)
    Cost
        The idle time per step of the least busy device on those steps (confidence 0.6: graphs
        remove most launch overhead, not all).
    Fix
        CUDA graphs (``torch.compile(mode="reduce-overhead")`` or ``torch.cuda.CUDAGraph``),
        fusing small ops, larger batches per launch.
    """
    la = results["launches"]
    per = steady(la.per_step, results)
    if per.is_empty():
        return
    bound = per.filter(pl.col("launch_bound"))
    share = bound.height * 100.0 / per.height
    if share < params.min_steps_pct:
        return
    gt = steady(results["gpu_time"].per_step, results)
    idle = gt.filter(pl.col("window").is_in(bound["window"].to_list())).group_by("window").agg(
        pl.col("idle_ns").max())
    cost = float(idle["idle_ns"].sum() or 0) / n_steady(results)
    pct = pct_of_step(cost, results)
    graphs = la.n_graph_launches
    fix = ("Capture the step in a CUDA graph so one launch replays all kernels: "
           "torch.compile(model, mode=\"reduce-overhead\") or torch.cuda.CUDAGraph; fuse small elementwise "
           "ops (torch.compile); give each kernel more work (larger batch).")
    if graphs:
        fix = (f"The trace already replays {graphs:,} graph launches: capture the remaining eager part "
               "as well (or enlarge the captured region), and fuse the small ops left outside it.")
    yield time_finding(
        "launch_bound_kernels", severity_for(pct, params.warning_pct, params.critical_pct, Severity.WARNING),
        f"Launch-bound: {bound.height} of {per.height} steady steps spend more CPU time launching than "
        f"the GPU spends running ({la.n_shorter_than_launch:,} kernels shorter than their launch)",
        {"launch_bound_steps": bound["step"].to_list(),
         "median_launch_cpu_us": None if la.cpu_dur_ns["median"] is None else round(la.cpu_dur_ns["median"] / 1e3, 2),
         "median_gpu_us": None if la.gpu_dur_ns["median"] is None else round(la.gpu_dur_ns["median"] / 1e3, 2),
         "pct_kernels_shorter_than_launch": round(la.n_shorter_than_launch * 100.0 / max(la.n_joined, 1), 1),
         "cpu_to_gpu_ratio": per["cpu_to_gpu_ratio"].median(),
         "kernels_per_step": per["kernels"].mean(), "graph_launches": graphs,
         "idle_ms_per_step": ms(cost)},
        fix, "step = torch.compile(step, mode=\"reduce-overhead\")  # CUDA graphs",
        cost, results, confidence=0.6,
    )
