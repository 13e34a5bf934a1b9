"""Cost arithmetic shared by the rules (private: the leading underscore keeps it out of discovery).

Every time-based rule states its cost per **steady step** (the ``steps`` analysis: warm-up
and a truncated last step left out) in ms, and as a % of the **median steady step**.
A trace without ``ProfilerStep#`` has one whole-trace window: "per step" then means
"over the whole trace".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Severity, shared

NS_PER_MS = 1_000_000.0


def steps_of(results: Results) -> StepsResult:
    """The ``steps`` result; NotApplicable without it (the rule is listed as not run)."""
    sr = results.typed("steps", StepsResult)
    if sr is None:
        raise NotApplicable("no step windows (the steps analysis did not run)")
    return sr


def median_step_ns(results: Results) -> float:
    """Median steady step window (ns); the whole trace without steps."""
    sr = steps_of(results)
    med = (sr.stats or {}).get("median")
    if med:
        return float(med)
    return float(sr.window_ns or 0)


def steady_windows(results: Results) -> list[int]:
    sr = steps_of(results)
    return list(shared(("steady_windows", id(sr)), sr.steady_windows))


def steady_steps(results: Results) -> list[int | None]:
    """Step labels of the steady windows (``[None]`` for a trace without steps)."""
    sr = steps_of(results)
    windows = steady_windows(results)
    return list(shared(("steady_steps", id(sr)),
                       lambda: sr.table.filter(pl.col("window").is_in(windows))["step"].to_list()))


def steady(df: pl.DataFrame, results: Results, by: str = "window") -> pl.DataFrame:
    """Rows of a per-window (``by="window"``) or per-step (``by="step"``) table that belong to
    steady steps. Per-step tables of a trace without steps (step null) are returned as is."""
    if df.is_empty() or by not in df.columns:
        return df
    if by == "window":
        return df.filter(pl.col("window").is_in(steady_windows(results)))
    labels = [s for s in steady_steps(results) if s is not None]
    if not labels:
        return df
    return df.filter(pl.col("step").is_in(labels))


def n_steady(results: Results) -> int:
    return max(len(steady_windows(results)), 1)


def per_step_ns(df: pl.DataFrame, col: str, results: Results, by: str = "window") -> float:
    """Mean over steady steps of ``col`` (missing steps count as 0)."""
    s = steady(df, results, by)
    total = float(s[col].fill_null(0).sum()) if s.height and col in s.columns else 0.0
    return total / n_steady(results)


def gpu_idle_per_step_ns(results: Results) -> float | None:
    """Mean idle per steady step of the busiest device (``gpu_time``); None without it. A CPU-side
    saving can give the GPU back at most this (plus the GPU work it removes)."""
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is None or gt.per_device.is_empty():
        return None
    dev = gt.per_device.sort(["busy_ns", "device"], descending=[True, False])["device"][0]
    return per_step_ns(gt.per_step.filter(pl.col("device") == dev), "idle_ns", results)


def pct_of_step(ns: float, results: Results) -> float | None:
    med = median_step_ns(results)
    return round(ns * 100.0 / med, 2) if med > 0 else None


def ms(ns: float | int | None) -> float | None:
    return None if ns is None else round(float(ns) / NS_PER_MS, 3)


def severity_for(pct: float | None, warning_pct: float, critical_pct: float,
                 floor: Severity = Severity.INFO) -> Severity:
    """INFO below ``warning_pct`` % of the step, WARNING from it, CRITICAL from ``critical_pct``."""
    if pct is None:
        return floor
    if pct >= critical_pct:
        return Severity.CRITICAL
    if pct >= warning_pct:
        return max(Severity.WARNING, floor)
    return floor


def time_finding(
    rule_id: str,
    severity: Severity,
    title: str,
    evidence: Mapping[str, Any],
    fix: str,
    code_hint: str,
    cost_ns_per_step: float | None,
    results: Results,
    confidence: float = 1.0,
) -> Finding:
    """A finding whose cost is time per step (ms and % of the median steady step)."""
    ev = dict(evidence)
    ev.setdefault("median_step_ms", ms(median_step_ns(results)))
    ev.setdefault("steady_steps", len(steady_windows(results)))
    return Finding(
        rule_id=rule_id,
        severity=severity,
        title=title,
        evidence=ev,
        fix=fix,
        code_hint=code_hint,
        cost_ms_per_step=None if cost_ns_per_step is None else round(cost_ns_per_step / NS_PER_MS, 3),
        cost_pct_of_step=None if cost_ns_per_step is None else pct_of_step(cost_ns_per_step, results),
        confidence=round(confidence, 2),
    )


def top_rows(df: pl.DataFrame, n: int = 5, cols: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The first ``n`` rows as dicts (JSON-safe), optionally restricted to ``cols``."""
    if df is None or df.is_empty():
        return []
    if cols is not None:
        df = df.select([c for c in cols if c in df.columns])
    return df.head(n).to_dicts()


def implied_sync(cause: pl.Expr) -> pl.Expr:
    """True for sync points caused by an op that implies a sync (``aten::item``, ``nonzero`` …)."""
    from traceanalyzer.analyses.syncs import IMPLIED_SYNC_OPS

    return cause.str.replace(r" \(boolean mask\)$", "").is_in(list(IMPLIED_SYNC_OPS)).fill_null(False)


def fmt_count(x: float) -> str:
    """A per-step count for a title: ``1`` not ``1.0``; ``1.5``; ``12`` (whole from 10 on)."""
    if abs(x - round(x)) < 0.05 or x >= 10:
        return f"{round(x):,}"
    return f"{x:.1f}"


def plural(x: float, one: str, many: str) -> str:
    return one if fmt_count(x) == "1" else many
