"""GPU busy less than half of the step: the device waits for something.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules low_gpu_utilization`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, per_step_ns, steady, time_finding


@rule("low_gpu_utilization", needs=("steps", "gpu_time"), severity=Severity.WARNING,
      params={"min_busy_pct": 50.0, "critical_busy_pct": 20.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """GPU busy less than half of the step: the device waits for something.

    Signal
        ``gpu_time``: per device, the busy share (compute, communication, copies, memsets,
        overlap counted once) of the **steady** step windows.
    Threshold
        ``min_busy_pct`` (50): tb_plugin's 0.5 and Nsight Systems' ``gpu_time_util`` 50 %;
        SageMaker's 70 % p95 is for whole-job system metrics. CRITICAL below
        ``critical_busy_pct`` (20).
    Cost
        The device's idle time per steady step: the upper bound of what removing every wait
        could buy (confidence 0.5: some idle is unavoidable; the host-bound / data loader /
        sync findings name the causes and their share).
    Fix
        Find what the GPU waits for (other findings say which), then feed it more work per
        launch: larger batch, overlapped data loading, fewer host syncs, torch.compile / CUDA graphs.
    """
    gt = results["gpu_time"]
    per = steady(gt.per_step, results)
    for device, busy in sorted(gt.steady_busy_pct.items()):
        if busy is None or busy >= params.min_busy_pct:
            continue
        rows = per.filter(pl.col("device") == device)
        idle = per_step_ns(rows, "idle_ns", results)
        parts = {c: ms(per_step_ns(rows, f"{c}_ns", results))
                 for c in ("compute", "communication", "memcpy", "memset", "idle")}
        worst = rows.sort("busy_pct").head(3).select("step", "busy_pct").to_dicts()
        sev = Severity.CRITICAL if busy < params.critical_busy_pct else Severity.WARNING
        yield time_finding(
            "low_gpu_utilization", sev,
            f"GPU {device} is busy only {busy:.1f} % of the step ({ms(idle)} ms/step idle)",
            {"device": device, "busy_pct": busy, "ms_per_step": parts, "least_busy_steps": worst,
             "threshold_busy_pct": params.min_busy_pct},
            "Find what the GPU waits for (see the host-bound, data-loader and sync findings), then give it "
            "more work per launch: a larger batch, overlapped data loading, fewer host syncs, "
            "torch.compile or CUDA graphs.",
            "model = torch.compile(model)  # and/or a larger batch_size",
            idle, results, confidence=0.5,
        )
