"""``zero_grad()`` writes zeros into every gradient: set them to None instead.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules zero_grad_memset`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import fmt_count, gpu_idle_per_step_ns, ms, per_step_ns, plural, time_finding


@rule("zero_grad_memset", needs=("steps", "ops"), severity=Severity.INFO, params={"min_fills_per_step": 1.0},
      uses=("gpu_time",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """``zero_grad()`` writes zeros into every gradient: set them to None instead.

    Signal
        ``ops``: memsets and fill/zero kernels launched inside ``Optimizer.zero_grad#…``
        ranges per steady step (``zero_grad(set_to_none=False)``, or a PyTorch before 2.0).
        Zeroing through ``model.zero_grad()`` outside an optimizer range is not annotated by
        the profiler and cannot be seen; without any ``Optimizer.zero_grad`` range the rule cannot
        run and says so.
    Threshold
        ≥ ``min_fills_per_step`` (1) fill per step (tuning guide; tb_plugin's "optimize zero_grad").
    Cost
        GPU time: the fills' GPU time, or the zero_grad CPU range time as far as the GPU could
        use it (at most the fills' GPU time + the GPU idle per step of the busiest device), per
        steady step (confidence 0.8). Without GPU activity, the larger of the two.
    Fix
        ``optimizer.zero_grad(set_to_none=True)`` (the default since PyTorch 2.0).
    """
    o = results.need("ops", OpsResult)
    if not o.op_counts.filter(pl.col("name").str.starts_with("Optimizer.zero_grad#")).height:
        raise NotApplicable("no Optimizer.zero_grad ranges in the trace: zeroing cannot be seen "
                            "(model.zero_grad() and set_to_none=True leave no range with fills)")
    fills = per_step_ns(o.optimizer, "zero_grad_fills", results)
    if fills < params.min_fills_per_step:
        return
    cpu = per_step_ns(o.optimizer, "zero_grad_ns", results)
    gpu = per_step_ns(o.optimizer, "zero_grad_gpu_ns", results)
    idle = gpu_idle_per_step_ns(results)
    # GPU time: the fills' GPU time, or the CPU range as far as the GPU idles (never more)
    cost = max(cpu, gpu) if idle is None else max(gpu, min(cpu, gpu + idle))
    yield time_finding(
        "zero_grad_memset", Severity.INFO,
        f"zero_grad() launches {fmt_count(fills)} memset/fill {plural(fills, 'kernel', 'kernels')} per step "
        f"({ms(cost)} ms/step)",
        {"fills_per_step": round(fills, 1), "zero_grad_cpu_ms_per_step": ms(cpu),
         "zero_grad_gpu_ms_per_step": ms(gpu), "optimizer": list(o.optimizer_names)},
        "Set gradients to None instead of zeroing them: optimizer.zero_grad(set_to_none=True) "
        "(default since PyTorch 2.0); the next backward allocates them fresh.",
        "optimizer.zero_grad(set_to_none=True)",
        cost, results, confidence=0.8,
    )
