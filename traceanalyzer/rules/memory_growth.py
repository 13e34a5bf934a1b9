"""Allocated memory grows step over step: a leak (tensors kept alive across iterations).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules memory_growth`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIX = ("Find what keeps tensors alive across iterations: accumulating graph-attached tensors "
        "(losses.append(loss) instead of loss.item()/loss.detach()), caches or lists that grow per step, "
        "hooks storing activations. Detach or drop them at the end of each step.")


@rule("memory_growth", needs=(), severity=Severity.WARNING,
      params={"min_growth_bytes": 16 << 20, "min_growth_pct": 5.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Allocated memory grows step over step: a leak (tensors kept alive across iterations).

    Signal
        Trace (``trace_memory``): allocated bytes at the end of each step per device; growth
        = last step end − first step end, and the number of steps that grew. Snapshot
        (``memory_leaks``): call sites whose live bytes never shrink and grow window over window.
    Threshold
        growth ≥ ``min_growth_bytes`` (16 MiB) and ≥ ``min_growth_pct`` (5) % of the peak
        (SageMaker's GPUMemoryIncrease: 5 %), with growth in at least half of the step
        transitions. Snapshot: any leak suspect of ``memory_leaks``. WARNING.
    Cost
        The bytes gained over the profiled steps (per step in the evidence): a leak grows until OOM.
    Fix
        Do not keep graph-attached tensors across steps (``losses.append(loss)`` → ``loss.item()``
        or ``loss.detach()``); clear caches/lists that grow per step.
    """
    ml = results.get("memory_leaks")
    if ml is not None:
        if ml.suspects.is_empty():
            return
        growth = int(ml.suspects["growth_bytes"].sum())
        top = ml.suspects.row(0, named=True)
        yield Finding(
            rule_id="memory_growth", severity=Severity.WARNING,
            title=f"{ml.suspects.height} call site(s) keep growing over {ml.n_windows} {ml.window_kind}: "
                  f"+{growth / 2**20:,.1f} MiB, most at {top['site']}",
            evidence={"suspects": ml.suspects.head(5).to_dicts(), "floor_growth_bytes": ml.floor_growth_bytes,
                      "live_at_end_bytes": ml.live_at_end_bytes, "window_kind": ml.window_kind},
            fix=_FIX, code_hint="total_loss += loss.detach()  # not: losses.append(loss)",
            cost_bytes=growth, confidence=0.8,
        )
        return
    tm = results.get("trace_memory")
    if tm is None:
        skipped = getattr(results, "skipped", {})
        raise NotApplicable(skipped.get("trace_memory") or skipped.get("memory_leaks")
                            or "no memory data: profile with profile_memory=True or record a memory snapshot")
    if tm.per_step.is_empty():
        raise NotApplicable("no steps with [memory] events: growth across steps cannot be measured")
    for dev, growth in sorted(tm.step_growth_bytes.items()):
        if dev.startswith("cpu"):
            continue
        g = tm.per_step.filter(pl.col("device") == dev).sort("step")
        ends = g["end_allocated_bytes"].to_list()
        grew = sum(1 for a, b in zip(ends, ends[1:]) if b > a)
        peak = int(g["peak_allocated_bytes"].max() or 0)
        if (growth < params.min_growth_bytes or growth * 100.0 / max(peak, 1) < params.min_growth_pct
                or grew * 2 < len(ends) - 1):
            continue
        per = growth / max(len(ends) - 1, 1)
        yield Finding(
            rule_id="memory_growth", severity=Severity.WARNING,
            title=f"{dev}: allocated memory grows {per / 2**20:,.1f} MiB per step "
                  f"(+{growth / 2**20:,.1f} MiB over {len(ends)} steps)",
            evidence={"device": dev, "growth_bytes": growth, "growth_per_step_bytes": int(per),
                      "steps_that_grew": grew, "end_allocated_bytes": ends, "peak_allocated_bytes": peak,
                      "top_allocating_ops": tm.top_ops.head(5).to_dicts()},
            fix=_FIX, code_hint="total_loss += loss.detach()  # not: losses.append(loss)",
            cost_bytes=int(growth), confidence=0.7,
        )
