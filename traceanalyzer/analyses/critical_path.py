"""Critical path: per steady step, the chain of CPU ops, launches, kernels and syncs that sets
the step time, its breakdown by what bounds it, and what-ifs.

Definitions (``docs/critical_path.md`` has the long form)
---------------------------------------------------------
* The **graph** of a step (``_cpgraph``: HolisticTraceAnalysis' construction): start and end
  nodes of every CPU op, runtime call and GPU activity of the step window; CPU nesting and
  order per thread, launch → kernel (*launch delay* when the stream's queue was empty),
  stream order (*kernel-kernel delay* otherwise), sync edges from Kineto's ``cuda_sync``
  events (context, stream, event sync, stream wait event) or, without them, from the runtime
  call names; a blocking call's own span weighs nothing, the sync edge into its end explains
  it.
* The **critical path** is the longest path of that graph; its **length** (``path_ns``) is
  at most the step window. With ``critical_path.cpu_gaps`` (default true) the time between
  top-level ops of the step's thread (Python between ops), and before its first op, counts as
  CPU time on the path; HTA gives those edges no weight (``false`` reproduces it).
* **Bound by** (HTA's classes) each path edge: ``cpu_bound`` (CPU ops, runtime calls, gaps
  between ops), ``data_loading`` (CPU time inside a DataLoader range), ``gpu_compute_bound``
  (kernels, copies, memsets), ``gpu_communication_bound`` (communication kernels as every
  analysis counts them, ``_comm``), ``gpu_kernel_kernel_overhead`` (gaps between queued
  kernels of a stream), ``gpu_kernel_launch_overhead`` (launch call start → kernel start when
  the queue was empty). Shares are **% of the path** (summed over steady steps); per-step
  figures are means over steady steps.
* **What-if**: the path recomputed with the weights of one target divided by a factor
  (``critical_path.whatif_target`` / ``whatif_factor``; by default every kernel class on a
  path, ``cpu``, ``data_loading`` and ``launch_overhead`` at 2×). Estimated step = step −
  (path − new path): the time outside the path (slack) is assumed unchanged; step, saving and
  new step are medians over steady steps (``saved_pct_of_step``: % of the median step).
  ``path_moved_steps``: steady steps whose new longest path is not the old one. Targets: a
  kernel class (``gemm``, ``attention``, ``communication``, ``elementwise``, ``reduction``,
  ``other``, ``memcpy``, ``memset``), ``cpu`` (CPU ops, runtime calls and the gaps between them
  outside DataLoader ranges), ``data_loading`` (inside them), ``launch_overhead``, ``op:NAME``
  (the CPU time of op NAME, nested calls included), ``kernel:REGEX`` (kernels by name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._cpgraph import (
    BATCH_NODES,
    BOUND_CLASSES,
    DEPENDENCY,
    EDGE_TYPES,
    KERNEL_KERNEL,
    LAUNCH,
    CPGraph,
    LongestPath,
    build_graph,
    graph_batches,
    longest_path,
)
from traceanalyzer.analyses._intervals import ms
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, deepest_at

if TYPE_CHECKING:
    import numpy as np  # imported where it runs: importing the analyses stays free of numpy

#: Kernel classes a what-if may name (``_kernels.kernel_class``, communication from ``_comm``,
#: and the copy activities).
KERNEL_CLASSES = ("gemm", "attention", "communication", "reduction", "elementwise", "other", "memcpy", "memset")

_STEP_SCHEMA = {"window": pl.Int64, "step": pl.Int64, "step_ns": pl.Int64, "path_ns": pl.Int64,
                **{f"{c}_ns": pl.Int64 for c in BOUND_CLASSES}}
_WHATIF_SCHEMA = {"target": pl.String, "factor": pl.Float64, "step_ns": pl.Int64, "new_step_ns": pl.Int64,
                  "saved_ns": pl.Int64, "saved_pct_of_step": pl.Float64, "path_moved_steps": pl.Int64,
                  "path_overlap_pct": pl.Float64, "requested": pl.Boolean}


@dataclass(frozen=True)
class CriticalPathResult:
    """Critical path per steady step, its breakdown and what-ifs. See the module docstring."""

    per_step: pl.DataFrame  # _STEP_SCHEMA, one row per steady step
    breakdown: pl.DataFrame  # bound_by, ns_per_step, pct_of_path
    top_events: pl.DataFrame  # name, kind, bound_by, ns_per_step, pct_of_path, count
    whatif: pl.DataFrame  # _WHATIF_SCHEMA
    sync_source: str
    cpu_gaps: bool
    rounds: int
    converged: bool
    graph_nodes: int
    graph_cross_edges: int
    whatif_error: str | None = None  # why the requested what-if could not run

    def median_step(self) -> tuple[int, int]:
        """(step_ns, path_ns) medians over steady steps."""
        med = [self.per_step[c].median() for c in ("step_ns", "path_ns")]
        return (int(med[0]) if isinstance(med[0], int | float) else 0,
                int(med[1]) if isinstance(med[1], int | float) else 0)

    def to_json(self) -> dict[str, Any]:
        step_ns, path_ns = self.median_step()
        return {
            "steady_steps": self.per_step.height,
            "step_ns_median": step_ns,
            "path_ns_median": path_ns,
            "sync_source": self.sync_source,
            "cpu_gaps": self.cpu_gaps,
            "rounds": self.rounds,
            "converged": self.converged,
            "graph_nodes": self.graph_nodes,
            "graph_cross_edges": self.graph_cross_edges,
            "breakdown": self.breakdown.to_dicts(),
            "top_events": self.top_events.to_dicts(),
            "whatif": self.whatif.to_dicts(),
            "whatif_error": self.whatif_error,
            "per_step": self.per_step.to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        step_ns, path_ns = self.median_step()
        parts = [f"{r['bound_by']} {r['pct_of_path']:.1f} %" for r in self.breakdown.iter_rows(named=True)
                 if r["pct_of_path"] and r["pct_of_path"] >= 0.05]
        out = [("Critical path (steady step, median)",
                f"{ms(path_ns)} of a {ms(step_ns)} step; " + (", ".join(parts) + " of the path" if parts else
                                                             "empty"))]
        wi = self.whatif.filter(pl.col("saved_ns") > 0).sort("saved_ns", descending=True).head(3)
        if wi.height:
            out.append(("What-if (estimated step)", "; ".join(
                f"{r['target']} {r['factor']:g}× faster: −{ms(r['saved_ns'])} "
                f"({r['saved_pct_of_step']:.1f} % of step)" + (", path moves" if r["path_moved_steps"] else "")
                for r in wi.iter_rows(named=True))))
        if self.whatif_error:
            out.append(("What-if not run", self.whatif_error))
        if self.sync_source != "cuda_sync events":
            out.append(("Sync edges", f"from {self.sync_source} (the trace has no cuda_sync events: "
                                      "event and stream-wait dependencies are inferred)"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "Critical path by bound (% of path)": self.breakdown,
            "Events on the critical path": self.top_events,
            "What-if (estimated step time)": self.whatif,
        }


def _event_scale(g: CPGraph, target: str, model: TraceModel) -> tuple[np.ndarray, bool]:
    """Per event: whether ``target`` scales it; and whether it scales launch delays instead."""
    import numpy as np

    ev = g.events
    if target == "launch_overhead":
        return np.zeros(ev.height, dtype=bool), True
    if target in ("cpu", "data_loading"):
        # A CPU event's bound is cpu_bound (code 0) or data_loading (1); a kernel's is 2 or 3.
        return g.bound_code == (1 if target == "data_loading" else 0), False
    if target.startswith("kernel:"):
        rx = target[len("kernel:"):]
        try:
            hit = ev.select((pl.col("klass") != "cpu") & pl.col("name").str.contains(rx).fill_null(False))
        except pl.exceptions.ComputeError as err:
            raise _BadTarget(f"{target!r}: bad regular expression ({str(err).splitlines()[0]})") from err
        return hit.to_series().to_numpy(), False
    if target.startswith("op:"):
        name = target[len("op:"):]
        ops = model.cpu_ops.filter((pl.col("name") == name) & (pl.col("end_ns") > pl.col("ts_ns"))).select(
            "pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        cpu = ev.filter(pl.col("klass") == "cpu")
        inside = np.zeros(ev.height, dtype=bool)
        if ops.height and cpu.height:
            # An event inside the op: its start is covered by one (nested ops share the thread).
            got = deepest_at(ops, cpu.select("pid", "tid", "ts_ns")).is_not_null().to_numpy()
            inside[cpu["event"].to_numpy()] = got
        return inside, False
    if target not in KERNEL_CLASSES:
        raise _BadTarget(f"unknown target {target!r} (a kernel class: {', '.join(KERNEL_CLASSES)}; cpu, "
                         "data_loading, launch_overhead, op:NAME or kernel:REGEX)")
    codes, code_of = g.klass_codes
    return codes == code_of.get(target, -1), False


class _BadTarget(ValueError):
    """A ``critical_path.whatif_target`` that names nothing: reported, the other what-ifs kept."""


@dataclass(frozen=True)
class _WhatifPart:
    """One what-if on one batch of windows: whether its target has an edge on a path there,
    and per window (in window order) the path saved and the overlap of the new path with the
    old (% of the new path's nodes); ``moved``: windows whose path changed."""

    touched: bool
    saved: list[int]
    overlap: list[float]
    moved: int


def _whatif(g: CPGraph, base: LongestPath, target: str, factor: float, model: TraceModel,
            node_win: np.ndarray) -> _WhatifPart:
    """``target``'s edges ``factor``× lighter, the longest paths of ``g`` recomputed.
    ``node_win``: each node's window as an index into the sorted windows of ``base``."""
    import numpy as np

    scaled, launch = _event_scale(g, target, model)
    lw, xw = g.link_w, g.x_w

    def lighter(w: np.ndarray, hit: np.ndarray) -> np.ndarray:
        out = w.copy()
        out[hit] = np.floor(w[hit] / factor)
        return out

    # Weights only shrink: a target with no edge on any path leaves every path as it is (the
    # lighter weights are made only for a target that has one).
    if launch:
        x_hit = g.x_type == LAUNCH
        if not x_hit[base.path_x].any():
            return _untouched(len(base.window_len))
        xw = lighter(g.x_w, x_hit)
    else:
        # Event -1 (a link of no event) reads the False appended at the end.
        scaled = np.append(scaled, False)
        cpu = target in ("cpu", "data_loading")  # the time between a thread's ops is CPU time too

        op_event, dep = g.link_codes

        def link_hit(at: np.ndarray | slice) -> np.ndarray:
            hit: np.ndarray = scaled[op_event[at]]
            if cpu:
                hit |= dep[at] == (2 if target == "data_loading" else 1)
            return hit

        # (Whether a path is hit, from the path's links alone: most targets miss.)
        touched = bool(link_hit(base.path_links).any())
        # Hand-offs between threads: CPU time of the step's thread.
        x_hit = g.x_type == DEPENDENCY if target == "cpu" else None
        if x_hit is not None:
            touched |= bool(x_hit[base.path_x].any())
        if not touched:
            return _untouched(len(base.window_len))
        hit = link_hit(slice(None))
        lw = lighter(g.link_w, hit)
        del hit
        if x_hit is not None:
            xw = lighter(g.x_w, x_hit)
    new = longest_path(g, lw, xw)
    del lw, xw
    saved = [base.window_len[w] - new.window_len.get(w, 0) for w in base.window_len]
    # Per window: nodes whose membership changed, nodes on both paths, nodes on the new one.
    n_win = len(base.window_len)
    moved = int(np.unique(node_win[base.on_path != new.on_path]).size)
    both = np.bincount(node_win[base.on_path & new.on_path], minlength=n_win)
    on_new = np.bincount(node_win[new.on_path], minlength=n_win)
    overlap = (100.0 * both / np.maximum(on_new, 1)).tolist()
    return _WhatifPart(True, saved, overlap, moved)


def _untouched(n_win: int) -> _WhatifPart:
    """A what-if that changes no weight on a path of ``n_win`` windows: every path stays."""
    return _WhatifPart(False, [0] * n_win, [100.0] * n_win, 0)


def _whatif_row(target: str, factor: float, steps: list[int], parts: list[_WhatifPart],
                order: np.ndarray) -> dict[str, Any]:
    """One what-if row from its batches' parts. Step, saving and new step are medians over
    the steady steps (``steps``: their durations; the step every report cites);
    ``path_overlap_pct``: mean over steps of the windows' overlaps (``order``: the windows'
    order by number, in which they are averaged)."""
    import numpy as np

    step_med = float(np.median(steps)) if steps else 0.0
    if not any(p.touched for p in parts):
        return {"target": target, "factor": factor, "step_ns": round(step_med), "new_step_ns": round(step_med),
                "saved_ns": 0, "saved_pct_of_step": 0.0, "path_moved_steps": 0, "path_overlap_pct": 100.0}
    saved = [v for p in parts for v in p.saved]
    overlap = np.asarray([v for p in parts for v in p.overlap], dtype=np.float64)[order]
    saved_med = float(np.median(saved)) if saved else 0.0
    return {"target": target, "factor": factor, "step_ns": round(step_med),
            "new_step_ns": round(step_med - saved_med), "saved_ns": round(saved_med),
            "saved_pct_of_step": 100.0 * saved_med / step_med if step_med else 0.0,
            "path_moved_steps": sum(p.moved for p in parts),
            "path_overlap_pct": float(np.mean(overlap)) if overlap.size else 100.0}


_BOUND_NAMES = (*BOUND_CLASSES, "")  # bound codes: index here (the last, none: a sync edge)


@dataclass(frozen=True)
class _PathEdges:
    """Every edge on a path (chain links, then cross edges) as parallel arrays: window, edge
    type (``EDGE_TYPES`` index), bound class (``_BOUND_NAMES`` index), weight, event (-1: none)."""

    window: np.ndarray
    type: np.ndarray
    bound: np.ndarray
    weight_ns: np.ndarray
    event: np.ndarray


def _path_edges(g: CPGraph, lp: LongestPath) -> _PathEdges:
    import numpy as np

    code = {c: i for i, c in enumerate(_BOUND_NAMES)}
    bound = g.bound_code
    li = lp.path_links
    l_ev = g.link_event[li]
    l_type = g.link_type[li]
    l_bound = np.where(l_type == KERNEL_KERNEL, code["gpu_kernel_kernel_overhead"],
                       np.where(l_type == DEPENDENCY, np.where(g.link_dl[li], code["data_loading"], code["cpu_bound"]),
                                np.where(l_ev >= 0, bound[np.maximum(l_ev, 0)], code["cpu_bound"])))
    xi = lp.path_x
    x_type = g.x_type[xi]
    x_bound = np.where(x_type == LAUNCH, code["gpu_kernel_launch_overhead"],
                       np.where(x_type == DEPENDENCY, code["cpu_bound"], code[""]))
    return _PathEdges(
        window=np.concatenate([g.node_window[li], g.node_window[g.x_dst[xi]]]),
        type=np.concatenate([l_type, x_type]), bound=np.concatenate([l_bound, x_bound]),
        weight_ns=np.concatenate([g.link_w[li], g.x_w[xi]]), event=np.concatenate([l_ev, g.x_event[xi]]))


def path_tables(g: CPGraph, lp: LongestPath) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(critical_events, path_edges)``: the events on a path (``kind, name, pid, tid, device,
    stream, ts_ns, end_ns, klass, bound``) and every path edge (``window, type, bound_by,
    weight_ns, event, name, kind``). The analysis keeps neither (its result holds what the
    reports read); they show a path in full (tests, investigations)."""
    import numpy as np

    ev = g.events
    pe = _path_edges(g, lp)
    edges = pl.DataFrame({"window": pe.window, "type": pe.type, "bound_by": pe.bound, "weight_ns": pe.weight_ns,
                          "event": pe.event},
                         schema={"window": pl.Int64, "type": pl.Int64, "bound_by": pl.Int64, "weight_ns": pl.Int64,
                                 "event": pl.Int64}).with_columns(
        pl.col("type").replace_strict(list(range(len(EDGE_TYPES))), list(EDGE_TYPES), return_dtype=pl.String),
        pl.col("bound_by").replace_strict(list(range(len(_BOUND_NAMES))), list(_BOUND_NAMES),
                                          return_dtype=pl.String))
    # Events are numbered by row: their name and kind by position (null for no event).
    at = edges["event"]
    edges = edges.with_columns(
        name=pl.when(at >= 0).then(ev["name"].gather(at.clip(lower_bound=0))),
        kind=pl.when(at >= 0).then(ev["kind"].gather(at.clip(lower_bound=0))))
    on = np.zeros(ev.height, dtype=bool)
    on[g.node_event[lp.on_path]] = True
    return ev.filter(pl.Series(on)).drop("event"), edges


def graph_and_path(tables: TraceTables, steps: StepsResult, cpu_gaps: bool) -> tuple[CPGraph, LongestPath]:
    """The graph of the steady steps and its longest paths (NotApplicable: no graph)."""
    g = build_graph(tables, steps.windows(), steps.steady_windows(), cpu_gaps)
    if g.n_nodes == 0:
        raise NotApplicable("no CPU op or runtime call of positive length in a steady step")
    return g, longest_path(g)


@analysis(
    "critical_path", depends_on=("steps",), title="Critical path", order=85,
    shared=("gpu_activity", "launches", "comm_classes", "op_nesting"),
    params={"cpu_gaps": True, "whatif_target": "", "whatif_factor": 2.0, "top_n": 15}, heavy=True, wide=True,
)
def critical_path(ctx: AnalysisContext[TraceModel]) -> CriticalPathResult:
    """Per steady step, the longest dependency chain through CPU ops, launches, kernels and
    syncs; its breakdown by bound (HTA's classes), top events and what-ifs."""
    import numpy as np

    model = ctx.model
    steps = ctx.need("steps", StepsResult)
    factor = float(ctx.params.whatif_factor)
    if not factor > 0:
        raise NotApplicable("critical_path.whatif_factor must be > 0")
    if model.cpu_ops.is_empty() and model.runtime.is_empty():
        raise NotApplicable("no CPU ops or runtime calls: the critical path needs the CPU side of the trace")
    step_of = dict(zip(steps.table["window"].to_list(), steps.table["dur_ns"].to_list(), strict=True))
    step_label = dict(zip(steps.table["window"].to_list(), steps.table["step"].to_list(), strict=True))
    target = str(ctx.params.whatif_target).strip()

    # The windows share no edge: their graphs are built, solved and summarised a batch at a
    # time (the memory follows the largest batch), and the batches' parts combined exactly
    # (sums, and medians and means over every window's values).
    parts = [_batch_part(g, model, target, factor, step_of, step_label)
             for g in graph_batches(ctx.tables, steps.windows(), steps.steady_windows(), bool(ctx.params.cpu_gaps),
                                    BATCH_NODES) if g.n_nodes]
    if not parts:
        raise NotApplicable("no CPU op or runtime call of positive length in a steady step")
    rows = sorted((r for p in parts for r in p.rows), key=lambda r: r["window"])
    per_step = pl.DataFrame(rows, schema=_STEP_SCHEMA)
    n_steps = per_step.height
    total_path = int(per_step["path_ns"].sum())
    breakdown = pl.DataFrame({
        "bound_by": list(BOUND_CLASSES),
        "ns_per_step": [round(float(per_step[f"{c}_ns"].sum()) / max(n_steps, 1)) for c in BOUND_CLASSES],
        "pct_of_path": [100.0 * float(per_step[f"{c}_ns"].sum()) / total_path if total_path else 0.0
                        for c in BOUND_CLASSES],
    })
    top_events = (
        pl.concat([p.events for p in parts])
        .group_by("name", "kind", "bound_by")
        .agg(pl.col("total").sum(), pl.col("count").sum().cast(pl.Int64))
        .with_columns(ns_per_step=(pl.col("total") / max(n_steps, 1)).round().cast(pl.Int64),
                      pct_of_path=100.0 * pl.col("total") / max(total_path, 1))
        .sort("total", "name", descending=[True, False])
        .drop("total")
        .head(int(ctx.params.top_n))
        .select("name", "kind", "bound_by", "ns_per_step", "pct_of_path", "count")
    )

    # What-ifs: the requested one, then each kernel class on the graph, the CPU and launches.
    # (A batch without a target's edges keeps its paths: its part is an untouched one.)
    classes = sorted(set().union(*(p.classes for p in parts)))
    targets = ([target] if target else []) + [c for c in [*classes, "cpu", "data_loading", "launch_overhead"]
                                              if c != target]
    errors = [e for p in parts if (e := p.whatif_error)]
    whatif_error = errors[0] if errors else None
    wins = np.asarray([w for p in parts for w in p.windows], dtype=np.int64)
    order = np.argsort(wins, kind="stable")
    steps_ns = [step_of[w] for p in parts for w in p.windows]
    wrows = [{**_whatif_row(t, factor, steps_ns, [p.whatif.get(t) or _untouched(len(p.windows)) for p in parts],
                            order), "requested": t == target}
             for t in targets if not (errors and t == target)]
    whatif = pl.DataFrame(wrows, schema=_WHATIF_SCHEMA).sort(["requested", "saved_ns"], descending=[True, True])
    sources = {p.sync_source for p in parts}
    sync_source = next(s for s in ("cuda_sync events", "runtime calls", "none", *sorted(sources)) if s in sources)
    return CriticalPathResult(
        per_step=per_step, breakdown=breakdown, top_events=top_events, whatif=whatif, sync_source=sync_source,
        cpu_gaps=bool(ctx.params.cpu_gaps), rounds=max(p.rounds for p in parts),
        converged=all(p.converged for p in parts), graph_nodes=sum(p.nodes for p in parts),
        graph_cross_edges=sum(p.cross_edges for p in parts), whatif_error=whatif_error,
    )


@dataclass(frozen=True)
class _BatchPart:
    """What one batch of windows adds to the result: its per-step rows, its path events'
    weights per ``(name, kind, bound_by)`` (``total``, ``count``), its GPU classes, its what-if
    parts per target, and its graph's figures."""

    windows: list[int]  # the windows of its paths, in order
    rows: list[dict[str, Any]]
    events: pl.DataFrame  # name, kind, bound_by, total, count
    classes: set[str]
    whatif: dict[str, _WhatifPart]
    whatif_error: str | None
    sync_source: str
    rounds: int
    converged: bool
    nodes: int
    cross_edges: int


def _batch_part(g: CPGraph, model: TraceModel, target: str, factor: float, step_of: dict[int, int],
                step_label: dict[int, int]) -> _BatchPart:
    """Solve the graph of one batch of windows and summarise it (see :class:`_BatchPart`)."""
    import numpy as np

    lp = longest_path(g)
    # Path edges (chain links and cross edges on a path) with their bound class, as codes:
    # summed per window and class, and per event, before any name is attached.
    ev = g.events
    pe = _path_edges(g, lp)
    # (Summed by one bincount over (window, class) codes: the sums, in ns, are far below 2⁵³,
    # exact in float64.)
    wins = sorted(lp.window_len)
    nb = len(_BOUND_NAMES)
    per_class = np.bincount(np.searchsorted(np.asarray(wins, dtype=np.int64), pe.window) * nb + pe.bound,
                            weights=pe.weight_ns, minlength=len(wins) * nb).reshape(-1, nb)
    rows = [{"window": w, "step": step_label.get(w), "step_ns": step_of.get(w, 0), "path_ns": lp.window_len[w],
             **{f"{c}_ns": int(v) for c, v in zip(BOUND_CLASSES, per_class[i].tolist(), strict=False)}}
            for i, w in enumerate(wins)]
    del per_class
    # Top events: weights per (event, class) first (integers), then named; an event has one
    # name and kind, so the events of a (name, kind, class) are its rows.
    # (A bincount over the events per class (the classes are few; the weights counted are
    # positive, their sums exact in float64 as above), then the pairs found sorted by one
    # integer key: several times cheaper than a group-by or a sort of every path edge.)
    keep_e = (pe.event >= 0) & (pe.weight_ns > 0) & (pe.type != LAUNCH)
    k_ev, k_bound, k_w = pe.event[keep_e].astype(np.int64), pe.bound[keep_e], pe.weight_ns[keep_e]
    del pe, keep_e
    keys: list[np.ndarray] = [np.zeros(0, np.int64)]
    sums: list[np.ndarray] = [np.zeros(0, np.float64)]
    for code in np.flatnonzero(np.bincount(k_bound, minlength=nb)).tolist():
        at = k_bound == code
        per = np.bincount(k_ev[at], weights=k_w[at])
        hit = np.flatnonzero(per)
        keys.append(hit * nb + code)
        sums.append(per[hit])
    del k_ev, k_bound, k_w
    key, total = np.concatenate(keys), np.concatenate(sums)
    order = np.argsort(key)
    key, total = key[order], total[order]
    per_event = pl.DataFrame({"event": key // nb, "bound": (key % nb).astype(np.int8), "w": total.astype(np.int64)},
                             schema={"event": pl.Int64, "bound": pl.Int8, "w": pl.Int64})
    del keys, sums, key, total, order
    # (Grouped with the class as its code, named after: the groups are few.)
    events = (
        ev.select(pl.col("name", "kind").gather(per_event["event"])).with_columns(per_event["bound"], per_event["w"])
        .group_by("name", "kind", "bound")
        .agg(total=pl.col("w").sum(), count=pl.len().cast(pl.Int64))
        .select("name", "kind", pl.col("bound").replace_strict(list(range(len(_BOUND_NAMES))), list(_BOUND_NAMES),
                                                               return_dtype=pl.String).alias("bound_by"),
                "total", "count")
    )
    del per_event

    codes, code_of = g.klass_codes
    present = set(np.unique(codes).tolist())
    classes = {c for c, i in code_of.items() if c and c != "cpu" and i in present}
    targets = ([target] if target else []) + [c for c in [*sorted(classes), "cpu", "data_loading", "launch_overhead"]
                                              if c != target]
    whatif: dict[str, _WhatifPart] = {}
    whatif_error = None
    node_win = np.searchsorted(np.asarray(wins, dtype=np.int64), g.node_window)
    for t in targets:
        try:
            whatif[t] = _whatif(g, lp, t, factor, model, node_win)
        except _BadTarget as err:
            whatif_error = f"critical_path.whatif_target: {err}"
    return _BatchPart(
        windows=list(lp.window_len), rows=rows, events=events, classes=classes, whatif=whatif,
        whatif_error=whatif_error, sync_source=g.sync_source, rounds=lp.rounds, converged=lp.converged,
        nodes=g.n_nodes, cross_edges=int(g.x_dst.size))
