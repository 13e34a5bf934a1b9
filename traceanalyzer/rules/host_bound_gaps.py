"""GPU idle because the CPU launched the next work too late (host-bound gaps).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules host_bound_gaps`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, fewer_launches, fewer_launches_hint, vendor_of, withhold_on_capture
from traceanalyzer.rules._util import ms, n_steady, pct_of_step, per_step_ns, severity_for, steady, time_finding
from traceanalyzer.units import device_name

_NO_CPU = "<no CPU activity on the launching thread>"


@rule("host_bound_gaps", needs=("steps", "idle_gaps"), severity=Severity.WARNING,
      params={"min_pct_of_step": 5.0, "min_ms_per_step": 0.1, "warning_pct": 10.0, "critical_pct": 30.0},
      uses=("context", "ops"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """GPU idle because the CPU launched the next work too late (host-bound gaps).

    Signal
        ``idle_gaps``: device gaps whose cause is ``host_bound`` (the next work was launched
        only after the device drained, and no sync, blocking copy or DataLoader range
        overlaps the gap — those have their own rules), summed over the steady steps (a gap
        spanning a step boundary is split between the steps), on the device where they are
        largest. Evidence
        names the CPU context (deepest op / annotation / Python frame at the gap's midpoint
        on the launching thread) of those gaps and the longest gaps.
    Threshold
        host-bound idle ≥ ``min_pct_of_step`` (5) % of the median steady step and ≥
        ``min_ms_per_step`` (0.1) ms per step. TraceLens flags GPU idle > 15 % of the
        timeline without naming a cause; we fire earlier because the cause is named. INFO
        below ``warning_pct`` (10) %, WARNING from it, CRITICAL from ``critical_pct`` (30) %.
    Cost
        GPU time lost: the host-bound idle time per steady step (confidence 0.7: the CPU work
        may not all be removable). It owns the ``host_bound`` gaps; the sync, blocking-copy and
        data-loader gaps belong to their rules, so these costs add up to at most the idle.
        In launch-bound steps (many tiny kernels) the same idle is also priced by
        ``launch_bound_kernels`` / ``kernel_count`` (another fix for it, not additive).
    Fix
        Reduce Python/CPU work between launches on the launching thread (the contexts
        listed), move logging/metrics off the step; torch.compile (and CUDA/HIP graphs on
        NVIDIA/AMD) for launch-heavy code. A compiled run is told what its compiled code
        still lacks, a run replaying graphs about the work outside them (``context``).
        Not run on a capture-only trace (no steady state to judge).
    """
    withhold_on_capture(results, "host-bound idle")
    ig = results.need("idle_gaps", IdleGapsResult)
    per = steady(ig.per_step, results)
    if per.is_empty():
        return
    best_dev, best = None, 0.0
    for dev in per["device"].unique().sort().to_list():
        v = per_step_ns(per.filter(pl.col("device") == dev), "host_bound_ns", results)
        if v > best:
            best_dev, best = dev, v
    pct = pct_of_step(best, results)
    if best_dev is None or pct is None or pct < params.min_pct_of_step or best < params.min_ms_per_step * 1e6:
        return
    gaps = steady(ig.device_gaps, results).filter((pl.col("device") == best_dev) & (pl.col("cause") == "host_bound"))
    ctx = (
        gaps.with_columns(pl.col("cpu_context").fill_null(_NO_CPU))
        .group_by("cpu_context").agg(n_gaps=pl.len().cast(pl.Int64), idle_ns=pl.col("dur_ns").sum())
        .sort(["idle_ns", "cpu_context"], descending=[True, False]).head(5)
    )
    longest = gaps.sort(["dur_ns", "start_ns"], descending=[True, False]).head(5).select(
        "step", "dur_ns", *[c for c in ("cpu_context", "next_name") if c in gaps.columns]).to_dicts()
    top = ctx.row(0, named=True)["cpu_context"] if ctx.height else None
    where = f", mostly inside `{top}`" if top and top != _NO_CPU else ""
    vendor = vendor_of(results)
    yield time_finding(
        "host_bound_gaps", severity_for(pct, params.warning_pct, params.critical_pct),
        f"{device_name(best_dev, vendor)} waits for the CPU to launch work: {ms(best)} ms/step of host-bound "
        f"idle{where}",
        {"device": best_dev, "host_bound_ms_per_step": ms(best),
         "gaps_per_step": round(gaps.height / n_steady(results), 2),
         "top_cpu_contexts": ctx.to_dicts(), "longest_gaps": longest},
        "Shorten the CPU work between launches on the launching thread (the contexts listed): move "
        "logging/metrics/Python bookkeeping out of the step or to another thread; launch fewer, larger "
        f"kernels: {fewer_launches(vendor, context_of(results))}.",
        fewer_launches_hint(vendor, context_of(results)) + "; log every N steps, not every step",
        best, results, confidence=0.7,
    )
