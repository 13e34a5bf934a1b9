"""Relations between events that several analyses need, computed with polars joins.

* :func:`nest` — depth and parent of properly nested intervals on each thread.
* :func:`deepest_at` — for points in time on a thread, the deepest interval that
  covers each point (e.g. "what was the CPU thread doing when this gap began");
  :func:`cover_index` builds its lookup structure once for several point sets.
* :func:`op_index` / :func:`op_top_level` / :func:`launches` / :func:`gpu_activity` — the
  same for ``model.cpu_ops``, and the launch join, built once per run of the analyses
  (:class:`~traceanalyzer.model.derived.DerivedTables`) since several analyses need them:
  they take the run's tables, or a bare model (then nothing is shared).
* :func:`launches` — every runtime/driver call joined by correlation id to the GPU
  activity it caused (one row per pair; a ``cudaGraphLaunch`` yields one row per
  replayed kernel).
* :func:`cpu_context` — the CPU-side intervals of a trace (ops, annotations, Python
  frames) in one frame, the usual input of :func:`deepest_at`.

All of these are vectorised: sorting plus as-of joins, no per-event Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from traceanalyzer.model.derived import DerivedTables
from traceanalyzer.model.trace import TraceModel
from traceanalyzer.timeutil import group_codes, group_numbers

# Runtime/driver calls that enqueue device work. HTA joins only the first few; we
# also count driver launches (Triton), graph launches, memcpy/memset APIs, HIP,
# XPU (Unified Runtime / Level Zero) and MTIA equivalents.
LAUNCH_APIS: frozenset[str] = frozenset(
    {
        "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch",
        "cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpy2DAsync", "cudaMemcpy2D", "cudaMemcpyPeerAsync",
        "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol", "cudaMemsetAsync", "cudaMemset", "cuMemcpyAsync",
        "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemsetD8Async", "cuMemsetD32Async",
        "hipLaunchKernel", "hipExtLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
        "hipLaunchCooperativeKernel", "hipGraphLaunch", "hipMemcpyAsync", "hipMemcpy",
        "hipMemcpyWithStream", "hipMemcpy2DAsync", "hipMemsetAsync", "hipMemset", "hipMemcpyDtoDAsync",
        "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync", "hipExtLaunchMultiKernelMultiDevice",
        "urEnqueueKernelLaunch", "urEnqueueUSMMemcpy", "urEnqueueUSMFill", "urEnqueueMemBufferCopy",
        "urEnqueueMemBufferWrite", "urEnqueueMemBufferRead", "zeCommandListAppendLaunchKernel",
        "zeCommandListAppendMemoryCopy", "zeCommandListAppendMemoryFill",
        # MTIA (the runtime's names; HTA counts runFunction as MTIA's kernel launch)
        "runFunction - job_prep_and_submit_for_execution", "enqueueCommand memcpyHtoDAsync",
        "enqueueCommand memcpyDtoHAsync",
    }
)


def is_launch_api(name: pl.Expr) -> pl.Expr:
    """True for runtime/driver call names that enqueue device work.

    Exact names from :data:`LAUNCH_APIS`, plus any ``*LaunchKernel*`` spelling
    (versioned driver entry points such as ``cuLaunchKernel_ptsz``).
    """
    return name.is_in(list(LAUNCH_APIS)) | name.str.contains("LaunchKernel")


def nest(intervals: pl.DataFrame, by: Sequence[str] = ("pid", "tid")) -> pl.DataFrame:
    """Depth and parent of each interval among the intervals of its group ``by``.

    ``intervals`` needs ``id`` (unique Int64), ``ts_ns``, ``end_ns`` and the ``by``
    columns. Returns ``id, depth, parent_id`` (depth 1 = top level, parent null).
    Intervals are assumed properly nested per thread, as profilers record them; a
    child that overhangs its parent by a rounding error is still placed under the
    interval that was open at its start. Zero-length intervals get depth from their
    position but never become parents.
    """
    by = list(by)
    if intervals.is_empty():
        return pl.DataFrame(schema={"id": pl.Int64, "depth": pl.Int64, "parent_id": pl.Int64})
    return _link_parents(_boundaries(intervals, by), by)


def nest_depth(intervals: pl.DataFrame, by: Sequence[str] = ("pid", "tid")) -> pl.DataFrame:
    """``id, depth`` of :func:`nest` without ``parent_id`` (its as-of join is a third of the cost)."""
    by = list(by)
    if intervals.is_empty():
        return pl.DataFrame(schema={"id": pl.Int64, "depth": pl.Int64})
    return _boundaries(intervals, by).filter(pl.col("kind") == 1).select("id", "depth")


def _link_parents(b: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``id, depth, parent_id`` from the boundary rows of :func:`_boundaries`.

    The parent of a start at depth d is the last earlier start of its group at depth
    d − 1. Where it fits in an Int64, that is one binary search on one sorted key
    ``(group number · depths + depth) · positions + pos`` (an as-of join by group and
    depth hashes every row: the largest transient of a CPU index build)."""
    # The columns, then the rows: a filter copies every column it is given.
    starts = b.select([*by, *_carried(b), "pos", "id", "depth", "kind"]).filter(pl.col("kind") == 1).drop("kind")
    keyed = _link_parents_keyed(starts, by)
    if keyed is not None:
        return keyed
    starts = starts.drop(_carried(starts))
    parents = starts.select([*by, "pos", pl.col("id").alias("parent_id"), pl.col("depth").alias("pdepth")])
    linked = (
        starts.with_columns(pdepth=pl.col("depth") - 1)
        .sort("pos")
        .join_asof(
            parents.sort("pos"),
            on="pos",
            by=[*by, "pdepth"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
    )
    return linked.select("id", "depth", "parent_id")


def _link_parents_keyed(starts: pl.DataFrame, by: list[str]) -> pl.DataFrame | None:
    """:func:`_link_parents` of ``starts`` (start rows in ``pos`` order, groups contiguous)
    by binary search; None when a key column holds nulls or the key would overflow."""
    if starts.is_empty() or any(starts[c].null_count() for c in [*by, "pos", "depth"]):
        return None
    d_min, d_max = int(starts["depth"].min()), int(starts["depth"].max())  # type: ignore[arg-type]
    n_depths = d_max - d_min + 2  # depth − d_min + 1 lies in [1, n_depths − 1]; its parent's one below
    n_pos = int(starts["pos"].max()) + 2  # type: ignore[arg-type]
    g = _group_numbers(starts, by)
    if (int(g.max()) + 1) * n_depths * n_pos >= 2**62:  # type: ignore[arg-type]
        return None
    # Series operations, not one query: as expressions the sorted key was recomputed per use.
    level = g * n_depths + (starts["depth"].cast(pl.Int64) - d_min + 1)
    pos = starts["pos"].cast(pl.Int64)
    key = level * n_pos + pos
    # The rows come in ``pos`` order, so sorting by ``key`` is a stable sort by ``level``
    # alone: few distinct values, a numpy radix sort when they fit 16 bits.
    import numpy as np  # lazy: importing the package does not pay for numpy

    lv = level.to_numpy()
    n_levels = int(lv.max()) + 1
    order = pl.Series(np.argsort(lv.astype(np.int16) if n_levels < 2**15 else lv, kind="stable"))
    keys, ids = key.gather(order), starts["id"].gather(order)
    # The last start one level below with pos <= this pos − 1 (strictly earlier).
    want = level - 1
    at = keys.search_sorted(want * n_pos + pos - 1, side="right").cast(pl.Int64) - 1
    j = at.clip(lower_bound=0)
    found = pl.select(
        pl.when((at >= 0) & (keys.gather(j) // n_pos == want)).then(ids.gather(j)).otherwise(None).alias("parent_id")
    ).to_series()
    return pl.DataFrame([starts["id"], starts["depth"], found.cast(starts.schema["id"])])


def _boundaries(intervals: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Start/end boundary rows in processing order with the depth after each.

    At equal times, ends come before starts (half-open intervals: an interval that
    ends at t does not cover t); among starts the longer first (parent before child);
    among ends the later-started first (child closes before parent); identical intervals
    nest by ``id`` (the lower one outside) and close in reverse. A zero-length
    interval's end comes right after its own start (sorting it with the other ends
    put it before its start: a depth one too low for everything after it on the thread).
    """
    return _numbered(_sorted_boundaries(intervals, by))


def _carried(df: pl.DataFrame) -> list[str]:
    """``["_g"]`` where ``df`` carries the group numbers of :func:`_sort_by_time_key`, else ``[]``."""
    return ["_g"] if "_g" in df.columns else []


def _group_numbers(df: pl.DataFrame, by: list[str]) -> pl.Series:
    """:func:`~traceanalyzer.timeutil.group_numbers` of ``df`` (rows of each group
    contiguous, groups in sorted order): the ``_g`` column that :func:`_sort_by_time_key`
    carries along the boundary rows where ``df`` has it (the same numbers: every group of
    the intervals keeps rows in each table derived from their boundaries), else computed."""
    return df["_g"] if "_g" in df.columns else group_numbers(df, by)


def sorted_boundaries(intervals: pl.DataFrame, by: Sequence[str] = ("pid", "tid")) -> pl.DataFrame:
    """The start and end rows of ``intervals`` (``*by, id, ts_ns, end_ns``, ids unique) in
    nesting order per group: ``*by, id, t, kind`` (1 start, 0 end), ``sec`` (a start's
    −end, an end's −start). At one instant ends come first, starts longer first, ends of
    later-started intervals first; identical intervals nest by ``id`` (see
    :func:`_boundaries`). Sorted by one Int64 key where it fits."""
    b = _sorted_boundaries(intervals, list(by))
    return b.drop(_carried(b))


def _sorted_boundaries(intervals: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The boundary rows of :func:`_boundaries` in order, without ``pos``/``depth``. The
    order is total (ids are unique), so the boundaries of a subset of the intervals are
    these rows filtered to the subset. Sorted by the Int64 key, the rows also carry ``_g``,
    the number of their ``by`` group in sorted order (Int64), for the steps after the sort."""
    iv = intervals.select([*by, "id", "ts_ns", "end_ns"]).with_columns(
        end_ns=pl.max_horizontal("end_ns", "ts_ns")
    )
    fast = _sort_by_time_key(iv, by)
    if fast is not None:
        return fast
    starts = iv.select([*by, "id", pl.col("ts_ns").alias("t"), pl.lit(1, pl.Int8).alias("kind"),
                        (-pl.col("end_ns")).alias("sec")])
    ends = iv.select([*by, "id", pl.col("end_ns").alias("t"), pl.lit(0, pl.Int8).alias("kind"),
                      (-pl.col("ts_ns")).alias("sec")])
    return _sort_boundary_rows(pl.concat([starts, ends]), by)


def _sort_boundary_rows(b: pl.DataFrame, by: list[str], lead: Sequence[str] = ()) -> pl.DataFrame:
    """``b`` (boundary rows: ``*by, id, t, kind, sec``) sorted by ``lead``, then in the
    order of :func:`_boundaries`: ``(*by, t)``; ends of positive-length intervals
    (``t ≠ −sec``), later-started first and, among identical intervals, the higher ``id``
    first (it is the child: its start came later); then starts and zero-length ends by
    ``sec`` (longer first), ``id``, start before end."""
    rank = (pl.col("kind") == 1) | (pl.col("t") == -pl.col("sec"))
    b = b.with_columns(rank.alias("_rank")).with_columns(
        _oid=pl.when(pl.col("_rank")).then(pl.col("id").cast(pl.Int64)).otherwise(-pl.col("id").cast(pl.Int64))
    )
    keys = [*lead, *by, "t", "_rank", "sec", "_oid", "kind"]
    return b.sort(keys, descending=[False] * (len(keys) - 1) + [True]).drop("_rank", "_oid")


def _sort_by_time_key(iv: pl.DataFrame, by: list[str]) -> pl.DataFrame | None:
    """The sorted boundary rows of ``iv`` (``*by, id, ts_ns, end_ns``, ``end_ns ≥
    ts_ns``) by one Int64 key ``group rank · span + (t − t_min)`` (one column to sort instead
    of six), the rows that tie on it (same thread and
    instant: few at ns resolution) then sorted by every key in place. Each column of the
    result is gathered straight from ``iv`` (row ``i < n`` is the start of interval ``i``,
    row ``n + i`` its end): the unsorted 2n boundary rows are never built. None when the
    key would overflow or a key column holds nulls (the caller sorts the rows).

    The key is sorted by numpy's stable sort (a merge of runs): a trace's starts and ends
    are each nearly sorted per thread, which it exploits and a general sort does not."""
    import numpy as np  # lazy: importing the package does not pay for numpy

    n = iv.height
    if n == 0 or any(iv[c].null_count() for c in [*by, "id", "ts_ns", "end_ns"]):
        return None
    t_min, t_max = int(iv["ts_ns"].min()), int(iv["end_ns"].max())  # type: ignore[arg-type]
    span = t_max - t_min + 1
    ts = iv["ts_ns"].cast(pl.Int64).to_numpy()
    en = iv["end_ns"].cast(pl.Int64).to_numpy()
    if by:
        coded = group_codes(iv, by)
        if coded is None:  # e.g. string columns: number the groups by a join
            groups = iv.select(by).unique().sort(by).with_row_index("_g").with_columns(pl.col("_g").cast(pl.Int64))
            coded = (iv.select(by).join(groups, on=by, how="left", maintain_order="left")["_g"].to_numpy(),
                     groups.height)
        codes, n_groups = coded
        if n_groups * span >= 2**62:
            return None
        g = codes * span - t_min
    else:
        if span >= 2**62:
            return None
        g = np.full(n, -t_min, dtype=np.int64)
    key = np.concatenate([g + ts, g + en])
    del g
    order = np.argsort(key, kind="stable")
    k = key[order]
    del key
    eq = k[1:] == k[:-1]
    tied = np.zeros(k.shape[0], dtype=bool)
    tied[1:] |= eq
    tied[:-1] |= eq
    del eq
    if tied.any():
        # Tied rows sit in contiguous blocks of equal key: sorting them by (key, …) keeps
        # each block at its place and orders it by the remaining keys. Only the order is
        # fixed (one column), before any column is gathered with it.
        at = np.flatnonzero(tied)
        o = order[at]
        end, s = o >= n, o % n
        rows = pl.DataFrame(
            {
                "_k": k[at],
                "t": np.where(end, en[s], ts[s]),
                "kind": (~end).astype(np.int8),
                "sec": np.where(end, -ts[s], -en[s]),
                "id": iv["id"].gather(s),
                "_o": o,
            }
        )
        order[at] = _sort_boundary_rows(rows, [], lead=["_k"])["_o"].to_numpy()
    del tied
    is_end = order >= n
    src = order % n
    del order
    at_src = pl.Series(src)
    cs = codes[src] if by else np.zeros(src.shape[0], dtype=np.int64)
    # The time is the sorted key less its group's offset (a tie reorders rows of one key
    # only), and the other end of the interval is its start + end less the time: a start's
    # sec is −end, an end's −start (exact in Int64 arithmetic, which wraps, as two gathers
    # of both ends and a choice were).
    t = k - cs * span + t_min
    del k
    sec = t - (ts + en)[src]
    return pl.DataFrame(
        [iv[c].gather(at_src) for c in [*by, "id"]]
        + [
            pl.Series("_g", cs, dtype=pl.Int64),
            pl.Series("t", t, dtype=pl.Int64),
            pl.Series("kind", (~is_end).astype(np.int8), dtype=pl.Int8),
            pl.Series("sec", sec, dtype=pl.Int64),
        ]
    )


def _numbered(b: pl.DataFrame) -> pl.DataFrame:
    """Add ``pos`` (row number) and ``depth`` (open intervals after the row) to sorted boundaries."""
    delta = pl.when(pl.col("kind") == 1).then(1).otherwise(-1)
    # A plain running sum is the per-group one: the rows of a group are contiguous and
    # each group holds as many ends as starts, so the sum is back to 0 where the next
    # group begins (a window over ``by`` cost as much as the sort).
    return b.with_columns(pos=pl.int_range(pl.len(), dtype=pl.Int64), depth=delta.cum_sum())


@dataclass(frozen=True)
class CoverIndex:
    """What covers each instant of a set of intervals, for :func:`deepest_at` lookups.

    ``state``: ``*by, t, current`` sorted by ``(*by, t)``; ``current`` is the ``id`` of
    the deepest interval covering ``[t, next t)`` of that group (null: nothing). Build it
    once with :func:`cover_index` and look up as many point sets as needed with
    :meth:`lookup` (building is most of a :func:`deepest_at` call).

    Where it fits in an Int64, the state is held as one sorted key per row instead,
    ``key = group number · span + (t − t_min)`` (``groups``: the ``by`` values in
    order, with their number ``_g``), plus one null row after each group's last time:
    16 bytes a row instead of 32 with two ``by`` columns, and a lookup is one binary
    search per point (no sort of the points, no as-of join by group).
    """

    state: pl.DataFrame
    by: tuple[str, ...]
    groups: pl.DataFrame | None = None  # *by, _g; None: state keeps *by, t
    t_min: int = 0
    t_max: int = 0
    span: int = 0

    def lookup(self, points: pl.DataFrame, point_col: str = "ts_ns") -> pl.Series:
        """The ``id`` of the deepest interval covering each row of ``points`` (``*by,
        point_col``): an Int64 series aligned with ``points``, null where nothing covers."""
        by = list(self.by)
        if self.state.is_empty() or points.is_empty():
            return pl.Series("id", [None] * points.height, dtype=pl.Int64)
        if self.groups is not None:
            return self._lookup_keyed(points, point_col)
        casted = {c: self.state.schema[c] for c in by}
        p = points.select([pl.col(c).cast(casted[c]) for c in by] + [pl.col(point_col).alias("t")]).with_row_index(
            "_row"
        )
        joined = p.sort("t").join_asof(
            self.state, on="t", by=by or None, strategy="backward", check_sortedness=False
        ).sort("_row")
        return joined["current"].alias("id")

    def _lookup_keyed(self, points: pl.DataFrame, point_col: str) -> pl.Series:
        assert self.groups is not None
        by = list(self.by)
        t = pl.col(point_col)
        if by:
            pb = points.select([pl.col(c).cast(self.groups.schema[c]) for c in by])
            g = self._group_of(pb, by)
            if g is None:
                g = pb.join(self.groups, on=by, how="left", maintain_order="left")["_g"]
        else:
            g = pl.zeros(points.height, dtype=pl.Int64, eager=True)
        # A point after every time of the index reads its group's last state (clipped to
        # t_max, so it stays inside the group's key range); one before every time, or of a
        # group without intervals, or with a null time, gets key -1: nothing covers it.
        key = points.select(
            pl.when(t.is_not_null() & (t >= self.t_min) & pl.lit(g).is_not_null())
            .then(pl.lit(g) * self.span + (t.clip(upper_bound=self.t_max) - self.t_min))
            .otherwise(-1)
            .cast(pl.Int64)
        ).to_series()
        keys, current = self.state["key"], self.state["current"]
        pos = keys.search_sorted(key, side="right").cast(pl.Int64) - 1
        at = pos.clip(lower_bound=0)
        return (
            pl.select(pl.when(pos >= 0).then(current.gather(at)).otherwise(None).cast(pl.Int64).alias("id"))
            .to_series()
        )

    def _group_of(self, pb: pl.DataFrame, by: list[str]) -> pl.Series | None:
        """The group number ``_g`` of each row of ``pb`` (the points' ``by`` columns), null
        where no group of the index has its values: the index's groups and the points
        numbered together (:func:`group_codes`), a lookup table from those numbers to
        ``_g`` (no hash join of the points). None where the columns cannot be numbered
        that way (nulls, non-integers, overflow): the caller joins."""
        import numpy as np  # lazy: importing the package does not pay for numpy

        assert self.groups is not None
        n_groups = self.groups.height
        coded = group_codes(pl.concat([self.groups.select(by), pb]), by)
        if coded is None:
            return None
        codes, n = coded
        lut = np.full(n, -1, dtype=np.int64)
        lut[codes[:n_groups]] = self.groups["_g"].cast(pl.Int64).to_numpy()
        g = pl.Series("_g", lut[codes[n_groups:]], dtype=pl.Int64)
        return pl.select(pl.when(pl.lit(g) >= 0).then(pl.lit(g)).alias("_g")).to_series()


def _keyed_index(state: pl.DataFrame, by: list[str]) -> CoverIndex:
    """The :class:`CoverIndex` of ``state`` (``*by, t, current`` sorted by ``(*by, t)``),
    keyed by one Int64 where that fits (see the class)."""
    keys = [*by, "t"]
    if state.is_empty() or any(state[c].null_count() for c in keys):
        return CoverIndex(state.drop(_carried(state)), tuple(by))
    t_min, t_max = int(state["t"].min()), int(state["t"].max())  # type: ignore[arg-type]
    # One spare instant after t_max per group holds its closing null row.
    span = t_max - t_min + 2
    g = _group_numbers(state, by)
    if by:
        # The rows of a group are contiguous: its first row is where the number changes (no hash).
        groups = state.select(*by, g).filter(pl.col("_g").ne_missing(pl.col("_g").shift(1)))
    else:
        groups = pl.DataFrame({"_g": [0]}, schema={"_g": pl.Int64})
    n_groups = groups.height
    if n_groups * span >= 2**62:
        return CoverIndex(state.drop(_carried(state)), tuple(by))
    key = g * span + (state["t"] - t_min)
    closing = pl.DataFrame(
        {
            "key": pl.int_range(n_groups, eager=True, dtype=pl.Int64) * span + (span - 1),
            "current": pl.Series([None] * n_groups, dtype=state.schema["current"]),
        }
    )
    body = pl.DataFrame({"key": key, "current": state["current"]})
    keyed = body.merge_sorted(closing, key="key")  # both sorted: a merge, not a sort
    return CoverIndex(keyed, tuple(by), groups, t_min, t_max, span)


def cover_index(intervals: pl.DataFrame, by: Sequence[str] = ("pid", "tid")) -> CoverIndex:
    """The :class:`CoverIndex` of ``intervals`` (``id, ts_ns, end_ns`` + ``by``).

    An interval ``[ts, end)`` covers t when ts ≤ t < end (zero-length intervals cover
    nothing); see :func:`deepest_at`.
    """
    return nest_with_index(intervals.filter(pl.col("end_ns") > pl.col("ts_ns")), by)[1]


def nest_with_index(
    intervals: pl.DataFrame, by: Sequence[str] = ("pid", "tid")
) -> tuple[pl.DataFrame, CoverIndex]:
    """:func:`nest` and :func:`cover_index` of the same ``intervals`` from one sort of their
    boundaries. ``intervals`` must have positive lengths (``end_ns > ts_ns``), as
    :func:`cover_index` keeps only those."""
    by = list(by)
    empty = pl.DataFrame(schema={**{c: intervals.schema.get(c, pl.Int64) for c in by}, "t": pl.Int64,
                                 "current": pl.Int64})  # lookups on an empty index: all null
    no_links = pl.DataFrame(schema={"id": pl.Int64, "depth": pl.Int64, "parent_id": pl.Int64})
    if intervals.is_empty():
        return no_links, CoverIndex(empty, tuple(by))
    return _nest_and_index(_boundaries(intervals, by), by)


def _nest_and_index(b: pl.DataFrame, by: list[str]) -> tuple[pl.DataFrame, CoverIndex]:
    """The second half of :func:`nest_with_index`, from numbered boundaries (non-empty)."""
    # The parents come from the same boundary rows (computing them anew via nest()
    # sorted the boundaries a second time: half of this function's cost).
    links = _link_parents(b, by)
    parent = by_id(b["id"], links["id"], links["parent_id"].cast(pl.Int64))
    # After a start the interval itself is the deepest; after an end, its parent.
    b = b.select(*by, *_carried(b), "t", current=pl.when(pl.col("kind") == 1).then(pl.col("id")).otherwise(parent))
    del parent
    # The state after all boundaries at one instant is what covers that instant: the
    # last boundary row of each (by, t), ``b`` being sorted by them (a filter, not a
    # group_by and a second sort). The carried group number stands for the ``by`` columns
    # (one comparison instead of one per column).
    keys = [*(_carried(b) or by), "t"]
    last_at_instant = pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(-1)) for k in keys])
    return links, _keyed_index(b.filter(last_at_instant), by)


def _row_of(ids: pl.Series, table_ids: pl.Series) -> pl.Series | None:
    """The row number (Int64) in ``table_ids`` (unique) of each of ``ids``; null where none is
    (or the id is null). None where the keys are not both integers (or are UInt64, or the
    table holds a null id): the caller joins.

    * The table's ids are its row numbers (0, 1, …, as the ids of :func:`nest`,
      :func:`cpu_context` and the CPU tree are): the ids themselves.
    * Small non-negative ids: a scatter of the row numbers into a dense array and a gather.
    * Other integers (correlation ids): one numpy binary search on the table's keys, sorted
      once; about a third of a hash join."""
    if (not ids.dtype.is_integer() or not table_ids.dtype.is_integer() or pl.UInt64 in (ids.dtype, table_ids.dtype)
            or table_ids.null_count()):
        return None
    n = table_ids.len()
    if not n or ids.null_count() == ids.len():
        return pl.Series(values=[None] * ids.len(), dtype=pl.Int64)
    ids = ids.cast(pl.Int64)
    if table_ids[0] == 0 and table_ids[-1] == n - 1 and (n == 1 or bool((table_ids.diff(null_behavior="drop") == 1)
                                                                        .all())):
        return pl.select(pl.when(ids.is_between(0, n - 1)).then(ids)).to_series()
    lo, hi = min(int(table_ids.min()), int(ids.min())), max(int(table_ids.max()), int(ids.max()))  # type: ignore[arg-type]
    if lo >= 0 and hi < 4 * (n + ids.len()) + 1024:
        dense = pl.repeat(None, hi + 1, dtype=pl.Int64, eager=True)
        return dense.scatter(table_ids, pl.int_range(n, dtype=pl.Int64, eager=True)).gather(ids)
    import numpy as np  # lazy: importing the package does not pay for numpy

    keys = table_ids.cast(pl.Int64).to_numpy()
    order = None if bool(np.all(keys[1:] >= keys[:-1])) else np.argsort(keys, kind="stable")
    if order is not None:
        keys = keys[order]
    q = ids.fill_null(0).to_numpy()
    at = np.minimum(np.searchsorted(keys, q), n - 1)
    hit = keys[at] == q
    if ids.null_count():
        hit &= ids.is_not_null().to_numpy()
    rows = pl.Series(at if order is None else order[at], dtype=pl.Int64)
    return rows if hit.all() else pl.select(pl.when(pl.lit(pl.Series(hit))).then(pl.lit(rows))).to_series()


def by_id(ids: pl.Series, table_ids: pl.Series, values: pl.Series) -> pl.Series:
    """``values`` of the row of ``table_ids`` (unique) equal to each of ``ids``; null where
    none is (or ``ids`` is null): a left join of ``ids`` on the table, aligned with ``ids``.
    Integer ids are looked up by row number (:func:`_row_of`): a hash join of millions of
    rows on ``id`` was 30 % of a CPU index build."""
    rows = _row_of(ids, table_ids)
    if rows is not None:
        return values.gather(rows).alias(values.name)
    table = pl.DataFrame({"_id": table_ids, "_v": values})
    joined = ids.cast(table_ids.dtype).to_frame("_id").join(table, on="_id", how="left", maintain_order="left")
    return joined["_v"].alias(values.name)


def join_unique(left: pl.DataFrame, right: pl.DataFrame, on: str, right_on: str | None = None) -> pl.DataFrame:
    """``left.join(right, left_on=on, right_on=right_on or on, how="left",
    maintain_order="left")`` where ``right``'s key holds each value at most once (the caller
    guarantees it: the first runtime call of each correlation id, :func:`launch_calls`,
    ``runtime_by_correlation``): each left row's match by row number (:func:`_row_of`), then
    right's other columns gathered. An empty frame or a column name on both sides take the join."""
    r_on = right_on or on
    rest = [c for c in right.columns if c != r_on]
    if not rest:
        return left
    rows = None if left.is_empty() or set(rest) & set(left.columns) else _row_of(left[on], right[r_on])
    if rows is None:
        return left.join(right, left_on=on, right_on=r_on, how="left", maintain_order="left")
    return left.hstack(right.select(pl.col(rest).gather(rows)).get_columns())


def deepest_at(
    intervals: pl.DataFrame,
    points: pl.DataFrame,
    by: Sequence[str] = ("pid", "tid"),
    point_col: str = "ts_ns",
) -> pl.Series:
    """For each row of ``points``, the ``id`` of the deepest interval covering it.

    ``intervals``: ``id, ts_ns, end_ns`` + ``by``; ``points``: ``point_col`` + ``by``.
    An interval ``[ts, end)`` covers t when ts ≤ t < end. Returns an Int64 series
    aligned with ``points`` (null where nothing covers the point). Several point sets
    against one interval set: build :func:`cover_index` once and call its ``lookup``.
    """
    if intervals.is_empty() or points.is_empty():
        return pl.Series("id", [None] * points.height, dtype=pl.Int64)
    return cover_index(intervals, by).lookup(points, point_col)


def cpu_context(model: TraceModel, include_python: bool = True) -> pl.DataFrame:
    """CPU-side intervals (cpu ops, user annotations, optionally Python frames).

    Columns: ``id`` (unique across the frame), ``source`` (``cpu_op`` /
    ``annotation`` / ``python``), ``name, ts_ns, end_ns, pid, tid``.
    """
    cols = ["name", "ts_ns", "end_ns", "pid", "tid"]
    parts = [
        model.cpu_ops.select(cols).with_columns(source=pl.lit("cpu_op")),
        model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#"))
        .select(cols)
        .with_columns(source=pl.lit("annotation")),
    ]
    if include_python:
        parts.append(model.python_frames.select(cols).with_columns(source=pl.lit("python")))
    return pl.concat(parts).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))


#: The shared derived tables of a trace's run (:mod:`traceanalyzer.model.derived`).
TraceTables = DerivedTables[TraceModel]


def trace_tables(src: TraceModel | TraceTables) -> TraceTables:
    """``src`` when it is a run's tables, else fresh tables of the bare model ``src``."""
    return src if isinstance(src, DerivedTables) else DerivedTables(src)


def gpu_activity(src: TraceModel | TraceTables) -> pl.DataFrame:
    """``model.gpu_activity()``, built once per run (read-only)."""
    t = trace_tables(src)
    return t.get("gpu_activity", t.model.gpu_activity)


def op_index(src: TraceModel | TraceTables) -> CoverIndex:
    """:func:`cover_index` of ``model.cpu_ops`` on (pid, tid), ``id`` = the op's row number
    in ``model.cpu_ops``: the launching/enclosing CPU op of any point (built once per run)."""
    return _op_nesting(trace_tables(src))


def annotation_index(src: TraceModel | TraceTables) -> tuple[pl.DataFrame, CoverIndex]:
    """User annotations but ``ProfilerStep#``: ``id, name`` (``id`` = row number among them)
    and their :func:`cover_index` on (pid, tid), the innermost annotation around any point
    (built once per run)."""
    t = trace_tables(src)

    def build() -> tuple[pl.DataFrame, CoverIndex]:
        anns = t.model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#")).select(
            "name", "pid", "tid", "ts_ns", "end_ns"
        ).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        return anns.select("id", "name"), cover_index(anns.select("id", "ts_ns", "end_ns", "pid", "tid"))

    return t.get("annotation_index", build)


def op_top_level(src: TraceModel | TraceTables) -> pl.Series:
    """Boolean per row of ``model.cpu_ops``: True where the op is top level on its (pid, tid),
    i.e. :func:`nest_depth` would give it depth 1: no other op of the thread is open at its
    start. Ops open at an instant are those of positive length started before it and ending
    after it; at a shared start the longer op, then the lower row, is the outer one; a
    zero-length op covers nothing (built once per run).

    One sort by (thread, start, longer first, row) and a running maximum of ends. Where
    :func:`op_index` is built first (``phases`` builds it before anything else), the flags
    come from its nesting instead (depth 1), and this sort is not needed at all
    (:func:`_top_level_from_nesting`)."""
    t = trace_tables(src)

    def build() -> pl.Series:
        ops = t.model.cpu_ops
        if ops.is_empty():
            return pl.Series("top_level", [], dtype=pl.Boolean)
        iv = ops.select(
            "pid", "tid", "ts_ns", pl.max_horizontal("end_ns", "ts_ns").alias("end_ns")
        ).with_row_index("_row")
        s = iv.sort(["pid", "tid", "ts_ns", "end_ns", "_row"], descending=[False, False, False, True, False])
        s = s.with_columns(group_numbers(s, ["pid", "tid"]))
        prev_end = pl.col("end_ns").cum_max().shift(1).over("_g")
        top = s.select(prev_end.is_null() | (prev_end <= pl.col("ts_ns")) | pl.col("ts_ns").is_null())
        out = pl.repeat(False, ops.height, dtype=pl.Boolean, eager=True)
        return out.scatter(s["_row"], top.to_series()).alias("top_level")

    return t.get("op_top_level", build)


def launch_calls(model: TraceModel) -> pl.DataFrame:
    """``correlation, pid, tid, ts_ns`` of the first runtime call (in file order) of each
    correlation id: where GPU work was launched from. The four columns are selected before
    the filter, which copies every column it is given (call names are long strings)."""
    # A filter on the first occurrence: the same rows, in file order, as unique(keep="first",
    # maintain_order=True), without its group table (about four times faster).
    corr = pl.col("correlation")
    return model.runtime.select("correlation", "pid", "tid", "ts_ns").filter(
        corr.is_not_null() & corr.is_first_distinct())


def _op_intervals(model: TraceModel) -> pl.DataFrame:
    """The CPU ops as ``id`` (row number), ``pid, tid, ts_ns, end_ns``: what the op nesting
    and its links are built from."""
    return model.cpu_ops.select("pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(
        pl.col("id").cast(pl.Int64)
    )


def _op_nesting(t: TraceTables) -> CoverIndex:
    def build() -> CoverIndex:
        ivs = _op_intervals(t.model)
        links, index = nest_with_index(ivs.filter(pl.col("end_ns") > pl.col("ts_ns")), ["pid", "tid"])
        # The nesting's depths are what op_top_level computes with a sort of its own:
        # handed over now, they save that sort.
        top = _top_level_from_nesting(ivs, links)
        if top is not None:
            t.get("op_top_level", lambda: top)
        # The links themselves are kept only for an analysis of this run that declares them.
        if t.wanted("op_links"):
            t.get("op_links", lambda: links)
        return index

    return t.get("op_nesting", build)


def op_links(src: TraceModel | TraceTables) -> pl.DataFrame:
    """:func:`nest` of the positive-length ops of ``model.cpu_ops`` on (pid, tid), ``id`` =
    the op's row number: ``id, depth, parent_id`` (built once per run, with :func:`op_index`,
    from the same sort of the boundaries)."""
    t = trace_tables(src)

    def build() -> pl.DataFrame:
        ivs = _op_intervals(t.model)
        return nest(ivs.filter(pl.col("end_ns") > pl.col("ts_ns")), ["pid", "tid"])

    if "op_nesting" not in t.held() and "op_links" not in t.held() and t.wanted("op_nesting"):
        _op_nesting(t)  # builds both from one sort, while the index is wanted anyway
    return t.get("op_links", build)


def _top_level_from_nesting(ivs: pl.DataFrame, links: pl.DataFrame) -> pl.Series | None:
    """:func:`op_top_level` of the ops ``ivs`` (``id`` = row number) from the nesting of
    their positive-length ones (``links``): top level is depth 1. None where some op has
    zero length or a null time: the nesting does not place those (the cover index would
    answer for them only where the ops nest properly), so op_top_level sorts."""
    if links.height != ivs.height:
        return None
    flag = pl.repeat(False, ivs.height, dtype=pl.Boolean, eager=True)
    return flag.scatter(links["id"], links["depth"] == 1).alias("top_level")


def launches(src: TraceModel | TraceTables) -> pl.DataFrame:
    """Runtime/driver calls joined to the GPU activity they enqueued (built once per run).

    One row per (call, GPU activity) pair matched on ``correlation``; calls with no
    GPU activity (syncs, event records, or a launch whose kernel was not captured)
    are kept with null GPU columns. Columns:

    ``api, api_cat, cpu_ts_ns, cpu_dur_ns, cpu_end_ns, pid, tid, correlation,
    external_id, is_launch`` and ``gpu_name, activity, gpu_ts_ns, gpu_dur_ns,
    gpu_end_ns, device, stream, launch_delay_ns`` (GPU start − call start).
    """
    t = trace_tables(src)
    return t.get("launches", lambda: _launches(t))


def _launches(t: TraceTables) -> pl.DataFrame:
    # The call names repeat (a handful of distinct APIs over every call): the test runs on
    # the distinct names, each row is a membership test (half of this join's cost otherwise).
    names = t.model.runtime["name"].unique()
    launch_names = names.filter(pl.select(is_launch_api(pl.lit(names))).to_series().fill_null(False))
    rt = t.model.runtime.select(
        pl.col("name").alias("api"),
        pl.col("cat").alias("api_cat"),
        pl.col("ts_ns").alias("cpu_ts_ns"),
        pl.col("dur_ns").alias("cpu_dur_ns"),
        pl.col("end_ns").alias("cpu_end_ns"),
        "pid",
        "tid",
        "correlation",
        "external_id",
    ).with_columns(is_launch=pl.col("api").is_in(launch_names.implode()))
    gpu = gpu_activity(t).select(
        pl.col("name").alias("gpu_name"),
        "activity",
        pl.col("ts_ns").alias("gpu_ts_ns"),
        pl.col("dur_ns").alias("gpu_dur_ns"),
        pl.col("end_ns").alias("gpu_end_ns"),
        "device",
        "stream",
        "correlation",
    ).filter(pl.col("correlation").is_not_null())
    joined = rt.join(gpu, on="correlation", how="left", nulls_equal=False)
    return joined.with_columns(launch_delay_ns=pl.col("gpu_ts_ns") - pl.col("cpu_ts_ns"))
