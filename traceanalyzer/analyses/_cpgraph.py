"""The critical-path graph of a trace and its longest path (private to the analyses package).

The graph follows HolisticTraceAnalysis' (``docs/critical_path.md`` has the long form):

* **Nodes**: the start and the end of every CPU op and runtime call of positive length, and of
  every GPU activity (kernel, memcpy, memset) whose launch call is in the graph. Each belongs
  to the step window its CPU event (or its launch call) starts in.
* **CPU chains**: per thread and window, the boundaries in nesting order (a parent's start, its
  children, its end), each linked to the next by an *op* edge weighted by the time between them
  (zero into the end of a blocking call: its wait is explained by a sync edge). Consecutive
  top-level ops are linked by a *dependency* edge, weighted by the gap when ``cpu_gaps`` on
  the step's own thread (the Python between ops; less the time another thread of the process
  ran an op meanwhile: waiting for it is not work), zero as in HTA otherwise. With
  ``cpu_gaps``, zero-weight *hand-off* edges join the step's thread to the other threads' ops.
* **GPU chains**: per stream, a kernel's start → end (its duration), then either a
  *kernel-kernel* edge (previous kernel's end → this start, weighted by the gap) when the
  kernel was queued behind it, or a *launch* edge (launch call's start → kernel start,
  weighted by the launch delay) when the stream's queue was empty at the launch (the previous
  kernel had ended before the call and no other launch came before the kernel started).
* **Sync edges** (zero weight): Kineto's ``cuda_sync`` events where the trace has them
  (context sync: the last activity of every stream → the sync call's end; stream sync: of
  that stream; event sync: the activity launched before the thread's last
  ``cudaEventRecord`` → the call's end; stream wait event: that activity → the next activity
  launched on the waiting stream). Without them, the same from the runtime call names, the
  stream of a stream sync being that of the thread's last launch. A blocking copy's own
  activity → the copy call's end.

The longest path is a dynamic programme over the nodes. Every edge inside a chain joins
consecutive nodes, so along a chain ``dist[i] = P[i] + max_{j ≤ i}(offer[j] − P[j])`` with
``P`` the chain's prefix sum of weights and ``offer[j]`` the best cross edge into ``j`` (or 0: a
path may start anywhere): one segmented running maximum over all chains at once. Cross edges
(launch, sync, stream wait) feed the offers of the next round; rounds repeat until no offer
changes, which takes as many rounds as the path switches between chains through a sync (a
launch edge leads onto the GPU, only a sync leads back). The first round is a few numpy passes
over the nodes; the later ones run on the cross edges' ends alone (a node's distance is its
first-round one or what the offers before it on its chain add, whichever is larger), and one
last pass gives every node its distance from the final offers. After :data:`MAX_ROUNDS` (a
window with thousands of syncs) one pass in topological order finishes the job: a Python loop
over nodes, linear whatever the depth, the fallback only.
The path is then walked back one chain segment at a time (a Python loop over segments of the
path, not over nodes), its nodes marked with a difference array.

Windows share no edge: :func:`graph_batches` builds the graph of consecutive windows a batch of
about :data:`BATCH_NODES` nodes at a time, from whole-trace inputs computed once
(:class:`GraphInputs`), and each batch's graph is the part of the graph of every window that
lies in its windows (ties between events at one instant are broken by event number, never by
what else is in the graph).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import polars as pl

from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.analyses._intervals import DATALOADER_RE, covered_within
from traceanalyzer.analyses._kernels import kernel_class, on_distinct
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import (
    CoverIndex,
    TraceTables,
    cover_index,
    gpu_activity,
    launches,
    sorted_boundaries,
)
from traceanalyzer.timeutil import merge_intervals

if TYPE_CHECKING:
    # numpy is imported where the graph is built or walked: importing the analyses (every CLI
    # start discovers them) stays free of its import time.
    import numpy as np
    import numpy.typing as npt

    I64: TypeAlias = npt.NDArray[np.int64]
    I32: TypeAlias = npt.NDArray[np.int32]
    F64: TypeAlias = npt.NDArray[np.float64]
    B: TypeAlias = npt.NDArray[np.bool_]
    I8: TypeAlias = npt.NDArray[np.int8]

#: Edge types (HTA's CPEdgeType).
OP, DEPENDENCY, LAUNCH, KERNEL_KERNEL, SYNC = 0, 1, 2, 3, 4
EDGE_TYPES = ("op", "dependency", "launch_delay", "kernel_kernel_delay", "sync")

#: HTA's bound_by classes, in report order.
BOUND_CLASSES = (
    "cpu_bound", "data_loading", "gpu_compute_bound", "gpu_communication_bound",
    "gpu_kernel_kernel_overhead", "gpu_kernel_launch_overhead",
)

#: Runtime calls whose CPU span is a wait (HTA's BLOCKING_SYNC_CALLS and their cu*/hip* names):
#: their own duration gets no weight, the sync edge into their end explains it.
BLOCKING_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpyAsync", "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpy",
    "cudaStreamSynchronize_ptsz", "cuStreamSynchronize_ptsz", "cudaThreadSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipEventQuery", "hipMemcpy",
    "hipMemcpyAsync", "hipMemcpyWithStream", "hipCtxSynchronize",
})
_DEVICE_SYNC = ("cudaDeviceSynchronize", "cuCtxSynchronize", "cudaThreadSynchronize", "hipDeviceSynchronize",
                "hipCtxSynchronize")
_STREAM_SYNC = ("cudaStreamSynchronize", "cuStreamSynchronize", "cudaStreamSynchronize_ptsz",
                "cuStreamSynchronize_ptsz", "hipStreamSynchronize")
_EVENT_SYNC = ("cudaEventSynchronize", "cuEventSynchronize", "hipEventSynchronize")
_EVENT_RECORD = ("cudaEventRecord", "cuEventRecord", "hipEventRecord", "cudaEventRecordWithFlags")
_STREAM_WAIT = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent")
_SYNC_CALLS = (*_DEVICE_SYNC, *_STREAM_SYNC, *_EVENT_SYNC, *_STREAM_WAIT, "cudaEventQuery", "hipEventQuery")
# Clock tolerance between a GPU end and the CPU call it releases (the two clocks are aligned
# to about a microsecond).
_TOL_NS = 2_000
#: HTA's KERNEL_KERNEL_DELAY_THRESHOLD_US: queued kernels further apart are not linked.
KK_MAX_GAP_NS = 1_500_000
#: A kernel starting this long after its launch call ended, its stream idle, waited for
#: something (traces without cuda_sync events: see _inferred_waits).
INFERRED_WAIT_NS = 50_000
#: Lazy queries here run on the in-memory engine, as eager operations do ("auto" may pick the
#: streaming engine, slower on these sorts and as-of joins of one trace).
_ENGINE: Final = "in-memory"
#: DP rounds before :func:`longest_path` switches to one topological pass (a path through
#: thousands of syncs; a cyclic graph, from bad timestamps, is reported as not converged).
MAX_ROUNDS = 48


@dataclass(frozen=True)
class CPGraph:
    """Nodes in chain order (chain-contiguous), chain links, cross edges and the event table.

    Node ``i`` is linked to node ``i − 1`` (same chain) unless ``seg_start[i]``; that link has
    weight ``link_w[i]``, type ``link_type[i]`` and is attributed to event ``link_event[i]``.
    Cross edge ``k`` joins ``x_src[k]`` → ``x_dst[k]`` (sorted by ``x_dst``), weight ``x_w``.
    Node, event, window and type numbers are int32 (far below 2³¹), times and weights int64.
    ``events``: ``event, kind, name, pid, tid, device, stream, ts_ns, end_ns, klass, bound``
    (``event`` = row number).
    """

    node_event: I32
    node_window: I32
    seg_start: B
    link_w: I64
    link_type: I32
    link_event: I32
    link_dl: B  # a dependency link (gap between ops, or lead) inside a DataLoader range
    lead: B  # the chain's first node carries a lead (its link_w: time from the step start)
    x_src: I32
    x_dst: I32
    x_w: I64
    x_type: I32
    x_event: I32
    events: pl.DataFrame
    sync_source: str  # "cuda_sync events" / "runtime calls" / "none"
    # Per event, its ``bound`` as an index of BOUND_CLASSES (the what-ifs and the path's
    # breakdown compare codes, not the strings of ``events``).
    bound_code: I8

    @property
    def n_nodes(self) -> int:
        return int(self.node_event.size)

    @functools.cached_property
    def chains(self) -> tuple[I64, I64, I64, I64, I32]:
        """``(seg, seg_first, seg_end, x_dst_first, x_dst_u)``: each node's segment, each
        segment's first node and end (exclusive), the first cross edge into each destination
        and those destinations (the what-ifs reuse them: only weights change)."""
        import numpy as np

        seg = _seg_ids(self.seg_start)
        seg_first = np.flatnonzero(self.seg_start).astype(np.int64)
        seg_end = np.r_[seg_first[1:], self.n_nodes].astype(np.int64)
        x_dst_first = np.flatnonzero(np.r_[True, self.x_dst[1:] != self.x_dst[:-1]]).astype(np.int64) \
            if self.x_dst.size else np.zeros(0, np.int64)
        return seg, seg_first, seg_end, x_dst_first, self.x_dst[x_dst_first]

    @functools.cached_property
    def x_run(self) -> I64:
        """Each cross edge's destination as an index into ``chains``' destinations."""
        import numpy as np

        return np.cumsum(np.r_[True, self.x_dst[1:] != self.x_dst[:-1]]).astype(np.int64) - 1

    @functools.cached_property
    def klass_codes(self) -> tuple[I32, dict[str, int]]:
        """Each event's ``klass`` as a number, and the numbers of the classes (the what-ifs
        compare numbers, not strings, per target)."""
        import numpy as np

        names = [c for c in self.events["klass"].unique(maintain_order=True).to_list() if c is not None]
        codes = self.events["klass"].replace_strict(names, list(range(len(names))), default=-1,
                                                    return_dtype=pl.Int32).fill_null(-1).to_numpy().astype(np.int32,
                                                                                                         copy=False)
        return codes, {c: i for i, c in enumerate(names)}

    @functools.cached_property
    def link_codes(self) -> tuple[I32, I8]:
        """Per node, its chain link's event where that link is an op edge (else -1), and what
        kind of dependency link it is (0 none, 1 outside a DataLoader range, 2 inside): the
        what-ifs test every link against a target with one look-up each."""
        import numpy as np

        op_event = np.where(self.link_type == OP, self.link_event, -1).astype(np.int32)
        dep = np.where(self.link_type == DEPENDENCY, np.where(self.link_dl, 2, 1), 0).astype(np.int8)
        return op_event, dep

    @functools.cached_property
    def window_runs(self) -> tuple[I64, I64, I32]:
        """``(start, end, window)`` of each run of consecutive nodes of one window."""
        import numpy as np

        w = self.node_window
        at = np.flatnonzero(np.r_[True, w[1:] != w[:-1]]).astype(np.int64)
        return at, np.r_[at[1:], w.size].astype(np.int64), w[at]

    @functools.cached_property
    def keys(self) -> tuple[I64, I64, I64, I64, I64]:
        """``(keys, k_src, k_dst, kseg, kseg_first)``: the nodes at either end of a cross edge
        (sorted), each cross edge's source and each destination of ``chains`` as an index
        there, and the keys' segments (numbered anew, from 0) with each one's first key: the
        nodes :func:`longest_path`'s rounds run on."""
        import numpy as np

        x_dst_u = self.chains[4]
        keys, inv = np.unique(np.concatenate([self.x_src, x_dst_u]).astype(np.int64), return_inverse=True)
        inv = inv.astype(np.int64)
        s = self.chains[0][keys]
        first = np.r_[True, s[1:] != s[:-1]]
        return keys, inv[:self.x_src.size], inv[self.x_src.size:], np.cumsum(first) - 1, np.flatnonzero(first)


def _empty_graph(events: pl.DataFrame, sync_source: str) -> CPGraph:
    import numpy as np

    z, z32, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=bool)
    return CPGraph(z32, z32, f, z, z32, z32, f, f, z32, z32, z, z32, z32, events, sync_source, np.zeros(0, np.int8))


#: Graph nodes per batch of step windows (two per event, at least one window a batch): each
#: batch's graph is built, solved and summarised before the next, so the critical path's
#: memory follows the largest batch rather than the trace. Windows share no edge: the
#: results are those of one graph of every window.
BATCH_NODES = 400_000


@dataclass(frozen=True)
class GraphInputs:
    """What every batch of windows reads from the whole trace, computed once: the stream
    queue state of each launch (HTA reads the queue of the full trace), the communication
    flag of each kernel, the DataLoader ranges, the step's threads, the ``cuda_sync`` records
    and the batches of windows themselves."""

    windows: pl.DataFrame  # window, step, start_ns, end_ns
    batches: list[list[int]]  # kept windows, in time order, in batches of bounded size
    queue: pl.DataFrame  # _lrow (row of launches()), cpu_ts_ns, queue_empty, _prev_end_all
    k_comm: pl.DataFrame  # correlation, ts_ns, is_comm
    k_comm_unique: bool  # k_comm's correlations are unique (no nulls): matched by correlation alone
    dl: CoverIndex | None  # the DataLoader ranges (None: none)
    syncs: pl.DataFrame  # cuda_sync records, _call_window: the window of their call in the graph (or null)
    main: pl.DataFrame  # pid, tid: the step's thread(s)


def _cpu_events(model: TraceModel, lo: int | None = None, hi: int | None = None) -> pl.DataFrame:
    """CPU ops and runtime calls of positive length (starting in ``[lo, hi]`` when given)."""
    cols = ["name", "pid", "tid", "ts_ns", "end_ns"]
    rng = pl.col("ts_ns").is_between(lo, hi) if lo is not None and hi is not None else pl.lit(True)
    ops = model.cpu_ops.lazy().select(cols).filter(rng).with_columns(kind=pl.lit("cpu_op"),
                                                                      correlation=pl.lit(None, pl.Int64))
    rt = model.runtime.lazy().select(*cols, "correlation").filter(rng).with_columns(kind=pl.lit("runtime"))
    ev = pl.concat([ops, rt.select(ops.collect_schema().names())]).filter(pl.col("end_ns") > pl.col("ts_ns"))
    return ev.collect(engine=_ENGINE)


def _bounds_exprs(windows: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
    """A window's start and end by look-up (the windows are few; a join would copy every column)."""
    bounds = windows.select("window", pl.col("start_ns").alias("_w0"), pl.col("end_ns").alias("_w1"))
    return (pl.col("window").replace_strict(bounds["window"], bounds["_w0"], default=None),
            pl.col("window").replace_strict(bounds["window"], bounds["_w1"], default=None))


def _span(windows: pl.DataFrame, batch: list[int]) -> tuple[int, int]:
    """``[first start, last end]`` of the windows ``batch``: every event that starts in one
    of them starts in there."""
    w = windows.filter(pl.col("window").is_in(batch))
    return int(w["start_ns"].min()), int(w["end_ns"].max())  # type: ignore[arg-type]


def _batch_cpu(model: TraceModel, windows: pl.DataFrame, batch: list[int]) -> pl.DataFrame:
    """The CPU events of the windows ``batch``, clipped to their window: an op that outlives
    its step (a thread's long op, a kernel past the next step's start) counts only inside
    it, so a path never exceeds its step. ``_w0``: their window's start."""
    if not batch:
        return assign_steps(_cpu_events(model, 0, -1), windows, "ts_ns")
    lo, hi = _span(windows, batch)
    return _in_batch(_cpu_events(model, lo, hi), windows, batch, "ts_ns").lazy().with_columns(
        ts_ns=pl.col("ts_ns").clip(pl.col("_w0"), pl.col("_w1")), end_ns=pl.col("end_ns").clip(pl.col("_w0"),
                                                                                           pl.col("_w1"))
    ).filter(pl.col("end_ns") > pl.col("ts_ns")).drop("_w1").collect(engine=_ENGINE)


def _in_batch(df: pl.DataFrame, windows: pl.DataFrame, batch: list[int], ts_col: str) -> pl.DataFrame:
    """The rows of ``df`` whose ``ts_col`` lies in one of the windows ``batch``, with ``window``
    and its bounds ``_w0``, ``_w1``: :func:`assign_steps`' window (the last starting at or
    before the time, if the time is before its end) by one binary search, the bounds gathered
    with it, and the rows of other windows dropped in the same pass."""
    import numpy as np

    w = windows.select("window", "start_ns", "end_ns").sort("start_ns", maintain_order=True)
    if w["start_ns"].null_count() or w["end_ns"].null_count() or df.schema[ts_col] != pl.Int64:
        w0, w1 = _bounds_exprs(windows)
        return assign_steps(df, windows, ts_col).drop("step").filter(pl.col("window").is_in(batch)).with_columns(
            _w0=w0, _w1=w1)
    starts, ends = _i64(w["start_ns"]), _i64(w["end_ns"])
    t = df[ts_col]
    tn = t.fill_null(0).to_numpy()
    pos = np.searchsorted(starts, tn, side="right") - 1
    at = np.clip(pos, 0, None)
    keep = (pos >= 0) & (tn < ends[at]) & w["window"].is_in(batch).to_numpy()[at]
    if t.null_count():
        keep &= t.is_not_null().to_numpy()
    at = at[keep]
    return df.filter(pl.Series(keep)).with_columns(
        window=pl.Series(_i64(w["window"])[at]), _w0=pl.Series(starts[at]), _w1=pl.Series(ends[at]))


def graph_inputs(t: TraceTables, windows: pl.DataFrame, keep: list[int],
                 max_nodes: int | None = BATCH_NODES) -> GraphInputs:
    """The whole-trace inputs of the graph of the windows ``keep``, in batches of about
    ``max_nodes`` graph nodes (``None``: one batch)."""
    import numpy as np

    model = t.model
    # Queue state per stream over the whole trace (HTA reads the queue of the full trace):
    # empty at the launch (everything launched earlier on the stream had started) and the
    # kernel was the next to start (no later launch on the stream before it began). Kept per
    # launch row (``_lrow``), in the order the graph reads them.
    # (Sorted by numpy, the running maxima per stream too: see _sort_rows.)
    ls = _sort_rows(launches(t).lazy().with_row_index("_lrow").filter(pl.col("gpu_ts_ns").is_not_null()).select(
        "_lrow", "correlation", "cpu_ts_ns", "cpu_dur_ns", "gpu_ts_ns", "device", "stream").collect(engine=_ENGINE),
        ("device", "stream", "cpu_ts_ns", "gpu_ts_ns"))
    lj = ls.lazy().with_columns(
        _prev_started=_prev_running_max(ls, "gpu_ts_ns", ("device", "stream")),
        _next_launch=pl.when(_same_group(("device", "stream"), -1)).then(pl.col("cpu_ts_ns").shift(-1)),
    ).with_columns(
        queue_empty=(pl.col("_prev_started").is_null() | (pl.col("_prev_started") <= pl.col("cpu_ts_ns")))
        & (pl.col("_next_launch").is_null() | (pl.col("_next_launch") > pl.col("gpu_ts_ns")))
    ).filter(pl.col("cpu_dur_ns") > 0)  # the queue counts every launch; the graph, calls of positive length
    del ls
    # The stream's previous activity among all of them, orphans (no launch call recorded)
    # included: a kernel queued behind an orphan waited for it, not for its launch.
    ga = _sort_rows(gpu_activity(t).lazy().select("device", "stream", pl.col("ts_ns").alias("gpu_ts_ns"), "end_ns",
                                                  "correlation").filter(pl.col("stream").is_not_null()).collect(
        engine=_ENGINE), ("device", "stream", "gpu_ts_ns"))
    ga = ga.with_columns(_prev_end_all=_prev_running_max(ga, "end_ns", ("device", "stream"))).drop("end_ns")
    if ga["correlation"].null_count() == 0 and ga["correlation"].n_unique() == ga.height:
        # One activity per correlation (the usual case): the four-key match is the activity
        # of the launch's correlation where its device, stream and start agree (a join on one
        # key, several times cheaper than on four; the four keys are unique already).
        same = pl.all_horizontal([pl.col(c) == pl.col(f"_{c}") for c in ("device", "stream", "gpu_ts_ns")])
        lq = lj.join(ga.lazy().select("correlation", *[pl.col(c).alias(f"_{c}") for c in
                                                      ("device", "stream", "gpu_ts_ns")], "_prev_end_all"),
                     on="correlation", how="left", maintain_order="left").with_columns(
            _prev_end_all=pl.when(same).then(pl.col("_prev_end_all")))
    else:
        lq = lj.join(ga.lazy().unique(["device", "stream", "gpu_ts_ns", "correlation"], keep="first"),
                     on=["device", "stream", "gpu_ts_ns", "correlation"], how="left", maintain_order="left")
    queue = lq.select(
        "_lrow", "cpu_ts_ns", queue_empty=pl.col("queue_empty") & (pl.col("_prev_end_all").is_null()
                                                                   | (pl.col("_prev_end_all") < pl.col("cpu_ts_ns"))),
        _prev_end_all="_prev_end_all").collect(engine=_ENGINE)
    comm = comm_classes(t).select("is_comm")
    k_comm = model.kernels.select("ts_ns", "correlation").with_columns(comm["is_comm"])
    k_comm_unique = k_comm["correlation"].null_count() == 0 and k_comm["correlation"].n_unique() == k_comm.height
    if not k_comm_unique:
        k_comm = k_comm.unique(["correlation", "ts_ns"], keep="first")
    dl_ranges = pl.concat([
        model.annotations.filter(pl.col("name").str.contains(DATALOADER_RE)).select("pid", "tid", "ts_ns", "end_ns"),
        model.cpu_ops.filter(pl.col("name").str.contains(DATALOADER_RE)).select("pid", "tid", "ts_ns", "end_ns"),
    ]).filter(pl.col("end_ns") > pl.col("ts_ns"))
    dl = None if dl_ranges.is_empty() else cover_index(
        dl_ranges.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64)))

    # Batches: consecutive kept windows (in time order) up to max_nodes nodes, two per event
    # starting in them (an estimate: the graph drops some; a window is never split).
    w = windows.filter(pl.col("window").is_in(keep)).sort("start_ns")
    order = w["window"].to_list()
    if max_nodes is None or len(order) <= 1:
        batches = [order]
    else:
        starts = w["start_ns"].to_numpy()
        ends = w["end_ns"].to_numpy()
        count = np.zeros(len(order), dtype=np.int64)
        for col in (model.cpu_ops["ts_ns"], model.runtime["ts_ns"], queue["cpu_ts_ns"]):
            # (By slices: the trace's full length of positions would be a large transient.)
            for lo in range(0, col.len(), 1 << 20):
                ts = col.slice(lo, 1 << 20).fill_null(-1).to_numpy()
                at = np.searchsorted(starts, ts, side="right") - 1
                inside = (at >= 0) & (ts < ends[np.maximum(at, 0)])
                count += np.bincount(at[inside], minlength=len(order))
        batches, size = [], 0
        for win, c in zip(order, (2 * count).tolist(), strict=True):
            if not batches or size + c > max_nodes:
                batches.append([])
                size = 0
            batches[-1].append(win)
            size += c

    # The step's own thread (the ProfilerStep's; without steps, the thread with the most
    # events in the graph).
    main = model.steps.select("pid", "tid").unique()
    if main.is_empty():
        per = [_batch_cpu(model, windows, b).group_by("pid", "tid").len() for b in batches]
        main = pl.concat(per).group_by("pid", "tid").agg(pl.col("len").sum()).sort(
            "len", "pid", "tid", descending=[True, False, False]).head(1)
    main = main.select("pid", "tid")

    # The cuda_sync records, each with the window of its runtime call in the graph, matched as
    # _sync_calls matches them (by correlation, the first such call; else by time, the sync
    # call starting last before the record, if the record lies within it): a batch reads the
    # records whose call is in it, and finds the same call among its own (the latest of a
    # superset is in it). A record of no call gives no edge.
    syncs = model.other_events.filter(pl.col("cat") == "cuda_sync")
    if syncs.height and keep:
        corr = syncs["correlation"].drop_nulls().unique().implode()
        w0, w1 = _bounds_exprs(windows)
        rt = model.runtime.lazy().with_row_index("_row").select(
            "_row", "name", "ts_ns", "end_ns", "correlation").filter(
            (pl.col("end_ns") > pl.col("ts_ns"))
            & (pl.col("correlation").is_in(corr) | pl.col("name").is_in(list(_SYNC_CALLS)))).collect(engine=_ENGINE)
        rt = assign_steps(rt, windows, "ts_ns").lazy().filter(pl.col("window").is_in(keep)).with_columns(
            _w0=w0, _w1=w1).with_columns(
            ts_ns=pl.col("ts_ns").clip(pl.col("_w0"), pl.col("_w1")),
            end_ns=pl.col("end_ns").clip(pl.col("_w0"), pl.col("_w1"))).filter(
            pl.col("end_ns") > pl.col("ts_ns")).collect(engine=_ENGINE)
        by_corr = rt.filter(pl.col("correlation").is_in(corr)).unique("correlation", keep="first",
                                                                       maintain_order=True).select(
            "correlation", pl.col("window").alias("_corr_window"))
        syncs = syncs.with_row_index("_srow").join(by_corr, on="correlation", how="left", maintain_order="left")
        sc = rt.filter(pl.col("name").is_in(list(_SYNC_CALLS))).select("_row", "ts_ns", "end_ns", "window").sort(
            "ts_ns", "_row")
        by_time = syncs.filter(pl.col("_corr_window").is_null()).select("_srow", pl.col("ts_ns").alias("_mid")).sort(
            "_mid").join_asof(sc, left_on="_mid", right_on="ts_ns", strategy="backward", check_sortedness=False).filter(
            pl.col("_row").is_not_null() & (pl.col("_mid") <= pl.col("end_ns") + _TOL_NS)).select(
            "_srow", pl.col("window").alias("_time_window"))
        syncs = syncs.join(by_time, on="_srow", how="left", maintain_order="left").with_columns(
            _call_window=pl.coalesce("_corr_window", "_time_window")).drop("_srow", "_corr_window", "_time_window")
    else:
        syncs = syncs.with_columns(_call_window=pl.lit(None, pl.Int64))
    return GraphInputs(windows=windows, batches=batches, queue=queue, k_comm=k_comm, k_comm_unique=k_comm_unique,
                       dl=dl, syncs=syncs, main=main)


def graph_batches(t: TraceTables, windows: pl.DataFrame, keep: list[int], cpu_gaps: bool,
                  max_nodes: int | None = BATCH_NODES, kk_max_gap_ns: int = KK_MAX_GAP_NS) -> Iterator[CPGraph]:
    """The graphs of the step windows ``keep`` (``windows``: ``window, step, start_ns, end_ns``),
    one per batch of windows of about ``max_nodes`` nodes (``None``: one graph), in time order."""
    inp = graph_inputs(t, windows, keep, max_nodes)
    for batch in inp.batches:
        yield _build_batch(t, inp, batch, cpu_gaps, kk_max_gap_ns)


def build_graph(t: TraceTables, windows: pl.DataFrame, keep: list[int], cpu_gaps: bool,
                kk_max_gap_ns: int = KK_MAX_GAP_NS) -> CPGraph:
    """The graph of the step windows ``keep`` (``windows``: ``window, step, start_ns, end_ns``)."""
    (g,) = graph_batches(t, windows, keep, cpu_gaps, None, kk_max_gap_ns)
    return g


def _build_batch(t: TraceTables, inp: GraphInputs, keep: list[int], cpu_gaps: bool,
                 kk_max_gap_ns: int) -> CPGraph:
    """The graph of the windows ``keep``, a batch of ``inp.batches``."""
    import numpy as np

    model = t.model
    windows = inp.windows
    w0, w1 = _bounds_exprs(windows)
    cpu = _batch_cpu(model, windows, keep)
    lo, hi = _span(windows, keep) if keep else (0, -1)
    # The launches of the batch, in the queue's order, with its state.
    q = inp.queue.filter(pl.col("cpu_ts_ns").is_between(lo, hi))
    lj = launches(t).select("correlation", "pid", "tid", "cpu_ts_ns", "cpu_end_ns", "cpu_dur_ns", "api",
                            "gpu_name", "activity", "gpu_ts_ns", "gpu_end_ns", "device", "stream")[q["_lrow"]]
    lj = lj.with_columns(queue_empty=q["queue_empty"], _prev_end_all=q["_prev_end_all"])
    del q
    gpu = _in_batch(lj, windows, keep, "cpu_ts_ns").lazy().with_columns(
        [pl.col(c).clip(pl.col("_w0"), pl.col("_w1")) for c in ("cpu_ts_ns", "cpu_end_ns", "gpu_ts_ns", "gpu_end_ns")]
    ).drop("_w0", "_w1").collect(engine=_ENGINE)
    del lj

    # The event table: CPU events, then GPU activities.
    # (Clipped starts lie in the batch's span: the kernels that can match are there.)
    k_comm = inp.k_comm.filter(pl.col("ts_ns").is_between(lo, hi))
    if inp.k_comm_unique:
        # (A join on the correlation alone, the start compared after: the same match.)
        gpu = gpu.join(k_comm.select("correlation", pl.col("ts_ns").alias("_k_ts"), "is_comm"), on="correlation",
                       how="left", maintain_order="left").with_columns(
            pl.when(pl.col("_k_ts") == pl.col("gpu_ts_ns")).then(pl.col("is_comm")).fill_null(False)).drop("_k_ts")
    else:
        gpu = gpu.join(k_comm.select("correlation", pl.col("ts_ns").alias("gpu_ts_ns"), "is_comm"),
                       on=["correlation", "gpu_ts_ns"], how="left", maintain_order="left").with_columns(
            pl.col("is_comm").fill_null(False))
    del k_comm
    gpu = on_distinct(gpu, ["gpu_name", "activity", "is_comm"], klass=pl.when(pl.col("activity") != "kernel").then(
        pl.col("activity")).when(pl.col("is_comm")).then(pl.lit("communication")).otherwise(
        kernel_class(pl.col("gpu_name"))))
    dl = _dataloader_flags(inp.dl, cpu)
    n_cpu = cpu.height
    cpu = cpu.with_columns(event=pl.int_range(pl.len(), dtype=pl.Int64), dl=dl)
    gpu = gpu.with_columns(event=pl.int_range(pl.len(), dtype=pl.Int64) + n_cpu)
    # The events' bound classes as codes (BOUND_CLASSES' order), for the path's breakdown.
    bound_code = np.concatenate([np.where(cpu["dl"].to_numpy(), 1, 0), np.where(gpu["is_comm"].to_numpy(), 3, 2)]
                                ).astype(np.int8)
    events = pl.concat([
        cpu.select("event", "window", "kind", "name", "pid", "tid", pl.lit(None, pl.Int64).alias("device"),
                   pl.lit(None, pl.Int64).alias("stream"), "ts_ns", "end_ns",
                   pl.lit("cpu").alias("klass"),
                   pl.when(pl.col("dl")).then(pl.lit("data_loading")).otherwise(pl.lit("cpu_bound")).alias("bound")),
        gpu.select("event", "window", pl.col("activity").alias("kind"), pl.col("gpu_name").alias("name"), "pid",
                   "tid", "device", "stream", pl.col("gpu_ts_ns").alias("ts_ns"), pl.col("gpu_end_ns").alias("end_ns"),
                   "klass", pl.when(pl.col("is_comm")).then(pl.lit("gpu_communication_bound"))
                   .otherwise(pl.lit("gpu_compute_bound")).alias("bound")),
    ])

    # The cuda_sync records whose call is in the batch (see graph_inputs).
    syncs = inp.syncs.filter(pl.col("_call_window").is_in(keep)).drop("_call_window")
    if cpu.is_empty():
        return _empty_graph(events, "none")

    # ---- CPU chains: boundaries in nesting order per (window, pid, tid).
    by = ["window", "pid", "tid"]
    # At one instant ends come first (half-open intervals); starts longer first; ends of
    # later-started intervals first (a child closes before its parent): sorted_boundaries'
    # order (the intervals have positive lengths). A plain running sum is the per-chain
    # depth: a chain's rows are contiguous and hold as many ends as starts, so the sum is
    # back to 0 where the next chain begins.
    sb = sorted_boundaries(cpu.select(*by, pl.col("event").alias("id"), "ts_ns", "end_ns"), by).rename(
        {"id": "event"})
    # Whether a boundary ends a blocking call (events are numbered by row of ``cpu``).
    blocking = cpu["name"].is_in(list(BLOCKING_CALLS)).gather(sb["event"]) & (sb["kind"] == 0)
    # (One lazy query from the boundaries to the gap starts.)
    lb = sb.lazy().with_columns(blocking.alias("_blocking")).with_columns(
        depth=pl.when(pl.col("kind") == 1).then(1).otherwise(-1).cum_sum()
    ).with_columns(
        first=pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in by]).fill_null(True),
        prev_t=pl.col("t").shift(1), prev_kind=pl.col("kind").shift(1), prev_event=pl.col("event").shift(1),
        prev_depth=pl.col("depth").shift(1),
        pos=pl.int_range(pl.len(), dtype=pl.Int64),
    )
    is_dep = (pl.col("prev_depth") == 0) & (pl.col("kind") == 1)
    blocking_end = (pl.col("kind") == 0) & pl.col("_blocking")
    gap = (pl.col("t") - pl.col("prev_t")).clip(lower_bound=0)
    # The time between top-level ops (and before the first) counts, with cpu_gaps, on the
    # step's own thread only (the ProfilerStep's; without steps, the thread with the most
    # events): a helper thread's idle between two ops is not work, and as a path it would tie
    # with the real one.
    main = inp.main
    counted = pl.col("_main") if cpu_gaps else pl.lit(False)
    # While another thread of the process runs an op, the step's thread between its own ops is
    # waiting for it (backward on the autograd thread), not working: that part of a gap (or
    # lead) does not count; the other thread's ops carry the path there (hand-off edges below).
    # (Expressions, not joins: a join would copy every column, and keep the rows in ``pos`` order.
    # The step's threads are one or a few: compared one by one, cheaper than a struct look-up.)
    if 0 < main.height <= 8:
        is_main = pl.any_horizontal([(pl.col("pid") == p) & (pl.col("tid") == t) for p, t in main.iter_rows()]
                                    ).fill_null(False)
    else:
        is_main = pl.struct("pid", "tid").is_in(main.select(pl.struct("pid", "tid")).to_series().implode())
    # (A window's start: the events' own, by row.)
    w0_sb = cpu["_w0"].gather(sb["event"]) if "_w0" in cpu.columns else w0
    b = lb.with_columns(is_main.alias("_main"), w0_sb.alias("_w0")).with_columns(
        _gap_from=pl.when(pl.col("first")).then(pl.col("_w0")).otherwise(pl.col("prev_t"))).collect(engine=_ENGINE)
    del sb, blocking, w0_sb
    cpu = cpu.drop("_w0", strict=False)
    busy = pl.zeros(b.height, pl.Int64, eager=True).alias("_busy")
    # (The columns read, projected before the filter; read with cpu_gaps only.)
    others = cpu.lazy().select("pid", "tid", "ts_ns", "end_ns").filter(
        ~is_main & pl.col("pid").is_in(main["pid"].implode())).select("pid", "ts_ns", "end_ns").collect(
        engine=_ENGINE) if cpu_gaps else None
    if others is not None and others.height:
        merged = merge_intervals(others, by=["pid"])
        # Busy time in [gap start, t): the covered length before t less that before the
        # gap's start, both ends in one pass; only where a gap counts (a lead or the gap
        # before a top-level op, on the step's thread).
        at = b.select((pl.col("_main") & (pl.col("first") | is_dep)).fill_null(False).arg_true())["_main"]
        spans = b[at].select("pid", pl.col("_gap_from").fill_null(pl.col("t")).alias("start_ns"),
                             pl.col("t").alias("end_ns"))
        busy = busy.scatter(at, covered_within(merged, spans, by=["pid"]))
    own = (pl.col("t") - pl.col("_gap_from") - pl.col("_busy")).clip(lower_bound=0)
    # A chain's first node: on the step's thread, the time from the step's start to its first
    # op (a lead: a path may start there with that much behind it).
    b = b.lazy().with_columns(busy).with_columns(
        link_type=pl.when(is_dep | pl.col("first")).then(DEPENDENCY).otherwise(OP),
        link_w=pl.when(pl.col("first")).then(pl.when(counted).then(own).otherwise(0))
        .when(is_dep).then(pl.when(counted).then(own).otherwise(0))
        .when(blocking_end).then(0).otherwise(gap),
        _unexplained=pl.when(blocking_end & pl.lit(cpu_gaps)).then(gap).otherwise(None),
        # Where a gap (or lead) lies: its middle, for the DataLoader test below.
        _gap_mid=pl.when(pl.col("first")).then((pl.col("t") + pl.col("_w0")) // 2)
        .otherwise((pl.col("t") + pl.col("prev_t")) // 2),
    ).drop("prev_t", "_gap_from", "_busy", "_w0", "_blocking").collect(engine=_ENGINE)
    del busy
    dl_gap = (pl.col("link_type") == DEPENDENCY) & _dataloader_flags(
        inp.dl, b.select("pid", "tid", pl.col("_gap_mid").alias("ts_ns")))
    # Attribution (HTA): start→start and start→end to the source, end→end to the destination,
    # end→start to the source's parent (the op open between them): the last start before it
    # at the depth left open, in its chain.
    lb = b.lazy().with_columns(link_dl=dl_gap).drop("_gap_mid")
    parent = _open_parents(b)
    b = lb.with_columns(_parent=pl.Series(parent)).with_columns(
        link_event=pl.when(pl.col("first") | (pl.col("link_type") == DEPENDENCY)).then(-1)
        .when(pl.col("prev_kind") == 1).then(pl.col("prev_event"))
        .when(pl.col("kind") == 0).then(pl.col("event"))
        .otherwise(pl.col("_parent").fill_null(-1)),
    ).collect(engine=_ENGINE)
    del parent, lb
    cpu_nodes = b.select(
        "event", (pl.col("kind") == 1).alias("start"), "window",
        pl.col("first").alias("seg"), "link_w", "link_type", "link_event", "link_dl")
    unexplained = b["_unexplained"]
    # Hand-offs (with cpu_gaps): another thread's top-level op may have waited for the step's
    # thread (the autograd engine's backward, a worker fed by the loop): a zero-weight edge
    # from the step thread's last node at or before its start. Without it a helper thread, its
    # gaps weightless, would start every path it carries from nothing. (CPU nodes are the
    # first nodes, ``pos`` their index.)
    handoff = pl.DataFrame(schema={c: pl.Int64 for c in ("src", "dst", "w", "type", "ev")})
    if cpu_gaps:
        helper = b.filter(~pl.col("_main") & (pl.col("kind") == 1) & (pl.col("first") | is_dep)).select(
            "window", "t", pl.col("pos").alias("dst"))
        mains = b.filter(pl.col("_main")).select("window", pl.col("t").alias("_mt"), pl.col("pos").alias("src"))
        if helper.height and mains.height:
            h = helper.sort("t").join_asof(_sort_rows(mains, ("_mt", "src")), left_on="t", right_on="_mt", by="window",
                                           strategy="backward", check_sortedness=False)
            handoff = h.filter(pl.col("src").is_not_null()).select(
                "src", "dst", pl.lit(0).alias("w"), pl.lit(DEPENDENCY).alias("type"),
                pl.lit(-1).alias("ev")).with_columns(pl.all().cast(pl.Int64))
    del b

    # ---- sync and stream-wait edges, GPU side.
    act = gpu.select("event", "window", "correlation", "pid", "tid", "cpu_ts_ns", "cpu_end_ns", "gpu_ts_ns",
                     "gpu_end_ns", "device", "stream", "queue_empty", "api", "_prev_end_all")
    rt = cpu.filter(pl.col("kind") == "runtime").select("event", "window", "name", "pid", "tid", "ts_ns", "end_ns",
                                                         "correlation")
    del cpu, gpu
    sync_calls, waits, source = _sync_calls(syncs, rt, act, inp.syncs.height > 0)
    if source != "cuda_sync events":
        waits = pl.concat([waits, _inferred_waits(act)])

    # ---- GPU chains per (window, device, stream), kernels by start.
    # (The columns read below; the join keeps the order: one row per event on its right.)
    lg = _sort_rows(act.select("event", "window", "correlation", "pid", "tid", "cpu_ts_ns", "gpu_ts_ns", "gpu_end_ns",
                               "device", "stream", "queue_empty", "_prev_end_all"),
                    ("window", "device", "stream", "gpu_ts_ns", "gpu_end_ns", "event")).lazy().with_columns(
        prev_end=pl.when(_same_group(("window", "device", "stream"))).then(pl.col("gpu_end_ns").shift(1)),
        prev_event=pl.when(_same_group(("window", "device", "stream"))).then(pl.col("event").shift(1)),
    )
    if waits.height:
        lg = lg.join(waits.lazy().select(pl.col("dst").alias("event"), pl.col("src_end").alias("wait_end")).group_by(
            "event").agg(pl.col("wait_end").max()), on="event", how="left", maintain_order="left")
    else:
        lg = lg.with_columns(wait_end=pl.lit(None, pl.Int64))
    w_ok_launch = pl.col("wait_end").is_null() | (pl.col("wait_end") < pl.col("cpu_ts_ns"))
    launch = pl.col("queue_empty") & (pl.col("prev_end").is_null() | (pl.col("prev_end") < pl.col("cpu_ts_ns"))) \
        & w_ok_launch
    # HTA links queued kernels only up to KERNEL_KERNEL_DELAY_THRESHOLD_US apart: a longer
    # gap is not queueing. HTA then leaves the kernel without an edge; it waited for its
    # launch, so it gets the launch edge instead.
    near = (pl.col("gpu_ts_ns") - pl.col("prev_end")) < kk_max_gap_ns
    kk = ~launch & pl.col("prev_end").is_not_null() & near & (
        pl.col("wait_end").is_null() | (pl.col("wait_end") < pl.col("prev_end")))
    launch = launch | (~kk & (pl.col("prev_end").is_null() | ~near) & w_ok_launch & (
        pl.col("_prev_end_all").is_null() | (pl.col("_prev_end_all") < pl.col("cpu_ts_ns"))))
    g = lg.with_columns(_launch=launch, _kk=kk).collect(engine=_ENGINE)
    del act, lg
    # Each activity's start node, then its end node: a start is linked to the previous
    # activity's end by a kernel-kernel edge (when queued behind it) or begins a segment; an
    # end to its start by the activity's duration. (Numbers int32, weights int64.)
    queued: B = g["_kk"].to_numpy()
    gev = _ints(g["event"])
    gwin = _ints(g["window"])
    w_start = _i64(g.select(pl.when(pl.col("_kk")).then((pl.col("gpu_ts_ns") - pl.col("prev_end")).clip(
        lower_bound=0)).otherwise(0)).to_series())
    ev_start = _ints(g.select(pl.when(pl.col("_kk")).then(pl.col("prev_event")).otherwise(-1)).to_series())

    # The graph's arrays: the CPU nodes, then each activity's start and end node.
    nc, ng = cpu_nodes.height, 2 * queued.size
    no = np.zeros(queued.size, dtype=bool)
    nodes: dict[str, npt.NDArray[Any]] = {}
    for col, dtype, at_start, at_end in (
            ("event", np.int32, gev, gev), ("start", np.bool_, ~no, no), ("window", np.int32, gwin, gwin),
            ("seg", np.bool_, ~queued, no), ("link_w", np.int64, w_start, _i64(g["gpu_end_ns"] - g["gpu_ts_ns"])),
            ("link_type", np.int32, np.where(queued, KERNEL_KERNEL, OP), OP), ("link_event", np.int32, ev_start, gev),
            ("link_dl", np.bool_, no, no)):
        out = np.empty(nc + ng, dtype=dtype)
        out[:nc] = cpu_nodes[col].to_numpy()
        out[nc::2], out[nc + 1::2] = at_start, at_end
        nodes[col] = out
    n_gpu_nodes = ng
    del cpu_nodes, gev, gwin, w_start, ev_start, queued, no
    # Each event's start and end node (events are numbered 0 … n − 1 by row, each has both).
    node_event = nodes["event"]
    node_start = nodes["start"]
    start_node = np.empty(events.height, dtype=np.int32)
    end_node = np.empty(events.height, dtype=np.int32)
    start_node[node_event[node_start]] = np.flatnonzero(node_start)
    end_node[node_event[~node_start]] = np.flatnonzero(~node_start)
    del node_start

    def edges(src: I32, dst: I32, w: pl.Series | int, typ: int,
              ev: pl.Series) -> pl.DataFrame:
        return pl.DataFrame({"src": src, "dst": dst, "w": w, "type": typ, "ev": ev}).with_columns(
            pl.all().cast(pl.Int64))

    # ---- cross edges: src node, dst node, weight, type, attributed event.
    parts = []
    le = g.filter(pl.col("_launch")).join(
        rt.select(pl.col("event").alias("rt_event"), "correlation", "pid", "tid"), on=["correlation", "pid", "tid"],
        how="inner")
    del g
    if le.height:
        parts.append(edges(start_node[_ints(le["rt_event"])], start_node[_ints(le["event"])],
                           (le["gpu_ts_ns"] - le["cpu_ts_ns"]).clip(lower_bound=0), LAUNCH, le["rt_event"]))
    del le
    if sync_calls.height:
        # GPU → CPU: the activity's end → the call's end.
        parts.append(edges(end_node[_ints(sync_calls["src_event"])], end_node[_ints(sync_calls["call"])], 0, SYNC,
                           sync_calls["call"]))
    if waits.height:
        parts.append(edges(end_node[_ints(waits["src_event"])], start_node[_ints(waits["dst"])], 0, SYNC,
                           waits["src_event"]))
    if handoff.height:
        parts.append(handoff)
    if parts:
        # (Sorted by source within a destination: which of tied edges into a node the path
        # walks back through must not depend on the other windows in the graph.)
        x = _sort_rows(pl.concat([p.with_columns(pl.all().cast(pl.Int64)) for p in parts]).unique(["src", "dst"]),
                       ("dst", "src"))
    else:
        x = pl.DataFrame(schema={c: pl.Int64 for c in ("src", "dst", "w", "type", "ev")})
    del parts, start_node, end_node

    # A blocking call's wait weighs nothing only where a sync edge explains it; one without
    # (its stream guessed wrong, a copy that returned early) keeps its CPU time (with
    # cpu_gaps; HTA's weights zero it regardless).
    x_src, x_dst, x_type = _ints(x["src"]), _ints(x["dst"]), _ints(x["type"])
    synced = np.zeros(node_event.size, dtype=bool)
    synced[x_dst[x_type == SYNC]] = True
    link_w = nodes["link_w"]
    if unexplained.null_count() < unexplained.len():
        # (Only CPU nodes carry one: the GPU nodes' part is none.)
        pad = np.zeros(n_gpu_nodes, dtype=bool)
        link_w = np.where(np.concatenate([unexplained.is_not_null().to_numpy(), pad]) & ~synced,
                          np.concatenate([_i64(unexplained.fill_null(0)), pad.astype(np.int64)]), link_w)
    del synced, unexplained
    seg_start = nodes["seg"]
    return CPGraph(
        node_event=node_event, node_window=nodes["window"], seg_start=seg_start, link_w=link_w,
        link_type=nodes["link_type"], link_event=nodes["link_event"],
        link_dl=nodes["link_dl"], lead=seg_start & (link_w > 0),
        x_src=x_src, x_dst=x_dst, x_w=_i64(x["w"]), x_type=x_type, x_event=_ints(x["ev"]),
        events=events.drop("window"), sync_source=source, bound_code=bound_code,
    )


def _open_parents(b: pl.DataFrame) -> I64:
    """Per boundary row of ``b`` (``first, kind, depth, event`` in chain order, ``first``
    where a chain begins): at a start that follows an end inside an op (not a top-level
    op's start), the event of the last start before it in its chain at the depth that end
    left (the op open there); -1 elsewhere. One integer key per (chain, depth), ranked, and
    the starts sorted by (key, row): one binary search per row asked."""
    import numpy as np

    n = b.height
    parent = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return parent
    kind = b["kind"].to_numpy()
    depth = b["depth"].cast(pl.Int64).to_numpy()
    # (A chain's rows are contiguous: its number is the running count of first rows.)
    chain = np.cumsum(b["first"].to_numpy()).astype(np.int64)
    d_lo = int(depth.min()) - 1
    span = int(depth.max()) - d_lo + 1
    key = chain * span + (depth - d_lo)
    start = kind == 1
    # The rows asked: a start after an end whose depth is not 0 (a top-level op's start
    # follows a dependency edge instead). Their key: their chain at the depth before them.
    ask = np.flatnonzero(start[1:] & (kind[:-1] == 0) & (depth[:-1] != 0)) + 1
    if not ask.size:
        return parent
    want = chain[ask] * span + (depth[ask - 1] - d_lo)
    opened = np.flatnonzero(start)
    uk, rank = np.unique(key[opened], return_inverse=True)
    comp = rank.astype(np.int64) * (n + 1) + opened
    order = np.argsort(comp)
    comp = comp[order]
    at = np.minimum(np.searchsorted(uk, want), uk.size - 1)
    known = uk[at] == want
    j = np.searchsorted(comp, at * (n + 1) + ask, side="right") - 1
    ok = known & (j >= 0)
    ok[ok] = comp[j[ok]] // (n + 1) == at[ok]
    parent[ask[ok]] = b["event"].cast(pl.Int64).to_numpy()[opened[order[j[ok]]]]
    return parent


def _same_group(by: tuple[str, ...], lag: int = 1) -> pl.Expr:
    """Whether a row's ``by`` equal those ``lag`` rows before (null = null), in a frame sorted by
    ``by``: a ``shift(lag)`` kept where this holds is that shift ``over(by)``, without its
    group-by."""
    return pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(lag)) for c in by])


def _sort_rows(df: pl.DataFrame, by: tuple[str, ...]) -> pl.DataFrame:
    """``df`` sorted by its integer columns ``by`` (ascending, nulls first), rows that tie on
    them kept in their order: numpy's lexsort, several times cheaper than polars' sort on
    several keys of frames this size."""
    import numpy as np

    keys: list[npt.NDArray[Any]] = []
    for c in reversed(by):  # (lexsort's last key is the first)
        col = df[c]
        if col.null_count():
            keys += [col.fill_null(0).to_numpy(), col.is_not_null().to_numpy()]
        else:
            keys.append(col.to_numpy())
    return df[np.lexsort(keys)] if keys and df.height > 1 else df


def _prev_running_max(df: pl.DataFrame, col: str, by: tuple[str, ...]) -> pl.Series:
    """``col``'s ``cum_max().shift(1).over(by)`` in ``df``, sorted by ``by`` (each group's rows
    contiguous): per row, the largest value of its group's rows before it, null at a
    group's first row and after a null (as polars' running maximum is), by one numpy running
    maximum per group instead of a group-by."""
    import numpy as np

    n = df.height
    if n == 0:
        return pl.Series(col, [], dtype=pl.Int64)
    first = df.select(~_same_group(by).alias("f")).to_series().to_numpy().copy()
    first[0] = True
    s = df[col].cast(pl.Int64)
    valid = s.is_not_null().to_numpy()
    acc = s.fill_null(np.iinfo(np.int64).min).to_numpy().copy()
    at = np.r_[np.flatnonzero(first), n].tolist()
    for a, b in zip(at[:-1], at[1:], strict=True):
        np.maximum.accumulate(acc[a:b], out=acc[a:b])
    ok = np.zeros(n, dtype=bool)
    ok[1:] = ~first[1:] & valid[:-1]
    prev = np.zeros(n, dtype=np.int64)
    prev[1:] = acc[:-1]
    return pl.select(pl.when(pl.lit(pl.Series(ok))).then(pl.lit(pl.Series(prev)))).to_series().alias(col)


def _ints(s: pl.Series) -> I32:
    """A column of node, event, window or type numbers as int32 (all far below 2³¹)."""
    import numpy as np

    return s.cast(pl.Int32).to_numpy().astype(np.int32, copy=False)


def _i64(s: pl.Series) -> I64:
    """A column of times or weights (ns) as int64."""
    import numpy as np

    return s.cast(pl.Int64).to_numpy().astype(np.int64, copy=False)


def _inferred_waits(act: pl.DataFrame) -> pl.DataFrame:
    """Cross-stream waits read from the timeline, for traces without ``cuda_sync`` events: an
    activity that starts more than :data:`INFERRED_WAIT_NS` after its launch call ended, on a
    stream with nothing before it, waited for something; where another stream of its device
    finished within :data:`_TOL_NS` before it started (and after the call ended), that is taken
    as what it waited for (a ``cudaStreamWaitEvent`` on another thread, or the device being
    full). Without it the whole wait would read as launch overhead."""
    a = _sort_rows(act.select("window", "device", "stream", "gpu_ts_ns", "gpu_end_ns", "cpu_end_ns", "event"),
                   ("window", "device", "stream", "gpu_ts_ns", "event")).lazy().with_columns(
        _prev_end=pl.when(_same_group(("window", "device", "stream"))).then(pl.col("gpu_end_ns").shift(1)))
    late = a.filter((pl.col("gpu_ts_ns") - pl.col("cpu_end_ns") > INFERRED_WAIT_NS)
                    & (pl.col("_prev_end").is_null() | (pl.col("_prev_end") < pl.col("cpu_end_ns")))).collect(
        engine=_ENGINE)
    empty = pl.DataFrame(schema={"src_event": pl.Int64, "dst": pl.Int64, "src_end": pl.Int64})
    if late.is_empty():
        return empty
    ends = _sort_rows(act.select("window", "device", pl.col("stream").alias("src_stream"),
                                 pl.col("gpu_end_ns").alias("src_end"), pl.col("event").alias("src_event")),
                      ("src_end", "src_event"))
    q = late.select("window", "device", "stream", "cpu_end_ns", pl.col("event").alias("dst"),
                    (pl.col("gpu_ts_ns") + _TOL_NS).alias("_t")).sort("_t")
    # The latest end on the device before the start; another stream's only (a same-stream end
    # is the previous activity, already ruled out).
    m = q.join_asof(ends, left_on="_t", right_on="src_end", by=["window", "device"], strategy="backward",
                    check_sortedness=False)
    m = m.filter(pl.col("src_event").is_not_null() & (pl.col("src_stream") != pl.col("stream"))
                 & (pl.col("src_end") > pl.col("cpu_end_ns")) & (pl.col("_t") - pl.col("src_end") <= 2 * _TOL_NS))
    return m.select("src_event", "dst", "src_end").with_columns(pl.all().cast(pl.Int64)) if m.height else empty


def _dataloader_flags(dl: CoverIndex | None, cpu: pl.DataFrame) -> pl.Series:
    """Per row of ``cpu`` (``pid, tid, ts_ns``): inside a DataLoader range (annotation or op)
    of its thread (``dl``: their cover index, :func:`graph_inputs`)."""
    if dl is None or cpu.is_empty():
        return pl.repeat(False, cpu.height, dtype=pl.Boolean, eager=True).alias("dl")
    return dl.lookup(cpu.select("pid", "tid", "ts_ns"), "ts_ns").is_not_null().alias("dl")


def _sync_calls(syncs: pl.DataFrame, rt: pl.DataFrame, act: pl.DataFrame,
                with_syncs: bool) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    """``(sync edges: src_event → call, wait edges: src_event → dst with src_end, source)``.

    ``rt``: runtime events in the graph; ``act``: GPU activities in the graph; ``with_syncs``:
    the trace has ``cuda_sync`` records (``syncs``: those of the graph's windows)."""
    # A launch row per activity, for "the thread's last launch before t" look-ups. (Ties, the
    # activities clipped to their window's end, broken by event number: the same activity
    # whatever the other windows in the graph.)
    last_cols = ("pid", "tid", "cpu_ts_ns", "event", "gpu_end_ns", "stream", "device", "window")
    first_cols = ("pid", "tid", "cpu_ts_ns", "event", "stream", "window")
    if act["correlation"].n_unique() == act.height:
        # One activity per launch (the usual case): it is both the first and the last.
        both = _sort_rows(act.select(*last_cols), ("cpu_ts_ns", "event"))
        last_act, first_act = both, both.select(first_cols)
    else:
        # (The columns read, projected before the sorts.)
        last_act = act.lazy().select("correlation", *last_cols).sort("gpu_end_ns", "event").unique(
            "correlation", keep="last").drop("correlation").sort("cpu_ts_ns", "event").collect(engine=_ENGINE)
        first_act = act.lazy().select("correlation", "gpu_ts_ns", *first_cols).sort("gpu_ts_ns", "event").unique(
            "correlation", keep="first").select(first_cols).sort("cpu_ts_ns", "event").collect(engine=_ENGINE)
    calls = rt.filter(pl.col("name").is_in(list(_SYNC_CALLS)))
    if with_syncs:
        source = "cuda_sync events"
        # rec_corr / wait_stream: the awaited cudaEventRecord's correlation and the stream it was
        # recorded on (Event Sync, Stream Wait Event), -1 when Kineto did not know it; null in
        # traces that do not carry them (then matched by time below).
        s = syncs.select("name", pl.col("tid").cast(pl.Int64, strict=False).alias("sync_stream"),
                         pl.col("ts_ns").alias("_mid"), pl.col("end_ns").alias("s_end"),
                         pl.col("correlation").alias("_corr"),
                         pl.col("pid").cast(pl.Int64, strict=False).alias("sync_dev"),
                         pl.col("wait_on_cuda_event_record_corr_id").alias("rec_corr"),
                         pl.col("wait_on_stream").alias("wait_stream"))
        cols: list[pl.Expr | str] = [pl.col("event").alias("call"), pl.col("name").alias("api"), "window", "pid",
                                     "tid", "ts_ns", "end_ns"]
        # The sync's runtime call: the one of the same correlation (as HTA); for a record
        # without one, the sync call starting last before it (the record starts inside its call,
        # within a few µs of its start).
        by_corr = s.join(rt.select(*cols, pl.col("correlation").alias("_corr")).filter(
            pl.col("_corr").is_not_null()).unique("_corr", keep="first"), on="_corr", how="inner")
        c = calls.select(*cols).sort("ts_ns", "call")
        by_time = s.join(by_corr.select("_corr"), on="_corr", how="anti").sort("_mid").join_asof(
            c, left_on="_mid", right_on="ts_ns", strategy="backward", check_sortedness=False).filter(
            pl.col("call").is_not_null() & (pl.col("_mid") <= pl.col("end_ns") + _TOL_NS))
        m = pl.concat([by_corr, by_time.select(by_corr.columns)])
        m = m.with_columns(kind=pl.col("name").replace_strict(
            {"Context Sync": "context", "Stream Sync": "stream", "Event Sync": "event",
             "Stream Wait Event": "wait"}, default=None))
    else:
        source = "runtime calls" if calls.height else "none"
        m = calls.select(pl.col("event").alias("call"), pl.col("name").alias("api"), "window", "pid", "tid", "ts_ns",
                         "end_ns").with_columns(
            kind=pl.when(pl.col("api").is_in(list(_DEVICE_SYNC))).then(pl.lit("context"))
            .when(pl.col("api").is_in(list(_STREAM_SYNC))).then(pl.lit("stream"))
            .when(pl.col("api").is_in(list(_EVENT_SYNC))).then(pl.lit("event"))
            .when(pl.col("api").is_in(list(_STREAM_WAIT))).then(pl.lit("wait")).otherwise(None),
            sync_stream=pl.lit(None, pl.Int64), s_end=pl.col("end_ns"), sync_dev=pl.lit(None, pl.Int64),
            rec_corr=pl.lit(None, pl.Int64), wait_stream=pl.lit(None, pl.Int64))
        # A stream sync's stream: that of the thread's last launch before it.
        lastl = last_act.select("pid", "tid", "cpu_ts_ns", pl.col("stream").alias("_ls"))
        m = m.sort("ts_ns").join_asof(lastl, left_on="ts_ns", right_on="cpu_ts_ns", by=["pid", "tid"],
                                      strategy="backward", check_sortedness=False).with_columns(
            sync_stream=pl.when(pl.col("kind") == "stream").then(pl.col("_ls"))).drop("_ls", "cpu_ts_ns")
    m = m.filter(pl.col("kind").is_not_null())
    parts: list[pl.DataFrame] = []
    # Context / stream sync: per stream, the last activity of the window started before the
    # sync ended (HTA sorts syncs by their end among kernels by start) and ended by then.
    cs = m.filter(pl.col("kind").is_in(["context", "stream"]))
    if cs.height and act.height:
        streams = act.select("window", "device", "stream").unique()
        q = cs.join(streams, on="window").filter(
            (pl.col("kind") == "context") | (pl.col("stream") == pl.col("sync_stream")))
        last = _sort_rows(act.select("window", "device", "stream", "gpu_ts_ns", "gpu_end_ns",
                                     pl.col("event").alias("src_event")), ("gpu_ts_ns", "src_event"))
        q = q.sort("s_end").join_asof(last, left_on="s_end", right_on="gpu_ts_ns", by=["window", "device", "stream"],
                                      strategy="backward", check_sortedness=False)
        q = q.filter(pl.col("src_event").is_not_null() & (pl.col("gpu_end_ns") <= pl.col("end_ns") + _TOL_NS))
        parts.append(q.select("src_event", "call"))
    # Event sync / stream wait: the activity launched before the thread's last event record.
    ew = m.filter(pl.col("kind").is_in(["event", "wait"]))
    waits = pl.DataFrame(schema={"src_event": pl.Int64, "dst": pl.Int64, "src_end": pl.Int64})
    if ew.height and act.height:
        src_cols: list[pl.Expr | str] = [pl.col("event").alias("src_event"), "gpu_end_ns",
                                         pl.col("stream").alias("src_stream"), pl.col("window").alias("src_window")]
        # With the cuda_sync record's arguments (as HTA): the awaited event's cudaEventRecord
        # call by correlation, and what it waits for, the activity launched last before that
        # call on the stream the event was recorded on (from any thread). A -1 (an event
        # recorded before the trace began) finds nothing: no edge, as in HTA.
        known = ew.filter(pl.col("rec_corr").is_not_null())
        # (The calls of those correlations only: the first of each is the one kept, the join is inner.)
        q_arg = known.join(rt.select(pl.col("correlation").alias("rec_corr"), pl.col("ts_ns").alias("rec_ts"))
                           .filter(pl.col("rec_corr").is_in(known["rec_corr"].unique().implode()))
                           .unique("rec_corr", keep="first"),
                           on="rec_corr", how="inner")
        q_arg = q_arg.sort("rec_ts").join_asof(
            last_act.select("device", pl.col("stream").alias("wait_stream"), "cpu_ts_ns", *src_cols),
            left_on="rec_ts", right_on="cpu_ts_ns", by_left=["sync_dev", "wait_stream"],
            by_right=["device", "wait_stream"], strategy="backward", check_sortedness=False)
        # Without them: the thread's last event record before the call, and the thread's last
        # launch before that record.
        rec = rt.filter(pl.col("name").is_in(list(_EVENT_RECORD))).select(
            "pid", "tid", pl.col("ts_ns").alias("rec_ts"))
        q = ew.filter(pl.col("rec_corr").is_null()).sort("ts_ns").join_asof(
            rec.sort("rec_ts"), left_on="ts_ns", right_on="rec_ts", by=["pid", "tid"], strategy="backward",
            check_sortedness=False).filter(pl.col("rec_ts").is_not_null())
        q = q.sort("rec_ts").join_asof(
            last_act.select("pid", "tid", "cpu_ts_ns", *src_cols),
            left_on="rec_ts", right_on="cpu_ts_ns", by=["pid", "tid"], strategy="backward", check_sortedness=False,
        )
        q = pl.concat([q.select(q_arg.columns), q_arg]) if q_arg.height else q
        q = q.filter(pl.col("src_event").is_not_null() & (pl.col("src_window") == pl.col("window")))
        ev = q.filter((pl.col("kind") == "event") & (pl.col("gpu_end_ns") <= pl.col("end_ns") + _TOL_NS))
        parts.append(ev.select("src_event", "call"))
        wq = q.filter(pl.col("kind") == "wait")
        if wq.height:
            # The next activity launched from the thread after the wait call: on the waiting
            # stream (the cuda_sync record's) when known, else whatever stream comes next.
            nxt = first_act.select("pid", "tid", pl.col("cpu_ts_ns").alias("n_ts"), pl.col("event").alias("dst"),
                                   pl.col("stream").alias("dst_stream"), pl.col("window").alias("dst_window"))
            has_stream = wq.filter(pl.col("sync_stream").is_not_null() & (pl.col("sync_stream") >= 0))
            no_stream = wq.filter(pl.col("sync_stream").is_null() | (pl.col("sync_stream") < 0))
            got = []
            if has_stream.height:
                got.append(has_stream.sort("end_ns").join_asof(
                    nxt.sort("n_ts", "dst"), left_on="end_ns", right_on="n_ts", by_left=["pid", "tid", "sync_stream"],
                    by_right=["pid", "tid", "dst_stream"], strategy="forward", check_sortedness=False,
                ).with_columns(dst_stream=pl.col("sync_stream")))
            if no_stream.height:
                got.append(no_stream.sort("end_ns").join_asof(
                    nxt.sort("n_ts", "dst"), left_on="end_ns", right_on="n_ts", by=["pid", "tid"], strategy="forward",
                    check_sortedness=False))
            w = pl.concat([x.select("src_event", "gpu_end_ns", "src_stream", "dst", "dst_stream", "dst_window",
                                    "window") for x in got])
            waits = w.filter(pl.col("dst").is_not_null() & (pl.col("dst_window") == pl.col("window"))
                             & (pl.col("dst_stream") != pl.col("src_stream"))).select(
                "src_event", "dst", pl.col("gpu_end_ns").alias("src_end"))
    # A blocking copy call waits for its own copy.
    copies = act.filter(pl.col("api").is_in(list(BLOCKING_CALLS)) & (pl.col("gpu_end_ns") <= pl.col("cpu_end_ns")
                                                                     + _TOL_NS))
    if copies.height:
        cp = copies.join(rt.select(pl.col("event").alias("call"), "correlation", "pid", "tid"),
                         on=["correlation", "pid", "tid"])
        parts.append(cp.select(pl.col("event").alias("src_event"), "call"))
    sync = (pl.concat([p.with_columns(pl.all().cast(pl.Int64)) for p in parts]).unique() if parts
            else pl.DataFrame(schema={"src_event": pl.Int64, "call": pl.Int64}))
    return sync, waits, source


@dataclass(frozen=True)
class LongestPath:
    """The longest path of each window: ``dist`` per node, the path's nodes and edges."""

    dist: I64
    rounds: int
    converged: bool
    window_len: dict[int, int]  # window → path length (ns)
    on_path: B  # per node
    path_links: I64  # node indices i whose chain link (i−1 → i) is on a path
    path_x: I64  # indices of cross edges on a path


def _seg_ids(seg_start: B) -> I64:
    import numpy as np

    return np.cumsum(seg_start).astype(np.int64) - 1


def longest_path(g: CPGraph, link_w: I64 | None = None, x_w: I64 | None = None,
                 max_rounds: int = MAX_ROUNDS) -> LongestPath:
    """The longest path of every window of ``g`` (weights overridable: the what-ifs)."""
    import numpy as np

    n = g.n_nodes
    lw = g.link_w if link_w is None else link_w
    xw = g.x_w if x_w is None else x_w
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return LongestPath(z, 0, True, {}, z.astype(bool), z, z)
    seg, seg_first, seg_end, x_dst_first, x_dst_u = g.chains
    w = np.where(g.seg_start, 0, lw)
    csum = np.cumsum(w)
    prefix = csum - np.repeat(csum[seg_first], seg_end - seg_first)  # P: weights from the segment's first node
    del csum
    # Segmented running maximum: offset each segment far above the previous one so a plain
    # running maximum never carries a value across segments.
    span = int(w.clip(min=0).sum()) + int(xw.clip(min=0).sum() if xw.size else 0) + 1
    del w
    big = np.int64(2 * span + 1)
    # The prefix less the offsets, computed once; where the offsets would overflow,
    # _chain_dist offsets by blocks.
    off = prefix - seg * big if float(big) * float(seg[-1] + 1) < 2.0**62 else None
    # A lead (time from the step start to a thread's first op) is where a path may start with
    # that much behind it: the floor of the node's offer.
    floor = np.where(g.lead, lw, 0)
    offer = floor.copy()
    rounds, converged = 1, True
    dist = _chain_dist(offer, prefix, seg, seg_first, big, off)
    if g.x_dst.size:
        # The rounds read distances only at the cross edges' ends (the "keys"), and run on
        # those nodes alone: a key's distance is P + the running maximum, over the keys before
        # it in its segment, of max(offer − P, S), S being the part no round changes (the
        # running maximum of floor − P over every node: dist − P after the first round). The
        # distances of every node follow once, from the final offers.
        keys, k_src, k_dst, kseg, kseg_first = g.keys
        kp = prefix[keys]
        kfloor = dist[keys]  # S + P
        k_offer = offer[keys]
        k_dist = kfloor
        koff = kp - kseg * big if float(big) * float(kseg[-1] + 1) < 2.0**62 else None
        raised = False
        while True:
            cand = k_dist[k_src] + xw
            best = np.maximum.reduceat(cand, x_dst_first)
            # Offers differ from the floor only at cross-edge destinations: compared and
            # updated there. They only grow (so do the distances they come from).
            new = np.maximum(floor[x_dst_u], best)
            grew = new != offer[x_dst_u]
            if not grew.any():
                break
            offer[x_dst_u[grew]] = new[grew]
            if rounds >= max_rounds:
                # Many chain switches (thousands of syncs in one window): finish with one pass in
                # topological order instead, linear in nodes and edges whatever the depth.
                dist, converged = _topological_dist(g, lw, xw, floor)
                cand = dist[g.x_src] + xw
                offer = floor.copy()
                offer[x_dst_u] = np.maximum(floor[x_dst_u], np.maximum.reduceat(cand, x_dst_first))
                raised = False
                break
            rounds += 1
            raised = True
            k_offer[k_dst[grew]] = new[grew]
            k_dist = _chain_dist(np.maximum(k_offer, kfloor), kp, kseg, kseg_first, big, koff)
        del keys, kp, kfloor, k_offer, k_dist, koff
        if raised:
            del dist  # (the first round's: not held while the last pass runs)
            dist = _chain_dist(offer, prefix, seg, seg_first, big, off)
    del prefix, off, floor
    return _extract(g, dist, offer, lw, xw, rounds, converged)


def _topological_dist(g: CPGraph, lw: I64, xw: I64, floor: I64) -> tuple[I64, bool]:
    """Longest distance to every node by Kahn's algorithm (a Python loop over nodes: the
    fallback of :func:`longest_path` for graphs whose paths switch chains too often for its
    rounds). False when some node is never reached (a cycle)."""
    import numpy as np

    n = g.n_nodes
    chain = ~g.seg_start[1:]  # link i → i + 1
    src = np.concatenate([np.flatnonzero(chain), g.x_src]).astype(np.int64)
    dst = np.concatenate([np.flatnonzero(chain) + 1, g.x_dst]).astype(np.int64)
    wt = np.concatenate([lw[1:][chain], xw]).astype(np.int64)
    order = np.argsort(src, kind="stable")
    src, dst, wt = src[order], dst[order], wt[order]
    starts = np.searchsorted(src, np.arange(n + 1)).tolist()
    indeg = np.bincount(dst, minlength=n).tolist()
    dst_l, wt_l = dst.tolist(), wt.tolist()
    dist = floor.tolist()
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        du = dist[u]
        for k in range(starts[u], starts[u + 1]):
            v = dst_l[k]
            if du + wt_l[k] > dist[v]:
                dist[v] = du + wt_l[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return np.asarray(dist, dtype=np.int64), seen == n


def _chain_dist(offer: I64, prefix: I64, seg: I64, seg_first: I64, big: np.int64, off: I64 | None) -> I64:
    """``dist`` along the chains: ``P[i] + max_{j ≤ i in i's segment}(offer[j] − P[j])``, one
    running maximum over segments offset ``big`` apart (``off``: ``P − seg · big``, so that
    ``dist = off + running max of (offer − off)``), or, where those offsets would overflow,
    over blocks of segments whose offsets fit."""
    import numpy as np

    if off is not None:
        d: I64 = offer - off
        np.maximum.accumulate(d, out=d)
        d += off
        return d
    v = offer - prefix
    m = np.empty_like(v)
    per = max(int(2**62 // int(big)) - 1, 1)  # segments per block
    bounds = np.r_[seg_first[::per], v.size]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        o = (seg[a:b] - seg[a]) * big
        m[a:b] = np.maximum.accumulate(v[a:b] + o) - o
    out: I64 = prefix + m
    return out


def _extract(g: CPGraph, dist: I64, offer: I64, lw: I64, xw: I64, rounds: int, converged: bool) -> LongestPath:
    import numpy as np

    n = dist.size
    # Where along its segment each node's best start lies: the last j ≤ i at which
    # offer[j] − P[j] reached the running maximum, i.e. offer[j] = dist[j]. A segment's first
    # node always qualifies (its distance is its offer), so the last qualifying index never
    # lies in the previous segment. (Qualifying nodes are few: segment starts and the nodes
    # a cross edge raised; the walk looks them up by bisection.)
    starts_at = np.flatnonzero((offer == dist) | g.seg_start).tolist()
    # Best cross edge into each node (the one whose offer won: the first of the largest
    # offers among the edges into it, edges being sorted by destination).
    # (The edges into a node are contiguous: their largest offer per run, then the first
    # edge of each run that has it.)
    cand = dist[g.x_src] + xw if g.x_src.size else np.zeros(0, np.int64)
    best_x = np.full(n, -1, dtype=np.int64)
    if cand.size:
        _, _, _, x_dst_first, x_dst_u = g.chains
        run = g.x_run
        top = np.flatnonzero(cand == np.maximum.reduceat(cand, x_dst_first)[run])
        best_x[x_dst_u] = top[np.r_[True, run[top][1:] != run[top][:-1]]]
    win = g.node_window
    # Each window's path ends at its first node of largest distance (windows in order): a
    # maximum per run of nodes of one window (the chains are grouped by window: few runs),
    # per window, then the first node reaching it in the first run that does.
    run_at, run_end, run_win = g.window_runs
    rmax = np.maximum.reduceat(dist, run_at)
    w0 = int(run_win.min())
    wmax = np.full(int(run_win.max()) - w0 + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(wmax, run_win - w0, rmax)
    top = np.flatnonzero(rmax == wmax[run_win - w0])
    _, first_top = np.unique(run_win[top], return_index=True)
    ends = np.asarray([a + int(np.argmax(dist[a:b] == m)) for a, b, m in zip(
        run_at[top[first_top]].tolist(), run_end[top[first_top]].tolist(), rmax[top[first_top]].tolist(),
        strict=True)], dtype=np.int64)
    window_len: dict[int, int] = {}
    # Path segments [lo, hi) of node indices, in walk order: their nodes are on the path,
    # their chain links (lo's link excluded) too.
    seg_lo: list[int] = []
    seg_hi: list[int] = []
    link_lo: list[int] = []
    link_hi: list[int] = []
    xs: list[int] = []
    for e in ends.tolist():
        window_len[int(win[e])] = int(dist[e])
        i = e
        # One iteration per segment of the path (a chain stretch entered by a cross edge).
        for _ in range(n):
            j = starts_at[bisect.bisect_right(starts_at, i) - 1]
            seg_lo.append(j)
            seg_hi.append(i + 1)
            if i > j:
                link_lo.append(j + 1)
                link_hi.append(i + 1)
            oj = int(offer[j])
            if oj <= 0:
                break
            k = int(best_x[j])
            if k < 0 or int(cand[k]) != oj:
                if g.lead[j] and oj == int(lw[j]):
                    link_lo.append(j)  # the path starts with the lead
                    link_hi.append(j + 1)
                break
            xs.append(k)
            i = int(g.x_src[k])
    mark = np.bincount(np.asarray(seg_lo, dtype=np.int64), minlength=n + 1) - np.bincount(
        np.asarray(seg_hi, dtype=np.int64), minlength=n + 1)
    on_path = np.cumsum(mark[:-1]) > 0
    path_links = _ranges(np.asarray(link_lo, dtype=np.int64), np.asarray(link_hi, dtype=np.int64))
    return LongestPath(dist, rounds, converged, window_len, on_path, path_links, np.asarray(xs, dtype=np.int64))


def _ranges(lo: I64, hi: I64) -> I64:
    """The concatenation of ``arange(lo[k], hi[k])`` over k, in order."""
    import numpy as np

    lens = hi - lo
    total = int(lens.sum()) if lens.size else 0
    if not total:
        return np.zeros(0, np.int64)
    starts = np.cumsum(lens) - lens  # where each range begins in the output
    out: I64 = np.repeat(lo - starts, lens) + np.arange(total, dtype=np.int64)
    return out
