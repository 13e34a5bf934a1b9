"""Step-time outliers, and warm-up steps inside the profiled window.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules step_outliers`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import median_step_ns, ms, n_steady, pct_of_step, time_finding


@rule("step_outliers", needs=("steps",), severity=Severity.INFO,
      params={"outlier_factor": 1.5, "min_steps": 3, "warning_pct": 10.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Step-time outliers, and warm-up steps inside the profiled window.

    Signal
        ``steps``: durations of the steady step windows and the leading warm-up steps the
        ``steps`` analysis set apart (a step longer than ``steps.warmup_factor`` × the median).
    Thresholds
        * outlier: a steady step longer than ``outlier_factor`` (1.5) × the median steady step,
          with ≥ ``min_steps`` (3) steady steps. SageMaker uses mean + 3σ, but with the 3–10 steps
          of a profile σ is dominated by the outlier itself; a ratio to the median is robust.
          INFO, WARNING when the outliers cost ≥ ``warning_pct`` (10) % of the median step.
        * warm-up: any warm-up step → INFO (it is excluded from every statistic; the profile
          schedule should skip it: ``schedule(wait=1, warmup=1, active=N)``).
    Cost
        Outliers: Σ (outlier − median) / steady steps — what steady pacing would save per step
        on average (confidence 0.5: the cause may be outside the program, e.g. GC, I/O, other
        processes). Warm-up: none (it does not recur).
    Fix
        Look at the slow steps' timelines (GC pauses, recompilation, data stalls, allocator
        growth, checkpointing); for warm-up, profile with a schedule that skips it.
    """
    sr = results["steps"]
    if not sr.has_steps:
        return
    med = median_step_ns(results)
    steady = sr.table.filter(pl.col("window").is_in(sr.steady_windows()))
    if steady.height >= params.min_steps and med > 0:
        out = steady.filter(pl.col("dur_ns") > params.outlier_factor * med)
        if out.height:
            excess = float((out["dur_ns"] - med).sum()) / n_steady(results)
            pct = pct_of_step(excess, results) or 0.0
            yield time_finding(
                "step_outliers", Severity.WARNING if pct >= params.warning_pct else Severity.INFO,
                f"{out.height} of {steady.height} steps take over {params.outlier_factor:g}× the median "
                f"({ms(med)} ms): step {', '.join('#' + str(s) for s in out['step'].to_list())}",
                {"outliers": [{"step": r["step"], "dur_ms": ms(r["dur_ns"]), "x_median": round(r["dur_ns"] / med, 2)}
                              for r in out.iter_rows(named=True)],
                 "step_ms": [ms(d) for d in steady["dur_ns"].to_list()]},
                "Open the slow steps' timelines: garbage-collection pauses (gc.freeze / gc.disable in the loop), "
                "recompilation (torch._dynamo recompiles), data-loader stalls, allocator growth (cudaMalloc), "
                "checkpointing or logging on some steps.",
                "torch._logging.set_logs(recompiles=True)  # and gc.freeze() after warm-up",
                excess, results, confidence=0.5,
            )
    if sr.warmup_steps:
        warm = sr.table.filter(pl.col("is_warmup"))
        yield time_finding(
            "step_outliers", Severity.INFO,
            f"Warm-up inside the profiled window: step {', '.join('#' + str(s) for s in sr.warmup_steps)} "
            f"took {', '.join(f'{d / med:.1f}×' for d in warm['dur_ns'].to_list())} the median "
            "(excluded from the statistics)",
            {"warmup_steps": list(sr.warmup_steps), "warmup_ms": [ms(d) for d in warm["dur_ns"].to_list()],
             "first_step_number": sr.table["step"][0]},
            "Skip warm-up when profiling so the window shows steady-state steps: "
            "torch.profiler.schedule(wait=1, warmup=1, active=N).",
            "prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))",
            None, results, confidence=0.9,
        )
