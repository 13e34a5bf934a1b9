"""The compact numbers of one analysed input: what a batch index row and the
multi-rank and compare summaries need, read from the analyses' ``to_json()``.

Nothing is recomputed here: every number comes from a result some analysis already
produced (``steps``, ``gpu_time``, ``idle_gaps``, ``kernels``, ``overview``,
``trace_memory``/``memory_peak``). Results are read defensively — an analysis that
could not run (no GPU, no steps …) leaves its numbers ``None``.

Definitions (all "per step" numbers are over the step windows of ``steps``):

* ``step_ms`` / ``step_ms_mean`` / ``step_ms_p95``: steady-step window durations
  (warm-up and truncated steps excluded, see ``steps``); ``None`` without ``ProfilerStep``.
* ``step_times_ms``: every steady step's duration (the samples ``compare`` tests).
* ``window_ms_per_step``: mean length of all step windows (warm-up included), the
  denominator of the other "per step" numbers.
* ``gpu_busy_pct`` / ``idle_pct``: busy and idle time over the summed step windows of
  every device (``gpu_time.per_device``); ``overview``'s busy % when ``gpu_time`` could not run.
* ``comm_ms_per_step`` / ``exposed_comm_ms_per_step`` / ``comm_overlap_pct``: the
  ``communication`` analysis' ``comm_ns_per_step``, ``exposed_ns_per_step`` and ``hidden_pct``
  (per steady step on the primary device, the figures the file's own report shows). Where it
  did not run: summed collective-kernel time (``kernels.by_name`` rows with ``is_comm``) per
  window, ``gpu_time``'s ``communication_ns`` per window, and ``100 × (comm − exposed) / comm``.
  Communication includes the time a rank waits inside NCCL for the others.
* ``breakdown_ms_per_step``: tb_plugin-style exclusive breakdown of the mean steady
  step (``gpu_time.tb_average_ns``): kernel, memcpy, memset, communication, runtime,
  dataloader, cpu_exec, other.
* ``idle_causes_ms``: GPU idle time by cause (``idle_gaps.per_device``), whole trace.
* ``peak_memory_bytes``: the highest allocated bytes of any device (profiler
  ``[memory]`` events or a snapshot's peak).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceanalyzer.units import fmt_cost

#: Columns of the per-file index, in order (see docs/batch.md).
METRIC_KEYS = (
    "n_steps",
    "step_ms",
    "step_ms_mean",
    "step_ms_p95",
    "gpu_busy_pct",
    "idle_pct",
    "compute_ms_per_step",
    "comm_ms_per_step",
    "exposed_comm_ms_per_step",
    "comm_overlap_pct",
    "n_kernels",
    "kernel_ms",
    "peak_memory_bytes",
    "n_findings",
)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)) and x == x:
        return float(x)
    return None


def _ms(ns: Any) -> float | None:
    v = _num(ns)
    return None if v is None else round(v / 1e6, 6)


def _rows(obj: Any) -> list[dict[str, Any]]:
    return [r for r in obj if isinstance(r, dict)] if isinstance(obj, list) else []


def _steady_steps(steps: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = _rows(steps.get("steps"))
    steady = [r for r in rows if not r.get("is_warmup") and not r.get("is_truncated")]
    return steady or rows


def metrics_from_analyses(analyses: Mapping[str, Any],
                          findings: list[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Compact metrics from ``{analysis name: to_json() dict}`` (see the module docstring).

    Works on a live report (``{n: r.to_json()}``) and on a ``summary.json``'s
    ``analyses`` alike, so cached rows and fresh rows are the same thing.
    """
    m: dict[str, Any] = {k: None for k in METRIC_KEYS}
    overview = analyses.get("overview") or {}
    steps = analyses.get("steps") or {}
    gpu = analyses.get("gpu_time") or {}
    idle = analyses.get("idle_gaps") or {}
    kernels = analyses.get("kernels") or {}

    # Steps
    n_windows = 0
    if steps:
        n_windows = len(_rows(steps.get("steps"))) or 0
        m["n_steps"] = steps.get("n_steps")
        if steps.get("has_steps"):
            st = steps.get("step_time_ns") or {}
            m["step_ms"] = _ms(st.get("median"))
            m["step_ms_mean"] = _ms(st.get("mean"))
            m["step_ms_p95"] = _ms(st.get("p95"))
        if n_windows and _num(steps.get("window_ns")) is not None:
            m["window_ms_per_step"] = _ms(float(steps["window_ns"]) / n_windows)
        if steps.get("has_steps"):
            m["step_times_ms"] = [
                round(float(r["dur_ns"]) / 1e6, 6) for r in _steady_steps(steps) if _num(r.get("dur_ns")) is not None
            ]
            m["steps"] = [
                {"step": r.get("step"), "dur_ms": _ms(r.get("dur_ns")),
                 "steady": not r.get("is_warmup") and not r.get("is_truncated")}
                for r in _rows(steps.get("steps"))
            ]
    elif overview:
        m["n_steps"] = overview.get("n_steps")

    # GPU busy / idle / exposed communication
    devs = _rows(gpu.get("per_device"))
    window = sum(_num(r.get("window_ns")) or 0.0 for r in devs)
    if devs and window > 0:
        busy = sum(_num(r.get("busy_ns")) or 0.0 for r in devs)
        idle_ns = sum(_num(r.get("idle_ns")) or 0.0 for r in devs)
        m["gpu_busy_pct"] = round(100.0 * busy / window, 3)
        m["idle_pct"] = round(100.0 * idle_ns / window, 3)
        if n_windows:
            compute = sum(_num(r.get("compute_ns")) or 0.0 for r in devs)
            exposed = sum(_num(r.get("communication_ns")) or 0.0 for r in devs)
            m["compute_ms_per_step"] = _ms(compute / n_windows)
            m["exposed_comm_ms_per_step"] = _ms(exposed / n_windows)
    elif _num(overview.get("gpu_busy_pct")) is not None:
        m["gpu_busy_pct"] = overview.get("gpu_busy_pct")
        m["idle_pct"] = round(100.0 - float(overview["gpu_busy_pct"]), 3)
    tb = gpu.get("tb_average_ns")
    if isinstance(tb, dict) and tb:
        m["breakdown_ms_per_step"] = {
            k[:-3] if k.endswith("_ns") else k: _ms(v) for k, v in tb.items() if k != "total_ns"
        }

    # Kernels and communication
    by_name = _rows(kernels.get("by_name"))
    if kernels:
        m["n_kernels"] = kernels.get("n_kernels")
        m["kernel_ms"] = _ms(kernels.get("total_ns"))
        comm = sum(_num(r.get("total_ns")) or 0.0 for r in by_name if r.get("is_comm"))
        if n_windows:
            m["comm_ms_per_step"] = _ms(comm / n_windows)
        if comm > 0 and m["exposed_comm_ms_per_step"] is not None:
            exposed_total = m["exposed_comm_ms_per_step"] * 1e6 * n_windows
            m["comm_overlap_pct"] = round(max(0.0, min(100.0, 100.0 * (comm - exposed_total) / comm)), 3)
    elif overview:
        m["n_kernels"] = (overview.get("counts") or {}).get("kernels")
    # One value per fact: where the communication analysis ran, its steady-step figures (the ones
    # the file's own report shows) replace the derivation above.
    ct = (analyses.get("communication") or {}).get("totals") or {}
    if _num(ct.get("comm_ns_per_step")) is not None:
        m["comm_ms_per_step"] = _ms(ct["comm_ns_per_step"])
        m["exposed_comm_ms_per_step"] = _ms(ct.get("exposed_ns_per_step"))
        m["comm_overlap_pct"] = ct.get("hidden_pct")

    # Idle causes
    causes: dict[str, float] = {}
    for r in _rows(idle.get("per_device")):
        for k, v in r.items():
            if k.endswith("_ns") and k not in ("idle_ns", "queued_ns") and _num(v) is not None:
                causes[k[:-3]] = causes.get(k[:-3], 0.0) + float(v)
    if causes:
        m["idle_causes_ms"] = {k: _ms(v) for k, v in causes.items()}

    # Memory peak
    peaks = [_num(r.get("peak_allocated_bytes")) for r in _rows((analyses.get("trace_memory") or {}).get("per_device"))]
    mp = analyses.get("memory_peak") or {}
    peaks += [_num(r.get("peak_allocated_bytes")) for r in _rows(mp.get("per_device"))]
    peaks.append(_num(mp.get("peak_allocated_bytes")))
    vals = [p for p in peaks if p is not None]
    if vals:
        m["peak_memory_bytes"] = int(max(vals))

    # Findings
    fs = [f for f in (findings or []) if isinstance(f, Mapping)]
    m["n_findings"] = len(fs)
    if fs:
        f = fs[0]
        m["top_finding"] = {
            "rule_id": f.get("rule_id"),
            "severity": f.get("severity"),
            "title": f.get("title"),
            "cost_ms_per_step": f.get("cost_ms_per_step"),
        }
    return m


def report_metrics(report: Any) -> dict[str, Any]:
    """:func:`metrics_from_analyses` for a live :class:`~traceanalyzer.report.document.Report`."""
    wanted = ("overview", "steps", "gpu_time", "idle_gaps", "kernels", "trace_memory", "memory_peak")
    analyses = {}
    for name in wanted:
        result = report.results.values.get(name)
        if result is not None:
            try:
                analyses[name] = result.to_json()
            except Exception:  # noqa: BLE001 - a broken to_json must not sink the batch row
                continue
    return metrics_from_analyses(analyses, [f.to_json() for f in report.findings])


def top_finding_text(metrics: Mapping[str, Any]) -> str:
    """``[severity] title (cost)`` of the top finding, or empty."""
    f = metrics.get("top_finding")
    if not isinstance(f, Mapping):
        return ""
    cost = f.get("cost_ms_per_step")
    tail = f" ({fmt_cost(cost, grouped=False)})" if isinstance(cost, (int, float)) else ""
    return f"[{f.get('severity')}] {f.get('title')}{tail}"
