"""Step-time outliers, and warm-up steps inside the profiled window.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules step_outliers`` prints.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import median_step_ns, ms, n_steady, pct_of_step, time_finding

#: tb_plugin step-breakdown categories, in words for the title.
_CATEGORIES = {
    "kernel": "GPU kernels", "memcpy": "copies", "memset": "memsets", "communication": "communication",
    "runtime": "runtime calls", "dataloader": "data loading", "cpu_exec": "CPU ops",
    "other": "time outside any op or runtime call (Python code, idle CPU)",
}


def _gpu_excess(results: Results, out: pl.DataFrame, ok_windows: list[int], med: float) -> float | None:
    """GPU idle the outlier steps add on the primary device, per steady step (see the Cost);
    None without ``gpu_time``."""
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is None or gt.per_step.is_empty() or gt.per_device.is_empty() or not ok_windows:
        return None
    dev = gt.per_device.sort(["busy_ns", "device"], descending=[True, False])["device"][0]
    idle = gt.per_step.filter(pl.col("device") == dev).select("window", "idle_ns")
    ref = idle.filter(pl.col("window").is_in(ok_windows))["idle_ns"].to_list()
    base = float(statistics.median(ref)) if ref else 0.0
    rows = out.select("window", "dur_ns").join(idle, on="window", how="left").with_columns(
        pl.col("idle_ns").fill_null(0))
    extra = sum(min(max(float(i) - base, 0.0), float(d) - med) for d, i in rows.select("dur_ns", "idle_ns").iter_rows())
    return extra / n_steady(results)


def _excess_by_category(results: Results, out_windows: list[int], ok_windows: list[int]) -> dict[str, float]:
    """Per tb_plugin category: Σ over the outlier steps of (their time − the median of the other
    steady steps), ns. Empty without the ``gpu_time`` breakdown."""
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is None or gt.tb_breakdown.is_empty() or not ok_windows:
        return {}
    tb = gt.tb_breakdown
    ref = tb.filter(pl.col("window").is_in(ok_windows))
    slow = tb.filter(pl.col("window").is_in(out_windows))
    out: dict[str, float] = {}
    for c in _CATEGORIES:
        col = f"{c}_ns"
        if col in tb.columns:
            out[c] = float(slow[col].sum()) - len(out_windows) * float(statistics.median(ref[col].to_list()))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@rule("step_outliers", needs=("steps",), severity=Severity.INFO,
      params={"outlier_factor": 1.5, "min_steps": 3, "warning_pct": 10.0}, uses=("gpu_time",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Step-time outliers, and warm-up steps inside the profiled window.

    Signal
        ``steps``: durations of the steady step windows and the leading warm-up steps the
        ``steps`` analysis set apart (longer than ``steps.warmup_factor`` (2) × the median of
        the others); a trace without ``ProfilerStep#`` ranges has no step times (not run).
        With ``gpu_time``, the outliers' extra time is split by tb_plugin category (kernel,
        memcpy, …, dataloader, cpu_exec, other: the outlier steps' time minus the median of
        the other steady steps) and the largest is named.
    Threshold
        * outlier: a steady step longer than ``outlier_factor`` (1.5) × the median steady step,
          with ≥ ``min_steps`` (3) steady steps. SageMaker uses mean + 3σ, but with the 3–10
          steps of a profile σ is dominated by the outlier itself; a ratio to the median is
          robust. INFO; WARNING when the outliers cost ≥ ``warning_pct`` (10) % of the median
          step.
        * warm-up: any warm-up step → INFO (it is excluded from every statistic; the profile
          schedule should skip it: ``schedule(wait=1, warmup=1, active=N)``).
    Cost
        Outliers, with GPU activity: the GPU idle they add — Σ over the outlier steps of
        (their idle on the primary device − the median idle of the other steady steps),
        each capped by (outlier − median step), / steady steps: what steady pacing would give
        the GPU back per step on average (a step slower because the GPU had more work loses
        no GPU time). CPU-only trace: Σ (outlier − median) / steady steps (wall time). The
        wall-time excess is evidence (``excess_ms_per_step``). Confidence 0.5: the cause may be
        outside the program (GC, I/O, other processes); a named category such as data loading
        is also priced by its own rule (the same idle, not additive). Warm-up: none (it does
        not recur).
    Fix
        Look at the slow steps' timelines (GC pauses, recompilation, data stalls, allocator
        growth, checkpointing); for warm-up, profile with a schedule that skips it.
    """
    sr = results.need("steps", StepsResult)
    if not sr.has_steps:
        raise NotApplicable("no ProfilerStep# ranges: step times are unknown (profile with a schedule / prof.step())")
    med = median_step_ns(results)
    steady = sr.table.filter(pl.col("window").is_in(sr.steady_windows()))
    if steady.height >= params.min_steps and med > 0:
        is_out = pl.col("dur_ns") > params.outlier_factor * med
        out = steady.filter(is_out)
        if out.height:
            excess = float((out["dur_ns"] - med).sum()) / n_steady(results)
            cost = _gpu_excess(results, out, steady.filter(~is_out)["window"].to_list(), med)
            cost = excess if cost is None else cost
            pct = pct_of_step(cost, results) or 0.0
            cats = _excess_by_category(results, out["window"].to_list(), steady.filter(~is_out)["window"].to_list())
            top = next(iter(cats.items()), None)
            spent = ""
            if top and top[1] > 0:
                spent = (f"; the extra time is mostly {_CATEGORIES[top[0]]} "
                         f"(+{ms(top[1] / out.height)} ms per slow step)")
            steps_txt = ", ".join("#" + str(s) for s in out["step"].to_list())
            yield time_finding(
                "step_outliers", Severity.WARNING if pct >= params.warning_pct else Severity.INFO,
                f"{out.height} of {steady.height} steps {'takes' if out.height == 1 else 'take'} over "
                f"{params.outlier_factor:g}× the median step "
                f"({ms(med)} ms): step {steps_txt}{spent}",
                {"outliers": [{"step": r["step"], "dur_ms": ms(r["dur_ns"]), "x_median": round(r["dur_ns"] / med, 2)}
                              for r in out.iter_rows(named=True)],
                 "step_ms": {str(s): ms(d) for s, d in steady.select("step", "dur_ns").iter_rows()},
                 "excess_ms_per_step": ms(excess),
                 "outlier_excess_ms_by_category": {c: ms(v) for c, v in cats.items()}},
                "Open the slow steps' timelines: garbage-collection pauses (gc.freeze / gc.disable in the loop), "
                "recompilation (torch._dynamo recompiles), data-loader stalls, allocator growth (cudaMalloc), "
                "checkpointing or logging on some steps.",
                "torch._logging.set_logs(recompiles=True)  # and gc.freeze() after warm-up",
                cost, results, confidence=0.5,
            )
    if sr.warmup_steps and med > 0:
        warm = sr.table.filter(pl.col("is_warmup"))
        yield time_finding(
            "step_outliers", Severity.INFO,
            f"Warm-up inside the profiled window: step {', '.join('#' + str(s) for s in sr.warmup_steps)} "
            f"took {', '.join(f'{d / med:.1f}×' for d in warm['dur_ns'].to_list())} the median step "
            "(excluded from the statistics)",
            {"warmup_steps": list(sr.warmup_steps), "warmup_ms": [ms(d) for d in warm["dur_ns"].to_list()],
             "first_step_number": sr.table["step"][0]},
            "Skip warm-up when profiling so the window shows steady-state steps: "
            "torch.profiler.schedule(wait=1, warmup=1, active=N).",
            "prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))",
            None, results, confidence=0.9,
        )
