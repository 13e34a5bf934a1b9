"""Launch-bound: kernels shorter than their launch, the CPU cannot keep the GPU fed.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules launch_bound_kernels`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.kernel_sequences import KernelSequencesResult
from traceanalyzer.analyses.launches import LaunchesResult
from traceanalyzer.analyses.queue_length import QueueLengthResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import (
    context_of,
    fewer_launches,
    fewer_launches_hint,
    graphs_name,
    has_graphs,
    is_compiled,
    uses_graphs,
    vendor_of,
    withhold_on_capture,
)
from traceanalyzer.rules._util import ms, n_steady, pct_of_step, steady, time_finding


@rule("launch_bound_kernels", needs=("steps", "launches", "gpu_time"), severity=Severity.WARNING,
      params={"min_steps_pct": 50.0, "min_pct_of_step": 5.0, "critical_pct": 30.0},
      uses=("context", "ops", "queue_length", "kernel_sequences"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Launch-bound: kernels shorter than their launch, the CPU cannot keep the GPU fed.

    Signal
        ``launches``: per steady step, the launch-bound verdict — CPU time in the step's
        non-blocking launch calls ≥ ``launches.min_cpu_to_gpu_ratio`` (1) × the GPU time of
        what they launched, and the least busy device < ``launches.max_busy_pct`` (80) % busy
        (blocking copies are left out: their CPU time is waiting, not launching) — and the
        share of the steady steps' kernels that ran shorter than their launch call (HTA).
    Threshold
        at least ``min_steps_pct`` (50) % of the steady steps are launch-bound, and the cost
        is ≥ ``min_pct_of_step`` (5) % of the median step (a step with two kernels and a
        long CPU phase passes the CPU ≥ GPU test without being limited by launches).
        (TraceLens counts kernels < 10 µs; HTA flags kernels shorter than their launch; a
        per-kernel majority alone flips on real traces, so we need the per-step CPU ≥ GPU
        test.) WARNING; CRITICAL when the cost is ≥ ``critical_pct`` (30) % of the median step.
    Cost
        Σ over the launch-bound steady steps of min(CPU time in their launch calls, idle time
        of their least busy device), divided by the number of steady steps: launching fewer
        kernels cannot give back more idle than the launch calls take (confidence 0.6:
        graphs and fusion remove most launch overhead, not all). GPU time: the GPU idle that
        fewer launches would fill. The same idle also shows as ``host_bound_gaps`` (another
        fix for it: the two costs are not additive).
    Fix
        NVIDIA/AMD: capture the step in a CUDA/HIP graph (``torch.compile(mode=
        "reduce-overhead")`` or ``torch.cuda.CUDAGraph``); every vendor: fuse small ops
        (torch.compile), more work per kernel (larger batch). When the trace already replays
        graphs: enlarge the captured region; when it is already compiled: what the compiled
        code still lacks (graph replay, graph breaks, recompiles, dynamic shapes: ``context``).
        Not run on a capture-only trace (kernels under capture are recorded, not run).
        Where they ran, the evidence adds the busiest stream's share of the steady steps with no
        launch queued (``queue_length``: a launch-bound stream's queue is mostly empty) and the
        kernel sequences launched most often per step (``kernel_sequences``: what a graph or a
        fusion would replace).
    """
    withhold_on_capture(results, "launch-boundness")
    la = results.need("launches", LaunchesResult)
    per = steady(la.per_step, results)
    if per.is_empty():
        return
    bound = per.filter(pl.col("launch_bound"))
    share = bound.height * 100.0 / per.height
    if share < params.min_steps_pct:
        return
    gt = steady(results.need("gpu_time", GpuTimeResult).per_step, results)
    idle = gt.filter(pl.col("window").is_in(bound["window"].to_list())).group_by("window").agg(
        pl.col("idle_ns").max())
    saved = bound.select("window", "launch_cpu_ns").join(idle, on="window", how="left").select(
        pl.min_horizontal("launch_cpu_ns", pl.col("idle_ns").fill_null(0)).sum())
    cost = float(saved.item() or 0) / n_steady(results)
    pct = pct_of_step(cost, results)
    if (pct or 0.0) < params.min_pct_of_step:
        return
    n_k = int(per["kernels"].sum() or 0)
    n_short = int(per["short_kernels"].sum() or 0)
    cpu, gpu = int(per["launch_cpu_ns"].sum() or 0), int(per["launched_gpu_ns"].sum() or 0)
    graphs = la.n_graph_launches
    vendor = vendor_of(results)
    ctx = context_of(results)
    if graphs:
        fix = (f"The trace already replays {graphs:,} graph launches: the launch-bound part is the work launched "
               "eagerly outside them; capture it as well (enlarge the captured region)"
               + (" and fuse the small ops left outside it (torch.compile)." if not is_compiled(ctx) else "."))
    elif uses_graphs(ctx) or is_compiled(ctx):
        fix = f"Launch fewer, larger kernels: {fewer_launches(vendor, ctx)}; give each kernel more work (larger batch)."
    elif has_graphs(vendor):
        fix = (f"Capture the step in {graphs_name(vendor)} so one launch replays all its kernels: "
               "torch.compile(model, mode=\"reduce-overhead\") or torch.cuda.CUDAGraph; fuse small elementwise "
               "ops (torch.compile); give each kernel more work (larger batch).")
    else:
        fix = ("Launch fewer, larger kernels: fuse small ops with torch.compile, use foreach/fused optimizers, "
               "give each kernel more work (larger batch).")
    hint = fewer_launches_hint(vendor, ctx)
    extra: dict[str, object] = {}
    queue = results.typed("queue_length", QueueLengthResult)
    busiest = queue.busiest() if queue is not None else None
    if busiest is not None and busiest["window_ns"]:
        extra["queue_empty_pct_of_steps"] = busiest["empty_pct_of_window"]
    seq = results.typed("kernel_sequences", KernelSequencesResult)
    if seq is not None and seq.top.height:
        often = seq.top.filter(pl.col("n") == pl.col("n").min()).sort(
            ["count_per_step", "total_ns"], descending=True).head(3)
        extra["frequent_sequences"] = often.select("ops", "count_per_step").to_dicts()
    yield time_finding(
        "launch_bound_kernels", Severity.CRITICAL if (pct or 0.0) >= params.critical_pct else Severity.WARNING,
        (f"Launch-bound: in {bound.height} of {per.height} steady steps" if results.need("steps", StepsResult).has_steps
         else "Launch-bound over the whole trace (no ProfilerStep#):")
        + f" the CPU spends longer in launch calls than the GPU runs their work ({n_short:,} of {n_k:,} kernels "
        "shorter than their launch)",
        {"launch_bound_steps": bound["step"].to_list(),
         "launch_cpu_ms_per_step": ms(cpu / n_steady(results)),
         "launched_gpu_ms_per_step": ms(gpu / n_steady(results)),
         "cpu_to_gpu_ratio": round(cpu / gpu, 3) if gpu else None,
         "kernels_per_step": round(n_k / n_steady(results), 1),
         "pct_kernels_shorter_than_launch": round(n_short * 100.0 / n_k, 1) if n_k else None,
         "median_launch_cpu_us": None if la.cpu_dur_ns["median"] is None else round(la.cpu_dur_ns["median"] / 1e3, 2),
         "median_gpu_us": None if la.gpu_dur_ns["median"] is None else round(la.gpu_dur_ns["median"] / 1e3, 2),
         "graph_launches": graphs,
         "idle_ms_per_step": ms(float(idle["idle_ns"].sum() or 0) / n_steady(results)), **extra},
        fix, hint, cost, results, confidence=0.6,
    )
