"""Memory leaks: call sites whose live memory grows iteration over iteration.

A leak is *repetition*: the same loop leaves more memory behind each time. One growth
phase is not a leak (a single step where gradients appear in the first backward, a
forward pass whose activations pile up layer by layer, a model being built), so the
history is first cut into iterations of a repeating pattern, best evidence first:

* ``steps``: ``ProfilerStep#N`` external annotations (>= 2.5, with ``time_us``);
* ``iterations``: forward/backward cycles seen in the stacks: an iteration starts at
  the first forward allocation (category ``activation``/``temporary``) after a
  ``gradient`` or ``optimizer_state`` allocation;
* ``repeats``: with no backward in the history, the recurrences of the stack of the
  history's first allocation (a loop allocating the same things in the same order).

With fewer than ``memory_leaks.min_iterations`` (default 3) iterations there is no
verdict (``suspects`` empty, ``verdict_note`` says why). For each call site (innermost
user frame) the bytes it holds are sampled at the end of every iteration:

* A site is a *leak suspect* when it holds at least ``memory_leaks.min_bytes``
  (default 1 MiB) at the end of the history, never shrinks from one iteration end to
  the next, and grew in at least ``min_iterations`` − 1 of those transitions and in at
  least half of them (``grew_windows``). Growth inside the first iteration does not
  count (that is where gradients, optimizer state and caches appear once). Sites of
  ``parameter`` allocations (model construction/loading) are not suspects.
  ``growth_bytes`` is its holding at the last iteration end minus the first,
  ``growth_per_window_bytes`` the mean increment; each suspect carries ``site_kind`` and
  the raw ``stack`` of its largest live allocation.
* ``growth_bytes``: the suspects' growth summed; ``growth_pct_of_peak``: that as % of
  the device's peak allocated bytes (the figure the ``memory_growth`` finding shows).
* ``window_floor_bytes``: the allocated minimum of each iteration; ``floor_rising``:
  it rose at every iteration after the second (a steady loop returns to the same floor;
  a leak raises it); ``floor_growth_bytes``: last floor − first.
* ``live_at_end_bytes``: bytes allocated during the history and never freed.
Allocations made before recording have no site and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    import numpy as np

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memory import attach_stacks
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import SnapshotModel


def _step_bounds(model: SnapshotModel, series: pl.DataFrame) -> np.ndarray | None:
    """Index of the first event of each ``ProfilerStep#N`` window: the first event at or after the
    annotation's start (needs times). Events before the first step belong to the first window."""
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    ann = model.annotations.filter(pl.col("name").str.starts_with("ProfilerStep#")
                                   & (pl.col("stage") == "START") & pl.col("ts_ns").is_not_null())
    if ann.height < 3 or series["ts_ns"].null_count() == series.height:
        return None
    ts = series["ts_ns"].fill_null(strategy="forward").fill_null(0).to_numpy()
    # side="left": an event at the annotation's instant is the step's first. (Starting one event
    # earlier, as before, moved each step's last event into the next window.)
    idx = np.searchsorted(ts, np.sort(ann["ts_ns"].to_numpy()), side="left")
    return np.unique(np.clip(idx, 0, len(ts) - 1))


def _category_bounds(alloc: pl.DataFrame) -> np.ndarray:
    """Event index of each iteration start after the first: the first forward allocation
    (``activation``/``temporary``) following a ``gradient``/``optimizer_state`` one."""
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    phase = alloc.filter(pl.col("alloc_idx") >= 0).sort("alloc_idx").select(
        "alloc_idx",
        ph=pl.when(pl.col("category").is_in(["activation", "temporary"])).then(pl.lit("F"))
        .when(pl.col("category").is_in(["gradient", "optimizer_state"])).then(pl.lit("B")),
    ).drop_nulls("ph")
    starts = phase.filter((pl.col("ph") == "F") & (pl.col("ph").shift(1) == "B"))["alloc_idx"]
    return starts.to_numpy().astype(np.int64)


def _repeat_bounds(alloc: pl.DataFrame) -> np.ndarray:
    """Event index of each recurrence of the stack of the history's first allocation."""
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    a = alloc.filter((pl.col("alloc_idx") >= 0) & pl.col("stack_id").is_not_null()).sort("alloc_idx")
    if a.is_empty():
        return np.zeros(0, dtype=np.int64)
    first = a["stack_id"][0]
    return a.filter(pl.col("stack_id") == first)["alloc_idx"].to_numpy()[1:].astype(np.int64)


@dataclass(frozen=True)
class MemoryLeaksResult:
    """See the module docstring. ``suspects``: one row per suspect site, largest
    growth first; ``window_kind`` is ``"steps"``, ``"iterations"``, ``"repeats"`` or
    ``"none"`` (no repeating pattern found); ``n_windows`` the iterations found."""

    device: int
    window_kind: str
    n_windows: int
    live_at_end_bytes: int
    live_at_end_count: int
    floor_growth_bytes: int
    window_floor_bytes: tuple[int, ...]
    suspects: pl.DataFrame
    live_at_end_by_site: pl.DataFrame
    min_iterations: int = 3
    floor_rising: bool = False
    growth_bytes: int = 0
    growth_pct_of_peak: float | None = None
    verdict_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device, "window_kind": self.window_kind, "n_windows": self.n_windows,
            "min_iterations": self.min_iterations,
            "live_at_end_bytes": self.live_at_end_bytes, "live_at_end_count": self.live_at_end_count,
            "floor_growth_bytes": self.floor_growth_bytes, "window_floor_bytes": list(self.window_floor_bytes),
            "floor_rising": self.floor_rising, "growth_bytes": self.growth_bytes,
            "growth_pct_of_peak": self.growth_pct_of_peak, "verdict_note": self.verdict_note,
            "suspects": self.suspects.to_dicts(), "live_at_end_by_site": self.live_at_end_by_site.head(20).to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        out = [("Allocated in history, alive at end",
                f"{fmt_bytes(self.live_at_end_bytes)} ({self.live_at_end_count:,})"),
               ("Iterations found", f"{self.n_windows} ({self.window_kind})")]
        if self.verdict_note:
            out.append(("Leak verdict", self.verdict_note))
            return out
        out += [(f"Floor growth over {self.n_windows} {self.window_kind}", fmt_bytes(self.floor_growth_bytes)),
                ("Leak suspects", f"{self.suspects.height}")]
        for row in self.suspects.head(3).iter_rows(named=True):
            out.append(("  grows", f"+{fmt_bytes(row['growth_bytes'])}  {row['site']}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Leak suspects (sites growing iteration over iteration)": self.suspects.drop("stack", strict=False),
                "Allocated during the history and alive at the end": self.live_at_end_by_site.head(15)}


@analysis("memory_leaks", input="snapshot", depends_on=("memory_timeline",), title="Memory leaks", order=13,
          params={"min_iterations": 3, "min_bytes": 1 << 20})
def memory_leaks(ctx: AnalysisContext[SnapshotModel]) -> MemoryLeaksResult:
    """Sites whose live allocations grow iteration over iteration and survive to the end."""
    model = ctx.model
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    min_iter = max(2, int(ctx.params.min_iterations))
    min_bytes = ctx.params.min_bytes
    tl = ctx.need("memory_timeline", MemoryTimelineResult)
    if not tl.history:
        raise NotApplicable("no allocation history: record with torch.cuda.memory._record_memory_history()")
    dev = tl.primary.device
    # Only the columns read below: these tables have one row per event / allocation.
    series = tl.series.lazy().filter(pl.col("device") == dev).select("ts_ns", "allocated_bytes").collect()
    n = series.height
    if n < 3 * 2:
        raise NotApplicable(f"history too short to see growth ({n} events)")
    alloc = tl.allocations.lazy().filter((pl.col("device") == dev) & (pl.col("alloc_idx") >= 0)).select(
        "site", "category", "bytes", "alloc_idx", "free_requested_idx", "stack_id").collect()

    bounds = _step_bounds(model, series)
    kind = "steps"
    if bounds is None or len(bounds) < 2:
        kind, starts_after = "iterations", _category_bounds(alloc)
        cycles = bool(alloc["category"].is_in(["gradient", "optimizer_state"]).any())
        if not len(starts_after) and not cycles:
            kind, starts_after = "repeats", _repeat_bounds(alloc)
        bounds = np.unique(np.append(0, starts_after)) if len(starts_after) else np.zeros(1, dtype=np.int64)
        if not len(starts_after) and not cycles:
            kind = "none"
    ends = np.append(bounds[1:] - 1, n - 1)  # last event of each window
    k = len(ends)

    # bytes per site at each window end: signed deltas bucketed by (site, window) with
    # np.add.at on integer site codes, then cumulated over windows. (A concat + group-by +
    # pivot on the site strings copied every allocation's site twice.)
    codes = alloc.select(pl.col("site").rank("dense").cast(pl.Int64) - 1).to_series().to_numpy()
    site_names = alloc["site"].unique().sort()
    size = alloc["bytes"].fill_null(0).to_numpy().astype(np.int64)
    freed = alloc["free_requested_idx"].is_not_null().to_numpy()
    grid = np.zeros((len(site_names), k), dtype=np.int64)
    np.add.at(grid, (codes, np.searchsorted(ends, alloc["alloc_idx"].to_numpy(), side="left")), size)
    np.add.at(grid, (codes[freed], np.searchsorted(ends, alloc["free_requested_idx"].drop_nulls().to_numpy(),
                                                   side="left")), -size[freed])
    del codes, size, freed
    mat = np.cumsum(grid, axis=1) if len(grid) else np.zeros((0, k), dtype=np.int64)
    diffs = np.diff(mat, axis=1)
    grew = (diffs > 0).sum(axis=1)
    never_shrinks = (diffs >= 0).all(axis=1) if k > 1 else np.ones(len(mat), dtype=bool)
    end_bytes = mat[:, -1] if len(mat) else np.zeros(0)
    growth = (mat[:, -1] - mat[:, 0]) if len(mat) else np.zeros(0)
    note = None
    if kind == "none":
        note = ("no leak verdict: no repeating pattern in the history (no ProfilerStep# annotations, no "
                "forward/backward cycle in the stacks, no recurring allocation stack); one growth phase is not a leak")
    elif k < min_iter:
        note = (f"no leak verdict: {k} iteration(s) found ({kind}), {min_iter} needed "
                "(memory_leaks.min_iterations); one growth phase is not a leak")
    suspect = (never_shrinks & (grew >= max(min_iter - 1, k // 2)) & (end_bytes >= min_bytes)
               & (growth > 0) & (k >= min_iter))
    # the site's category (most bytes) and its largest allocation's stack, for the evidence
    site_info = alloc.group_by("site").agg(
        category=pl.col("category").sort_by("bytes", descending=True).first(),
        stack_id=pl.col("stack_id").sort_by("bytes", "alloc_idx", descending=[True, False]).first())
    suspects = pl.DataFrame({
        "site": site_names, "end_bytes": end_bytes.astype(np.int64), "growth_bytes": growth.astype(np.int64),
        "grew_windows": grew.astype(np.int64),
        "growth_per_window_bytes": (growth / max(k - 1, 1)).astype(np.int64),
    }).filter(pl.Series(suspect)).join(site_info, on="site", how="left").filter(
        pl.col("category") != "parameter").sort(["growth_bytes", "site"], descending=[True, False])
    suspects = attach_stacks(suspects, tl.stacks)

    live_end = alloc.filter(pl.col("free_requested_idx").is_null())
    by_site = live_end.group_by("site").agg(bytes=pl.col("bytes").sum(), count=pl.len(),
                                            category=pl.col("category").mode().sort().first()
                                            ).sort(["bytes", "site"], descending=[True, False])
    allocated = series["allocated_bytes"].to_numpy()
    starts = np.append(0, ends[:-1] + 1)
    floors = tuple(int(allocated[s:e + 1].min()) for s, e in zip(starts, ends))
    total = int(suspects["growth_bytes"].sum()) if suspects.height else 0
    peak = tl.device(dev).peak_allocated
    return MemoryLeaksResult(
        device=dev, window_kind=kind, n_windows=k,
        live_at_end_bytes=int(live_end["bytes"].sum()), live_at_end_count=live_end.height,
        floor_growth_bytes=floors[-1] - floors[0], window_floor_bytes=floors,
        suspects=suspects, live_at_end_by_site=by_site, min_iterations=min_iter,
        # from the first iteration's end on: the first one is where one-off memory appears
        floor_rising=k >= min_iter and all(b > a for a, b in zip(floors[1:], floors[2:])),
        growth_bytes=total, growth_pct_of_peak=round(total * 100.0 / peak, 2) if peak > 0 else None,
        verdict_note=note,
    )
