"""Diagnosis: baseline → bottleneck type → phase → operation, the way a performance engineer works.

``docs/diagnosis.md`` has the method, the definitions and two real traces walked through.

Bottleneck type (per step, and overall over the steady steps)
-------------------------------------------------------------
On the **primary device** (most busy; ``phases``) each step window splits, every instant
once, into (``gpu_time``'s precedence compute > communication > memcpy > memset > idle):

* **productive** GPU time: compute kernels + exposed copies/memsets;
* **lost** time, by cause:

  - ``communication``: exposed collective kernels (not hidden under compute);
  - ``input``: idle gaps whose CPU side was inside the DataLoader (``idle_gaps`` cause
    ``data_loader``), plus idle before the device's first / after its last activity that
    overlaps a DataLoader range;
  - ``sync``: idle gaps caused by blocking syncs or blocking copies (``idle_gaps`` causes
    ``sync`` and ``memcpy``);
  - ``host``: idle gaps with nothing queued while the CPU was busy elsewhere (``idle_gaps``
    cause ``host_bound``), plus the rest of the leading/trailing idle (nothing launched yet);
  - ``other``: idle the trace cannot explain (queued work with the device idle: waiting on
    another stream, device or peer; gaps without a launch call).

The verdict, in this order:

1. productive ≥ ``diagnosis.gpu_bound_pct`` (90) % of the step → **GPU-bound**: then
   **memory-bandwidth-bound** when memory-bound kernels (elementwise, reductions,
   normalisation, softmax, copies by kernel name) take more of the step's kernel time than
   GEMM/conv/attention kernels, else **GPU-compute-bound**. Share = productive %.
2. productive ≥ ``diagnosis.mostly_busy_pct`` (85) % and no lost cause holds
   ``diagnosis.cause_min_pct`` (15) % of the step → **GPU-bound** as in 1: the GPU is mostly
   busy and what it loses is spread thin, so no single loss limits the step more than the
   GPU work does (the small causes are listed under "Also lost").
3. otherwise the GPU waits: the largest lost cause names the verdict —
   ``communication`` → **communication-bound**, ``input`` → **input-bound**, ``sync`` →
   **sync-bound**, ``host`` → **CPU/launch-bound** — provided it holds at least
   ``diagnosis.dominant_pct`` (50) % of the lost time and is not ``other``; else **mixed**.
   Share = that cause's % of the step.

A capture-only trace (``context.capture_only``: CUDA/HIP stream capture and no replay) gets the
verdict ``capture_only`` instead, every step too: kernels under capture are recorded, not run.
"What would move it" respects ``context`` (``docs/context.md``): nothing the run already does.

CPU-only traces (no device activity; also traces whose GPU activity was not captured): the
CPU phases decide — **input-bound** when data loading takes ≥ ``diagnosis.dominant_pct`` % of
the step, else **CPU-bound** (the model runs on the CPU). A trace with neither CPU ops nor
device activity is not applicable.

Phase and operation
-------------------
The **dominant phase** follows the verdict: communication for communication-bound, data loading
for input-bound, the largest GPU phase (forward, backward, optimizer …) for GPU-bound verdicts,
the largest CPU phase otherwise. The **top ops** are the top-level CPU ops of that phase
(``phases``) ranked by the GPU time they launched (GPU verdicts) or their CPU time (CPU
verdicts), with kernel count, mean GPU time per call, input shapes and module/annotation.

Settings: ``diagnosis.gpu_bound_pct`` (90), ``diagnosis.mostly_busy_pct`` (85),
``diagnosis.cause_min_pct`` (15), ``diagnosis.dominant_pct`` (50),
``diagnosis.minor_pct`` (5: secondary causes listed), ``diagnosis.top_ops`` (10),
``baseline.batch_size`` (0 = infer) belongs to ``baseline``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import polars as pl
from polars.expr.whenthen import ChainedThen, Then

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._advice import capture_only_note, engine_sync_move, fewer_launches
from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.analyses._copysync import runtime_by_correlation
from traceanalyzer.analyses._intervals import DATALOADER_RE, ms, window_union_lengths
from traceanalyzer.analyses._kernels import kernel_class, kernel_norms, on_distinct
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._phases import PHASES, USER_DATA_RE
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.baseline import BaselineResult
from traceanalyzer.analyses.communication import CommunicationResult
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.analyses.launches import LaunchesResult
from traceanalyzer.analyses.phases import PhasesResult
from traceanalyzer.analyses.queue_length import QueueLengthResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.analyses.syncs import SyncsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, gpu_activity, join_unique, op_index
from traceanalyzer.timeutil import merge_intervals
from traceanalyzer.units import device_name

R = TypeVar("R")


class _Reads(Protocol):
    """What the communication helpers read: the optional results of the analysis context."""

    def typed(self, name: str, kind: type[R]) -> R | None: ...


#: verdict id → label shown to users.
VERDICTS: dict[str, str] = {
    "input_bound": "input-bound (data loader)",
    "cpu_bound": "CPU/launch-bound",
    "compute_bound": "GPU-compute-bound",
    "memory_bound": "memory-bandwidth-bound",
    "comm_bound": "communication-bound",
    "sync_bound": "sync-bound",
    "mixed": "mixed",
    "cpu_compute": "CPU-bound (no GPU activity)",
    "capture_only": "capture/warm-up trace (steady-state verdict withheld)",
}
#: lost-time cause → verdict.
CAUSE_VERDICT = {"input": "input_bound", "sync": "sync_bound", "communication": "comm_bound", "host": "cpu_bound"}
LOST_CAUSES = ("input", "sync", "communication", "host", "other")  # tie order

_CAUSE_LABEL = {"input": "GPU idle in the DataLoader", "sync": "GPU idle after syncs",
                "communication": "exposed communication", "host": "GPU idle while the CPU is busy",
                "other": "unexplained GPU idle"}
_CAUSE_OF_GAP = {"data_loader": "input", "sync": "sync", "memcpy": "sync", "host_bound": "host"}


def _pct(part: float | int | None, whole: float | int | None) -> float:
    return round(100.0 * float(part or 0) / float(whole), 2) if whole else 0.0


def verdict_exprs(gpu_bound_pct: float, dominant_pct: float, mostly_busy_pct: float = 85.0,
                  cause_min_pct: float = 15.0) -> list[pl.Expr]:
    """``verdict``, ``share_pct``, ``top_cause`` from a frame of per-window ns columns:
    ``dur_ns, productive_ns, communication_ns, input_ns, sync_ns, host_ns, other_ns,
    compute_kernel_ns, memory_kernel_ns``."""
    lost = pl.sum_horizontal([pl.col(f"{c}_ns") for c in LOST_CAUSES])
    top_val = pl.max_horizontal([pl.col(f"{c}_ns") for c in LOST_CAUSES])
    top: Then | ChainedThen = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
    for c in LOST_CAUSES:
        top = top.when(pl.col(f"{c}_ns") == top_val).then(pl.lit(c))
    prod_pct = pl.col("productive_ns") * 100.0 / pl.col("dur_ns")
    gpu_bound = (prod_pct >= gpu_bound_pct) | (
        (prod_pct >= mostly_busy_pct) & (top_val * 100.0 < cause_min_pct * pl.col("dur_ns"))
    )
    verdict = (
        pl.when(pl.col("dur_ns") <= 0)
        .then(pl.lit("mixed"))
        .when(gpu_bound & (pl.col("memory_kernel_ns") > pl.col("compute_kernel_ns")))
        .then(pl.lit("memory_bound"))
        .when(gpu_bound)
        .then(pl.lit("compute_bound"))
        .when((pl.col("_top") == "other") | (top_val * 100.0 < dominant_pct * lost) | (lost <= 0))
        .then(pl.lit("mixed"))
        .otherwise(pl.col("_top").replace_strict(CAUSE_VERDICT, default="mixed"))
    )
    share = pl.when(pl.col("dur_ns") <= 0).then(0.0).when(gpu_bound).then(prod_pct).otherwise(
        top_val * 100.0 / pl.col("dur_ns")
    )
    return [top.alias("_top"), verdict.alias("verdict"), share.round(2).alias("share_pct")]


def apply_verdicts(df: pl.DataFrame, gpu_bound_pct: float, dominant_pct: float, mostly_busy_pct: float = 85.0,
                   cause_min_pct: float = 15.0) -> pl.DataFrame:
    e = verdict_exprs(gpu_bound_pct, dominant_pct, mostly_busy_pct, cause_min_pct)
    return df.with_columns(e[0]).with_columns(e[1], e[2]).rename({"_top": "top_cause"})


def cpu_verdict_exprs(dominant_pct: float) -> list[pl.Expr]:
    dl_pct = pl.col("data_loading_ns") * 100.0 / pl.col("total_ns")
    work = pl.sum_horizontal([pl.col(f"{p}_ns") for p in ("forward", "backward", "optimizer", "communication")])
    verdict = pl.when(pl.col("total_ns") <= 0).then(pl.lit("mixed")).when(dl_pct >= dominant_pct).then(
        pl.lit("input_bound")).otherwise(pl.lit("cpu_compute"))
    share = pl.when(pl.col("total_ns") <= 0).then(0.0).when(dl_pct >= dominant_pct).then(dl_pct).otherwise(
        work * 100.0 / pl.col("total_ns"))
    return [verdict.alias("verdict"), share.round(2).alias("share_pct")]


@dataclass(frozen=True)
class DiagnosisResult:
    """The diagnosis: verdict with its share and evidence, dominant phase, top ops, per-step verdicts."""

    resource: str  # "gpu" or "cpu"
    verdict: str
    share_pct: float
    evidence: tuple[str, ...]
    moves: tuple[str, ...]
    secondary: tuple[str, ...]
    breakdown: dict[str, Any]  # steady totals: ns and % of step per category
    per_step: pl.DataFrame
    steady_agree: int
    n_steady: int
    dominant_phase: str | None
    phase_line: str
    phase_means: dict[str, Any]
    fwd_bwd: dict[str, float | None]
    top_ops: pl.DataFrame
    rank_by: str  # "gpu_ns" or "cpu_ns"
    baseline_line: str
    throughput_line: str | None
    conditions_line: str
    baseline: dict[str, Any]
    notes: tuple[str, ...]
    primary_device: int | None
    top_cause: str | None = None
    base_label: str = "the step"  # what share_pct is a share of
    phase_tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return VERDICTS[self.verdict]

    def verdict_line(self) -> str:
        agree = f"{self.steady_agree} of {self.n_steady} steady step(s) agree" if self.n_steady else ""
        what = {
            "compute_bound": "of the step the GPU is busy computing",
            "memory_bound": "of the step the GPU is busy, mostly in memory-bound kernels",
            "input_bound": "of the step the GPU idles while the DataLoader runs"
            if self.resource == "gpu" else "of the step is spent in data loading",
            "cpu_bound": "of the step the GPU idles with nothing queued while the CPU is busy",
            "sync_bound": "of the step the GPU idles after blocking host syncs",
            "comm_bound": "of the step is exposed communication",
            "mixed": ("of the step is GPU idle with no cause visible in the trace" if self.top_cause == "other"
                      else f"of the step is lost to the largest cause "
                           f"({_CAUSE_LABEL.get(self.top_cause or '', 'n/a')}), which does not dominate"),
            "cpu_compute": "of the step is CPU op time",
            "capture_only": "",
        }[self.verdict]
        if self.verdict == "capture_only":
            return f"{self.label}: the trace records graph capture and no replay, so no steady state to judge"
        if self.base_label != "the step":
            what = what.replace("of the step", f"of {self.base_label}", 1)
        return f"{self.label}: {self.share_pct:.1f} % {what}" + (f" ({agree})" if agree else "")

    def ops_lines(self, n: int = 3) -> list[str]:
        out = []
        steps = n
        n = max(self.n_steady, 1)
        for r in self.top_ops.head(steps).iter_rows(named=True):
            where = f" [{r['module']}]" if r.get("module") else ""
            shapes = (f" shapes {r['input_dims']}"
                      + (f" (+{r['n_shapes'] - 1} other)" if r.get("n_shapes", 1) > 1 else "")
                      if r.get("input_dims") else "")
            if r["kernels"]:
                out.append(
                    f"{r['name']}{where}: GPU {ms(r['gpu_ns_per_step'])}/step, {r['kernels'] / n:,.1f} kernel(s)"
                    f" in {r['calls_per_step']:,.1f} call(s) per step (mean {ms(r['mean_gpu_ns'])}/call, mostly "
                    f"{r['top_kernel']})" + (f", CPU {ms(r['cpu_ns'] / n)}/step" if r["cpu_ns"] else "") + shapes
                )
            else:
                out.append(f"{r['name']}{where}: CPU {ms(r['cpu_ns'] / n)}/step in {r['calls_per_step']:,.1f} "
                           f"call(s) per step, no GPU work{shapes}")
        return out

    def narrative(self) -> list[str]:
        """The diagnosis as plain text lines (no markup), in the order a reader needs them."""
        lines = [f"Baseline: {self.baseline_line}."]
        if self.throughput_line:
            lines.append(f"Throughput: {self.throughput_line}.")
        lines.append(f"Measured on: {self.conditions_line}.")
        lines.append(f"Bottleneck: {self.verdict_line()}.")
        lines += [f"Evidence: {e}" for e in self.evidence]
        if self.secondary:
            lines.append("Also lost: " + "; ".join(self.secondary) + ".")
        lines += [f"What would move it: {m}" for m in self.moves]
        if self.dominant_phase:
            lines.append(f"Phase: {self.dominant_phase.replace('_', ' ')} dominates; {self.phase_line}.")
        ops = self.ops_lines(5)
        if ops:
            lines.append(f"Operations in {(self.dominant_phase or 'the step').replace('_', ' ')}, by "
                         f"{'GPU' if self.rank_by == 'gpu_ns' else 'CPU'} time:")
            lines += [f"  {i}. {o}" for i, o in enumerate(ops, 1)]
        elif self.dominant_phase:
            lines.append(f"Operations: no CPU op runs inside {self.dominant_phase.replace('_', ' ')}"
                         + (" (the main thread waits for the DataLoader's workers, which are not in this trace)"
                            if self.dominant_phase == "data_loading" else
                            " (its time is in recorded ranges without ops inside, or in untraced code)") + ".")
        lines += [f"Note: {n}" for n in self.notes]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "verdict": self.verdict,
            "label": self.label,
            "share_pct": self.share_pct,
            "evidence": list(self.evidence),
            "what_would_move_it": list(self.moves),
            "secondary": list(self.secondary),
            "breakdown": self.breakdown,
            "steady_steps_agreeing": self.steady_agree,
            "n_steady_steps": self.n_steady,
            "per_step": self.per_step.to_dicts(),
            "dominant_phase": self.dominant_phase,
            "phase_mean_ns": self.phase_means,
            "fwd_bwd_ratio": self.fwd_bwd,
            "top_ops_rank_by": self.rank_by,
            "top_ops": self.top_ops.to_dicts(),
            "baseline": self.baseline,
            "primary_device": self.primary_device,
            "top_cause": self.top_cause,
            "base": self.base_label,
            "notes": list(self.notes),
            "thresholds": self.thresholds,
            "narrative": self.narrative(),
        }

    def summary(self) -> list[tuple[str, str]]:
        out = [("Verdict", self.verdict_line())]
        out.append(("Evidence", " ".join(self.evidence)))
        if self.secondary:
            out.append(("Also lost", "; ".join(self.secondary)))
        out.append(("What would move it", " ".join(self.moves)))
        out.append(("Baseline", self.baseline_line + (f"; {self.throughput_line}" if self.throughput_line else "")))
        out.append(("Conditions", self.conditions_line))
        if self.dominant_phase:
            out.append(("Dominant phase", f"{self.dominant_phase.replace('_', ' ')} ({self.phase_line})"))
        ops = self.ops_lines(3)
        if ops:
            out.append(("Top ops", " | ".join(ops)))
        if self.per_step.height > 1:
            counts = self.per_step.group_by("verdict").len().sort(["len", "verdict"], descending=[True, False])
            out.append(("Per-step verdicts", ", ".join(f"{VERDICTS[v]} {n}" for v, n in counts.iter_rows())))
        for n in self.notes:
            out.append(("Note", n))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"Per-step verdicts": self.per_step}
        out.update(self.phase_tables)
        if self.top_ops.height:
            out[f"Top ops in {(self.dominant_phase or 'the step').replace('_', ' ')}"] = self.top_ops
        return out


# ------------------------------------------------------------------------------------------------
# GPU side: per-window breakdown of the primary device
# ------------------------------------------------------------------------------------------------


def _dataloader_intervals(model: TraceModel) -> pl.DataFrame:
    parts = [
        model.annotations.filter(
            pl.col("name").str.contains(DATALOADER_RE) | pl.col("name").str.contains(USER_DATA_RE)),
        model.cpu_ops.filter(contains_by_name(model.cpu_ops, DATALOADER_RE)),
    ]
    return pl.concat([p.select("ts_ns", "end_ns") for p in parts])


def _active_span(t: TraceTables, windows: pl.DataFrame, device: int) -> pl.DataFrame | None:
    """The single window of a step-less trace cut to ``device``'s first-to-last activity (None when
    the device has no activity inside it)."""
    act = gpu_activity(t).filter(pl.col("device") == device)
    if act.is_empty() or windows.height != 1:
        return None
    lo, hi = int(windows["start_ns"][0]), int(windows["end_ns"][0])
    first = max(int(act["ts_ns"].min()), lo)  # type: ignore[arg-type]
    last = min(int(act["end_ns"].max()), hi)  # type: ignore[arg-type]
    if last <= first:
        return None
    return windows.with_columns(start_ns=pl.lit(first, pl.Int64), end_ns=pl.lit(last, pl.Int64))


def _span_edges(windows: pl.DataFrame, span: pl.DataFrame) -> tuple[int, int]:
    """ns of the window before and after the active span."""
    return (int(span["start_ns"][0] - windows["start_ns"][0]), int(windows["end_ns"][0] - span["end_ns"][0]))


def _gpu_breakdown(t: TraceTables, reads: AnalysisContext[TraceModel], windows: pl.DataFrame, device: int,
                   clipped: bool = False) -> tuple[pl.DataFrame, list[str]]:
    """Per window on ``device``: dur, productive, communication, input, sync, host, other, kernel mix.
    ``clipped``: ``windows`` is the device's active span (a trace without steps), not gpu_time's."""
    model = t.model
    notes: list[str] = []
    gtr = reads.typed("gpu_time", GpuTimeResult)
    if gtr is None:  # the caller checked it ran
        raise NotApplicable("gpu_time did not run")
    gt = gtr.per_step.filter(pl.col("device") == device)
    base = windows.select("window", "step").join(
        gt.select("window", "dur_ns", "compute_ns", "communication_ns", "memcpy_ns", "memset_ns", "idle_ns"),
        on="window", how="left",
    ).with_columns(pl.col(c).fill_null(0) for c in ("compute_ns", "communication_ns", "memcpy_ns", "memset_ns"))
    w_len = windows.select("window", (pl.col("end_ns") - pl.col("start_ns")).alias("_len"))
    base = base.join(w_len, on="window").with_columns(
        dur_ns=pl.col("_len"), idle_ns=pl.col("idle_ns").fill_null(pl.col("_len"))
    ).drop("_len")
    if clipped:
        # The window is the device's active span, not gpu_time's window: every activity lies inside
        # it, so its idle is the span less the (exclusive) busy categories.
        busy = pl.sum_horizontal("compute_ns", "communication_ns", "memcpy_ns", "memset_ns")
        base = base.with_columns(idle_ns=(pl.col("dur_ns") - busy).clip(lower_bound=0))

    # Idle causes: gaps between activities (idle_gaps) and the edges before/after all activity.
    pieces: list[pl.DataFrame] = []
    ig = reads.typed("idle_gaps", IdleGapsResult)
    if ig is not None and ig.device_gaps.height:
        g = ig.device_gaps.filter(pl.col("device") == device).select(
            "start_ns", "end_ns",
            pl.col("cause").replace_strict(_CAUSE_OF_GAP, default="other").alias("c"),
        )
        pieces.append(g)
    elif ig is None:
        notes.append("idle_gaps did not run: GPU idle inside steps cannot be given a cause (counted as other)")
    act = gpu_activity(t).filter(pl.col("device") == device)
    lo, hi = int(windows["start_ns"].min()), int(windows["end_ns"].max())  # type: ignore[arg-type]
    if act.height:
        first, last = int(act["ts_ns"].min()), int(act["end_ns"].max())  # type: ignore[arg-type]
        edges = pl.DataFrame({"start_ns": [lo, last], "end_ns": [first, hi]}).filter(
            pl.col("end_ns") > pl.col("start_ns"))
    else:
        edges = pl.DataFrame({"start_ns": [lo], "end_ns": [hi]})
    dl = merge_intervals(_dataloader_intervals(model))
    if edges.height and dl.height:
        inter = (
            edges.join(dl.rename({"start_ns": "ds", "end_ns": "de"}), how="cross")
            .select(pl.max_horizontal("start_ns", "ds").alias("start_ns"),
                    pl.min_horizontal("end_ns", "de").alias("end_ns"))
            .filter(pl.col("end_ns") > pl.col("start_ns"))
        )
    else:
        inter = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
    pieces.append(edges.with_columns(c=pl.lit("edge")))
    pieces.append(inter.with_columns(c=pl.lit("edge_input")))
    iv = pl.concat([p.select(pl.col("start_ns").cast(pl.Int64).alias("ts_ns"), pl.col("end_ns").cast(pl.Int64),
                             pl.col("c").cast(pl.String)) for p in pieces])
    # The causes by integer codes: the interval unions take their integer-keyed route.
    labels = sorted(iv["c"].unique().to_list())
    lens = window_union_lengths(
        iv.with_columns(pl.col("c").replace_strict({c: i for i, c in enumerate(labels)}, return_dtype=pl.Int64)),
        windows, ["c"]).with_columns(pl.col("c").replace_strict(dict(enumerate(labels)), return_dtype=pl.String))
    wide = (lens.pivot(on="c", index="window", values="length_ns") if lens.height
            else pl.DataFrame({"window": []}, schema={"window": pl.Int64}))
    for c in ("input", "sync", "host", "other", "edge", "edge_input"):
        if c not in wide.columns:
            wide = wide.with_columns(pl.lit(0, pl.Int64).alias(c))
    wide = wide.select(
        "window", *[pl.col(c).fill_null(0) for c in ("input", "sync", "host", "other", "edge", "edge_input")])
    b = base.join(wide, on="window", how="left").with_columns(
        pl.col(c).fill_null(0) for c in ("input", "sync", "host", "other", "edge", "edge_input")
    )
    # Idle before the first / after the last activity: nothing was launched yet (host), unless
    # the trace has no launch calls at all (GPU-only trace: the cause is not visible).
    edge_cause = "host" if model.runtime.height else "other"
    b = b.with_columns(
        input=pl.col("input") + pl.col("edge_input"),
    ).with_columns(
        (pl.col(edge_cause) + (pl.col("edge") - pl.col("edge_input")).clip(lower_bound=0)).alias(edge_cause)
    )
    known = pl.col("input") + pl.col("sync") + pl.col("host") + pl.col("other")
    # The causes tile the idle time; any rounding/definition residue goes to "other",
    # an excess (overlapping definitions) is scaled down so the parts add up to idle.
    b = b.with_columns(_k=known).with_columns(
        _f=pl.when(pl.col("_k") > pl.col("idle_ns")).then(pl.col("idle_ns") / pl.col("_k")).otherwise(1.0)
    ).with_columns(
        [(pl.col(c) * pl.col("_f")).round(0).cast(pl.Int64).alias(f"{c}_ns")
         for c in ("input", "sync", "host", "other")]
    ).with_columns(
        other_ns=pl.col("other_ns") + (pl.col("idle_ns") - pl.col("input_ns") - pl.col("sync_ns") - pl.col("host_ns")
                                       - pl.col("other_ns")).clip(lower_bound=0)
    )
    # Kernel mix of the device's kernels, per window.
    # Communication as every analysis counts it (_comm.comm_classes), the rest by name.
    k = on_distinct(model.kernels.with_columns(is_comm=comm_classes(t)["is_comm"]).filter(pl.col("device") == device),
                    ["name", "is_comm"],
                    kclass=pl.when(pl.col("is_comm")).then(pl.lit("communication")).otherwise(kernel_class(pl.col("name"))))
    k = assign_steps(k.select("ts_ns", "dur_ns", "kclass"), windows, "ts_ns").filter(pl.col("window").is_not_null())
    mix = k.group_by("window").agg(
        compute_kernel_ns=pl.col("dur_ns").filter(pl.col("kclass").is_in(["gemm", "attention"])).sum(),
        memory_kernel_ns=pl.col("dur_ns").filter(pl.col("kclass").is_in(["elementwise", "reduction"])).sum(),
        other_kernel_ns=pl.col("dur_ns").filter(pl.col("kclass") == "other").sum(),
        comm_kernel_ns=pl.col("dur_ns").filter(pl.col("kclass") == "communication").sum(),
    )
    b = b.join(mix, on="window", how="left").with_columns(
        pl.col(c).fill_null(0) for c in ("compute_kernel_ns", "memory_kernel_ns", "other_kernel_ns", "comm_kernel_ns")
    )
    b = b.with_columns(
        productive_ns=pl.col("compute_ns") + pl.col("memcpy_ns") + pl.col("memset_ns"),
        transfer_ns=pl.col("memcpy_ns") + pl.col("memset_ns"),
    )
    return b.select(
        "window", "step", "dur_ns", "productive_ns", "compute_ns", "transfer_ns", "communication_ns", "input_ns",
        "sync_ns", "host_ns", "other_ns", "idle_ns", "compute_kernel_ns", "memory_kernel_ns", "other_kernel_ns",
        "comm_kernel_ns",
    ).sort("window"), notes


# ------------------------------------------------------------------------------------------------
# Evidence and advice (a handful of strings from aggregate numbers)
# ------------------------------------------------------------------------------------------------


def _throughput_line(bl: BaselineResult, ctx: Any) -> str | None:
    """Samples/s for training; for an inference engine tokens/s when the trace records the tokens of
    its engine steps, and never samples (a decode step makes one token per sequence)."""
    engine = getattr(ctx, "inference_engine", None)
    if engine:
        inf = getattr(ctx, "inference", None) or {}
        if inf.get("tokens_per_s"):
            return (f"{inf['tokens_per_s']:,.1f} tokens/s ({engine} {inf['phase']}: {inf['tokens_per_step']:,.0f} "
                    f"tokens and {inf['sequences_per_step']:,.0f} sequences per engine step of "
                    f"{inf['engine_step_ms']:,.3f} ms, from {inf['source']})")
        return (f"{engine} inference: throughput is tokens/s, and the trace records no token counts "
                "(samples/s does not apply)")
    if bl.samples_per_s is None:
        return None
    return f"{bl.samples_per_s:,.1f} samples/s at batch {bl.batch_size} ({bl.batch_source})"


def _first(df: Any, n: int = 1) -> list[dict[str, Any]]:
    return df.head(n).to_dicts() if df is not None and int(getattr(df, "height", 0) or 0) > 0 else []


def _gpu_evidence(verdict: str, tot: dict[str, Any], model: TraceModel, reads: AnalysisContext[TraceModel],
                  bl: BaselineResult,
                  steady: list[int], device: int) -> tuple[list[str], list[str]]:
    d = tot["dur_ns"]
    p = {c: _pct(tot[f"{c}_ns"], d) for c in ("productive", "compute", "transfer", "communication", "input", "sync",
                                               "host", "other", "idle")}
    ev: list[str] = [
        f"{device_name(device, model.meta.vendor)} is busy {p['productive'] + p['communication']:.1f} % of the "
        "steady steps "
        f"(compute {p['compute']:.1f} %, copies {p['transfer']:.1f} %, exposed communication "
        f"{p['communication']:.1f} %) and idle {p['idle']:.1f} % (DataLoader {p['input']:.1f} %, syncs "
        f"{p['sync']:.1f} %, host busy {p['host']:.1f} %, unexplained {p['other']:.1f} %)."
    ]
    mv: list[str] = []
    kern = reads.typed("kernels", KernelsResult)
    launches = reads.typed("launches", LaunchesResult)
    syncs = reads.typed("syncs", SyncsResult)
    ig = reads.typed("idle_gaps", IdleGapsResult)
    run_ctx = reads.typed("context", ContextResult)
    ktot = tot["compute_kernel_ns"] + tot["memory_kernel_ns"] + tot["other_kernel_ns"]
    dtypes = set(bl.conditions["dtypes"]["ops"]) | set(bl.conditions["dtypes"]["kernels"])
    if verdict in ("compute_bound", "memory_bound"):
        ev.append(
            f"Kernel mix (non-collective): GEMM/conv/attention {_pct(tot['compute_kernel_ns'], ktot):.1f} %, "
            f"elementwise/reduction/normalisation {_pct(tot['memory_kernel_ns'], ktot):.1f} %, other "
            f"{_pct(tot['other_kernel_ns'], ktot):.1f} % of kernel time."
        )
        top = _first(kern.by_name.filter(~pl.col("is_comm")) if kern is not None else None)
        if top:
            ev.append(f"Top kernel: {top[0]['name']} ({top[0]['pct_of_kernel_time']:.1f} % of kernel time, "
                      f"{top[0]['count']:,} calls).")
        if dtypes:
            ev.append("Compute dtypes seen: " + ", ".join(sorted(dtypes)) + ".")
    if verdict == "compute_bound":
        if {"fp32", "tf32"} & dtypes and not {"bf16", "fp16", "fp8"} & dtypes:
            if run_ctx is not None and run_ctx.vendor == "nvidia" and run_ctx.supports_bf16 is False:
                mv.append(f"The GEMMs run in fp32: fp16 autocast with a GradScaler is the first lever (the "
                          f"{run_ctx.device_arch} tensor cores take fp16 only: no bf16, no TF32 on this device).")
            else:
                mv.append("The GEMMs run in fp32/tf32: mixed precision (torch.autocast bf16/fp16) is the first "
                          "lever (2-8× tensor-core throughput); torch.set_float32_matmul_precision('high') at least.")
        attn = "" if run_ctx is not None and run_ctx.fused_attention else "fused attention (SDPA/FlashAttention), "
        low = ("lower precision (fp16 with a GradScaler: no bf16 on this device)"
               if run_ctx is not None and run_ctx.vendor == "nvidia" and run_ctx.supports_bf16 is False
               else "lower precision (bf16/fp8)")
        gpu_like = run_ctx is None or run_ctx.vendor in ("nvidia", "amd", "unknown", None)
        shapes = ("tensor-core friendly shapes (multiples of 8/16)" if gpu_like
                  else "shapes that fill the accelerator's matrix units (its vendor's tiling guidance)")
        mv.append(f"Less work or faster math: {low}, {shapes}, {attn}no unneeded recomputation, a larger/faster "
                  f"{'GPU' if gpu_like else 'device'}. The {'GPU' if gpu_like else 'device'} is saturated, so "
                  "CPU-side fixes will not help.")
    elif verdict == "memory_bound":
        fuse = ("the code is already compiled: shrink what runs outside the compiled regions (graph breaks), "
                "fused" if run_ctx is not None and run_ctx.compiled
                else "torch.compile (fuses elementwise/reduction chains), fused")
        mv.append(f"Fuse the memory-bound kernels: {fuse} "
                  "optimizers (fused=True / foreach), fused norms and SDPA, channels_last for convs, avoid "
                  "needless .contiguous()/copies; larger GEMMs raise arithmetic intensity.")
    elif verdict == "input_bound":
        cpu_dl = reads.need("phases", PhasesResult).cpu_mean.get("data_loading_ns")
        ev.append(f"The CPU spends {ms(cpu_dl)} per step in the DataLoader "
                  f"({_pct(cpu_dl, d / max(len(steady), 1)):.1f} "
                  "% of the step).")
        single = model.annotations.filter(pl.col("name").str.contains("_SingleProcessDataLoaderIter")).height
        if single:
            ev.append("The iterator is _SingleProcessDataLoaderIter: num_workers=0, data is loaded on the training "
                      "thread.")
            mv.append("Set DataLoader(num_workers=N>0) (and persistent_workers=True).")
        mv.append("Feed the GPU faster: more DataLoader workers, prefetch_factor, pin_memory=True with "
                  "non_blocking copies, cheaper decoding/augmentation (or on the GPU, e.g. DALI), cached/preprocessed "
                  "data, faster storage.")
        pageable = model.memcpy.filter((pl.col("src") == "Pageable") | (pl.col("dst") == "Pageable")).height
        if pageable:
            ev.append(f"{pageable:,} transfers use pageable host memory.")
    elif verdict == "cpu_bound":
        if launches is not None:
            ps = launches.per_step.filter(pl.col("window").is_in(steady))
            lc, lg = int(ps["launch_cpu_ns"].sum() or 0), int(ps["launched_gpu_ns"].sum() or 0)
            nb = int(ps["launch_bound"].sum() or 0)
            ev.append(f"Launch calls cost {ms(lc / max(len(steady), 1))} of CPU per step for "
                      f"{ms(lg / max(len(steady), 1))} of GPU work (ratio {lc / lg if lg else float('nan'):.2f}); "
                      f"{nb} of {ps.height} steady step(s) are launch-bound by the launches analysis; "
                      f"{100.0 * launches.n_shorter_than_launch / max(launches.n_joined, 1):.1f} % of GPU "
                      "activities are shorter than their launch call.")
            if nb * 2 >= max(ps.height, 1):
                if run_ctx is not None and (run_ctx.compiled or run_ctx.cuda_graphs or run_ctx.graph_capture):
                    mv.append("Launch overhead dominates: " + fewer_launches(model.meta.vendor, run_ctx)
                              + "; a larger batch per launch helps too.")
                else:
                    mv.append("Launch overhead dominates: capture the step in CUDA graphs "
                              "(torch.compile(mode='reduce-overhead') or torch.cuda.CUDAGraph) and fuse small ops "
                              "(torch.compile) so fewer, larger kernels are launched; a larger batch per launch "
                              "helps too.")
        queue = reads.typed("queue_length", QueueLengthResult)
        busiest = queue.busiest() if queue is not None else None
        if busiest is not None and busiest["window_ns"]:
            # A launch-bound stream has nothing queued most of the time (queue_length's definition).
            ev.append(f"Launch queue of the busiest stream (GPU {busiest['device']} stream {busiest['stream']}): "
                      f"nothing queued {busiest['empty_pct_of_window']:.1f} % of the steady steps, "
                      f"{busiest['mean_queue']:.1f} launches queued on average.")
        if kern is not None:
            ev.append(f"Median kernel {kern.duration_ns['median'] / 1e3:,.1f} µs; {kern.n_short:,} of "
                      f"{kern.n_kernels:,} kernels are shorter than {kern.short_kernel_ns / 1e3:g} µs.")
        top = _first(ig.attribution if ig is not None else None)
        if top:
            ev.append(f"During long GPU gaps the CPU is mostly in `{top[0]['cpu_context']}` "
                      f"({top[0]['pct_of_idle']:.0f} % of idle time).")
        if run_ctx is not None and run_ctx.inference_engine:
            mv.append(f"Cut the CPU work between engine steps ({run_ctx.inference_engine}: scheduling, sampling, input "
                      "preparation, detokenisation run on the host between graph replays): larger decode batches, "
                      "async scheduling/output processing where the engine offers it.")
        elif run_ctx is not None and run_ctx.compiled:
            mv.append("Cut the CPU work between launches: the code is already compiled, so remove what still runs "
                      "eagerly (graph breaks: TORCH_LOGS=graph_breaks; recompiles: TORCH_LOGS=recompiles), move "
                      "host-side bookkeeping (logging, metric math, Python loops over tensors) out of the step, "
                      "larger batches per step.")
        else:
            mv.append("Cut the CPU work between launches: torch.compile to remove Python/dispatcher overhead, move "
                      "host-side bookkeeping (logging, metric math, Python loops over tensors) out of the step, "
                      "vectorise per-sample Python code, larger batches per step.")
    elif verdict == "sync_bound":
        if syncs is not None:
            t = syncs.totals
            threads = int(t.get("blocking_threads") or 0)
            ev.append(f"{t['sync_points']:,} sync points ({t['sync_calls']:,} blocking calls); the CPU is blocked "
                      f"{t['pct_blocked_of_steps'] or 0:.1f} % of step time"
                      + (f" (summed over {threads} threads)" if threads > 1 else "")
                      + f" and the GPU then idles {t['pct_idle_after_of_steps'] or 0:.1f} % of step time waiting to "
                      "be fed again.")
            for r in _first(syncs.by_site, 3):
                ev.append(f"Sync site {r['site']}: {r['count']:,} point(s) ({r.get('causes') or ''}), blocked "
                          f"{ms(r['blocked_ns'])}.")
        if run_ctx is not None and run_ctx.inference_engine:
            # The engine's own step syncs (sampled tokens copied to the host): its settings, not user code.
            mv.append(engine_sync_move(str(run_ctx.inference_engine)))
        else:
            mv.append("Remove host syncs from the loop: keep metrics on the GPU and call .item()/.cpu() every N steps, "
                      "no print/if on CUDA tensors, no torch.cuda.synchronize() in the step, pinned memory with "
                      "non_blocking=True copies, static-shape alternatives to nonzero/masked_select/boolean indexing.")
    elif verdict == "comm_bound":
        comm_total = tot["comm_kernel_ns"]
        hidden = max(comm_total - tot["communication_ns"], 0)
        cr = reads.typed("communication", CommunicationResult)
        if cr is not None and cr.totals["device"] == device:  # one value per fact: the communication analysis'
            comm_ps, hidden_pct = cr.totals["comm_ns_per_step"], cr.totals["hidden_pct"] or 0.0
        else:
            comm_ps, hidden_pct = comm_total / max(len(steady), 1), _pct(hidden, comm_total)
        ev.append(f"Communication kernels run {ms(comm_ps)} per step, {hidden_pct:.1f} % of it hidden under "
                  f"compute; the exposed part is {p['communication']:.1f} % of the step.")
        top = _first(kern.by_name.filter(pl.col("is_comm")) if kern is not None else None)
        if top:
            ev.append(f"Top collective kernel: {top[0]['name']} ({top[0]['count']:,} calls, "
                      f"{ms(top[0]['total_ns'])} in all).")
        ev += _comm_evidence(reads)
        mv += _comm_moves(reads)
    else:  # mixed
        causes = sorted(((tot[f"{c}_ns"], c) for c in LOST_CAUSES), reverse=True)
        ev.append("No single cause holds the majority of the lost time: " + ", ".join(
            f"{c} {_pct(v, d):.1f} %" for v, c in causes if v > 0) + " of the step.")
        if causes and causes[0][1] == "other":
            ev.append("The largest part of the idle time has no visible cause in this trace (work was queued "
                      "but the device idled: waiting on another stream, device or collective peer, or the "
                      "launching CPU thread is not in the trace).")
        mv.append("Work on the largest causes in order; re-profile after each change (the verdict may become "
                  "clear once one cause is gone).")
    return ev, mv


#: Advice per kind of communication; the kinds present (by time) choose which apply.
_COMM_MOVES: dict[str, str] = {
    "expert": ("Expert-parallel all-to-all (dispatch/combine) is exposed: overlap it with compute (DeepEP's "
               "hook-based receive, two micro-batches in flight so one batch's dispatch/combine runs under the "
               "other's experts), DeepEP low-latency kernels for decode, node-limited routing so fewer tokens "
               "cross nodes, FP8 dispatch, and a balanced router (capacity factor, auxiliary-loss-free balancing): "
               "the slowest expert rank sets every all-to-all."),
    "tensor_parallel": ("The tensor-parallel all-reduce sits between layers on the critical path: a one-shot / "
                        "custom all-reduce for small messages (vLLM custom all-reduce, PyTorch symmetric memory), "
                        "all-reduce fused with the following norm (the engine's fusion passes), a smaller "
                        "tensor-parallel degree or NVLink-local groups."),
    "pipeline": ("Pipeline-parallel send/recv is exposed: more micro-batches per step (a smaller bubble), an "
                 "interleaved 1F1B schedule, and p2p overlapped with compute."),
    "data_parallel": ("Hide or shrink the gradient collectives: overlap them with backward (DDP bucket_cap_mb, "
                      "gradient_as_bucket_view, FSDP forward/backward prefetch), no_sync() during gradient "
                      "accumulation, bf16/fp16 gradient compression hooks, fewer/larger collectives, a faster "
                      "interconnect."),
}
_STRAGGLER = ("Long collectives on one rank can also mean another rank is slow (straggler): compare ranks "
              "(`traceanalyzer batch` over every rank's trace).")


def _comm_moves(reads: _Reads) -> list[str]:
    """What would move a communication-bound step, by the collective types that take the time:
    all-to-all/dispatch/combine → expert parallelism; all-reduce in an inference engine → tensor
    parallelism; send/recv → pipeline parallelism; otherwise gradient collectives (data parallel)."""
    c = reads.typed("communication", CommunicationResult)
    run_ctx = reads.typed("context", ContextResult)
    kinds: list[str] = []
    if c is not None and c.by_type.height:
        total = float(c.by_type["total_ns"].sum() or 0)
        for r in c.by_type.sort("total_ns", descending=True).iter_rows(named=True):
            if total <= 0 or r["total_ns"] < 0.2 * total:
                break
            t = str(r["type"])
            kind = ("expert" if t in ("all_to_all", "dispatch", "combine") else
                    "pipeline" if t in ("send_recv", "send", "recv") else
                    "tensor_parallel" if t == "all_reduce" and getattr(run_ctx, "inference_engine", None) else
                    "data_parallel")
            if kind not in kinds:
                kinds.append(kind)
    moves = [_COMM_MOVES[k] for k in (kinds or ["data_parallel"])]
    families = set(c.totals.get("families") or ()) if c is not None else set()
    if "tensor_parallel" in kinds and families & {"custom_all_reduce", "symm_mem"}:
        # The run already uses a one-shot / custom all-reduce: what is left is fusion and the degree.
        moves[kinds.index("tensor_parallel")] = (
            "The tensor-parallel all-reduce sits between layers on the critical path and already runs as a "
            "custom/one-shot all-reduce: fuse it with the following norm (the engine's fusion passes), or use a "
            "smaller tensor-parallel degree or NVLink-local groups.")
    if "expert" in kinds and "deepep" in families:
        moves[kinds.index("expert")] = moves[kinds.index("expert")].replace(
            "overlap it with compute (DeepEP's hook-based receive,",
            "overlap it with compute (the run uses DeepEP: its "
            "hook-based receive,")
    return moves + [_STRAGGLER]


def _comm_evidence(reads: _Reads) -> list[str]:
    """How the communication kernels were recognised and what they are (``communication``)."""
    c = reads.typed("communication", CommunicationResult)
    if c is None:
        return []
    out = [f"{c.signal_line()}."]
    types = [f"{r['type']} {r['count']:,}" + (f" (busbw {r['busbw_gbps']:,.1f} GB/s)" if r["busbw_gbps"] else "")
             for r in c.by_type.head(4).iter_rows(named=True)]
    if types:
        out.append("Collectives: " + ", ".join(types) + ".")
    return out


def _comm_note(reads: _Reads, verdict: str) -> str | None:
    """A note when communication is large but hidden under compute (not the bottleneck)."""
    c = reads.typed("communication", CommunicationResult)
    if c is None or verdict == "comm_bound" or c.totals["overlap_verdict"] != "large_but_hidden":
        return None
    t = c.totals
    return (f"{ms(t['comm_ns_per_step'])}/step of communication ({t['comm_pct_of_step'] or 0:.1f} % of the step), "
            f"{t['hidden_pct'] or 0:.1f} % hidden under compute: not the bottleneck")


def _secondary(tot: dict[str, Any], verdict: str, minor_pct: float) -> list[str]:
    d = tot["dur_ns"]
    labels = _CAUSE_LABEL
    main = {"input_bound": "input", "sync_bound": "sync", "comm_bound": "communication",
            "cpu_bound": "host"}.get(verdict)
    rows = sorted(((tot[f"{c}_ns"], c) for c in LOST_CAUSES if c != main), reverse=True)
    return [f"{labels[c]} {_pct(v, d):.1f} %" for v, c in rows if _pct(v, d) >= minor_pct]


def _comm_ops(t: TraceTables, windows: pl.DataFrame, steady: list[int], device: int | None, n: int) -> pl.DataFrame:
    """Collective kernels of the steady steps grouped by the CPU op that launched them (the deepest
    op around the launch call: ``c10d::allreduce_``, ``record_param_comms`` …), wherever that op
    sits (DDP launches them from inside backward ops on the autograd thread)."""
    model = t.model
    k = model.kernels.with_columns(_k=kernel_norms(t)).filter(comm_classes(t)["is_comm"])
    if device is not None:
        k = k.filter(pl.col("device") == device)
    k = assign_steps(k, windows, "ts_ns").filter(pl.col("window").is_in(steady))
    if k.is_empty():
        return pl.DataFrame()
    rt = runtime_by_correlation(t).select("correlation", "pid", "tid", "api_ts_ns")
    k = join_unique(k, rt, "correlation")
    ops = model.cpu_ops.select("name", "input_dims").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    pts = k.select(pl.col("pid").fill_null(-1), pl.col("tid").fill_null(-1),
                   pl.col("api_ts_ns").fill_null(0).alias("ts_ns"))
    k = k.with_columns(_op=op_index(t).lookup(pts) if ops.height else None)
    k = k.join(ops.select(pl.col("id").alias("_op"), pl.col("name").alias("op"), "input_dims"), on="_op", how="left")
    steps = max(len(steady), 1)
    return (
        k.with_columns(pl.col("op").fill_null("<no launching CPU op>"))
        .group_by("op", "comm_name")
        .agg(calls=pl.len().cast(pl.Int64), gpu_ns=pl.col("dur_ns").sum(),
             n_shapes=pl.col("input_dims").n_unique().cast(pl.Int64),
             input_dims=pl.col("input_dims").drop_nulls().mode().sort().first(),
             top_kernel=pl.col("_k").mode().sort().first())
        .select(pl.lit("communication").alias("phase"), pl.col("comm_name").alias("module"), pl.col("op").alias("name"),
                "input_dims", "n_shapes", "calls", (pl.col("calls") / steps).round(2).alias("calls_per_step"),
                pl.lit(0, pl.Int64).alias("cpu_ns"), "gpu_ns",
                (pl.col("gpu_ns") / steps).round(1).alias("gpu_ns_per_step"),
                pl.col("calls").alias("kernels"), (pl.col("gpu_ns") / pl.col("calls")).round(1).alias("mean_gpu_ns"),
                "top_kernel")
        .sort(["gpu_ns", "name"], descending=[True, False])
        .head(n)
    )


def _top_ops(ph: PhasesResult | None, phase: str | None, by: str, n: int) -> pl.DataFrame:
    if ph is None or phase is None or ph.ops.is_empty():
        return pl.DataFrame()
    return ph.ops.filter(pl.col("phase") == phase).sort(
        [by, "cpu_ns", "name"], descending=[True, True, False], maintain_order=True  # ties: ph.ops' total order
    ).head(n)


@analysis(
    "diagnosis",
    depends_on=("steps", "baseline", "phases"),
    after=("gpu_time", "idle_gaps", "kernels", "launches", "syncs", "context", "communication", "queue_length"),
    title="Diagnosis",
    order=1,
    shared=("gpu_activity", "op_nesting", "runtime_by_correlation", "comm_classes", "kernel_norms"),
    params={"gpu_bound_pct": 90.0, "mostly_busy_pct": 85.0, "cause_min_pct": 15.0, "dominant_pct": 50.0,
            "minor_pct": 5.0, "top_ops": 10},
)
def diagnosis(ctx: AnalysisContext[TraceModel]) -> DiagnosisResult:
    """Baseline → bottleneck type (per step and overall, with evidence) → dominant phase → top operations."""
    model = ctx.model
    gpu_bound_pct = ctx.params.gpu_bound_pct
    mostly_busy_pct = ctx.params.mostly_busy_pct
    cause_min_pct = ctx.params.cause_min_pct
    dominant_pct = ctx.params.dominant_pct
    minor_pct = ctx.params.minor_pct
    top_n = ctx.params.top_ops
    thresholds = {"gpu_bound_pct": gpu_bound_pct, "mostly_busy_pct": mostly_busy_pct, "cause_min_pct": cause_min_pct,
                  "dominant_pct": dominant_pct, "minor_pct": minor_pct,
                  "top_ops": top_n}
    sr = ctx.need("steps", StepsResult)
    bl = ctx.need("baseline", BaselineResult)
    ph = ctx.need("phases", PhasesResult)
    windows = sr.windows()
    steady = sr.steady_windows()
    if int((windows["end_ns"] - windows["start_ns"]).sum()) <= 0:
        raise NotApplicable("the trace window is empty (no events with a duration)")
    notes: list[str] = []
    if not sr.has_steps:
        notes.append("no ProfilerStep# ranges: the whole trace is judged as one window, start-up and tail included; "
                     "profile with torch.profiler.schedule and prof.step() for per-step numbers")
    gt = ctx.typed("gpu_time", GpuTimeResult)
    use_gpu = model.has_gpu and gt is not None and ph.primary_device is not None
    if model.has_gpu and not use_gpu:
        why = ctx.results.skipped.get("gpu_time") or ctx.results.failed.get("gpu_time") or "gpu_time did not run"
        notes.append(f"the trace has GPU activity but its GPU breakdown is unavailable ({why}): CPU-side verdict")
    if not model.has_gpu and model.cpu_ops.is_empty() and model.annotations.is_empty():
        raise NotApplicable("no CPU ops and no GPU activity in this trace: nothing to diagnose")

    phase_tables: dict[str, pl.DataFrame] = {}
    steady_flag = pl.col("window").is_in(steady)
    base_label = "the step"
    if use_gpu:
        device = int(ph.primary_device)  # type: ignore[arg-type]
        span_windows = _active_span(ctx.tables, windows, device) if not sr.has_steps else None
        if span_windows is not None:
            # Without step markers the window is the whole trace: profiler start-up before the
            # device's first activity and the tail after its last are not the workload. The GPU is
            # judged over its active span, as HTA's temporal breakdown is; the edges are reported.
            lead, tail = _span_edges(windows, span_windows)
            notes.append(f"no steps: the GPU verdict is judged over {device_name(device, model.meta.vendor)}'s "
                         "active span (first to last "
                         f"activity, {ms(int(span_windows['end_ns'][0] - span_windows['start_ns'][0]))} of the "
                         f"{ms(int(windows['end_ns'].max() - windows['start_ns'].min()))} trace); "  # type: ignore[operator, arg-type]  # noqa: E501 - polars' scalar union
                         f"{ms(lead)} before its "
                         f"first activity and {ms(tail)} after its last are left out")
            base_label = f"{device_name(device, model.meta.vendor)}'s active span"
        bd, more = _gpu_breakdown(ctx.tables, ctx, span_windows if span_windows is not None else windows, device,
                                  clipped=span_windows is not None)
        notes += more
        n_dev = gt.per_device.height  # type: ignore[union-attr]
        if n_dev > 1:
            notes.append(f"{n_dev} devices have activity; the verdict is for "
                         f"{device_name(device, model.meta.vendor)}, the busiest")
        per = apply_verdicts(bd, gpu_bound_pct, dominant_pct, mostly_busy_pct, cause_min_pct)
        sums = bd.filter(steady_flag).select(pl.exclude("window", "step").sum())
        tot_df = apply_verdicts(sums, gpu_bound_pct, dominant_pct, mostly_busy_pct, cause_min_pct)
        tot = tot_df.row(0, named=True)
        verdict, share = str(tot["verdict"]), float(tot["share_pct"])
        ev, mv = _gpu_evidence(verdict, tot, model, ctx, bl, steady, device)
        secondary = _secondary(tot, verdict, minor_pct)
        pct_cols = ("productive", "communication", "input", "sync", "host", "other")
        per_step = per.with_columns(
            [(pl.col(f"{c}_ns") * 100.0 / pl.col("dur_ns")).round(2).alias(f"{c}_pct") for c in pct_cols]
        ).select(
            "step", "verdict", "share_pct", "top_cause", "dur_ns", *[f"{c}_pct" for c in pct_cols],
            steady=steady_flag,
        ).with_columns(pl.col("verdict").replace_strict(VERDICTS, default=None).alias("label"))
        breakdown = {k: v for k, v in tot.items() if k.endswith("_ns")}
        breakdown.update({f"{c}_pct": _pct(tot[f"{c}_ns"], tot["dur_ns"]) for c in (*pct_cols, "idle", "compute",
                                                                                     "transfer")})
        resource = "gpu"
        phase_tables[f"{device_name(device, model.meta.vendor)} time per phase and step"] = ph.gpu.filter(
            pl.col("device") == device).drop("device")
        phase_tables["CPU time per phase and step"] = ph.cpu
    else:
        device = None
        if model.runtime.filter(pl.col("name").str.contains("(?i)launch")).height and not model.has_gpu:
            notes.append("the trace has kernel launch calls but no GPU activity (device activity not captured): "
                         "only the CPU side can be judged; profile with ProfilerActivity.CUDA")
        e = cpu_verdict_exprs(dominant_pct)
        per = ph.cpu.with_columns(e)
        sums = ph.cpu.filter(steady_flag).select(pl.exclude("window", "step").sum())
        tot = sums.with_columns(e).row(0, named=True)
        verdict, share = str(tot["verdict"]), float(tot["share_pct"])
        d = tot["total_ns"]
        ev = [("CPU time per steady step: " + ", ".join(
            f"{p.replace('_', ' ')} {_pct(tot[f'{p}_ns'], d):.1f} %" for p in PHASES if tot[f"{p}_ns"]) + ".")]
        if not model.has_gpu:
            ev.append("No GPU activity in the trace: the model runs on the CPU (or the device was not profiled).")
        if verdict == "input_bound":
            mv = ["Feed the model faster: DataLoader(num_workers>0, persistent_workers=True, prefetch_factor), "
                  "cheaper decoding/augmentation, cached/preprocessed data."]
        else:
            mv = ["The CPU executes the model: optimise the top CPU ops (torch.compile, oneDNN/MKL threads via "
                  "torch.set_num_threads, channels_last, bf16 on CPUs that support it) — or profile on the target "
                  "accelerator if this run should have used one."]
        secondary = [f"data loading {_pct(tot['data_loading_ns'], d):.1f} %"] if (
            verdict != "input_bound" and _pct(tot["data_loading_ns"], d) >= minor_pct) else []
        per_step = per.select(
            "step", "verdict", "share_pct", pl.col("total_ns").alias("dur_ns"),
            *[(pl.col(f"{p}_ns") * 100.0 / pl.col("total_ns")).round(2).alias(f"{p}_pct") for p in PHASES],
            steady=steady_flag,
        ).with_columns(pl.col("verdict").replace_strict(VERDICTS, default=None).alias("label"))
        breakdown = {f"{p}_ns": tot[f"{p}_ns"] for p in PHASES}
        breakdown.update({"dur_ns": d, **{f"{p}_pct": _pct(tot[f"{p}_ns"], d) for p in PHASES}})
        resource = "cpu"
        phase_tables["CPU time per phase and step"] = ph.cpu

    comm_note = _comm_note(ctx, verdict) if use_gpu else None
    if comm_note:
        notes.append(comm_note)
    run_ctx = ctx.typed("context", ContextResult)
    cap_note = capture_only_note(run_ctx)
    inf = (run_ctx.inference if run_ctx is not None else None) or {}
    if run_ctx is not None and run_ctx.inference_engine and inf.get("tokens_per_step") and inf.get("engine_step_ms"):
        # An engine step is judged per token and sequence, not per sample.
        ev.append(f"{run_ctx.inference_engine} {inf['phase']} engine step: {inf['engine_step_ms']:,.3f} ms for "
                  f"{inf['tokens_per_step']:,.0f} token(s) of {inf['sequences_per_step']:,.0f} sequence(s), "
                  f"{inf['engine_step_ms'] * 1000.0 / inf['tokens_per_step']:,.1f} µs per token.")
    if cap_note:
        # A capture/warm-up trace: kernels under capture are recorded, not run; no steady state to judge.
        verdict, share = "capture_only", 0.0
        per = per.with_columns(verdict=pl.lit("capture_only"))
        per_step = per_step.with_columns(verdict=pl.lit("capture_only"), label=pl.lit(VERDICTS["capture_only"]))
        seen = run_ctx.capture_evidence if run_ctx is not None else ()
        ev = [f"Capture seen: {'; '.join(seen)}; no graph replay in the trace.", *ev[:1]]
        mv = ["Profile the steady state instead: the graph replays (decode/training steps after warm-up), e.g. "
              "torch.profiler with schedule(wait=…, warmup=…, active=…) started after the capture, or the "
              "engine's profiler during serving."]
        secondary = []
        notes.append(cap_note)
    agree = int(per.filter(steady_flag & (pl.col("verdict") == verdict)).height)
    n_steady = int(per.filter(steady_flag).height)
    # Phase, then operation.
    dom: str | None
    if verdict == "comm_bound":
        dom, rank_by, res = "communication", "gpu_ns", "gpu"
    elif verdict == "input_bound":
        dom, rank_by, res = "data_loading", "cpu_ns", "cpu"
    elif verdict in ("compute_bound", "memory_bound"):
        dom, rank_by, res = ph.dominant("gpu"), "gpu_ns", "gpu"
    else:
        dom, res = ph.dominant("cpu"), "cpu"
        rank_by = "cpu_ns" if resource == "cpu" or verdict != "mixed" else "gpu_ns"
        if dom in (None, "other") and use_gpu and ph.dominant("gpu") not in (None, "other"):
            dom, rank_by, res = ph.dominant("gpu"), "gpu_ns", "gpu"  # no CPU ops: the GPU phases tell
    means = ph.gpu_mean if res == "gpu" and ph.gpu_mean else ph.cpu_mean
    res = "gpu" if means is ph.gpu_mean and ph.gpu_mean else "cpu"
    phase_line = f"{'GPU' if res == 'gpu' else 'CPU'} per step: {ph.line(res)}"
    ratios = []
    if ph.fwd_bwd_ratio_gpu is not None:
        ratios.append(f"backward/forward {ph.fwd_bwd_ratio_gpu:.2f}× on the GPU")
    if ph.fwd_bwd_ratio_cpu is not None:
        ratios.append(f"{ph.fwd_bwd_ratio_cpu:.2f}× on the CPU")
    if ratios:
        phase_line += "; " + ", ".join(ratios)
    annotated = ph.annotated_line(res) if hasattr(ph, "annotated_line") else ""
    if annotated:
        # User record_function ranges (attn, mlp, dispatch …) say where the time goes inside the phases.
        phase_line += ("; other is split by your record_function ranges: " if dom == "other"
                       else "; by your record_function ranges: ") + annotated + " of the step"
    top = _top_ops(ph, dom, rank_by, top_n)
    if dom == "communication" and use_gpu:
        top = _comm_ops(ctx.tables, windows, steady, device, top_n)
    return DiagnosisResult(
        resource=resource,
        verdict=verdict,
        share_pct=round(share, 2),
        evidence=tuple(ev),
        moves=tuple(mv),
        secondary=tuple(secondary),
        breakdown=breakdown,
        per_step=per_step,
        steady_agree=agree,
        n_steady=n_steady,
        dominant_phase=dom,
        phase_line=phase_line,
        phase_means={"cpu": ph.cpu_mean, "gpu": ph.gpu_mean},
        fwd_bwd={"gpu": ph.fwd_bwd_ratio_gpu, "cpu": ph.fwd_bwd_ratio_cpu},
        top_ops=top,
        rank_by=rank_by,
        baseline_line=bl.headline(),
        throughput_line=_throughput_line(bl, run_ctx),
        conditions_line=bl.conditions_line(),
        baseline={"step_time_ns": bl.stats, "warmup_steps": bl.warmup.to_dicts(), "batch_size": bl.batch_size,
                  "samples_per_s": bl.samples_per_s},
        notes=tuple(notes),
        primary_device=device,
        base_label=base_label,
        top_cause=(str(tot["top_cause"]) if resource == "gpu" and tot.get("top_cause") else None),
        phase_tables=phase_tables,
        thresholds=thresholds,
    )
