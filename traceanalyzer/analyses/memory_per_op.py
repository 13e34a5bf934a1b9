"""Memory per operator and the memory curve of each step, from a trace's ``[memory]`` events
(TensorBoard's memory view; ``profile_memory=True``).

Definitions
-----------
* Each ``[memory]`` event (an allocation, ``bytes`` > 0, or a free, ``bytes`` < 0, on one
  device; ``total_allocated`` = the device's allocated bytes after it) belongs to the deepest
  CPU op running on its thread at that instant (**self**), and to every op enclosing that one
  (**total**). Events outside every op are left out of the per-op numbers.
* Per (op name, device), over the op's calls: ``alloc_count``/``alloc_bytes`` and
  ``free_count``/``free_bytes`` (bytes freed, positive) self and total (``total_…``);
  ``increase_bytes`` = allocated − freed, self (``self_increase_bytes``) and total
  (``total_increase_bytes``): what the op leaves allocated when it returns (its outputs,
  or a leak); ``calls``: calls with at least one event of the device.
* ``peak_increase_bytes``: per call, the highest ``total_allocated`` among the events of the call
  (its own and its nested ops') less the device's allocated bytes just before the call
  started; the largest over the calls. It is how far the op raises the device's memory at its
  worst: what it adds to a peak, temporaries included.
* ``curve``: per (device, step window), the allocated and reserved bytes over the step in
  ``memory_per_op.curve_points`` (50) equal slices of the window: the highest value in each
  slice (the last value before it where no event falls in it); ``t_ns``: the slice's start as
  an offset from the window's start.
* Tables keep the ``memory_per_op.top_n`` (30) ops with the largest total allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memevents import memory_ops
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import op_links

if TYPE_CHECKING:  # numpy is imported when the analysis runs, not when the CLI discovers it
    import numpy as np

_SUMS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes")
_NO_PEAK = -(2**63)  # int64's minimum; a null total_allocated: below every value, never the max
CURVE_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "device": pl.String, "window": pl.Int64, "step": pl.Int64, "point": pl.Int64, "t_ns": pl.Int64,
    "allocated_bytes": pl.Int64, "reserved_bytes": pl.Int64,
}


@dataclass(frozen=True)
class MemoryPerOpResult:
    """Allocations per operator and the memory curve per step. See the module docstring."""

    by_op: pl.DataFrame
    curve: pl.DataFrame  # CURVE_SCHEMA
    n_events: int
    n_outside_ops: int  # events on no op's span
    top_n: int

    def to_json(self) -> dict[str, Any]:
        return {"n_events": self.n_events, "n_outside_ops": self.n_outside_ops,
                "by_op": self.by_op.head(self.top_n).to_dicts(), "curve": self.curve.to_dicts()}

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        out = []
        for dev in sorted(set(self.by_op["device"].to_list())):
            d = self.by_op.filter(pl.col("device") == dev)
            top = d.sort(["peak_increase_bytes", "name"], descending=[True, False]).row(0, named=True)
            if top["peak_increase_bytes"] > 0:
                out.append((f"{dev}: op raising memory most",
                            f"{top['name']} (+{fmt_bytes(top['peak_increase_bytes'])} at its peak, "
                            f"{top['calls']:,} calls)"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"Memory per operator": self.by_op.head(self.top_n)}
        if self.curve.height:
            out["Memory curve per step"] = self.curve
        return out


def _curve(mem: pl.DataFrame, windows: pl.DataFrame, points: int) -> pl.DataFrame:
    """Highest allocated/reserved per (device, window, slice), carried forward over empty slices."""
    ev = assign_steps(mem.select("device", "ts_ns", "total_allocated", "total_reserved"), windows, "ts_ns")
    ev = ev.filter(pl.col("window").is_not_null())
    if ev.is_empty() or points <= 0:
        return pl.DataFrame(schema=CURVE_SCHEMA)
    w = windows.select("window", "start_ns", "end_ns", length=pl.max_horizontal(pl.col("end_ns") - pl.col("start_ns"),
                                                                               pl.lit(1)))
    ev = ev.join(w, on="window").with_columns(
        point=((pl.col("ts_ns") - pl.col("start_ns")) * points // pl.col("length")).clip(0, points - 1))
    per = ev.sort("ts_ns", maintain_order=True).group_by("device", "window", "step", "point").agg(
        allocated_bytes=pl.col("total_allocated").max(), reserved_bytes=pl.col("total_reserved").max(),
        _al=pl.col("total_allocated").last(), _rl=pl.col("total_reserved").last())
    grid = (per.select("device", "window", "step").unique()
            .join(pl.DataFrame({"point": pl.int_range(0, points, eager=True, dtype=pl.Int64)}), how="cross"))
    # The level before the window's first event: the last event before the window on that device.
    before = mem.select("device", "ts_ns", "total_allocated", "total_reserved").sort("ts_ns").join_asof(
        w.select("window", "start_ns").sort("start_ns"), left_on="ts_ns", right_on="start_ns", strategy="forward",
        allow_exact_matches=False)
    first = before.filter(pl.col("window").is_not_null()).group_by("device", "window").agg(
        _a0=pl.col("total_allocated").last(), _r0=pl.col("total_reserved").last())
    return (
        grid.join(per, on=["device", "window", "step", "point"], how="left")
        .join(first, on=["device", "window"], how="left")
        .join(w.select("window", "length"), on="window")
        .sort("device", "window", "point")
        .with_columns(
            # An empty slice holds the level the last event before it left.
            allocated_bytes=pl.coalesce("allocated_bytes", pl.col("_al").forward_fill().over("device", "window"),
                                        "_a0"),
            reserved_bytes=pl.coalesce("reserved_bytes", pl.col("_rl").forward_fill().over("device", "window"), "_r0"),
            t_ns=pl.col("point") * pl.col("length") // points,
        )
        .select(list(CURVE_SCHEMA)).cast(CURVE_SCHEMA)  # type: ignore[arg-type]  # polars' dict typing
    )


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, ascending (a sort, not numpy's hash unique: faster here)."""
    import numpy as np
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def _per_call(k: np.ndarray, b: np.ndarray, allocated: np.ndarray, parent: np.ndarray, depth: np.ndarray,
              n_dev: int) -> pl.DataFrame:
    """Self and total sums and peak per (op id, device), keyed ``_k`` = op × ``n_dev`` + device
    code, from the events inside ops (``k`` their key, ``b`` their bytes, ``allocated`` their
    ``total_allocated``, nulls as 0 and as the int64 minimum): the self sums and peak added /
    maxed into every enclosing op (``parent``: -1 at the top), deepest level first (a few tens
    of levels, each one vectorised ``ufunc.at`` over the keys of that depth). The keys are the
    events' and all their ancestors', in key order; exact integer sums (no float bincount)."""
    import numpy as np
    # Every ancestor of a key with events, up to the top.
    found, frontier = [], _sorted_unique(k)
    while frontier.size:
        found.append(frontier)
        pop = parent[frontier // n_dev]
        up = pop >= 0
        frontier = _sorted_unique(pop[up] * n_dev + frontier[up] % n_dev)
    keys = _sorted_unique(np.concatenate(found)) if found else k[:0]
    at = np.searchsorted(keys, k)
    cols = {c: np.zeros(keys.size, np.int64) for c in _SUMS}
    np.add.at(cols["alloc_count"], at, (b > 0).astype(np.int64))
    np.add.at(cols["alloc_bytes"], at, np.where(b > 0, b, 0))
    np.add.at(cols["free_count"], at, (b < 0).astype(np.int64))
    np.add.at(cols["free_bytes"], at, np.where(b < 0, -b, 0))
    total_peak = np.full(keys.size, _NO_PEAK, np.int64)
    np.maximum.at(total_peak, at, allocated)
    totals = {c: v.copy() for c, v in cols.items()}
    op = keys // n_dev
    pop, kdepth = parent[op], depth[op]
    has_parent = pop >= 0
    pidx = np.searchsorted(keys, np.where(has_parent, pop, 0) * n_dev + keys % n_dev)
    for d in range(int(kdepth.max(initial=0)), 1, -1):
        sel = np.flatnonzero((kdepth == d) & has_parent)
        for v in totals.values():
            np.add.at(v, pidx[sel], v[sel])
        np.maximum.at(total_peak, pidx[sel], total_peak[sel])
    return pl.DataFrame({
        "_k": keys, **cols, **{f"total_{c}": v for c, v in totals.items()},
        "total_peak": total_peak}).with_columns(
        total_peak=pl.when(pl.col("total_peak") != _NO_PEAK).then("total_peak"))


def _level_before(mem: pl.DataFrame, dev: np.ndarray, ts: np.ndarray) -> pl.Series:
    """``total_allocated`` of ``mem``'s (time-ordered ``[memory]`` events) last event on device
    code ``dev`` strictly before ``ts`` (non-null times), per query; null where none. Of events
    at one instant, the last in ``mem``'s order. One binary search per device (a handful), on
    the events' times kept in order: no sort of the queries, no join, no sort back."""
    import numpy as np
    m = mem.select("_dev", "ts_ns").with_row_index("_i").filter(pl.col("ts_ns").is_not_null())
    md, mt, mi = m["_dev"].to_numpy(), m["ts_ns"].to_numpy(), m["_i"].to_numpy().astype(np.int64)
    rows = np.full(ts.size, -1, np.int64)
    for d in np.unique(dev):
        on = md == d
        q = np.flatnonzero(dev == d)
        pos = np.searchsorted(mt[on], ts[q], side="left") - 1  # the last event before, not at, the start
        rows[q] = np.where(pos >= 0, mi[on][np.maximum(pos, 0)], -1)
    return pl.select(pl.when(pl.lit(pl.Series(rows >= 0))).then(
        mem["total_allocated"].gather(np.maximum(rows, 0)))).to_series()


@analysis("memory_per_op", input="trace", depends_on=("steps",), title="Memory per operator", order=61,
          shared=("op_nesting", "op_links", "memory_ops"), params={"top_n": 30, "curve_points": 50}, wide=True)
def memory_per_op(ctx: AnalysisContext[TraceModel]) -> MemoryPerOpResult:
    """Allocations, frees and peak increase per operator (self and with nested ops); memory curve per step."""
    import numpy as np
    model = ctx.model
    top_n, points = int(ctx.params.top_n), int(ctx.params.curve_points)
    if model.memory_events.filter(~pl.col("oom")).is_empty():
        raise NotApplicable("no [memory] events: profile with profile_memory=True")
    mem, op_id = memory_ops(ctx.tables)
    curve = _curve(mem, ctx.need("steps", StepsResult).windows(), points)
    # The device names by their codes (the per-op tables below key on op × n_dev + code).
    dev_names = mem.select("_dev", "device").unique("_dev").sort("_dev")["device"]
    n_dev = dev_names.len()
    ops = model.cpu_ops
    inside = mem.select("_dev", "bytes", "total_allocated", op=op_id).filter(pl.col("op").is_not_null())
    n_inside = inside.height
    if not bool((inside["bytes"] > 0).any()):
        raise NotApplicable("no allocation ([memory] event) falls inside a CPU op on its thread")
    links = op_links(ctx.tables)
    parent = np.full(ops.height, -1, np.int64)
    parent[links["id"].to_numpy()] = links["parent_id"].fill_null(-1).to_numpy()
    depth = np.zeros(ops.height, np.int64)
    depth[links["id"].to_numpy()] = links["depth"].to_numpy()
    calls = _per_call(
        (inside["op"] * n_dev + inside["_dev"]).to_numpy(), inside["bytes"].fill_null(0).to_numpy(),
        inside["total_allocated"].fill_null(_NO_PEAK).to_numpy(), parent, depth, n_dev)
    del inside
    op, dev = calls["_k"] // n_dev, (calls["_k"] % n_dev).cast(pl.UInt32)
    # The device's allocated bytes just before each call started (0 before its first event).
    before = _level_before(mem, dev.to_numpy(), ops["ts_ns"].gather(op).to_numpy())
    calls = calls.with_columns(
        name=ops["name"].gather(op), device=dev_names.gather(dev),
        peak_increase_bytes=(pl.col("total_peak") - before.fill_null(0)).clip(lower_bound=0))
    by_op = (
        calls.group_by("name", "device").agg([
            pl.len().cast(pl.Int64).alias("calls"),
            *[pl.col(c).sum() for c in _SUMS],
            *[pl.col(f"total_{c}").sum() for c in _SUMS],
            pl.col("peak_increase_bytes").max().cast(pl.Int64),
        ])
        .with_columns(self_increase_bytes=pl.col("alloc_bytes") - pl.col("free_bytes"),
                      total_increase_bytes=pl.col("total_alloc_bytes") - pl.col("total_free_bytes"))
        .sort(["total_alloc_bytes", "peak_increase_bytes", "name", "device"], descending=[True, True, False, False])
    )
    return MemoryPerOpResult(by_op=by_op, curve=curve, n_events=mem.height,
                             n_outside_ops=mem.height - n_inside, top_n=top_n)
