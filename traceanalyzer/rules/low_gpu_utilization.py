"""GPU busy less than half of the step: the device waits for something.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules low_gpu_utilization`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, fewer_launches, fewer_launches_hint, vendor_of, withhold_on_capture
from traceanalyzer.rules._util import ms, per_step_ns, steady, time_finding
from traceanalyzer.units import device_name

#: idle_gaps cause → the rule that prices it (evidence points the reader there).
_CAUSE_RULES = {
    "data_loader": "dataloader_bottleneck",
    "host_bound": "host_bound_gaps",
    "sync": "explicit_sync / item_sync",
    "memcpy": "pageable_memcpy / blocking_copies",
}
_CAUSES = ("host_bound", "sync", "memcpy", "data_loader", "other")
_CAUSE_WORDS = {
    "host_bound": "host-bound launches", "sync": "host syncs", "memcpy": "blocking copies",
    "data_loader": "data loading", "other": "waits with work queued (other streams, devices or ranks)",
}


@rule("low_gpu_utilization", needs=("steps", "gpu_time"), severity=Severity.WARNING,
      params={"min_busy_pct": 50.0, "critical_busy_pct": 20.0}, uses=("context", "idle_gaps", "ops"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """GPU busy less than half of the step: the device waits for something.

    Signal
        ``gpu_time``: per device, the busy share (compute, communication, copies, memsets,
        overlap counted once) of the **steady** step windows (Σ busy / Σ window). When
        ``idle_gaps`` ran, its gaps of the steady steps split the idle time by cause
        (host-bound, sync, memcpy, data loader, other); idle outside any gap (before the
        first / after the last device activity of a window) is ``outside_gaps``.
    Threshold
        busy < ``min_busy_pct`` (50) %: tb_plugin's 0.5 and Nsight Systems' ``gpu_time_util``
        50 %; SageMaker's 70 % p95 is for whole-job system metrics. CRITICAL below
        ``critical_busy_pct`` (20) %. One finding per device below the threshold.
    Cost
        The device's idle time per steady step (Σ idle / steady steps; without
        ``ProfilerStep#`` the window is the whole trace, setup included): the upper bound of
        what removing every wait could buy (confidence 0.5: some idle is unavoidable; the
        host-bound / data-loader / sync findings name the causes and price their share, so
        this cost overlaps theirs: it is the umbrella, not one more cause).
    Fix
        Remove what the GPU waits for (the largest idle cause is named), then give it more
        work per launch: a larger batch, overlapped data loading, fewer host syncs,
        torch.compile (plus CUDA/HIP graphs on NVIDIA/AMD) — or, where the ``context`` shows the
        run compiled or replaying graphs, what it still lacks. Not run on a capture-only trace.
    """
    withhold_on_capture(results, "GPU utilisation")
    gt = results.need("gpu_time", GpuTimeResult)
    per = steady(gt.per_step, results)
    ig = results.typed("idle_gaps", IdleGapsResult)
    gaps = steady(ig.per_step, results) if ig is not None else None
    vendor = vendor_of(results)
    # Without ProfilerStep# the one window is the whole trace (setup and teardown included).
    has_steps = results.need("steps", StepsResult).has_steps
    of = "of the step" if has_steps else "of the whole trace (no ProfilerStep#)"
    unit = "/step" if has_steps else ""
    for device, busy in sorted(gt.steady_busy_pct.items()):
        if busy is None or busy >= params.min_busy_pct:
            continue
        rows = per.filter(pl.col("device") == device)
        idle = per_step_ns(rows, "idle_ns", results)
        parts = {c: ms(per_step_ns(rows, f"{c}_ns", results))
                 for c in ("compute", "communication", "memcpy", "memset", "idle")}
        worst = rows.sort(["busy_pct", "window"]).head(3).select("step", "busy_pct").to_dicts()
        ev: dict[str, Any] = {"device": device, "busy_pct": busy, "ms_per_step": parts, "least_busy_steps": worst,
                              "threshold_busy_pct": params.min_busy_pct}
        why = ""
        if gaps is not None:
            g = gaps.filter(pl.col("device") == device)
            causes = {c: per_step_ns(g, f"{c}_ns", results) for c in _CAUSES}
            causes["outside_gaps"] = (per_step_ns(g, "outside_gaps_ns", results) if "outside_gaps_ns" in g.columns
                                      else max(idle - per_step_ns(g, "idle_ns", results), 0.0))
            ranked = sorted(((c, v) for c, v in causes.items() if v > 0), key=lambda cv: -cv[1])
            ev["idle_ms_per_step_by_cause"] = {c: ms(v) for c, v in ranked}
            ev["see_rules"] = [_CAUSE_RULES[c] for c, _ in ranked if c in _CAUSE_RULES]
            if ranked and ranked[0][0] != "outside_gaps":
                top, v = ranked[0]
                why = f", largest cause: {_CAUSE_WORDS[top]} ({ms(v)} ms{unit})"
        sev = Severity.CRITICAL if busy < params.critical_busy_pct else Severity.WARNING
        yield time_finding(
            "low_gpu_utilization", sev,
            f"{device_name(device, vendor)} is busy only {busy:.1f} % {of}: {ms(idle)} ms{unit} idle{why}",
            ev,
            "Find what the GPU waits for (the idle causes above and the host-bound, data-loader and sync "
            "findings), remove it, then give the GPU more work per launch: a larger batch, overlapped data "
            f"loading, fewer host syncs; {fewer_launches(vendor, context_of(results))}.",
            fewer_launches_hint(vendor, context_of(results)) + "; and/or a larger batch_size",
            idle, results, confidence=0.5,
        )
