"""Queue length: how many launches each stream has waiting, over time (HTA's queue-length analysis).

Definitions
-----------
* A **queued launch** is device work (kernel, copy, memset) between the start of the
  runtime/driver call that enqueued it and the start of the work on the device: it counts
  +1 on its ``(device, stream)`` from the call's start and −1 from the work's start (HTA:
  +1 at each launch call, −1 at each correlated GPU event, cumulative sum per stream). A
  graph launch enqueues every kernel it replays: each one is queued from the call's start
  until it starts. Work that starts before its call (clock skew) is queued for no time.
  At one instant the starts on the device are counted before new launches, so a launch
  whose work starts at once is never queued.
* The **queue length** of a stream is the step function of those counts. Its statistics are
  **time-weighted** over the steady step windows (``steps``; the whole trace span without
  ``ProfilerStep#``): ``mean_queue`` = ∫ length dt / window time, ``p95_queue`` = the
  smallest length the stream is at or below during 95 % of that time, ``max_queue``.
* ``empty_ns``/``empty_pct_of_window``: time with nothing queued on the stream (length 0):
  the device's next piece of work on that stream had not been launched yet (when the stream
  is also idle, it is waiting on the CPU: a launch-bound stream has an empty queue most of the
  time). ``full_ns``/``full_pct_of_window``: time with at least
  ``queue_length.full_queue`` (1024, CUDA's per-stream launch queue limit that HTA uses)
  launches waiting: the CPU blocks in its launch calls until the device catches up.
* ``per_step``: the same (mean, max, empty %) per (step window, stream), all windows.
* Streams are listed by the device time of the work launched on them (``gpu_ns``, whole
  trace), busiest first; ``launches`` counts their queued activities (whole trace). A stream
  used only outside the steady windows has null statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import launches as join_launches
from traceanalyzer.timeutil import group_codes

STREAM_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "device": pl.Int64, "stream": pl.Int64, "launches": pl.Int64, "gpu_ns": pl.Int64, "window_ns": pl.Int64,
    "mean_queue": pl.Float64, "p95_queue": pl.Int64, "max_queue": pl.Int64, "empty_ns": pl.Int64,
    "empty_pct_of_window": pl.Float64, "full_ns": pl.Int64, "full_pct_of_window": pl.Float64,
}
STEP_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "window": pl.Int64, "step": pl.Int64, "device": pl.Int64, "stream": pl.Int64, "mean_queue": pl.Float64,
    "max_queue": pl.Int64, "empty_pct_of_window": pl.Float64,
}


@dataclass(frozen=True)
class QueueLengthResult:
    """Per-stream queue statistics over the steady windows, and per step. See the module docstring."""

    per_stream: pl.DataFrame  # STREAM_SCHEMA, busiest stream first
    per_step: pl.DataFrame  # STEP_SCHEMA
    full_queue: int
    n_queued: int  # (call, activity) pairs counted

    def busiest(self) -> dict[str, Any] | None:
        """The row of the stream with the most device time, None when there is none."""
        return self.per_stream.row(0, named=True) if self.per_stream.height else None

    def to_json(self) -> dict[str, Any]:
        return {"full_queue": self.full_queue, "n_queued": self.n_queued,
                "per_stream": self.per_stream.to_dicts(), "per_step": self.per_step.to_dicts()}

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for r in self.per_stream.filter(pl.col("window_ns") > 0).head(3).iter_rows(named=True):
            out.append((f"GPU {r['device']} stream {r['stream']}",
                        f"{r['mean_queue']:.1f} launches queued on average (p95 {r['p95_queue']}, max "
                        f"{r['max_queue']}); nothing queued {r['empty_pct_of_window']:.1f} % of the steady "
                        f"steps, ≥ {self.full_queue} queued {r['full_pct_of_window']:.1f} % of the steady steps"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"Launch queue per stream (steady steps)": self.per_stream}
        if self.per_step.height:
            out["Launch queue per step"] = self.per_step
        return out


def _sort_events(ev: pl.DataFrame) -> pl.DataFrame:
    """``ev`` (``device, stream, ts_ns, delta``, delta in −1…1) sorted by all four columns.
    Rows equal on all four are identical, so any sort gives the same frame: where the
    streams can be numbered (:func:`group_codes`) and the times fit, one Int64 key
    ``(stream number · span + t − t_min) · 3 + delta + 1`` ordered by numpy's stable sort
    (the launches and the ends come as two nearly sorted runs, which it merges) and one
    gather, instead of a four-column sort."""
    t = ev["ts_ns"]
    coded = group_codes(ev, ["device", "stream"]) if ev.height >= 4096 and not t.null_count() else None
    if coded is not None and ev["delta"].null_count() == 0:
        import numpy as np  # lazy: importing the package does not pay for numpy

        lo, hi = int(t.min()), int(t.max())  # type: ignore[arg-type]  # an Int64 column without nulls
        span = hi - lo + 1
        if coded[1] * span * 3 < 2**62:
            key = (coded[0] * span + (t.to_numpy() - lo)) * 3 + (ev["delta"].to_numpy() + 1)
            return ev[pl.Series(np.argsort(key, kind="stable"))]
    return ev.sort("device", "stream", "ts_ns", "delta")


def _segments(queued: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The queue-length step function of every (device, stream), cut at the window bounds:
    ``device, stream, ts_ns, dur_ns, queue, window, step`` (segments outside every window dropped)."""
    plus = queued.select("device", "stream", pl.col("cpu_ts_ns").alias("ts_ns"), delta=pl.lit(1, pl.Int64))
    minus = queued.select("device", "stream", pl.max_horizontal("gpu_ts_ns", "cpu_ts_ns").alias("ts_ns"),
                          delta=pl.lit(-1, pl.Int64))
    # Breakpoints (delta 0) at every window bound of every stream: each segment then lies in one window.
    bounds = pl.concat([windows.select(ts_ns="start_ns"), windows.select(ts_ns="end_ns")]).unique()
    marks = queued.select("device", "stream").unique().join(bounds, how="cross").with_columns(
        delta=pl.lit(0, pl.Int64))
    ev = pl.concat([plus, minus, marks.select(plus.columns)])
    # At one instant: starts on the device (−1) first, then bounds, then launches (+1).
    ev = _sort_events(ev)
    # Each stream's rows are contiguous after the sort: its running sum is the column's less the
    # sum before its first row, and its last row has no next one (no window function per stream).
    first = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in ("device", "stream")])
    total = pl.col("delta").cum_sum()
    seg = ev.with_columns(
        queue=total - pl.when(first).then(total - pl.col("delta")).forward_fill().fill_null(0),
        dur_ns=pl.when(first.shift(-1, fill_value=True)).then(None).otherwise(
            pl.col("ts_ns").shift(-1) - pl.col("ts_ns")),
    ).filter(pl.col("dur_ns") > 0)
    return assign_steps(seg, windows, "ts_ns").filter(pl.col("window").is_not_null())


def _queued(tables: Any, skip_apis: tuple[str, ...] = ()) -> pl.DataFrame:
    """Every (launch call, device work) pair with a stream: ``device, stream, cpu_ts_ns,
    gpu_ts_ns, gpu_dur_ns`` (``tables``: the run's DerivedTables, or a TraceModel)."""
    keep = pl.col("is_launch") & pl.col("gpu_ts_ns").is_not_null() & pl.col("stream").is_not_null() \
        & pl.col("cpu_ts_ns").is_not_null()
    if skip_apis:
        keep = keep & ~pl.col("api").is_in(list(skip_apis))
    return join_launches(tables).filter(keep).select("device", "stream", "cpu_ts_ns", "gpu_ts_ns", "gpu_dur_ns")


#: Launch calls HTA 0.5.0's queue length does not count (its runtime-launch query lists
#: kernel, copy and memset launches only): the kernels a graph launch replays are never queued.
HTA_UNCOUNTED_APIS = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")


def span_stats(tables: Any, start_ns: int, end_ns: int, hta_rules: bool = False) -> pl.DataFrame:
    """The queue statistics of every (device, stream) over one span ``[start_ns, end_ns)``
    instead of the steady steps: ``device, stream, launches`` (calls in the span),
    ``window_ns, mean_queue`` (time-weighted), ``max_queue, empty_ns``. For comparisons with
    tools that report the whole trace (HTA, docs/parity.md). ``hta_rules``: count as HTA 0.5.0
    does, without graph launches (:data:`HTA_UNCOUNTED_APIS`) and without the launches whose
    device work starts after ``end_ns`` (HTA keeps the events of its analysis range only, so
    it never sees that work and drops the launch with it)."""
    windows = pl.DataFrame({"window": [0], "step": [0], "start_ns": [start_ns], "end_ns": [end_ns]},
                           schema={"window": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    queued = _queued(tables, HTA_UNCOUNTED_APIS if hta_rules else ())
    if hta_rules:
        queued = queued.filter(pl.col("gpu_ts_ns") <= end_ns)
    seg = _segments(queued, windows)
    w, q = pl.col("dur_ns"), pl.col("queue")
    n = queued.filter(pl.col("cpu_ts_ns").is_between(start_ns, end_ns)).group_by("device", "stream").agg(
        launches=pl.len())
    return seg.group_by("device", "stream").agg(
        window_ns=w.sum(), mean_queue=(q * w).sum() / w.sum(), max_queue=q.max(), empty_ns=w.filter(q <= 0).sum(),
    ).join(n, on=["device", "stream"], how="left", nulls_equal=True).sort("device", "stream")


def _p95(seg: pl.DataFrame) -> pl.DataFrame:
    """Time-weighted 95th percentile of the queue per (device, stream) of ``seg``
    (``p95_queue``): the smallest level whose cumulative time, levels sorted, reaches 95 % of
    the total. From the time per (stream, level), a few hundred levels, not the segments:
    the cumulative time at the end of each level's segments is the same sum."""
    d = pl.col("_d")
    return (seg.group_by("device", "stream", "queue").agg(_d=pl.col("dur_ns").sum())
            .sort("device", "stream", "queue")
            .group_by("device", "stream", maintain_order=True)
            .agg(p95_queue=pl.col("queue").filter(d.cum_sum() >= 0.95 * d.sum()).first()))


@analysis("queue_length", depends_on=("steps",), title="Launch queue length", order=52,
          shared=("gpu_activity", "launches"), params={"full_queue": 1024}, wide=True)
def queue_length(ctx: AnalysisContext[TraceModel]) -> QueueLengthResult:
    """Outstanding launches per stream over time: mean/p95/max, time empty and time full."""
    full_queue = int(ctx.params.full_queue)
    sr = ctx.need("steps", StepsResult)
    queued = _queued(ctx.tables)
    if queued.is_empty():
        raise NotApplicable("no launch call joined to device work (no runtime events with correlated kernels)")
    windows = sr.windows()
    steady = sr.steady_windows()
    seg = _segments(queued, windows)
    w = pl.col("dur_ns")
    q = pl.col("queue")
    st = seg.filter(pl.col("window").is_in(steady))
    per_stream = (
        st.group_by("device", "stream").agg(
            window_ns=w.sum(),
            _area=(q * w).sum(),
            max_queue=q.max(),
            empty_ns=w.filter(q <= 0).sum(),
            full_ns=w.filter(q >= full_queue).sum(),
        )
        .with_columns(
            mean_queue=(pl.col("_area") / pl.col("window_ns")).round(3),
            empty_pct_of_window=(pl.col("empty_ns") * 100.0 / pl.col("window_ns")).round(3),
            full_pct_of_window=(pl.col("full_ns") * 100.0 / pl.col("window_ns")).round(3),
        )
        .join(_p95(st), on=["device", "stream"], how="left", nulls_equal=True)
    )
    totals = queued.group_by("device", "stream").agg(launches=pl.len(), gpu_ns=pl.col("gpu_dur_ns").sum())
    per_stream = (
        totals.join(per_stream, on=["device", "stream"], how="left", nulls_equal=True)
        .sort(["gpu_ns", "device", "stream"], descending=[True, False, False])
        .select(list(STREAM_SCHEMA)).cast(STREAM_SCHEMA)  # type: ignore[arg-type]  # polars' dict typing
    )
    per_step = (
        seg.group_by("window", "step", "device", "stream").agg(
            _area=(q * w).sum(), _len=w.sum(), max_queue=q.max(), _empty=w.filter(q <= 0).sum())
        .with_columns(mean_queue=(pl.col("_area") / pl.col("_len")).round(3),
                      empty_pct_of_window=(pl.col("_empty") * 100.0 / pl.col("_len")).round(3))
        .sort("window", "device", "stream")
        .select(list(STEP_SCHEMA)).cast(STEP_SCHEMA)  # type: ignore[arg-type]  # as above
    )
    return QueueLengthResult(per_stream=per_stream, per_step=per_step, full_queue=full_queue,
                             n_queued=queued.height)
