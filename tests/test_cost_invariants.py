"""Cost invariants (docs/costs.md) over every trace of ../shared/data/traces and sample_traces.

A finding's cost is GPU time the user could win back, per steady step. On every input:

* no finding costs more than the median steady step (the whole window without steps), and no
  ``cost_pct_of_step`` exceeds 100;
* the rules that price disjoint causes of idle (:data:`DISJOINT`: each owns the idle of its own
  ``idle_gaps`` causes) together never price more than the idle of the step;
* idle per step is one figure: ``idle_gaps``' per-step idle (gap pieces plus the window time
  outside any gap) equals ``gpu_time``'s, window by window and device by device;
* the GPU idle after syncs per step never exceeds the step.

Loads and analyses come from the session caches of conftest (one per file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import REPO, SHARED_TRACES, shared_chrome_traces, shared_model, shared_params, shared_results

from traceanalyzer.rules import RuleOutcome, run_rules

#: Rules whose costs price disjoint idle: host-blocking calls (the sync and memcpy gaps, split
#: by event), data loading (data-loader gaps) and late launches (host-bound gaps).
DISJOINT = ("item_sync", "explicit_sync", "blocking_copies", "pageable_memcpy", "dataloader_bottleneck",
            "host_bound_gaps")
#: Rounding of costs to µs in findings, per rule summed.
TOL_MS = 0.005


SHARED_FILES = list(shared_chrome_traces())
SAMPLE_FILES = sorted(p for p in (REPO / "sample_traces").rglob("*.json*") if ".truth." not in p.name)


def _id(p: Path) -> str:
    try:
        return str(p.relative_to(SHARED_TRACES))
    except ValueError:
        return str(p.relative_to(REPO))


_OUT: dict[Path, tuple[Any, RuleOutcome]] = {}


def _run(path: Path) -> tuple[Any, RuleOutcome]:
    if path not in _OUT:
        assert shared_model(path).kind == "trace"
        results = shared_results(path)
        _OUT[path] = (results, run_rules(results, strict=True))
    return _OUT[path]


def _idle_per_step_ns(results: Any) -> float:
    """Mean over the steady steps of the idle of the least busy device (gpu_time)."""
    sr = results["steps"]
    steady = sr.steady_windows()
    per = results["gpu_time"].per_step.filter(pl.col("window").is_in(steady))
    worst = per.group_by("window").agg(pl.col("idle_ns").max())
    return float(worst["idle_ns"].sum() or 0) / max(len(steady), 1)


@pytest.mark.parametrize("path", shared_params(SHARED_FILES) + [pytest.param(p, id=_id(p)) for p in SAMPLE_FILES])
def test_cost_invariants(path: Path) -> None:
    results, out = _run(path)
    sr = results["steps"]
    med_ms = float((sr.stats or {}).get("median") or sr.window_ns) / 1e6
    for f in out.findings:
        where = f"{_id(path)}: {f.rule_id}: {f.title}"
        if f.cost_ms_per_step is not None:
            assert 0 <= f.cost_ms_per_step <= med_ms + TOL_MS, where
        if f.cost_pct_of_step is not None:
            assert 0 <= f.cost_pct_of_step <= 100.0 + 0.01, where

    if "gpu_time" in results:
        idle_ms = _idle_per_step_ns(results) / 1e6
        disjoint = [f for f in out.findings if f.rule_id in DISJOINT and f.cost_ms_per_step is not None]
        total = sum(f.cost_ms_per_step for f in disjoint)
        assert total <= idle_ms + TOL_MS * max(len(disjoint), 1), (
            _id(path), idle_ms, {f.rule_id: f.cost_ms_per_step for f in disjoint})

    if "idle_gaps" in results and "gpu_time" in results:
        ig = results["idle_gaps"].per_step.select(
            "window", "device", (pl.col("idle_ns") + pl.col("outside_gaps_ns")).alias("gaps_idle_ns"))
        gt = results["gpu_time"].per_step.select("window", "device", "idle_ns")
        j = gt.join(ig, on=["window", "device"], how="full", coalesce=True)
        bad = j.filter(pl.col("idle_ns").fill_null(-1) != pl.col("gaps_idle_ns").fill_null(-1))
        assert bad.is_empty(), (_id(path), bad.head(5).to_dicts())

    if "syncs" in results:
        s = results["syncs"]
        pcts = [p for p in s.per_step["pct_idle_after"].to_list() if p is not None]
        assert all(p <= 100.0 + 1e-6 for p in pcts), (_id(path), max(pcts))
        tot = s.totals["pct_idle_after_of_steps"]
        assert tot is None or tot <= 100.0 + 1e-6
