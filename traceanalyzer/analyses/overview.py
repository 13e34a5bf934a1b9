"""Overview: the first numbers anyone asks of a trace.

Steps found, trace span, GPU busy share, counts per event table, the top kernels.
Later analyses go deeper; this one exists so that ``analyze`` says something useful
on every trace, including CPU-only ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import gpu_activity
from traceanalyzer.timeutil import union_length_ns


@dataclass(frozen=True)
class OverviewResult:
    """Whole-trace totals.

    * ``span_ns``: first event start to last event end (any table).
    * ``gpu_busy_ns``: length of the union of all kernel/memcpy/memset intervals over
      all devices and streams (overlap counted once), inside the span.
    * ``gpu_window_ns``: first to last GPU activity; ``gpu_busy_pct`` is busy over that
      window (0 ≤ pct ≤ 100 × number of devices is impossible: union is per trace).
    * ``counts``: rows per model table.
    * ``top_kernels``: name, count, total/mean ns and share of kernel time, top 10 by total.
    """

    span_ns: int
    n_steps: int
    step_numbers: tuple[int, ...]
    devices: tuple[int, ...]
    gpu_busy_ns: int
    gpu_window_ns: int
    gpu_busy_pct: float | None
    counts: dict[str, int]
    top_kernels: pl.DataFrame
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "span_ns": self.span_ns,
            "n_steps": self.n_steps,
            "step_numbers": list(self.step_numbers),
            "devices": list(self.devices),
            "gpu_busy_ns": self.gpu_busy_ns,
            "gpu_window_ns": self.gpu_window_ns,
            "gpu_busy_pct": self.gpu_busy_pct,
            "counts": self.counts,
            "top_kernels": self.top_kernels.to_dicts(),
            "warnings": list(self.warnings),
        }

    def summary(self) -> list[tuple[str, str]]:
        # Over the whole trace (first to last GPU activity), not the steady steps that gpu_time
        # and diagnosis use: the label says so, so the two figures are not read as one.
        busy = ("n/a (no GPU activity)" if self.gpu_busy_pct is None
                else f"{self.gpu_busy_pct:.1f} % of the whole trace's GPU window (first to last GPU activity)")
        steps = (
            f"{self.n_steps} ({self.step_numbers[0]}–{self.step_numbers[-1]})" if self.n_steps else "none"
        )
        return [
            ("Steps", steps),
            ("Trace span", f"{self.span_ns / 1e6:,.3f} ms"),
            ("GPU busy (whole trace)", busy),
            ("Kernels", f"{self.counts.get('kernels', 0):,}"),
            ("Memcpy / memset", f"{self.counts.get('memcpy', 0):,} / {self.counts.get('memset', 0):,}"),
            ("Runtime calls", f"{self.counts.get('runtime', 0):,}"),
            ("CPU ops", f"{self.counts.get('cpu_ops', 0):,}"),
        ]

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Top kernels by total time": self.top_kernels} if self.top_kernels.height else {}


_COUNTED = (
    "cpu_ops", "annotations", "python_frames", "runtime", "kernels", "memcpy", "memset",
    "gpu_annotations", "flows", "memory_events", "steps", "other_events",
)


@analysis("overview", title="Overview", order=5, shared=("gpu_activity",),
          params={"top_kernels": 10})
def overview(ctx: AnalysisContext[TraceModel]) -> OverviewResult:
    """Whole-trace totals: span, steps, GPU busy %, event counts, top kernels."""
    model = ctx.model
    top_n = ctx.params.top_kernels
    gpu = gpu_activity(ctx.tables)
    busy = union_length_ns(gpu["ts_ns"], gpu["end_ns"]) if gpu.height else 0
    window = int(gpu["end_ns"].max() - gpu["ts_ns"].min()) if gpu.height else 0  # type: ignore[operator, arg-type]  # polars scalars
    k = model.kernels
    if k.height:
        total = k["dur_ns"].sum()
        top = (
            k.group_by("name")
            .agg(count=pl.len(), total_ns=pl.col("dur_ns").sum(), mean_ns=pl.col("dur_ns").mean())
            .with_columns(
                mean_ns=pl.col("mean_ns").round(0).cast(pl.Int64),
                pct_of_kernel_time=(pl.col("total_ns") * 100.0 / max(total, 1)).round(2),
            )
            .sort(["total_ns", "name"], descending=[True, False])
            .head(top_n)
        )
    else:
        top = pl.DataFrame(
            schema={"name": pl.String, "count": pl.UInt32, "total_ns": pl.Int64, "mean_ns": pl.Int64,
                    "pct_of_kernel_time": pl.Float64}
        )
    return OverviewResult(
        span_ns=model.meta.span_ns,
        n_steps=model.steps.height,
        step_numbers=tuple(model.steps["step"].to_list()),
        devices=tuple(sorted({d for d in gpu["device"].to_list() if d is not None})),
        gpu_busy_ns=busy,
        gpu_window_ns=window,
        gpu_busy_pct=round(busy * 100.0 / window, 3) if window > 0 else None,
        counts={t: model.table(t).height for t in _COUNTED},
        top_kernels=top,
        warnings=model.warnings,
    )
