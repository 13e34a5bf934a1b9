"""Memory leaks: allocations still alive at the end whose call sites grew step over step.

The history is cut into windows: steps from ``ProfilerStep#N`` external annotations
(>= 2.5, with ``time_us``) when there are at least 3, else ``memory_leaks.windows``
(default 8) equal slices of events. For each call site (innermost user frame) the
bytes it holds are sampled at every window end.

* A site is a *leak suspect* when it holds at least ``memory_leaks.min_bytes``
  (default 1 MiB) at the end of the history, never shrinks from one window end to the
  next, and grew in at least half of the windows (``grew_windows``);
  ``growth_bytes`` is its holding at the last window end minus the first,
  ``growth_per_window_bytes`` the mean increment.
* ``floor_growth_bytes``: growth of the allocated minimum from the first window to
  the last (a steady loop returns to the same floor; a leak raises it).
* ``live_at_end_bytes``: bytes allocated during the history and never freed.
Allocations made before recording have no site and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    import numpy as np

from traceanalyzer.analyses import Results, analysis
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.config import Config
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


@dataclass(frozen=True)
class MemoryLeaksResult:
    """See the module docstring. ``suspects``: one row per suspect site, largest
    growth first; ``window_kind`` is ``"steps"`` or ``"slices"``."""

    device: int
    window_kind: str
    n_windows: int
    live_at_end_bytes: int
    live_at_end_count: int
    floor_growth_bytes: int
    window_floor_bytes: tuple[int, ...]
    suspects: pl.DataFrame
    live_at_end_by_site: pl.DataFrame

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device, "window_kind": self.window_kind, "n_windows": self.n_windows,
            "live_at_end_bytes": self.live_at_end_bytes, "live_at_end_count": self.live_at_end_count,
            "floor_growth_bytes": self.floor_growth_bytes, "window_floor_bytes": list(self.window_floor_bytes),
            "suspects": self.suspects.to_dicts(), "live_at_end_by_site": self.live_at_end_by_site.head(20).to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.report.text import fmt_bytes

        out = [("Allocated in history, alive at end", f"{fmt_bytes(self.live_at_end_bytes)} ({self.live_at_end_count:,})"),
               (f"Floor growth over {self.n_windows} {self.window_kind}", fmt_bytes(self.floor_growth_bytes)),
               ("Leak suspects", f"{self.suspects.height}")]
        for row in self.suspects.head(3).iter_rows(named=True):
            out.append(("  grows", f"+{fmt_bytes(row['growth_bytes'])}  {row['site']}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Leak suspects (sites growing window over window)": self.suspects,
                "Allocated during the history and alive at the end": self.live_at_end_by_site.head(15)}


@analysis("memory_leaks", input="snapshot", depends_on=("memory_timeline",), title="Memory leaks", order=13)
def memory_leaks(model: SnapshotModel, results: Results, config: Config) -> MemoryLeaksResult:
    """Sites whose live allocations grow window over window and survive to the end."""
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    n_slices = config.get("memory_leaks.windows", 8)
    min_bytes = config.get("memory_leaks.min_bytes", 1 << 20)
    tl: MemoryTimelineResult = results["memory_timeline"]
    if not tl.history:
        raise NotApplicable("no allocation history: record with torch.cuda.memory._record_memory_history()")
    dev = tl.primary.device
    # Only the columns read below: these tables have one row per event / allocation.
    series = tl.series.lazy().filter(pl.col("device") == dev).select("ts_ns", "allocated_bytes").collect()
    n = series.height
    if n < 3 * 2:
        raise NotApplicable(f"history too short to see growth ({n} events)")
    bounds = _step_bounds(model, series)
    kind = "steps"
    if bounds is None or len(bounds) < 3:
        kind = "slices"
        bounds = np.unique(np.linspace(0, n, n_slices + 1).astype(np.int64)[:-1])
    ends = np.append(bounds[1:] - 1, n - 1)  # last event of each window
    k = len(ends)
    alloc = tl.allocations.lazy().filter((pl.col("device") == dev) & (pl.col("alloc_idx") >= 0)).select(
        "site", "category", "bytes", "alloc_idx", "free_requested_idx").collect()

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
    suspect = never_shrinks & (grew >= max(1, (k - 1) // 2)) & (end_bytes >= min_bytes) & (growth > 0)
    suspects = pl.DataFrame({
        "site": site_names, "end_bytes": end_bytes.astype(np.int64), "growth_bytes": growth.astype(np.int64),
        "grew_windows": grew.astype(np.int64),
        "growth_per_window_bytes": (growth / max(k - 1, 1)).astype(np.int64),
    }).filter(pl.Series(suspect)).sort(["growth_bytes", "site"], descending=[True, False])

    live_end = alloc.filter(pl.col("free_requested_idx").is_null())
    by_site = live_end.group_by("site").agg(bytes=pl.col("bytes").sum(), count=pl.len(),
                                            category=pl.col("category").mode().sort().first()
                                            ).sort(["bytes", "site"], descending=[True, False])
    allocated = series["allocated_bytes"].to_numpy()
    starts = np.append(0, ends[:-1] + 1)
    floors = tuple(int(allocated[s:e + 1].min()) for s, e in zip(starts, ends))
    return MemoryLeaksResult(
        device=dev, window_kind=kind, n_windows=k,
        live_at_end_bytes=int(live_end["bytes"].sum()), live_at_end_count=live_end.height,
        floor_growth_bytes=floors[-1] - floors[0], window_floor_bytes=floors,
        suspects=suspects, live_at_end_by_site=by_site,
    )
