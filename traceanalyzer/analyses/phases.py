"""Phases: where each step's time goes — data loading, forward, backward, optimizer,
communication, other — on the CPU and on the GPU, and the ops behind each phase.

Phase evidence (every signal the trace offers, none required)
-------------------------------------------------------------
* **data_loading**: ``enumerate(DataLoader)#…`` / ``enumerate(DataPipe)#…`` ranges, and user
  ``record_function`` ranges named like data loading (``dataload``, ``load_batch``,
  ``get_batch``, ``next_batch``, ``prefetch``). On the GPU also host-to-device copies
  launched outside backward/optimizer/communication (moving the batch in).
* **communication**: CPU communication ops (``nccl:*``, ``gloo:*``, ``c10d::*``,
  ``record_param_comms``, functional collectives, ``symm_mem::*``, custom all-reduce and DeepEP
  ops: ``_comm.COMM_OP_RE``); on the GPU every communication kernel (``_comm.comm_classes``).
* **optimizer**: ``Optimizer.step#…`` / ``Optimizer.zero_grad#…`` annotations, user ranges
  named ``optimizer``/``zero_grad``, fused/foreach optimizer ops (``aten::_fused_adam*``,
  ``aten::_foreach_*``).
* **backward**: autograd ops (``…Backward0``, ``autograd::engine::evaluate_function: …``,
  ``AccumulateGrad``), every op on an autograd engine thread (a thread named
  ``pt_autograd_*``, or a thread other than the step thread that runs backward ops), the ops
  that ``fwdbwd`` flows end on, and user ranges named ``backward``.
* **forward**: user ranges named ``forward`` (``DistributedDataParallel.forward``,
  ``## forward ##``), ``nn.Module: X`` frames (``with_modules``), and every other CPU op that
  starts before the step's first backward op (all of them when the step has no backward:
  inference).
* **other**: the rest — ops after backward began that are none of the above (metrics,
  logging, ``loss.item()``), CPU time outside any recorded op, GPU work launched from there.

Each instant counts once, in the first phase that covers it, in the precedence
``data_loading > communication > optimizer > backward > forward > other``, so the CPU
phases add up to the step window exactly (union over the threads of the trace: while the
autograd thread runs backward the main thread waits, and that is backward time).

GPU: each kernel/copy/memset takes the phase of the CPU point that launched it (its runtime
call, joined by correlation id, on the calling thread, same precedence), collectives are
communication, host-to-device copies data_loading (see above). Per device, each instant of the
step window counts once in the precedence ``forward > backward > optimizer > data_loading >
other > communication`` (so communication is *exposed* communication, as in ``gpu_time``),
the rest is ``idle``; the seven add up to the window. The **primary device** is the one with
the most busy time.

Ops: every top-level CPU op (outermost on its thread) of the steady steps, grouped by phase,
module (innermost ``nn.Module`` frame, else innermost user annotation) and op name, with the
most frequent input shapes (and the number of distinct ones), CPU time and the GPU time /
count of everything launched inside (kernels, copies, memsets) with its top kernel.

forward/backward ratio = backward time / forward time over the steady steps (GPU: primary
device; CPU: the CPU phases). A plain training step is around 2.

Annotated phases (``annotated``)
--------------------------------
User ``record_function`` ranges named like model parts (:data:`ANNOTATION_PHASE_RE`: ``attn``,
``attention``, ``mlp``, ``ffn``, ``moe``, ``experts``, ``dispatch``, ``combine``, ``router``,
``embed``, ``norm``, ``lm_head``, ``encoder``, ``decoder``, ``sampler``, ``all_to_all`` …; not
the ranges the six phases above already read) become phases of their own, next to the six
(never replacing them: the ids above are what the diagnosis and rules rely on). A phase is
the range's name with digit runs replaced by ``N`` (``layer_3.attn`` → ``layer_N.attn``, so
every layer's ``attn`` is one phase). CPU: per step the union of that phase's ranges. GPU
(primary device): each activity belongs to the innermost such range around its launch call
(same thread), per step the union of its activities. Per steady step means, with the share of
the step window; overlaps between streams and nested ranges of different names are counted in
each, so the shares need not add up. Where the six phases leave the time in ``other`` (or in one
phase: inference is all forward), these say where it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
from polars.expr.whenthen import ChainedThen, Then

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._copysync import containing, runtime_by_correlation
from traceanalyzer.analyses._gputime import CPU_COMM_RE, exclusive_breakdown
from traceanalyzer.analyses._intervals import (
    DATALOADER_RE,
    FOREACH_PREFIX,
    FUSED_OPTIMIZER_RE,
    OPTIMIZER_STEP_RE,
    OPTIMIZER_ZERO_RE,
    gpu_activity_classes,
    ms,
    window_union_lengths,
)
from traceanalyzer.analyses._kernels import normalize_kernel_names, on_distinct
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._phases import PHASES, USER_DATA_RE
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import (
    TraceTables,
    annotation_index,
    by_id,
    deepest_at,
    join_unique,
    op_index,
    op_top_level,
)
from traceanalyzer.timeutil import group_codes, merge_intervals
from traceanalyzer.units import device_name

#: CPU precedence (first wins); ``other`` is the rest.
CPU_PRECEDENCE: tuple[str, ...] = ("data_loading", "communication", "optimizer", "backward", "forward")
#: GPU precedence per device; ``idle`` is the rest.
GPU_PRECEDENCE: tuple[str, ...] = ("forward", "backward", "optimizer", "data_loading", "other", "communication")

BACKWARD_OP_RE = r"Backward\d*$|^autograd::engine::evaluate_function|AccumulateGrad|^torch::autograd::"
OPTIMIZER_OP_RE = f"{OPTIMIZER_STEP_RE}|{OPTIMIZER_ZERO_RE}|{FUSED_OPTIMIZER_RE}|^{FOREACH_PREFIX}"
USER_BACKWARD_RE = r"(?i)backward"
USER_FORWARD_RE = r"(?i)forward"
USER_OPTIMIZER_RE = r"(?i)optimi[sz]er|zero_grad"
MODULE_FRAME_PREFIX = "nn.Module:"
#: User ranges named like model parts: they become annotated phases.
ANNOTATION_PHASE_RE = (
    r"(?i)(^|[^a-z])(attn|attention|self_attn|cross_attn|mlp|ffn|feed_?forward|moe|experts?|shared_experts?|"
    r"dispatch|combine|router|routing|gate|gating|embed|embedding|embeddings|lm_head|head|norm|layernorm|rmsnorm|"
    r"encoder|decoder|rope|rotary|sampler|sampling|logits|all_?to_?all|a2a|kv_cache|qkv|proj|o_proj)([^a-z]|$)"
)

_IV = {"pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64}


def _iv(df: pl.DataFrame) -> pl.DataFrame:
    if df.is_empty():
        return pl.DataFrame(schema=_IV)
    return df.select([pl.col(c).cast(t) for c, t in _IV.items()]).filter(pl.col("end_ns") >= pl.col("ts_ns"))


@dataclass(frozen=True)
class PhaseContext:
    """Interval sets per phase (``pid, tid, ts_ns, end_ns``) and per-window backward starts."""

    intervals: dict[str, pl.DataFrame]
    bwd_start: pl.DataFrame  # window, bwd_start_ns
    windows: pl.DataFrame
    sources: dict[str, int]
    #: per CPU phase, the union of its intervals per (pid, tid) (merge_intervals), for classify
    merged: dict[str, pl.DataFrame] = field(default_factory=dict)

    def classify(self, points: pl.DataFrame, t_col: str = "t") -> pl.Series:
        """Phase of each point (``pid, tid, t_col``), aligned with ``points``."""
        n = points.height
        if n == 0:
            return pl.Series("phase", [], dtype=pl.String)
        p = points.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
                          pl.col(t_col).cast(pl.Int64).alias("t"))
        # Point t is in a phase when the last merged interval of its thread starting at or
        # before t ends after t (the unions are disjoint).
        unions = {name: self.merged[name] if name in self.merged else _merge_phase(self.intervals[name])
                  for name in CPU_PRECEDENCE}
        flags = _phase_flags(p, unions)
        if flags is None:  # a null thread or time: one as-of join per phase
            s = p.with_row_index("_r").sort("t")
            for name, merged in unions.items():
                if merged.is_empty():
                    s = s.with_columns(pl.lit(False).alias(name))
                    continue
                s = s.join_asof(
                    merged.select("pid", "tid", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e")),
                    left_on="t", right_on="_s", by=["pid", "tid"], strategy="backward", check_sortedness=False,
                ).with_columns((pl.col("t") < pl.col("_e")).fill_null(False).alias(name)).drop("_s", "_e")
            flags = s.sort("_r").select(list(CPU_PRECEDENCE))
        w = assign_steps(p, self.windows, "t").join(self.bwd_start, on="window", how="left", maintain_order="left")
        chain: Then | ChainedThen = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
        for name in CPU_PRECEDENCE:
            chain = chain.when(pl.col(name)).then(pl.lit(name))
        expr = (
            chain.when(pl.col("_t").is_null())
            .then(pl.lit("other"))
            .when(pl.col("_b").is_null() | (pl.col("_t") < pl.col("_b")))
            .then(pl.lit("forward"))
            .otherwise(pl.lit("other"))
        )
        frame = flags.with_columns(_t=w["t"], _b=w["bwd_start_ns"], _pid=w["pid"])
        out = frame.select(
            pl.when(pl.col("_pid").is_null()).then(pl.lit("other")).otherwise(expr).alias("phase")
        )["phase"]
        return out


def phase_context(t: TraceTables, windows: pl.DataFrame) -> PhaseContext:
    """Collect the phase evidence of ``model`` (see the module docstring)."""
    model = t.model
    ann = model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#"))
    # Only these columns are read: selected first (no copy), every filter below copies
    # five columns instead of the op table's dozen.
    cols = ["name", "pid", "tid", "ts_ns", "end_ns"]
    ops = model.cpu_ops.select(cols)
    ann_iv = ann.select(cols)

    def cpu_named(pattern: str) -> pl.DataFrame:
        """The ops, then the annotations, whose name ``pattern`` matches. The regex runs once
        per distinct name of the model's tables (found once per table and pattern, and shared
        with the other analyses that test them): ``ops`` and ``ann_iv`` hold rows of those
        tables, so membership in their matching names is the regex test."""
        return pl.concat([ops.filter(contains_by_name(model.cpu_ops, pattern)),
                          ann_iv.filter(contains_by_name(model.annotations, pattern))])

    dl = cpu_named(DATALOADER_RE)
    dl_user = ann.filter(pl.col("name").str.contains(USER_DATA_RE) & ~pl.col("name").str.contains(DATALOADER_RE))
    comm = cpu_named(CPU_COMM_RE)
    opt = pl.concat([
        cpu_named(OPTIMIZER_OP_RE),
        ann.filter(pl.col("name").str.contains(USER_OPTIMIZER_RE)).select(cols),
    ])
    bwd_ops = ops.filter(contains_by_name(model.cpu_ops, BACKWARD_OP_RE))
    # Autograd engine threads: named so, or a non-step thread that runs backward ops.
    step_threads = model.steps.select("pid", "tid").unique()
    if step_threads.is_empty() and ops.height:
        step_threads = ops.sort("ts_ns").head(1).select("pid", "tid")
    named = model.threads.filter(pl.col("name").str.contains("(?i)autograd")).select("pid", "tid")
    with_bwd = bwd_ops.select("pid", "tid").unique().join(step_threads, on=["pid", "tid"], how="anti")
    bwd_threads = pl.concat([named, with_bwd]).unique()
    # The rows of those threads' tids first (a one-column test), then the exact (pid, tid)
    # semi join on them: a two-key join over every op row-encodes both keys of each.
    on_bwd_threads = ops.filter(pl.col("tid").is_in(bwd_threads["tid"].implode())).join(
        bwd_threads, on=["pid", "tid"], how="semi")
    # fwdbwd flow ends: the deepest op covering the flow's end point is a backward op.
    fends = model.flows.filter((pl.col("kind") == "fwdbwd") & (pl.col("ph") == "f")).select("pid", "tid", "ts_ns")
    flow_ops = pl.DataFrame(schema=_IV)
    if fends.height and ops.height:
        ivs = ops.select("pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        ids = op_index(t).lookup(fends)
        flow_ops = ivs.join(pl.DataFrame({"id": ids}).drop_nulls().unique(), on="id", how="semi").drop("id")
    bwd_user = ann.filter(pl.col("name").str.contains(USER_BACKWARD_RE))
    bwd = pl.concat([_iv(bwd_ops), _iv(on_bwd_threads), _iv(flow_ops), _iv(bwd_user)])
    mod_frames = model.python_frames.filter(pl.col("name").str.starts_with(MODULE_FRAME_PREFIX))
    fwd_user = ann.filter(pl.col("name").str.contains(USER_FORWARD_RE))
    fwd_explicit = pl.concat([_iv(fwd_user), _iv(mod_frames)])

    bw = assign_steps(bwd.select("ts_ns"), windows, "ts_ns").filter(pl.col("window").is_not_null())
    bwd_start = bw.group_by("window").agg(bwd_start_ns=pl.col("ts_ns").min())
    # Every other op before the step's first backward op is forward work.
    o = assign_steps(_iv(ops), windows, "ts_ns").join(bwd_start, on="window", how="left")
    fwd_implicit = o.filter(pl.col("bwd_start_ns").is_null() | (pl.col("ts_ns") < pl.col("bwd_start_ns"))).with_columns(
        end_ns=pl.when(pl.col("bwd_start_ns").is_null()).then(pl.col("end_ns"))
        .otherwise(pl.min_horizontal("end_ns", "bwd_start_ns"))
    )
    intervals = {
        "data_loading": pl.concat([_iv(dl), _iv(dl_user)]),
        "communication": _iv(comm),
        "optimizer": _iv(opt),
        "backward": bwd,
        "forward": pl.concat([fwd_explicit, _iv(fwd_implicit)]),
    }
    sources = {
        "dataloader_ranges": dl.height,
        "user_data_ranges": dl_user.height,
        "collective_cpu_ops": comm.height,
        "optimizer_ranges": opt.height,
        "backward_ops": bwd_ops.height,
        "autograd_threads": bwd_threads.height,
        "fwdbwd_flow_ops": flow_ops.height,
        "user_backward_ranges": bwd_user.height,
        "user_forward_ranges": fwd_user.height,
        "module_frames": mod_frames.height,
    }
    merged = {name: _merge_phase(intervals[name]) for name in CPU_PRECEDENCE}
    return PhaseContext(intervals, bwd_start, windows.select("window", "step", "start_ns", "end_ns"), sources, merged)


def _phase_flags(p: pl.DataFrame, unions: dict[str, pl.DataFrame]) -> pl.DataFrame | None:
    """One boolean column per phase of ``unions`` (disjoint intervals per thread: ``pid,
    tid, start_ns, end_ns``): whether each point of ``p`` (``pid, tid, t``, Int64) lies in
    that phase's union on its thread. By numpy binary search: the threads of the points and
    of every union numbered together (:func:`group_codes`), each union start and each point
    keyed ``thread · span + (t − t_min)``, the last start at or before each point found by
    one ``searchsorted`` per phase (no sort of the points, no as-of join). None where a
    thread or time is null or the key would overflow (the caller joins)."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    if p["t"].null_count():
        return None
    by = ["pid", "tid"]
    threads = [p.select(by), *[u.select(by).cast({c: pl.Int64 for c in by}) for u in unions.values()]]
    coded = group_codes(pl.concat(threads), by)
    if coded is None:
        return None
    codes, n_groups = coded
    t = p["t"].to_numpy()
    starts = [u["start_ns"].to_numpy() for u in unions.values()]
    ends = [u["end_ns"].to_numpy() for u in unions.values()]
    lo = min([int(t.min()), *[int(s.min()) for s in starts if s.shape[0]]])
    hi = max([int(t.max()), *[int(e.max()) for e in ends if e.shape[0]]])
    span = hi - lo + 1
    if n_groups * span >= 2**62:
        return None
    n = p.height
    g_p = codes[:n]
    key_p = g_p * span + (t - lo)
    flags, at = {}, n
    for name, start, end in zip(unions, starts, ends):
        g_m = codes[at:at + start.shape[0]]
        at += start.shape[0]
        key_m = g_m * span + (start - lo)
        if not bool(np.all(key_m[1:] >= key_m[:-1])):
            order = np.argsort(key_m, kind="stable")
            key_m, g_m, end = key_m[order], g_m[order], end[order]
        pos = np.searchsorted(key_m, key_p, side="right") - 1
        j = np.clip(pos, 0, None)
        flags[name] = (pos >= 0) & (g_m[j] == g_p) & (t < end[j]) if start.shape[0] else np.zeros(n, dtype=bool)
    return pl.DataFrame(flags)


def _merge_phase(iv: pl.DataFrame) -> pl.DataFrame:
    return merge_intervals(iv.filter(pl.col("end_ns") > pl.col("ts_ns")), by=["pid", "tid"])


@dataclass(frozen=True)
class PhasesResult:
    """Per-step phase times on the CPU and per device on the GPU, and ops per phase."""

    cpu: pl.DataFrame  # window, step, <phase>_ns …, total_ns
    gpu: pl.DataFrame  # window, step, device, <phase>_ns …, idle_ns, total_ns
    primary_device: int | None
    cpu_mean: dict[str, float]  # steady mean per step, ns
    gpu_mean: dict[str, float]  # primary device, steady mean per step, ns
    fwd_bwd_ratio_cpu: float | None
    fwd_bwd_ratio_gpu: float | None
    ops: pl.DataFrame
    n_steady: int
    sources: dict[str, int]
    top_n: int = 15
    thresholds: dict[str, Any] = field(default_factory=dict)
    #: phase, n_ranges, cpu_ns_per_step, cpu_pct_of_step, gpu_ns_per_step, gpu_pct_of_step (primary device)
    annotated: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The trace's vendor (``TraceMeta.vendor``): how its devices are named in text (not in to_json).
    vendor: str = "unknown"

    def annotated_line(self, resource: str = "gpu", n: int = 6) -> str:
        """The annotated phases as "attn 40.1 %, mlp 30.2 %" (% of the step window), largest first."""
        if self.annotated.is_empty():
            return ""
        col = f"{resource}_pct_of_step"
        rows = self.annotated.filter(pl.col(col) > 0).sort([col, "phase"], descending=[True, False]).head(n)
        return ", ".join(f"{r['phase']} {r[col]:.1f} %" for r in rows.iter_rows(named=True))

    def to_json(self) -> dict[str, Any]:
        return {
            "primary_device": self.primary_device,
            "n_steady_steps": self.n_steady,
            "cpu_mean_ns": self.cpu_mean,
            "gpu_mean_ns": self.gpu_mean,
            "fwd_bwd_ratio_cpu": self.fwd_bwd_ratio_cpu,
            "fwd_bwd_ratio_gpu": self.fwd_bwd_ratio_gpu,
            "cpu": self.cpu.to_dicts(),
            "gpu": self.gpu.to_dicts(),
            "ops": self.ops.sort("phase", maintain_order=True).group_by("phase", maintain_order=True).head(50)
            .to_dicts(),
            "n_op_groups": self.ops.height,
            "sources": self.sources,
            "annotated_phases": self.annotated.to_dicts() if self.annotated.height else [],
        }

    def dominant(self, resource: str = "gpu", exclude: tuple[str, ...] = ("other",)) -> str | None:
        """The phase with the most steady time on ``resource`` (``other`` only if nothing else)."""
        means = self.gpu_mean if resource == "gpu" else self.cpu_mean
        cand = {p: means.get(f"{p}_ns", 0.0) for p in PHASES}
        best = sorted(((v, p) for p, v in cand.items() if p not in exclude and v > 0), reverse=True)
        if best:
            return best[0][1]
        rest = sorted(((v, p) for p, v in cand.items() if v > 0), reverse=True)
        return rest[0][1] if rest else None

    def line(self, resource: str) -> str:
        means = self.gpu_mean if resource == "gpu" else self.cpu_mean
        total = means.get("total_ns") or 0.0
        if not total:
            return "n/a"
        keys = [*PHASES, "idle"] if resource == "gpu" else list(PHASES)
        parts = [f"{p.replace('_', ' ')} {100 * means.get(f'{p}_ns', 0.0) / total:.1f} %" for p in keys
                 if means.get(f"{p}_ns", 0.0) > 0]
        return ", ".join(parts) + f" of {ms(total)}"

    def summary(self) -> list[tuple[str, str]]:
        out = []
        if self.gpu_mean:
            out.append((f"{device_name(self.primary_device, self.vendor)} per step", self.line("gpu")))
        if self.cpu_mean:
            out.append(("CPU per step", self.line("cpu")))
        ratios = []
        if self.fwd_bwd_ratio_gpu is not None:
            ratios.append(f"{self.fwd_bwd_ratio_gpu:.2f}× on the GPU")
        if self.fwd_bwd_ratio_cpu is not None:
            ratios.append(f"{self.fwd_bwd_ratio_cpu:.2f}× on the CPU")
        out.append(("Backward / forward", ", ".join(ratios) if ratios else "n/a (no forward or no backward found)"))
        for res in ("gpu", "cpu"):
            line = self.annotated_line(res)
            if line:
                out.append((f"Annotated phases ({res.upper()}, % of the step)", line))
        used = [k.replace("_", " ") for k, v in self.sources.items() if v]
        out.append(("Phase evidence", ", ".join(used) if used else "none: every op counts as forward"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {}
        if self.gpu.height:
            out["GPU time per phase and step"] = self.gpu
        out["CPU time per phase and step"] = self.cpu
        if self.annotated.height:
            out["Annotated phases (record_function)"] = self.annotated
        if self.ops.height:
            out["Top ops per phase"] = (
                self.ops.sort(["phase", "gpu_ns", "cpu_ns"], descending=[False, True, True], maintain_order=True)
                .group_by("phase", maintain_order=True)
                .head(self.top_n)
            )
        return out


def _annotated(model: TraceModel, windows: pl.DataFrame, steady: list[int], act: pl.DataFrame,
               primary: int | None, cpu_total: float, gpu_total: float) -> pl.DataFrame:
    """Annotated phases (see the module docstring), steady-step means."""
    schema = {"phase": pl.String, "n_ranges": pl.Int64, "cpu_ns_per_step": pl.Float64, "cpu_pct_of_step": pl.Float64,
              "gpu_ns_per_step": pl.Float64, "gpu_pct_of_step": pl.Float64}
    ann = model.annotations
    if ann.is_empty() or not steady:
        return pl.DataFrame(schema=schema)
    taken = f"{DATALOADER_RE}|{USER_DATA_RE}|{USER_BACKWARD_RE}|{USER_FORWARD_RE}|{USER_OPTIMIZER_RE}|{CPU_COMM_RE}"
    rng = ann.filter(pl.col("name").str.contains(ANNOTATION_PHASE_RE) & ~pl.col("name").str.contains(taken)
                     & ~pl.col("name").str.starts_with("ProfilerStep#"))
    if rng.is_empty():
        return pl.DataFrame(schema=schema)
    rng = rng.select("pid", "tid", "ts_ns", "end_ns",
                     pl.col("name").str.replace_all(r"\d+", "N").str.strip_chars().alias("phase"))
    w = windows.filter(pl.col("window").is_in(steady)).select("window", "start_ns", "end_ns")
    n = len(steady)
    cpu = window_union_lengths(rng, w, ["phase"]).group_by("phase").agg(cpu_ns=pl.col("length_ns").sum())
    counts = assign_steps(rng.select("phase", "ts_ns"), windows, "ts_ns").filter(
        pl.col("window").is_in(steady)).group_by("phase").agg(n_ranges=pl.len().cast(pl.Int64))
    out = counts.join(cpu, on="phase", how="left")
    if primary is not None and act.height:
        g = act.filter((pl.col("device") == primary) & pl.col("api_ts_ns").is_not_null())
        if g.height:
            iv = rng.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
            ids = deepest_at(iv.select("id", "pid", "tid", "ts_ns", "end_ns"),
                             g.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "api_ts_ns"),
                             point_col="api_ts_ns")
            g = g.with_columns(phase=by_id(ids, iv["id"], iv["phase"])).filter(pl.col("phase").is_not_null())
            gl = window_union_lengths(g.select("phase", "ts_ns", "end_ns"), w, ["phase"]).group_by("phase").agg(
                gpu_ns=pl.col("length_ns").sum())
            out = out.join(gl, on="phase", how="left")
    if "gpu_ns" not in out.columns:
        out = out.with_columns(gpu_ns=pl.lit(None, pl.Int64))
    return (
        out.with_columns(
            cpu_ns_per_step=(pl.col("cpu_ns").fill_null(0) / n).round(1),
            gpu_ns_per_step=(pl.col("gpu_ns").fill_null(0) / n).round(1),
        ).with_columns(
            cpu_pct_of_step=(pl.col("cpu_ns_per_step") * 100.0 / cpu_total).round(2) if cpu_total else pl.lit(0.0),
            gpu_pct_of_step=(pl.col("gpu_ns_per_step") * 100.0 / gpu_total).round(2) if gpu_total else pl.lit(0.0),
        )
        .select(list(schema))
        .sort(["gpu_ns_per_step", "cpu_ns_per_step", "phase"], descending=[True, True, False])
    )


def _ratio(means: dict[str, float]) -> float | None:
    f, b = means.get("forward_ns", 0.0), means.get("backward_ns", 0.0)
    return round(b / f, 3) if f > 0 and b > 0 else None


def _means(df: pl.DataFrame, steady: list[int], cols: list[str]) -> dict[str, float]:
    s = df.filter(pl.col("window").is_in(steady))
    if s.is_empty():
        return {}
    return {c: round(float(s[c].mean()), 1) for c in cols}  # type: ignore[arg-type]


def _ops_table(t: TraceTables, ctx: PhaseContext, steady: list[int], act: pl.DataFrame) -> pl.DataFrame:
    """Top-level CPU ops of the steady windows with phase, module, shapes, CPU and GPU time."""
    model = t.model
    schema = {"phase": pl.String, "module": pl.String, "name": pl.String, "input_dims": pl.String,
              "n_shapes": pl.Int64, "calls": pl.Int64, "calls_per_step": pl.Float64, "cpu_ns": pl.Int64,
              "gpu_ns": pl.Int64,
              "gpu_ns_per_step": pl.Float64, "kernels": pl.Int64, "mean_gpu_ns": pl.Float64,
              "top_kernel": pl.String}
    ops = model.cpu_ops
    if ops.is_empty() or not steady:
        return pl.DataFrame(schema=schema)
    iv = ops.select(
        "name", "pid", "tid", "ts_ns", "end_ns", "dur_ns", "input_dims").with_row_index("op_id").with_columns(
        pl.col("op_id").cast(pl.Int64)
    )
    top = iv.filter(op_top_level(t))  # aligned with model.cpu_ops, as iv
    top = assign_steps(top, ctx.windows, "ts_ns").filter(pl.col("window").is_in(steady))
    if top.is_empty():
        return pl.DataFrame(schema=schema)
    top = top.with_columns(phase=ctx.classify(top.select("pid", "tid", pl.col("ts_ns").alias("t"))))
    # Module: innermost nn.Module frame, else innermost user annotation, at the op's start.
    pts = top.select("pid", "tid", "ts_ns")
    mods = model.python_frames.filter(pl.col("name").str.starts_with(MODULE_FRAME_PREFIX)).select(
        "name", "pid", "tid", "ts_ns", "end_ns"
    ).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    mid = deepest_at(mods, pts) if mods.height else pl.Series("id", [None] * pts.height, dtype=pl.Int64)
    # The user annotations but ProfilerStep#, numbered and indexed once per model.
    anns, ann_index = annotation_index(t)
    aid = ann_index.lookup(pts)
    mod_names = mods["name"].str.replace(r"^nn\.Module:\s*", "")
    top = top.with_columns(
        module=pl.coalesce(pl.lit(by_id(mid, mods["id"], mod_names)), pl.lit(by_id(aid, anns["id"], anns["name"])))
    )
    # GPU work launched inside each top-level op (runtime call start inside the op, same thread).
    g = act.filter(pl.col("api_ts_ns").is_not_null()) if act.height else act
    if g.height:
        g = g.with_columns(
            op_id=containing(g.select("pid", "tid", "api_ts_ns"), top.select("pid", "tid", "ts_ns", "end_ns", "op_id"),
                             "api_ts_ns", "op_id")
        ).filter(pl.col("op_id").is_not_null())
    keys = ["phase", "module", "name"]
    g = g.join(top.select("op_id", *keys), on="op_id", how="inner") if g.height else g
    n = len(steady)
    agg = top.group_by(keys).agg(
        calls=pl.len().cast(pl.Int64),
        cpu_ns=pl.col("dur_ns").sum(),
        n_shapes=pl.col("input_dims").n_unique().cast(pl.Int64),
        # the most frequent input shapes (ties: the lexically first, for determinism)
        input_dims=pl.col("input_dims").drop_nulls().mode().sort().first(),
    )
    if g.height:
        kg = g.group_by(keys).agg(gpu_ns=pl.col("dur_ns").sum(), kernels=pl.len().cast(pl.Int64))
        topk = (
            on_distinct(g, ["gpu_name"], _k=normalize_kernel_names(pl.col("gpu_name")))
            .group_by([*keys, "_k"]).agg(_s=pl.col("dur_ns").sum())
            .sort(["_s", "_k"], descending=[True, False])
            .group_by(keys, maintain_order=True).first()
            .select(*keys, pl.col("_k").alias("top_kernel"))
        )
        agg = agg.join(kg, on=keys, how="left", nulls_equal=True).join(topk, on=keys, how="left", nulls_equal=True)
    else:
        agg = agg.with_columns(gpu_ns=pl.lit(None, pl.Int64), kernels=pl.lit(None, pl.Int64),
                               top_kernel=pl.lit(None, pl.String))
    return (
        agg.with_columns(pl.col("gpu_ns").fill_null(0), pl.col("kernels").fill_null(0))
        .with_columns(
            calls_per_step=(pl.col("calls") / n).round(2),
            gpu_ns_per_step=(pl.col("gpu_ns") / n).round(1),
            mean_gpu_ns=pl.when(pl.col("kernels") > 0).then((pl.col("gpu_ns") / pl.col("calls")).round(1)),
        )
        .select(list(schema))
        # (phase, module, name) is the group key: a total order, whatever order group_by returned.
        .sort(["phase", "gpu_ns", "cpu_ns", "name", "module"], descending=[False, True, True, False, False],
              nulls_last=True)
    )


@analysis(
    "phases", depends_on=("steps",), title="Phases", order=3,
    shared=("annotation_index", "gpu_activity", "gpu_activity_classes", "op_nesting", "op_top_level",
            "runtime_by_correlation", "comm_classes"),
    params={"top_ops": 15},
)
def phases(ctx: AnalysisContext[TraceModel]) -> PhasesResult:
    """Per-step time in data loading, forward, backward, optimizer, communication and other, CPU and GPU."""
    model = ctx.model
    top_n = ctx.params.top_ops
    sr = ctx.need("steps", StepsResult)
    windows = sr.windows()
    steady = sr.steady_windows()
    # The CPU op index is built here, the first analysis that may read it, while little else
    # is held: built later, next to idle_gaps' CPU tree, it raises the run's memory peak.
    op_index(ctx.tables)
    pc = phase_context(ctx.tables, windows)

    # Each phase's per-thread union (built for classify) covers exactly what its intervals
    # cover, in a fraction of the rows (nested ops merge).
    levels = [(p, pc.merged[p].select(pl.col("start_ns").alias("ts_ns"), "end_ns")) for p in CPU_PRECEDENCE]
    cpu = exclusive_breakdown(levels, windows, [], "other")
    cpu = cpu.join(windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("total_ns")),
                   on="window").select("window", "step", *[f"{p}_ns" for p in PHASES], "total_ns").sort("window")

    act = pl.DataFrame()
    gpu = pl.DataFrame()
    primary: int | None = None
    if model.has_gpu:
        # The columns read below, then the rows: a filter or a gather copies every column
        # it is given.
        a = gpu_activity_classes(ctx.tables).select(
            "name", "ts_ns", "dur_ns", "end_ns", "device", "correlation", "activity", "category"
        ).filter(pl.col("device").is_not_null())
        rt = runtime_by_correlation(ctx.tables).select("correlation", "api_ts_ns", "pid", "tid")
        a = join_unique(a, rt, "correlation")
        ph = pc.classify(a.select("pid", "tid", pl.col("api_ts_ns").alias("t")))
        # by distinct name of the shared table ``a`` was taken from (kernel names are long)
        htod = (pl.col("activity") == "memcpy") & contains_by_name(gpu_activity_classes(ctx.tables), r"HtoD|H2D|M2D")
        a = a.with_columns(phase=ph).with_columns(
            phase=pl.when(pl.col("category") == "communication").then(pl.lit("communication"))
            .when(htod & pl.col("phase").is_in(["forward", "other", "data_loading"])).then(pl.lit("data_loading"))
            .otherwise(pl.col("phase"))
        )
        act = a.rename({"name": "gpu_name"})
        a_iv = a.select("device", "ts_ns", "end_ns", "phase")
        glevels = [(p, a_iv.filter(pl.col("phase") == p).drop("phase")) for p in GPU_PRECEDENCE]
        del a_iv
        gpu = exclusive_breakdown(glevels, windows, ["device"], "idle")
        gpu = gpu.join(windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("total_ns")),
                       on="window").select("window", "step", "device", *[f"{p}_ns" for p in PHASES], "idle_ns",
                                           "total_ns").sort(["window", "device"])
        busy = gpu.group_by("device").agg(b=(pl.col("total_ns") - pl.col("idle_ns")).sum()).sort(
            ["b", "device"], descending=[True, False]
        )
        primary = int(busy["device"][0]) if busy.height else None

    cols = [f"{p}_ns" for p in PHASES]
    cpu_mean = _means(cpu, steady, [*cols, "total_ns"])
    gpu_mean = (
        _means(gpu.filter(pl.col("device") == primary), steady, [*cols, "idle_ns", "total_ns"])
        if primary is not None else {}
    )
    ops_act = act.select("gpu_name", "dur_ns", "pid", "tid", "api_ts_ns") if act.height else pl.DataFrame()
    ops = _ops_table(ctx.tables, pc, steady, ops_act)
    annotated = _annotated(model, windows, steady, act.rename({"gpu_name": "name"}) if act.height else act, primary,
                           float(cpu_mean.get("total_ns") or 0.0), float(gpu_mean.get("total_ns") or 0.0))
    return PhasesResult(
        cpu=cpu,
        gpu=gpu,
        primary_device=primary,
        cpu_mean=cpu_mean,
        gpu_mean=gpu_mean,
        fwd_bwd_ratio_cpu=_ratio(cpu_mean),
        fwd_bwd_ratio_gpu=_ratio(gpu_mean),
        ops=ops,
        n_steady=len(steady),
        sources=pc.sources,
        top_n=top_n,
        annotated=annotated,
        vendor=ctx.model.meta.vendor,
    )
