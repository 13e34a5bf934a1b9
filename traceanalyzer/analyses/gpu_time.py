"""GPU time: busy/idle breakdown per device and per step, plus tb_plugin's step breakdown.

Device breakdown (union semantics)
----------------------------------
Every kernel, memcpy and memset of a device is an interval ``[ts, ts+dur)``. Each
instant of a step window is counted **once**, in the first category that covers it on
that device, in this fixed precedence:

    compute  >  communication  >  memcpy  >  memset  >  idle

* ``compute``: kernels that are not collectives;
* ``communication``: communication kernels (collective metadata, launching communication
  CPU op, or a communication library's name family: ``docs/communication.md``) — i.e.
  *exposed* communication, not hidden under compute;
* ``memcpy`` / ``memset``: copies and fills not hidden under any kernel;
* ``idle``: no device activity at all.

So overlapping streams are counted once and the five add up to the window
(``busy = compute + communication + memcpy + memset``). This is TraceLens's identity
(computation + exposed comm + exposed memcpy + idle = total) with memsets split out.
Per step the window is the step window (see ``steps``); the whole-trace row sums the
windows. ``gpu_span`` gives, per device, the same numbers over HTA's window (first to
last activity on the device) for comparison with HTA's temporal breakdown
(HTA "compute" = our compute; HTA "non-compute" = communication + memcpy + memset).

tb_plugin step breakdown (exclusive, all devices and threads)
-------------------------------------------------------------
Priority ``kernel > memcpy > memset > communication > runtime > dataloader > cpu_exec >
other``: kernel = non-collective kernels; communication = communication kernels and CPU
communication ops (``nccl:*``, ``gloo:*``, ``c10d::*``, ``record_param_comms``, functional
collectives, ``symm_mem::*``, custom all-reduce and DeepEP ops: ``_comm.COMM_OP_RE``); runtime =
CUDA/HIP/XPU runtime and driver calls; dataloader = ``enumerate(DataLoader)#…`` /
``enumerate(DataPipe)#…`` ranges; cpu_exec = every other CPU op or user annotation
(``ProfilerStep#`` itself excluded; Python frames are not counted, as in tb_plugin,
because the outermost frame would swallow "other"); other = the rest. The eight add up
to the step window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._gputime import CPU_COMM_RE, exclusive_breakdown
from traceanalyzer.analyses._intervals import (
    DATALOADER_RE,
    device_union,
    gpu_activity_classes,
    ms,
    pct,
)
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.timeutil import merge_intervals
from traceanalyzer.units import device_name

DEVICE_CATEGORIES = ("compute", "communication", "memcpy", "memset")
TB_CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")


@dataclass(frozen=True)
class GpuTimeResult:
    """Busy/idle per device and step, HTA-comparable span numbers, tb_plugin breakdown."""

    per_device: pl.DataFrame  # device, window_ns, busy_ns, compute_ns, …, idle_ns, busy_pct
    per_step: pl.DataFrame  # window, step, device, dur_ns, compute_ns, …, idle_ns, busy_pct
    gpu_span: pl.DataFrame  # device, first_ns, last_ns, span_ns, busy_ns, compute_ns, non_compute_ns, idle_ns
    tb_breakdown: pl.DataFrame  # window, step, kernel_ns … other_ns, total_ns
    tb_average: dict[str, float]  # mean per steady step, ns
    steady_busy_pct: dict[int, float | None]  # device → busy % over steady steps
    #: The trace's vendor (``TraceMeta.vendor``): how its devices are named in text (not in to_json).
    vendor: str = "unknown"

    def to_json(self) -> dict[str, Any]:
        return {
            "per_device": self.per_device.to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "gpu_span": self.gpu_span.to_dicts(),
            "tb_breakdown": self.tb_breakdown.to_dicts(),
            "tb_average_ns": self.tb_average,
            "steady_busy_pct": {str(k): v for k, v in self.steady_busy_pct.items()},
            "precedence": list(DEVICE_CATEGORIES),
        }

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for r in self.per_device.iter_rows(named=True):
            w = r["window_ns"]
            parts = ", ".join(
                f"{c} {pct(r[f'{c}_ns'], w) or 0:.1f} %" for c in (*DEVICE_CATEGORIES, "idle")
            )
            out.append((f"{device_name(r['device'], self.vendor)} busy (all step windows)",
                        f"{r['busy_pct'] or 0:.1f} % of {ms(w)} ({parts} of the windows)"))
        if self.tb_average:
            total = self.tb_average.get("total_ns") or 0
            top = sorted(
                ((k[:-3], v) for k, v in self.tb_average.items() if k != "total_ns"), key=lambda kv: -kv[1]
            )[:4]
            out.append(
                ("Step breakdown (tb_plugin)",
                 ", ".join(f"{k} {pct(v, total) or 0:.1f} %" for k, v in top) + " of the mean steady step")
            )
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "GPU time per device": self.per_device,
            "GPU time per step": self.per_step,
            "Step time breakdown (tb_plugin priority)": self.tb_breakdown,
        }


def _with_pct(df: pl.DataFrame, total: str) -> pl.DataFrame:
    return df.with_columns(
        busy_pct=pl.when(pl.col(total) > 0).then((pl.col("busy_ns") * 100.0 / pl.col(total)).round(3)).otherwise(None)
    )


@analysis(
    "gpu_time", depends_on=("steps",), title="GPU busy / idle", order=20,
    shared=("device_union", "gpu_activity", "gpu_activity_classes", "comm_classes", "op_nesting"),
)
def gpu_time(ctx: AnalysisContext[TraceModel]) -> GpuTimeResult:
    """Busy/idle per device and step (compute > communication > memcpy > memset), tb_plugin breakdown."""
    model = ctx.model
    if not model.has_gpu:
        raise NotApplicable("no GPU activity in this trace (no kernels, memcpy or memset)")
    sr = ctx.need("steps", StepsResult)
    windows = sr.windows()
    # The columns read below, then the rows: each filter copies every column it is given.
    act = gpu_activity_classes(ctx.tables).select("device", "ts_ns", "end_ns", "category").filter(
        pl.col("device").is_not_null())
    # One filter per category, read by the three breakdowns below.
    by_cat = {c: act.filter(pl.col("category") == c) for c in DEVICE_CATEGORIES}
    levels = list(by_cat.items())
    ex = exclusive_breakdown(levels, windows, ["device"], "idle")
    ex = ex.join(windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")), on="window")
    busy = pl.sum_horizontal([pl.col(f"{c}_ns") for c in DEVICE_CATEGORIES])
    per_step = _with_pct(
        ex.with_columns(busy_ns=busy).select(
            "window", "step", "device", "dur_ns", "busy_ns", *[f"{c}_ns" for c in DEVICE_CATEGORIES], "idle_ns"
        ),
        "dur_ns",
    ).sort(["window", "device"])
    sums = [pl.col(c).sum() for c in ("dur_ns", "busy_ns", *[f"{c}_ns" for c in DEVICE_CATEGORIES], "idle_ns")]
    per_device = _with_pct(
        per_step.group_by("device").agg(sums).rename({"dur_ns": "window_ns"}).sort("device"), "window_ns"
    )
    steady = per_step.filter(pl.col("window").is_in(sr.steady_windows()))
    steady_dev = steady.group_by("device").agg(pl.col("busy_ns").sum(), pl.col("dur_ns").sum()).sort("device")
    steady_busy = {int(d): pct(b, w) for d, b, w in steady_dev.select("device", "busy_ns", "dur_ns").iter_rows()}

    # HTA-comparable: per device, first to last activity.
    all_m = device_union(ctx.tables)  # = merge_intervals(act, by=["device"]): the same rows
    comp_m = merge_intervals(by_cat["compute"], by=["device"])
    span = (
        all_m.group_by("device")
        .agg(
            first_ns=pl.col("start_ns").min(),
            last_ns=pl.col("end_ns").max(),
            busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
        )
        .join(
            comp_m.group_by("device").agg(compute_ns=(pl.col("end_ns") - pl.col("start_ns")).sum()),
            on="device",
            how="left",
        )
        .with_columns(pl.col("compute_ns").fill_null(0), span_ns=pl.col("last_ns") - pl.col("first_ns"))
        .with_columns(
            non_compute_ns=pl.col("busy_ns") - pl.col("compute_ns"), idle_ns=pl.col("span_ns") - pl.col("busy_ns")
        )
        .select("device", "first_ns", "last_ns", "span_ns", "busy_ns", "compute_ns", "non_compute_ns", "idle_ns")
        .sort("device")
    )

    tb = _tb_breakdown(model, by_cat, windows)
    tb_steady = tb.filter(pl.col("window").is_in(sr.steady_windows()))
    cols = [f"{c}_ns" for c in (*TB_CATEGORIES, "other")] + ["total_ns"]
    tb_avg = {c: round(float(tb_steady[c].mean()), 1) for c in cols} if tb_steady.height else {}  # type: ignore[arg-type]
    return GpuTimeResult(per_device, per_step, span, tb, tb_avg, steady_busy, vendor=ctx.model.meta.vendor)


def _tb_breakdown(model: TraceModel, by_cat: dict[str, pl.DataFrame], windows: pl.DataFrame) -> pl.DataFrame:
    """tb_plugin's breakdown per window; ``by_cat``: the device activity of each category."""
    iv = ["ts_ns", "end_ns"]
    cpu = pl.concat(
        [
            model.cpu_ops.select("name", *iv),
            model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#")).select("name", *iv),
        ]
    )
    levels = [
        ("kernel", by_cat["compute"].select(iv)),
        ("memcpy", by_cat["memcpy"].select(iv)),
        ("memset", by_cat["memset"].select(iv)),
        (
            "communication",
            pl.concat(
                [
                    by_cat["communication"].select(iv),
                    cpu.filter(contains_by_name(cpu, CPU_COMM_RE)).select(iv),
                ]
            ),
        ),
        ("runtime", model.runtime.select(iv)),
        ("dataloader", cpu.filter(pl.col("name").str.contains(DATALOADER_RE)).select(iv)),
        ("cpu_exec", cpu.select(iv)),
    ]
    ex = exclusive_breakdown(levels, windows, [], "other")
    return ex.join(
        windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("total_ns")), on="window"
    ).select("window", "step", *[f"{c}_ns" for c in (*TB_CATEGORIES, "other")], "total_ns")
