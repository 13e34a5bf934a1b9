"""Kernels: counts and duration statistics per name, per step and per launching CPU op.

Definitions
-----------
* Kernels are ``model.kernels`` (copies and memsets are in ``gpu_time`` / copies
  analyses). Durations are ns; ``pct_of_kernel_time`` is a share of the summed kernel
  durations (overlapping kernels each count), ``pct_of_window`` a share of the step
  windows' total length.
* **Normalised name** (:func:`normalize_kernel_name`): template arguments ``<…>`` and
  parameter lists ``(…)`` removed (nested ones too), ``(anonymous namespace)::`` and a
  leading ``void`` dropped. ``void at::native::vectorized_elementwise_kernel<4, …>(int, …)``
  becomes ``at::native::vectorized_elementwise_kernel``. Tables group by it and keep
  the number of distinct full names and one example; a full-name table is also given.
* **Per step**: a kernel belongs to the step window containing its start; ``comm_ns``
  sums the durations of its communication kernels (all devices, overlap counted twice;
  ``is_comm``: recognised by collective metadata, launching CPU op or name family, see
  ``docs/communication.md``).
* **Launching CPU op**: the deepest ``cpu_op`` covering the start of the runtime call
  that launched the kernel (joined by correlation id), on that call's thread.
* **Short kernels**: shorter than ``kernels.short_kernel_us`` (default 10 µs, TraceLens's
  value); a fine-grained histogram of durations is threshold-free.
* Top-N tables: ``kernels.top_n`` (default 20).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.analyses._intervals import SHORT_BINS_NS, dist_stats, histogram, ms, pct, us
from traceanalyzer.analyses._kernels import kernel_norms
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import join_unique, launch_calls, op_index


@dataclass(frozen=True)
class KernelsResult:
    """Kernel statistics; see the module docstring for definitions."""

    n_kernels: int
    total_ns: int
    window_ns: int
    duration_ns: dict[str, Any]
    short_kernel_ns: int
    n_short: int
    short_total_ns: int
    by_name: pl.DataFrame
    by_full_name: pl.DataFrame
    per_step: pl.DataFrame
    by_cpu_op: pl.DataFrame
    short_histogram: pl.DataFrame
    top_n: int

    def to_json(self) -> dict[str, Any]:
        return {
            "n_kernels": self.n_kernels,
            "total_ns": self.total_ns,
            "window_ns": self.window_ns,
            "pct_of_window": pct(self.total_ns, self.window_ns),
            "duration_ns": self.duration_ns,
            "short_kernel_ns": self.short_kernel_ns,
            "n_short": self.n_short,
            "short_total_ns": self.short_total_ns,
            "by_name": self.by_name.to_dicts(),
            "by_full_name": self.by_full_name.head(self.top_n).to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "by_cpu_op": self.by_cpu_op.to_dicts(),
            "short_histogram": self.short_histogram.to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        d = self.duration_ns
        out = [
            ("Kernels", f"{self.n_kernels:,} ({ms(self.total_ns)} summed, {self.by_name.height:,} distinct names)"),
            ("Kernel duration", f"median {us(d['median'])}, mean {us(d['mean'])}, p95 {us(d['p95'])}"),
            (
                f"Short kernels (< {self.short_kernel_ns / 1000:g} µs)",
                f"{self.n_short:,} ({pct(self.n_short, self.n_kernels) or 0:.1f} % of kernels, "
                f"{pct(self.short_total_ns, self.total_ns) or 0:.1f} % of kernel time)",
            ),
        ]
        if self.by_name.height:
            top = self.by_name.row(0, named=True)
            out.append(("Top kernel", f"{top['name']} ({top['pct_of_kernel_time']:.1f} % of kernel time)"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "Top kernels (normalised name)": self.by_name.drop("example").head(self.top_n),
            "Kernels per step": self.per_step,
            "Kernels per launching CPU op": self.by_cpu_op.head(self.top_n),
            "Kernel duration histogram": self.short_histogram,
        }


def _stats_aggs() -> list[pl.Expr]:
    d = pl.col("dur_ns")
    return [
        pl.len().cast(pl.Int64).alias("count"),
        d.sum().alias("total_ns"),
        d.mean().round(1).alias("mean_ns"),
        d.median().alias("median_ns"),
        d.quantile(0.95, "linear").alias("p95_ns"),
        d.min().alias("min_ns"),
        d.max().alias("max_ns"),
    ]


@analysis("kernels", depends_on=("steps",), title="Kernels", order=40,
          shared=("op_nesting", "comm_classes", "kernel_norms"),
          params={"top_n": 20, "short_kernel_us": 10.0})
def kernels(ctx: AnalysisContext[TraceModel]) -> KernelsResult:
    """Kernel counts/durations per (normalised) name, step and launching CPU op; short kernels."""
    model = ctx.model
    if model.kernels.is_empty():
        raise NotApplicable("no GPU kernels in this trace")
    top_n = ctx.params.top_n
    short_us = ctx.params.short_kernel_us
    short_ns = int(short_us * 1000)
    sr = ctx.need("steps", StepsResult)
    # Communication kernels as every analysis counts them (metadata, launching op, name: _comm).
    # The columns read below only: the filters copy every column they are given.
    k = model.kernels.select("name", "ts_ns", "dur_ns", "correlation", norm=kernel_norms(ctx.tables),
                             is_comm=comm_classes(ctx.tables)["is_comm"])
    total = int(k["dur_ns"].sum())

    by_name = (
        k.group_by("norm")
        .agg(*_stats_aggs(), n_variants=pl.col("name").n_unique().cast(pl.Int64), example=pl.col("name").first(),
             is_comm=pl.col("is_comm").any())
        .rename({"norm": "name"})
        .with_columns(pct_of_kernel_time=(pl.col("total_ns") * 100.0 / max(total, 1)).round(3))
        .sort(["total_ns", "name"], descending=[True, False])
    )
    by_full = (
        k.group_by("name")
        .agg(*_stats_aggs(), normalized=pl.col("norm").first())
        .with_columns(pct_of_kernel_time=(pl.col("total_ns") * 100.0 / max(total, 1)).round(3))
        .sort(["total_ns", "name"], descending=[True, False])
    )
    ks = assign_steps(k, sr, "ts_ns")
    per_step = (
        ks.filter(pl.col("window").is_not_null())
        .group_by("window", "step")
        .agg(
            n_kernels=pl.len().cast(pl.Int64),
            kernel_ns=pl.col("dur_ns").sum(),
            median_ns=pl.col("dur_ns").median(),
            n_short=(pl.col("dur_ns") < short_ns).sum().cast(pl.Int64),
            n_comm=pl.col("is_comm").sum().cast(pl.Int64),
            comm_ns=pl.col("dur_ns").filter(pl.col("is_comm")).sum(),
        )
        .sort("window")
    )

    # Launching CPU op: runtime call (by correlation) → deepest cpu_op covering its start.
    rt = launch_calls(model)
    # Only the launch points of these kernels are looked up (not every runtime call), and
    # op ids are row numbers of model.cpu_ops: the name is a gather, not a join.
    launch = join_unique(k.select("correlation"), rt.select("correlation", "pid", "tid", "ts_ns"), "correlation")
    op_id = op_index(ctx.tables).lookup(launch.select("pid", "tid", "ts_ns"))
    kk = k.with_columns(cpu_op=model.cpu_ops["name"].gather(op_id))
    by_op = (
        kk.with_columns(pl.col("cpu_op").fill_null("<no launching CPU op>"))
        .group_by("cpu_op")
        .agg(
            n_kernels=pl.len().cast(pl.Int64),
            kernel_ns=pl.col("dur_ns").sum(),
            mean_ns=pl.col("dur_ns").mean().round(1),
            n_names=pl.col("norm").n_unique().cast(pl.Int64),
            top_kernel=pl.col("norm").mode().sort().first(),  # sorted: ties deterministic
        )
        .with_columns(pct_of_kernel_time=(pl.col("kernel_ns") * 100.0 / max(total, 1)).round(3))
        .sort(["kernel_ns", "cpu_op"], descending=[True, False])
    )
    short = k.filter(pl.col("dur_ns") < short_ns)
    return KernelsResult(
        n_kernels=k.height,
        total_ns=total,
        window_ns=sr.window_ns,
        duration_ns=dist_stats(k["dur_ns"]),
        short_kernel_ns=short_ns,
        n_short=short.height,
        short_total_ns=int(short["dur_ns"].sum()) if short.height else 0,
        by_name=by_name,
        by_full_name=by_full,
        per_step=per_step,
        by_cpu_op=by_op,
        short_histogram=histogram(k["dur_ns"], SHORT_BINS_NS),
        top_n=top_n,
    )
