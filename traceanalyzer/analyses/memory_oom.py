"""Out-of-memory: the failed request, the device state at that moment and what filled it.

The allocator records an ``oom`` entry when cudaMalloc fails even after freeing its
cache: ``requested_bytes`` (the rounded request), ``device_free_bytes`` (what
``cudaMemGetInfo`` reported free on the device). At that event the replay gives
``allocated_bytes``, ``reserved_bytes`` and ``cached_free_bytes`` (reserved −
allocated: memory PyTorch holds but no tensor uses). ``verdict``:

* ``"fragmentation"`` when the cached free memory alone exceeds the request (there
  was room, but in pieces no block could serve: try
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``);
* ``"capacity"`` otherwise: live tensors fill the device; ``top_sites`` and
  ``categories`` say which, with ``pct_of_allocated`` (share of allocated at the OOM).

``device_total_estimate_bytes`` = reserved + device free (excludes other processes'
memory and the CUDA context, so it underestimates the card).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memory import breakdown, live_at
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import SnapshotModel
from traceanalyzer.units import device_name


@dataclass(frozen=True)
class MemoryOOMResult:
    """The first OOM event (``n_ooms`` counts all) and the state at that moment.
    ``failing_site`` is the failing allocation's call site (``failing_site_kind`` as in
    :func:`~traceanalyzer.analyses.memory_timeline.stack_sites`), ``failing_stack`` its raw stack."""

    device: int
    n_ooms: int
    event_idx: int
    ts_ns: int | None
    requested_bytes: int
    device_free_bytes: int | None
    allocated_bytes: int
    reserved_bytes: int
    cached_free_bytes: int
    device_total_estimate_bytes: int | None
    verdict: str
    failing_site: str | None
    top_sites: pl.DataFrame
    categories: pl.DataFrame
    top_allocations: pl.DataFrame
    failing_site_kind: str | None = None
    failing_stack: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, pl.DataFrame)}
        out.update(top_sites=self.top_sites.to_dicts(), categories=self.categories.to_dicts(),
                   top_allocations=self.top_allocations.to_dicts())
        return out

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        free = "?" if self.device_free_bytes is None else fmt_bytes(self.device_free_bytes)
        out = [("OOM", f"{device_name(self.device)} asked {fmt_bytes(self.requested_bytes)}, device free {free}"),
               ("State at OOM",
                f"allocated {fmt_bytes(self.allocated_bytes)}, reserved {fmt_bytes(self.reserved_bytes)}, "
                                f"cached free {fmt_bytes(self.cached_free_bytes)}"),
               ("Verdict", self.verdict)]
        if self.failing_site:
            out.append(("Failing allocation", self.failing_site))
        for row in self.top_sites.head(3).iter_rows(named=True):
            out.append((f"  {row['pct_of_allocated']:.1f} % {row['category']}",
                        f"{fmt_bytes(row['bytes'])}  {row['site']}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Live at OOM by call site": self.top_sites.drop("stack", strict=False),
                "Live at OOM by category": self.categories}


@analysis("memory_oom", input="snapshot", depends_on=("memory_timeline",), title="Out of memory", order=14,
          params={"top_n": 10})
def memory_oom(ctx: AnalysisContext[SnapshotModel]) -> MemoryOOMResult:
    """The OOM event: requested size, free device memory, state then, what filled it."""
    model = ctx.model
    top_n = ctx.params.top_n
    ooms = model.trace.filter(pl.col("action") == "oom").sort("device", "event_idx")
    if ooms.is_empty():
        raise NotApplicable("no OOM event in the history (the allocator records one when cudaMalloc fails "
                            "while history recording is on)")
    o = ooms.row(0, named=True)
    dev, idx = int(o["device"]), int(o["event_idx"])
    tl = ctx.need("memory_timeline", MemoryTimelineResult)
    state = tl.series.filter((pl.col("device") == dev) & (pl.col("event_idx") == idx)).row(0, named=True)
    live = live_at(tl.allocations, dev, idx)
    top, sites, cats = breakdown(live, int(state["allocated_bytes"]), top_n, tl.stacks, pct="pct_of_allocated")
    cached = int(state["reserved_bytes"]) - int(state["allocated_bytes"])
    requested = int(o["bytes"] or 0)
    site = site_kind = stack = None
    if o["stack_id"] is not None:
        s = tl.stacks.filter(pl.col("stack_id") == o["stack_id"])
        if s.height:
            site, site_kind, stack = s["site"][0], s["site_kind"][0], s["stack"][0].to_list()
    free = o["device_free_bytes"]
    return MemoryOOMResult(
        device=dev, n_ooms=ooms.height, event_idx=idx, ts_ns=o["ts_ns"], requested_bytes=requested,
        device_free_bytes=free, allocated_bytes=int(state["allocated_bytes"]),
        reserved_bytes=int(state["reserved_bytes"]), cached_free_bytes=cached,
        device_total_estimate_bytes=None if free is None else int(state["reserved_bytes"]) + int(free),
        verdict="fragmentation" if cached >= requested else "capacity",
        failing_site=site, failing_site_kind=site_kind, failing_stack=stack,
        top_sites=sites, categories=cats, top_allocations=top,
    )
