"""Memory peak: what is live at the instant allocated memory is highest, and who made it.

Per device, the peak is the first event at which the replayed ``allocated_bytes``
(requested bytes held by the program, see :mod:`memory_timeline`) is maximal; with no
history it is the state at dump time (``source = "dump"``). At that instant:

* ``top_allocations``: the largest live allocations (size, call site, category, when
  allocated, stream, address).
* ``top_sites``: live bytes grouped by call site (innermost frame in the user's code;
  ``site_kind`` says when there is none and a library/runtime/C++ frame stands in), with
  count, ``pct_of_peak`` (share of the peak's allocated bytes) and the raw ``stack``.
* ``categories``: live bytes by inferred category (parameter, optimizer_state,
  activation, gradient, temporary, pre_recording, unknown); inference rules in
  :func:`~traceanalyzer.analyses.memory_timeline.stack_sites`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memory import breakdown, live_at
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.model.memory import SnapshotModel
from traceanalyzer.units import device_name


@dataclass(frozen=True)
class MemoryPeakResult:
    """The peak of the device with the highest peak (``device``), plus every device's
    peak in ``per_device``. ``peak_event_idx`` is ``-1`` when the peak is the state
    before the history starts; ``source`` is ``"replay"`` or ``"dump"``.
    ``peak_reserved_at_bytes``: reserved at that instant (cached-but-free =
    reserved − allocated)."""

    device: int
    source: str
    peak_allocated_bytes: int
    peak_active_bytes: int
    peak_reserved_at_bytes: int
    peak_event_idx: int
    peak_ts_ns: int | None
    peak_action: str | None
    top_allocations: pl.DataFrame
    top_sites: pl.DataFrame
    categories: pl.DataFrame
    per_device: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "source": self.source,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_active_bytes": self.peak_active_bytes,
            "peak_reserved_at_bytes": self.peak_reserved_at_bytes,
            "peak_event_idx": self.peak_event_idx,
            "peak_ts_ns": self.peak_ts_ns,
            "peak_action": self.peak_action,
            "top_allocations": self.top_allocations.to_dicts(),
            "top_sites": self.top_sites.to_dicts(),
            "categories": self.categories.to_dicts(),
            "per_device": list(self.per_device),
        }

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        where = "at dump (no history)" if self.source == "dump" else (
            "before the history starts" if self.peak_event_idx < 0 else f"event #{self.peak_event_idx:,}")
        out = [(f"Peak allocated ({device_name(self.device)})", f"{fmt_bytes(self.peak_allocated_bytes)}  {where}"),
               ("Reserved at peak", fmt_bytes(self.peak_reserved_at_bytes))]
        for row in self.top_sites.head(3).iter_rows(named=True):
            out.append((f"  {row['pct_of_peak']:.1f} % {row['category']}", f"{fmt_bytes(row['bytes'])}  {row['site']}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        # The raw stacks are evidence for the JSON, too long for a table.
        return {
            "Live at peak by call site": self.top_sites.drop("stack", strict=False),
            "Live at peak by category": self.categories,
            "Largest allocations live at peak": self.top_allocations.drop("addr", "stack", strict=False),
        }


@analysis("memory_peak", input="snapshot", depends_on=("memory_timeline",), title="Memory peak", order=11,
          params={"top_n": 15})
def memory_peak(ctx: AnalysisContext[SnapshotModel]) -> MemoryPeakResult:
    """Peak allocated memory and what is live then: top allocations, call sites, categories."""
    model = ctx.model
    top_n = ctx.params.top_n
    tl = ctx.need("memory_timeline", MemoryTimelineResult)
    per_device = []
    for d in tl.devices:
        per_device.append({"device": d.device, "peak_allocated_bytes": d.peak_allocated,
                           "peak_event_idx": d.peak_allocated_idx, "peak_reserved_bytes": d.peak_reserved})
    p = tl.primary
    live = live_at(tl.allocations, p.device, p.peak_allocated_idx)
    top, sites, cats = breakdown(live, p.peak_allocated, top_n, tl.stacks)
    ts = action = None
    reserved_at = p.baseline_reserved
    if p.peak_allocated_idx >= 0:
        row = tl.series.filter((pl.col("device") == p.device) & (pl.col("event_idx") == p.peak_allocated_idx)).row(
            0, named=True)
        ts, action, reserved_at = row["ts_ns"], row["action"], row["reserved_bytes"]
    return MemoryPeakResult(
        device=p.device,
        source="replay" if model.meta.has_history else "dump",
        peak_allocated_bytes=p.peak_allocated,
        peak_active_bytes=p.peak_active,
        peak_reserved_at_bytes=int(reserved_at),
        peak_event_idx=p.peak_allocated_idx,
        peak_ts_ns=ts,
        peak_action=action,
        top_allocations=top,
        top_sites=sites,
        categories=cats,
        per_device=tuple(per_device),
    )
