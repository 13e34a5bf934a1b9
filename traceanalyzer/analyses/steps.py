"""Steps: the training/inference iterations of a trace, as windows on the timeline.

Definitions
-----------
* A **step** is a CPU-side ``ProfilerStep#N`` range (``model.steps``; the GPU-side
  ``gpu_user_annotation`` duplicate never becomes a step).
* Its **window** starts where the CPU range starts and ends at the later of the CPU end
  and the end of the last GPU activity launched from inside it (a runtime call whose
  start lies in the CPU range, joined by correlation id: kernels, copies, memsets, graph
  replays). A window never starts before the previous window ends, so windows are
  disjoint and GPU tails are counted once (tb_plugin does the same).
* **Truncated last step**: the last of ≥ 2 steps is flagged when it launched fewer than
  ``steps.truncated_ops_ratio`` (0.8) × the median GPU-op count of the other steps, or its
  window is shorter than ``steps.truncated_dur_ratio`` (0.5) × their median. It is kept
  (HTA drops the last step unconditionally; we keep it and say so).
* **Warm-up**: the leading steps whose window is longer than ``steps.warmup_factor``
  (2.0) × the median of the other steps (needs ≥ 2 other steps).
* **Stats** (mean, median, p95, std, min, max of window durations, ns) are over steady
  steps (neither warm-up nor truncated); the same over all steps is given apart.
* A trace without ``ProfilerStep#`` gets one window, the whole trace span
  (``step`` null, name ``"whole trace"``).

Other analyses use :meth:`StepsResult.windows` and
:func:`~traceanalyzer.analyses._steps.assign_steps` to attribute events to windows; the join
key is the ``window`` index (0…n−1), ``step`` is the label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._intervals import assign_window, dist_stats, ms
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import gpu_activity, launches

WINDOW_SCHEMA = {
    "window": pl.Int64,
    "step": pl.Int64,
    "name": pl.String,
    "cpu_start_ns": pl.Int64,
    "cpu_end_ns": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "gpu_end_ns": pl.Int64,
    "gpu_tail_ns": pl.Int64,
    "launches": pl.Int64,
    "gpu_ops": pl.Int64,
    "is_warmup": pl.Boolean,
    "is_truncated": pl.Boolean,
}


@dataclass(frozen=True)
class StepsResult:
    """Step windows, flags and step-time distributions. See the module docstring."""

    has_steps: bool
    table: pl.DataFrame  # WINDOW_SCHEMA, one row per window, sorted by start
    warmup_steps: tuple[int, ...]
    truncated_step: int | None
    stats: dict[str, Any]  # steady steps
    stats_all: dict[str, Any]
    window_ns: int  # total length of all windows
    thresholds: dict[str, float]

    @property
    def n_windows(self) -> int:
        return self.table.height

    def windows(self) -> pl.DataFrame:
        """``window, step, start_ns, end_ns`` (disjoint, sorted)."""
        return self.table.select("window", "step", "start_ns", "end_ns")

    def steady_windows(self) -> list[int]:
        t = self.table.filter(~pl.col("is_warmup") & ~pl.col("is_truncated"))
        return t["window"].to_list() if t.height else self.table["window"].to_list()

    def to_json(self) -> dict[str, Any]:
        return {
            "has_steps": self.has_steps,
            "n_steps": self.table.height if self.has_steps else 0,
            "window_ns": self.window_ns,
            "warmup_steps": list(self.warmup_steps),
            "truncated_step": self.truncated_step,
            "step_time_ns": self.stats,
            "step_time_all_ns": self.stats_all,
            "thresholds": self.thresholds,
            "steps": self.table.to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        if not self.has_steps:
            return [("Steps", "none: whole trace analysed as one window"), ("Window", ms(self.window_ns))]
        steps = self.table["step"].to_list()
        out = [
            ("Steps", f"{len(steps)} (#{steps[0]}–#{steps[-1]})"),
            (
                "Step time (steady)",
                f"median {ms(self.stats['median'])}, mean {ms(self.stats['mean'])}, "
                f"p95 {ms(self.stats['p95'])}, std {ms(self.stats['std'])} over {self.stats['count']} steps",
            ),
        ]
        if self.warmup_steps:
            out.append(("Warm-up steps", ", ".join(f"#{s}" for s in self.warmup_steps)))
        if self.truncated_step is not None:
            out.append(("Truncated last step", f"#{self.truncated_step} (kept, excluded from the stats)"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "Steps": self.table.select(
                "step", "name", "start_ns", "dur_ns", "cpu_start_ns", "cpu_end_ns", "gpu_tail_ns",
                "launches", "gpu_ops", "is_warmup", "is_truncated",
            )
        }


def _flag(values: list[int], idx: int, others: list[int], factor: float, above: bool) -> bool:
    if len(others) < 1:
        return False
    srt = sorted(others)
    n = len(srt)
    med = srt[n // 2] if n % 2 else (srt[n // 2 - 1] + srt[n // 2]) / 2
    return values[idx] > factor * med if above else values[idx] < factor * med


@analysis("steps", title="Steps", order=10, shared=("gpu_activity", "launches"),
          params={"warmup_factor": 2.0, "truncated_ops_ratio": 0.8, "truncated_dur_ratio": 0.5})
def steps(ctx: AnalysisContext[TraceModel]) -> StepsResult:
    """Step windows from CPU ProfilerStep#N extended to their GPU work; warm-up/truncation flags."""
    model = ctx.model
    warmup_factor = ctx.params.warmup_factor
    trunc_ops = ctx.params.truncated_ops_ratio
    trunc_dur = ctx.params.truncated_dur_ratio
    thresholds = {
        "warmup_factor": warmup_factor,
        "truncated_ops_ratio": trunc_ops,
        "truncated_dur_ratio": trunc_dur,
    }
    st = model.steps.sort("ts_ns")
    if st.is_empty():
        lo, hi = model.meta.span_start_ns, model.meta.span_end_ns
        gpu = gpu_activity(ctx.tables)
        table = pl.DataFrame(
            {
                "window": [0], "step": [None], "name": ["whole trace"], "cpu_start_ns": [lo],
                "cpu_end_ns": [hi], "start_ns": [lo], "end_ns": [hi], "dur_ns": [hi - lo],
                "gpu_end_ns": [gpu["end_ns"].max() if gpu.height else None], "gpu_tail_ns": [0],
                "launches": [model.runtime.height], "gpu_ops": [gpu.height],
                "is_warmup": [False], "is_truncated": [False],
            },
            schema=WINDOW_SCHEMA,
        )
        whole = dist_stats(table["dur_ns"])
        return StepsResult(False, table, (), None, whole, whole, hi - lo, thresholds)

    cpu = st.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("window"),
        "step",
        "name",
        pl.col("ts_ns").alias("cpu_start_ns"),
        pl.col("end_ns").alias("cpu_end_ns"),
    )
    cpu_w = cpu.select("window", pl.col("cpu_start_ns").alias("start_ns"), pl.col("cpu_end_ns").alias("end_ns"))
    # The columns read below, then the rows: a filter copies every column it is given.
    lj = launches(ctx.tables).select("cpu_ts_ns", "gpu_ts_ns", "gpu_end_ns", "correlation", "is_launch").filter(
        pl.col("gpu_ts_ns").is_not_null() | pl.col("is_launch")
    )
    lj = assign_window(lj, cpu_w, "cpu_ts_ns", "window").filter(pl.col("window").is_not_null())
    per = lj.group_by("window").agg(
        gpu_end_ns=pl.col("gpu_end_ns").max(),
        launches=pl.col("correlation").filter(pl.col("is_launch")).n_unique().cast(pl.Int64),
        gpu_ops=pl.col("gpu_ts_ns").is_not_null().sum().cast(pl.Int64),
    )
    t = (
        cpu.join(per, on="window", how="left")
        .with_columns(pl.col("launches").fill_null(0), pl.col("gpu_ops").fill_null(0))
        .with_columns(end_ns=pl.max_horizontal("cpu_end_ns", "gpu_end_ns"))
        .with_columns(prev_end=pl.col("end_ns").cum_max().shift(1))
        .with_columns(start_ns=pl.max_horizontal("cpu_start_ns", pl.col("prev_end").fill_null(pl.col("cpu_start_ns"))))
        .with_columns(start_ns=pl.min_horizontal("start_ns", "end_ns"))
        .with_columns(
            dur_ns=pl.col("end_ns") - pl.col("start_ns"),
            gpu_tail_ns=(pl.col("end_ns") - pl.col("cpu_end_ns")).clip(lower_bound=0),
        )
    )

    durs = t["dur_ns"].to_list()
    ops = t["gpu_ops"].to_list()
    n = len(durs)
    truncated = [False] * n
    if n >= 2:
        last = n - 1
        others = list(range(last))
        truncated[last] = _flag(ops, last, [ops[i] for i in others], trunc_ops, above=False) or _flag(
            durs, last, [durs[i] for i in others], trunc_dur, above=False
        )
    warm = [False] * n
    for i in range(n):  # leading steps only: at most a handful of iterations
        others = [durs[j] for j in range(n) if j != i and not warm[j] and not truncated[j]]
        if len(others) >= 2 and _flag(durs, i, others, warmup_factor, above=True):
            warm[i] = True
        else:
            break
    t = t.with_columns(
        is_warmup=pl.Series(warm, dtype=pl.Boolean), is_truncated=pl.Series(truncated, dtype=pl.Boolean)
    ).select(list(WINDOW_SCHEMA))
    steady = t.filter(~pl.col("is_warmup") & ~pl.col("is_truncated"))
    stats: dict[str, Any] = dict(dist_stats((steady if steady.height else t)["dur_ns"]))
    stats["steps"] = (steady if steady.height else t)["step"].to_list()
    return StepsResult(
        has_steps=True,
        table=t,
        warmup_steps=tuple(t.filter("is_warmup")["step"].to_list()),
        truncated_step=(t["step"][-1] if truncated[-1] else None),
        stats=stats,
        stats_all=dist_stats(t["dur_ns"]),
        window_ns=int(t["dur_ns"].sum()),
        thresholds=thresholds,
    )
