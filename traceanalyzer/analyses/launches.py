"""Launches: every runtime/driver call that enqueued device work, joined to that work.

Definitions
-----------
* **Launch calls**: runtime/driver calls in :data:`traceanalyzer.model.relations.LAUNCH_APIS`
  or named ``*LaunchKernel*`` — cudaLaunchKernel(ExC), cuLaunchKernel(Ex) (Triton),
  hipLaunchKernel, hipExtModuleLaunchKernel, cudaGraphLaunch/hipGraphLaunch, memcpy and
  memset APIs, XPU Unified Runtime / Level Zero enqueues, MTIA ``runFunction`` and
  ``enqueueCommand memcpy*Async``. Each is joined to its GPU
  activity by correlation id (one row per (call, activity) pair).
* Per joined row: ``cpu_dur_ns`` (the call), ``gpu_dur_ns`` (the activity),
  ``launch_delay_ns`` = max(0, GPU start − call end) — queueing behind earlier work plus
  driver latency, HTA's definition — and ``start_delay_ns`` = GPU start − call start.
* **CUDA/HIP graphs**: one ``cudaGraphLaunch`` replays many kernels under one correlation
  id. Each replayed kernel is its own row (``is_graph``, ``n_replayed``), and the call's
  CPU time is shared among them (``cpu_share_ns`` = call duration / kernels replayed),
  so per-kernel comparisons stay meaningful. Per-call statistics count each call once.
* ``shorter_than_launch``: the activity ran for less time than its (share of the) launch
  call took on the CPU: the CPU cannot keep such a GPU busy.
* ``blocking``: a copy or memset whose call blocks the host until the device is done —
  a synchronous API (``cudaMemcpy``, ``hipMemcpyWithStream``, ``cudaMemset`` …: no
  ``Async`` in the name; XPU ``ur*`` enqueues are treated as asynchronous) or a copy
  from/to pageable host memory; also MTIA ``runFunction`` calls where the runtime is
  synchronous (in most of the trace's ``runFunction`` calls the work starts before the
  call returns: the call then lasts until about the work's end). Its CPU time is mostly
  waiting for the GPU, not launch overhead.
* **Launch-bound verdict per step**: the CPU time spent in the step's non-blocking
  launch calls is at least ``launches.min_cpu_to_gpu_ratio`` (1.0) × the GPU time of the
  work they launched (``launch_cpu_ns ≥ ratio × launched_gpu_ns``: even with no Python
  overhead at all the CPU could not keep the device fed) **and** the least busy device
  was busy less than ``launches.max_busy_pct`` (80) % of the step window (``gpu_time``).
  Blocking calls are left out of both sums (``blocking_cpu_ns`` gives their CPU time):
  a blocking DtoH copy per step would otherwise make any graph-replayed decode step
  look launch-bound; a step with no non-blocking launch (0 ≥ 0) is not launch-bound.
  CUDA graphs / torch.compile help. (A per-kernel majority vote — "most kernels are
  shorter than their launch" — was rejected: it flips on real traces whose median
  kernel equals the median launch; the share is still reported.)
* A launch call belongs to the step whose CPU ``ProfilerStep#`` range contains its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._intervals import dist_stats, pct, us
from traceanalyzer.analyses._kernels import on_distinct
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import launches as join_launches

# The launch APIs HTA 0.5.0 joins in get_cuda_kernel_launch_stats (include_memory_events=True;
# runFunction is MTIA's).
HTA_LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",
                   "runFunction - job_prep_and_submit_for_execution")


@dataclass(frozen=True)
class LaunchesResult:
    """Per-launch table, distributions, per-API counts and the per-step verdict."""

    table: pl.DataFrame
    n_calls: int  # launch calls joined to ≥ 1 GPU activity
    n_joined: int  # (call, activity) rows
    n_unjoined_calls: int  # launch calls whose GPU activity is not in the trace
    n_graph_launches: int
    n_graph_kernels: int
    cpu_dur_ns: dict[str, Any]  # per call
    gpu_dur_ns: dict[str, Any]  # per activity
    launch_delay_ns: dict[str, Any]  # per activity
    n_shorter_than_launch: int
    by_api: pl.DataFrame
    per_step: pl.DataFrame
    thresholds: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "n_calls": self.n_calls,
            "n_joined": self.n_joined,
            "n_unjoined_calls": self.n_unjoined_calls,
            "n_graph_launches": self.n_graph_launches,
            "n_graph_kernels": self.n_graph_kernels,
            "cpu_dur_ns": self.cpu_dur_ns,
            "gpu_dur_ns": self.gpu_dur_ns,
            "launch_delay_ns": self.launch_delay_ns,
            "n_shorter_than_launch": self.n_shorter_than_launch,
            "by_api": self.by_api.to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "launch_bound_steps": self.per_step.filter(pl.col("launch_bound"))["step"].to_list(),
            "thresholds": self.thresholds,
        }

    def summary(self) -> list[tuple[str, str]]:
        out = [
            ("Launches", f"{self.n_calls:,} calls → {self.n_joined:,} GPU activities"
                         + (f" ({self.n_unjoined_calls:,} calls without captured GPU work)"
                            if self.n_unjoined_calls else "")),
            ("Launch call (CPU)", f"median {us(self.cpu_dur_ns['median'])}, p95 {us(self.cpu_dur_ns['p95'])}"),
            ("Launch delay", f"median {us(self.launch_delay_ns['median'])}, p95 {us(self.launch_delay_ns['p95'])}"),
            ("Shorter than their launch",
             f"{self.n_shorter_than_launch:,} "
             f"({pct(self.n_shorter_than_launch, self.n_joined) or 0:.1f} % of launched kernels)"),
        ]
        if self.n_graph_launches:
            out.append(("CUDA-graph launches",
                        f"{self.n_graph_launches:,} replaying {self.n_graph_kernels:,} GPU activities "
                                                  "(kernels, copies and memsets)"))
        bound = self.per_step.filter(pl.col("launch_bound"))
        out.append(("Launch-bound steps", f"{bound.height} of {self.per_step.height}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Launches per API": self.by_api, "Launches per step": self.per_step}


@analysis(
    "launches", depends_on=("steps", "gpu_time"), title="Kernel launches", order=50,
    shared=("gpu_activity", "launches"),
    params={"min_cpu_to_gpu_ratio": 1.0, "max_busy_pct": 80.0},
)
def launches(ctx: AnalysisContext[TraceModel]) -> LaunchesResult:
    """Launch calls joined to GPU work: CPU/GPU durations, launch delay, launch-bound steps."""
    min_ratio = ctx.params.min_cpu_to_gpu_ratio
    max_busy = ctx.params.max_busy_pct
    sr = ctx.need("steps", StepsResult)
    all_calls = join_launches(ctx.tables).filter(pl.col("is_launch"))
    if all_calls.is_empty():
        raise NotApplicable("no kernel/copy launch calls in this trace (no CUDA/HIP/XPU/MTIA runtime events)")
    j = all_calls.filter(pl.col("gpu_ts_ns").is_not_null())
    unjoined = all_calls.filter(pl.col("gpu_ts_ns").is_null())["correlation"].n_unique()
    if j.is_empty():
        raise NotApplicable(
            f"none of the {all_calls.height:,} launch calls has its GPU activity in the trace (kernels not captured)"
        )
    # The API names repeat (a handful in 100k calls): their string tests run once per name.
    api = pl.col("api")
    j = on_distinct(j, ["api"], is_graph=api.str.contains("Graph"),
                    _sync_api=~api.str.contains("(?i)async") & ~api.str.starts_with("ur"),
                    _run_fn=api.str.starts_with("runFunction"))
    t = (
        j.with_columns(
            n_replayed=pl.len().over("correlation").cast(pl.Int64),
            launch_delay_ns=(pl.col("gpu_ts_ns") - pl.col("cpu_end_ns")).clip(lower_bound=0),
            start_delay_ns=pl.col("gpu_ts_ns") - pl.col("cpu_ts_ns"),
        )
        .with_columns(cpu_share_ns=pl.col("cpu_dur_ns") // pl.col("n_replayed"))
        .with_columns(
            shorter_than_launch=pl.col("gpu_dur_ns") < pl.col("cpu_share_ns"),
            blocking=pl.col("activity").is_in(["memcpy", "memset"])
            & (
                pl.col("_sync_api")
                | pl.col("gpu_name").str.contains("Pageable").fill_null(False)
            )
            # A synchronous MTIA runtime (some versions): runFunction returns at about
            # its work's end, so the call is mostly waiting. Told per trace, by the
            # majority: host and device clocks differ by tens of µs, so a short work item
            # may appear to start just after a synchronous call returned, or just before
            # an asynchronous one returned.
            | (
                pl.col("_run_fn")
                & ((pl.col("gpu_ts_ns") < pl.col("cpu_end_ns")).mean().over("api") > 0.5)
            ),
        )
        .drop("launch_delay_ns_right", strict=False)
    )
    # A call belongs to the step whose CPU range contains its start (the windows are
    # extended by GPU tails, which would hand the next step's first calls to this one).
    cpu_ranges = sr.table.select(
        "window", "step", pl.col("cpu_start_ns").alias("start_ns"), pl.col("cpu_end_ns").alias("end_ns")
    )
    t = assign_steps(t, cpu_ranges, "cpu_ts_ns").select(
        "window", "step", "api", "correlation", "pid", "tid", "cpu_ts_ns", "cpu_dur_ns", "cpu_share_ns",
        "gpu_name", "activity", "device", "stream", "gpu_ts_ns", "gpu_dur_ns", "launch_delay_ns",
        "start_delay_ns", "shorter_than_launch", "blocking", "is_graph", "n_replayed",
    )
    # One row per call: only its CPU duration is read (a unique of two columns, not of the table).
    calls = t.select("correlation", "cpu_dur_ns").unique("correlation", keep="first")
    by_api = (
        t.group_by("api")
        .agg(
            calls=pl.col("correlation").n_unique().cast(pl.Int64),
            gpu_activities=pl.len().cast(pl.Int64),
            median_cpu_ns=pl.col("cpu_dur_ns").median(),
            median_gpu_ns=pl.col("gpu_dur_ns").median(),
            median_delay_ns=pl.col("launch_delay_ns").median(),
            shorter_than_launch=pl.col("shorter_than_launch").sum().cast(pl.Int64),
        )
        .sort(["gpu_activities", "api"], descending=[True, False])
    )
    gt = ctx.need("gpu_time", GpuTimeResult).per_step
    busy = gt.group_by("window").agg(busy_pct=pl.col("busy_pct").min())  # least busy device decides
    kern = pl.col("activity") == "kernel"
    per_step = (
        t.filter(pl.col("window").is_not_null())
        .group_by("window", "step")
        .agg(
            calls=pl.col("correlation").n_unique().cast(pl.Int64),
            gpu_activities=pl.len().cast(pl.Int64),
            kernels=kern.sum().cast(pl.Int64),
            launch_cpu_ns=pl.col("cpu_share_ns").filter(~pl.col("blocking")).sum(),
            launched_gpu_ns=pl.col("gpu_dur_ns").filter(~pl.col("blocking")).sum(),
            blocking_cpu_ns=pl.col("cpu_share_ns").filter(pl.col("blocking")).sum(),
            median_cpu_ns=pl.col("cpu_share_ns").median(),
            median_kernel_ns=pl.col("gpu_dur_ns").filter(kern).median(),
            median_delay_ns=pl.col("launch_delay_ns").median(),
            short_kernels=(pl.col("shorter_than_launch") & kern).sum().cast(pl.Int64),
        )
        .join(busy, on="window", how="left")
        .with_columns(
            pct_kernels_shorter=pl.when(pl.col("kernels") > 0)
            .then((pl.col("short_kernels") * 100.0 / pl.col("kernels")).round(2))
            .otherwise(None)
        )
        .with_columns(
            cpu_to_gpu_ratio=pl.when(pl.col("launched_gpu_ns") > 0)
            .then((pl.col("launch_cpu_ns") / pl.col("launched_gpu_ns")).round(4))
            .otherwise(None),
            # A step with no non-blocking launch (0 ≥ 0) is not launch-bound.
            launch_bound=(pl.col("launch_cpu_ns") >= min_ratio * pl.col("launched_gpu_ns"))
            & (pl.col("launch_cpu_ns") > 0)
            & (pl.col("busy_pct") < max_busy).fill_null(False),
        )
        .sort("window")
    )
    graph = t.filter(pl.col("is_graph"))
    return LaunchesResult(
        table=t,
        n_calls=calls.height,
        n_joined=t.height,
        n_unjoined_calls=int(unjoined),
        n_graph_launches=graph["correlation"].n_unique(),
        n_graph_kernels=graph.height,
        cpu_dur_ns=dist_stats(calls["cpu_dur_ns"]),
        gpu_dur_ns=dist_stats(t["gpu_dur_ns"]),
        launch_delay_ns=dist_stats(t["launch_delay_ns"]),
        n_shorter_than_launch=int(t["shorter_than_launch"].sum()),
        by_api=by_api,
        per_step=per_step,
        thresholds={"min_cpu_to_gpu_ratio": min_ratio, "max_busy_pct": max_busy},
    )
