"""Memory fragmentation and waste: reserved memory the program does not use, and why.

From the dumped segments (every snapshot, with or without history):

* ``reserved_bytes`` = Σ segment sizes; ``allocated_bytes`` = Σ sizes of blocks the
  program holds (rounded block sizes, as ``torch.cuda.memory_allocated``);
  ``free_bytes`` = Σ inactive blocks (cached by the allocator, reusable).
* ``largest_free_block_bytes``: the biggest single inactive block anywhere — the
  largest request that can be served without a new cudaMalloc.
* ``fragmentation_pct`` = 100 × (1 − largest free block / free bytes): 0 when all free
  memory is one block; high when free memory is scattered in small pieces.
* ``inactive_split_blocks``: free blocks inside segments that also hold live blocks
  (the segment cannot be returned to CUDA: external fragmentation).
* ``empty_segments``: segments with no live block (``empty_cache()`` would release
  them), with their bytes.
* ``rounding_waste_bytes``: Σ (block size − requested) over live blocks (internal
  fragmentation from 512-B rounding and unsplit tails).

From the history (when present): ``max_unused_reserved_bytes`` = max over events of
reserved − allocated (requested bytes), ``reserved_at_max_unused_bytes`` the reserved bytes
at that event, ``max_unused_pct_of_reserved`` = 100 × max unused / reserved then
(``free_pct_of_reserved`` is the same share at dump), ``segment_allocs``/``segment_frees`` (cudaMalloc
/cudaFree count), and ``churn_reallocs``: segment allocations that follow a segment
free (``empty_cache`` inside a loop makes the allocator cudaMalloc again), with bytes.
``settings`` are the allocator settings in effect (>= 2.3), ``non_default_settings``
those that differ from PyTorch's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import SnapshotModel

_DEFAULTS: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
    "expandable_segments": False, "release_lock_on_cudamalloc": False,
}


@dataclass(frozen=True)
class MemoryFragmentationResult:
    """See the module docstring for each number. ``per_segment``: one row per segment
    with its free bytes, largest free block and number of free blocks (most free
    first); ``per_device``: the same totals per device."""

    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    free_bytes: int
    largest_free_block_bytes: int
    fragmentation_pct: float | None
    inactive_split_blocks: int
    inactive_split_bytes: int
    empty_segments: int
    empty_segment_bytes: int
    rounding_waste_bytes: int
    private_pool_bytes: int
    expandable_segments: bool
    max_unused_reserved_bytes: int | None
    segment_allocs: int
    segment_frees: int
    churn_reallocs: int
    churn_realloc_bytes: int
    settings: dict[str, Any] | None
    non_default_settings: dict[str, Any]
    per_device: pl.DataFrame
    per_segment: pl.DataFrame
    reserved_at_max_unused_bytes: int | None = None
    free_pct_of_reserved: float | None = None
    max_unused_pct_of_reserved: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, pl.DataFrame)}
        out["per_device"] = self.per_device.to_dicts()
        out["per_segment"] = self.per_segment.head(50).to_dicts()
        return out

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        frag = "n/a" if self.fragmentation_pct is None else f"{self.fragmentation_pct:.1f} %"
        out = [
            ("Reserved / allocated at dump", f"{fmt_bytes(self.reserved_bytes)} / {fmt_bytes(self.allocated_bytes)}"),
            ("Cached free / largest free block",
             f"{fmt_bytes(self.free_bytes)} / {fmt_bytes(self.largest_free_block_bytes)}"),
            ("Fragmentation of free memory", frag),
            ("Free blocks in split segments",
             f"{self.inactive_split_blocks:,} ({fmt_bytes(self.inactive_split_bytes)})"),
        ]
        if self.max_unused_reserved_bytes is not None:
            pct = ("" if self.max_unused_pct_of_reserved is None
                   else f" ({self.max_unused_pct_of_reserved:.1f} % of reserved)")
            out.append(("Max reserved − allocated", fmt_bytes(self.max_unused_reserved_bytes) + pct))
        if self.churn_reallocs:
            out.append(("cudaMalloc after a segment free",
                        f"{self.churn_reallocs:,} ({fmt_bytes(self.churn_realloc_bytes)})"))
        if self.non_default_settings:
            out.append(("Allocator settings", ", ".join(f"{k}={v}" for k, v in self.non_default_settings.items())))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Segments with the most free memory": self.per_segment.head(15)}


@analysis("memory_fragmentation", input="snapshot", depends_on=("memory_timeline",),
          title="Memory fragmentation and waste", order=12)
def memory_fragmentation(ctx: AnalysisContext[SnapshotModel]) -> MemoryFragmentationResult:
    """Reserved vs allocated, free-block sizes, split segments, empty_cache churn, settings."""
    model = ctx.model
    if model.segments.is_empty():
        raise NotApplicable("the snapshot holds no segments (nothing reserved at dump time)")
    b = model.blocks.with_columns(
        free=pl.col("state") == "inactive",
        live=pl.col("state") == "active_allocated",
    )
    seg = (
        b.group_by("segment_idx").agg(
            free_bytes=pl.col("bytes").filter(pl.col("free")).sum(),
            largest_free_bytes=pl.col("bytes").filter(pl.col("free")).max().fill_null(0),
            free_blocks=pl.col("free").sum(),
            live_blocks=(~pl.col("free")).sum(),
            rounding_waste_bytes=(pl.col("bytes") - pl.col("requested_bytes")).filter(pl.col("live")).sum(),
        )
        .join(model.segments.select("segment_idx", "device", "address", "total_bytes", "allocated_bytes",
                                    "active_bytes", "segment_type", "is_private_pool", "is_expandable"),
              on="segment_idx", how="right")
        .with_columns(pl.col("free_bytes", "largest_free_bytes", "free_blocks", "live_blocks",
                             "rounding_waste_bytes").fill_null(0))
        .sort(["free_bytes", "segment_idx"], descending=[True, False])
    )
    reserved = int(seg["total_bytes"].sum())
    free = int(seg["free_bytes"].sum())
    top = seg["largest_free_bytes"].max()
    largest = int(top) if isinstance(top, (int, float)) else 0
    split = seg.filter((pl.col("live_blocks") > 0) & (pl.col("free_blocks") > 0))
    empty = seg.filter(pl.col("live_blocks") == 0)
    per_device = seg.group_by("device").agg(
        reserved_bytes=pl.col("total_bytes").sum(), allocated_bytes=pl.col("allocated_bytes").sum(),
        free_bytes=pl.col("free_bytes").sum(), largest_free_block_bytes=pl.col("largest_free_bytes").max(),
        segments=pl.len(),
    ).sort("device")

    tl = ctx.need("memory_timeline", MemoryTimelineResult)
    max_unused = reserved_at_max = None
    if not tl.series.is_empty():
        unused = tl.series["reserved_bytes"] - tl.series["allocated_bytes"]
        i = int(unused.arg_max())  # type: ignore[arg-type]
        max_unused, reserved_at_max = int(unused[i]), int(tl.series["reserved_bytes"][i])
    t = model.trace.filter(pl.col("action").is_in(["segment_alloc", "segment_free", "segment_map", "segment_unmap"]))
    seg_allocs = t.filter(pl.col("action").is_in(["segment_alloc", "segment_map"]))
    seg_frees = t.filter(pl.col("action").is_in(["segment_free", "segment_unmap"]))
    churn = t.sort("device", "event_idx").with_columns(
        after_free=pl.col("action").is_in(["segment_free", "segment_unmap"]).cum_sum().over("device") > 0
    ).filter(pl.col("after_free") & pl.col("action").is_in(["segment_alloc", "segment_map"]))
    settings = model.meta.allocator_settings
    non_default = {k: settings[k] for k, v in _DEFAULTS.items() if settings and k in settings and settings[k] != v}
    return MemoryFragmentationResult(
        reserved_bytes=reserved,
        allocated_bytes=int(seg["allocated_bytes"].sum()),
        active_bytes=int(seg["active_bytes"].sum()),
        free_bytes=free,
        largest_free_block_bytes=largest,
        fragmentation_pct=round(100.0 * (1 - largest / free), 2) if free else None,
        inactive_split_blocks=int(split["free_blocks"].sum()),
        inactive_split_bytes=int(split["free_bytes"].sum()),
        empty_segments=empty.height,
        empty_segment_bytes=int(empty["total_bytes"].sum()),
        rounding_waste_bytes=int(seg["rounding_waste_bytes"].sum()),
        private_pool_bytes=int(seg.filter(pl.col("is_private_pool"))["total_bytes"].sum()),
        expandable_segments=bool(seg["is_expandable"].any()),
        max_unused_reserved_bytes=max_unused,
        reserved_at_max_unused_bytes=reserved_at_max,
        free_pct_of_reserved=round(100.0 * free / reserved, 2) if reserved else None,
        max_unused_pct_of_reserved=round(100.0 * max_unused / reserved_at_max, 2)
        if max_unused is not None and reserved_at_max else None,
        segment_allocs=seg_allocs.height,
        segment_frees=seg_frees.height,
        churn_reallocs=churn.height,
        churn_realloc_bytes=int(churn["bytes"].sum()),
        settings=settings,
        non_default_settings=non_default,
        per_device=per_device,
        per_segment=seg.select("device", "segment_idx", "segment_type", "total_bytes", "allocated_bytes",
                               "free_bytes", "largest_free_bytes", "free_blocks", "live_blocks"),
    )
