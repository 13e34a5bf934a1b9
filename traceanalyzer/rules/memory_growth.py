"""Allocated memory grows step over step: a leak (tensors kept alive across iterations).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules memory_growth`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.memory_leaks import MemoryLeaksResult
from traceanalyzer.analyses.memory_peak import MemoryPeakResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import steady_steps
from traceanalyzer.units import device_name

_FIX = ("Find what keeps tensors alive across iterations: accumulating graph-attached tensors "
        "(losses.append(loss) instead of loss.item()/loss.detach()), caches or lists that grow per step, "
        "hooks storing activations. Detach or drop them at the end of each step.")
_HINT = "total_loss += loss.detach()  # not: losses.append(loss)"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


@rule("memory_growth", needs_any=("memory_leaks", "trace_memory"), severity=Severity.WARNING,
      params={"min_growth_bytes": 16 << 20, "min_growth_pct": 5.0, "min_steps": 3}, uses=("memory_peak", "steps"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Allocated memory grows step over step: a leak (tensors kept alive across iterations).

    Signal
        Trace (``trace_memory``, per device including host memory): allocated bytes at the end
        of each steady step (warm-up and a truncated last step left out, see ``steps``); growth
        = last − first, and how many step-to-step transitions grew. Snapshot
        (``memory_leaks``): the call sites whose live bytes never shrink and grow iteration
        over iteration (iterations from ``ProfilerStep#`` annotations, else forward/backward
        cycles in the stacks, else recurrences of the first allocation's stack); growth = the
        sum of their growth and its share of the peak, both as ``memory_leaks`` reports them.
        A leak needs repetition: one growth phase (gradients appearing in a single step's first
        backward) is not one. Cannot decide (not run) from a trace without ``ProfilerStep#``
        windows holding ``[memory]`` events or with fewer than ``min_steps`` (3) steady steps,
        nor from a snapshot without allocation history or with fewer than
        ``memory_leaks.min_iterations`` (3) iterations.
    Threshold
        growth ≥ ``min_growth_bytes`` (16 MiB) and ≥ ``min_growth_pct`` (5) % of the peak
        allocated (SageMaker's GPUMemoryIncrease: 5 %); for a trace also growth in at least
        half of the transitions. WARNING.
    Cost
        The bytes gained over the profiled steps (per step in the evidence): a leak keeps
        growing until OOM. Confidence 0.7 from a trace (a cache filling up also grows), 0.8
        from snapshot steps, 0.7 from forward/backward cycles, 0.6 from repeated allocation
        patterns.
    Fix
        Do not keep graph-attached tensors across steps (``losses.append(loss)`` →
        ``loss.item()`` or ``loss.detach()``); clear caches/lists that grow per step.
    """
    ml = results.typed("memory_leaks", MemoryLeaksResult)
    if ml is not None:
        if ml.verdict_note:
            raise NotApplicable(ml.verdict_note)
        if ml.suspects.is_empty():
            return
        # The analysis' figures (one value per fact in the report), never recomputed here.
        growth, pct = int(ml.growth_bytes), ml.growth_pct_of_peak
        mp = results.typed("memory_peak", MemoryPeakResult)
        peak = int(mp.peak_allocated_bytes) if mp is not None else 0
        if growth < params.min_growth_bytes or (pct is not None and pct < params.min_growth_pct):
            return
        top = ml.suspects.row(0, named=True)
        yield Finding(
            rule_id="memory_growth", severity=Severity.WARNING,
            title=f"{ml.suspects.height} call site(s) on {device_name(ml.device)} keep growing over {ml.n_windows} "
                  f"{ml.window_kind}: +{_mib(growth)}, most at {top['site']}",
            evidence={"device": ml.device, "growth_bytes": growth,
                      "pct_of_peak": pct, "peak_allocated_bytes": peak or None,
                      "suspects": ml.suspects.head(5).to_dicts(), "n_windows": ml.n_windows,
                      "window_kind": ml.window_kind, "floor_growth_bytes": ml.floor_growth_bytes,
                      "window_floor_bytes": list(ml.window_floor_bytes), "floor_rising": ml.floor_rising,
                      "live_at_end_bytes": ml.live_at_end_bytes},
            fix=_FIX, code_hint=_HINT, cost_bytes=growth,
            confidence={"steps": 0.8, "iterations": 0.7}.get(ml.window_kind, 0.6),
        )
        return
    tm = results.need("trace_memory", TraceMemoryResult)
    if tm.per_step.is_empty():
        raise NotApplicable("no ProfilerStep# windows holding [memory] events: growth across steps cannot be "
                            "measured")
    steady: list[Any] = []
    if results.typed("steps", StepsResult) is not None:
        steady = [s for s in steady_steps(results) if s is not None]
    per_step = tm.per_step.filter(pl.col("step").is_in(steady)) if steady else tm.per_step
    measured = 0
    for (dev,), g in per_step.sort("device", "step").group_by(["device"], maintain_order=True):
        if g.height < params.min_steps:
            continue
        measured += 1
        ends = [int(v) for v in g["end_allocated_bytes"].to_list()]
        growth = ends[-1] - ends[0]
        grew = sum(1 for a, b in zip(ends, ends[1:]) if b > a)
        peak = int(g["peak_allocated_bytes"].max() or 0)  # type: ignore[arg-type]
        pct = growth * 100.0 / peak if peak > 0 else 0.0
        if growth < params.min_growth_bytes or pct < params.min_growth_pct or grew * 2 < len(ends) - 1:
            continue
        per = growth / (len(ends) - 1)
        yield Finding(
            rule_id="memory_growth", severity=Severity.WARNING,
            title=f"{device_name(str(dev))}: allocated memory grows {_mib(per)} per step (+{_mib(growth)} over "
                  f"{len(ends)} steps, "
                  f"{pct:.0f} % of the peak)",
            evidence={"device": dev, "growth_bytes": growth, "growth_per_step_bytes": int(per),
                      "pct_of_peak": round(pct, 2), "steps": g["step"].to_list(), "steps_that_grew": grew,
                      "end_allocated_bytes": ends, "peak_allocated_bytes": peak,
                      "top_allocating_ops": tm.top_ops.filter(pl.col("device") == dev).head(5).to_dicts(),
                      "top_allocating_sites": tm.top_sites.filter(pl.col("device") == dev).head(5).to_dicts()},
            fix=_FIX, code_hint=_HINT, cost_bytes=int(growth), confidence=0.7,
        )
    if not measured:
        raise NotApplicable(f"fewer than {params.min_steps} steady steps with [memory] events: a trend across "
                            "steps cannot be measured")
