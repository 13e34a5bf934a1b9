"""Timings inflated by the profiler itself (with_stack, record_shapes, overhead events).

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules profiler_overhead`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.analyses.overview import OverviewResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule


@rule("profiler_overhead", needs=("ops", "overview"), severity=Severity.INFO,
      params={"max_python_pct": 50.0, "max_overhead_pct": 1.0})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Timings inflated by the profiler itself (with_stack, record_shapes, overhead events).

    Signal
        ``ops``: the share of ``python_function`` events among all events (CPU ops,
        annotations, Python frames, runtime calls, kernels, copies, memsets, memory and other
        events; ``with_stack=True`` records one per Python call), the summed duration of
        Kineto/CUPTI ``overhead`` events (activity-buffer flushes) against the trace span
        (``overview``), and the profiler flags written in the trace (evidence).
    Threshold
        Python frames ≥ ``max_python_pct`` (50) % of the events (peers' suggested caveat), or
        overhead events ≥ ``max_overhead_pct`` (1) % of the span. INFO: a caveat on every other
        number, not a problem of the program. The flags alone (e.g. ``record_shapes``) do not
        fire it.
    Cost
        Not estimated (the profiler's cost is not in the production run).
    Fix
        Profile timing runs without ``with_stack``/``record_shapes``/``profile_memory`` and
        with a short ``active`` window; use a separate run for stacks and shapes.
    """
    o = results.need("ops", OpsResult)
    c = o.event_counts
    total = max(int(c.get("total", 0)), 1)
    py_pct = round(c.get("python_frames", 0) * 100.0 / total, 1)
    span = max(int(results.need("overview", OverviewResult).span_ns or 0), 1)
    ov_pct = round(c.get("overhead_ns", 0) * 100.0 / span, 2)
    reasons = []
    if py_pct >= params.max_python_pct:
        reasons.append(f"{py_pct:.0f} % of the events are Python frames (with_stack=True)")
    if ov_pct >= params.max_overhead_pct:
        reasons.append(f"profiler buffer flushes take {ov_pct:.1f} % of the trace")
    if not reasons:
        return
    flags = sorted(k for k, v in o.profiler_flags.items() if v)
    yield Finding(
        rule_id="profiler_overhead", severity=Severity.INFO,
        title="Timings include profiler overhead: " + "; ".join(reasons),
        evidence={"profiler_flags": flags, "python_frames": c.get("python_frames", 0), "events": total,
                  "python_pct_of_events": py_pct, "overhead_events": c.get("overhead", 0),
                  "overhead_pct_of_span": ov_pct},
        fix="Measure timings in a run profiled without with_stack/record_shapes/profile_memory and with a short "
            "active window; keep a separate run for call stacks and shapes.",
        code_hint="torch.profiler.profile(activities=[...], with_stack=False, record_shapes=False)",
        confidence=0.8,
    )
