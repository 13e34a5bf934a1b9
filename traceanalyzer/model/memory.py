"""Memory models: a CUDA caching-allocator snapshot and an ``export_memory_timeline``.

Snapshot tables (all may be empty, never missing; ``SNAPSHOT_SCHEMAS`` is the single
source of truth for names and dtypes). Addresses and stream handles are ``UInt64``
(they can exceed ``2**63``); sizes are ``Int64`` bytes; times are ``Int64`` ns since
the Unix epoch (``time_us × 1000``), null where the release did not record them.

``segments``  one row per cudaMalloc'd range (per contiguous mapped range for
              expandable segments) at dump time: ``total_bytes`` reserved,
              ``allocated_bytes`` (blocks the program holds), ``active_bytes``
              (+ blocks freed but still used by another stream), ``requested_bytes``
              (unrounded sizes of active blocks), pool id, stream, ``stack_id`` of the
              allocation that triggered the cudaMalloc.
``blocks``    one row per block of a segment, address-ordered: ``bytes`` is the rounded
              block size, ``requested_bytes`` what the program asked for (stale on
              inactive blocks), ``state`` ``active_allocated`` / ``active_pending_free``
              / ``inactive``; ``stack_id`` of its allocation (null when allocated before
              recording or without context).
``trace``     the allocator's event history, one row per entry in recording order per
              device: ``event_idx`` (0-based position in that device's list), ``action``,
              ``addr``, ``bytes`` (the entry's ``size``: requested bytes for
              alloc/free, segment bytes for segment_*, total active bytes for
              ``snapshot``, the rounded request for ``oom``), ``device_free_bytes`` (oom
              only), ``stack_id``.
              ``action``, ``compile_context`` and ``user_metadata`` are Categorical:
              a handful of distinct values over millions of entries (4 B per row
              instead of a 16 B string view).
``frames``    deduplicated stacks: one row per (``stack_id``, ``depth``), depth 0 is the
              innermost frame (the allocator call site). Real snapshots share a few
              hundred stacks among hundreds of thousands of events.
``annotations`` ``external_annotations`` (record_function ranges, >= 2.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

SNAPSHOT_SCHEMAS: dict[str, dict[str, pl.DataType | type[pl.DataType]]] = {
    "segments": {
        "segment_idx": pl.Int64,
        "device": pl.Int64,
        "address": pl.UInt64,
        "total_bytes": pl.Int64,
        "allocated_bytes": pl.Int64,
        "active_bytes": pl.Int64,
        "requested_bytes": pl.Int64,
        "stream": pl.UInt64,
        "segment_type": pl.String,
        "pool_id": pl.String,
        "is_private_pool": pl.Boolean,
        "is_expandable": pl.Boolean,
        "stack_id": pl.Int64,
    },
    "blocks": {
        "segment_idx": pl.Int64,
        "device": pl.Int64,
        "address": pl.UInt64,
        "bytes": pl.Int64,
        "requested_bytes": pl.Int64,
        "state": pl.String,
        "stack_id": pl.Int64,
    },
    "trace": {
        "device": pl.Int64,
        "event_idx": pl.Int64,
        "action": pl.Categorical,
        "addr": pl.UInt64,
        "bytes": pl.Int64,
        "stream": pl.UInt64,
        "ts_ns": pl.Int64,
        "device_free_bytes": pl.Int64,
        "stack_id": pl.Int64,
        "compile_context": pl.Categorical,
        "user_metadata": pl.Categorical,
    },
    "frames": {
        "stack_id": pl.Int64,
        "depth": pl.Int64,
        "name": pl.String,
        "filename": pl.String,
        "line": pl.Int64,
    },
    "annotations": {
        "device": pl.Int64,
        "ts_ns": pl.Int64,
        "name": pl.String,
        "stage": pl.String,
    },
}

ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom",
)


def empty_snapshot_table(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema=SNAPSHOT_SCHEMAS[table])


@dataclass(frozen=True)
class SnapshotMeta:
    """What the snapshot says about itself.

    ``layout``: ``"dict"`` (``_dump_snapshot``/``_snapshot``), ``"dict-legacy"`` (2.0
    blocks with ``history``) or ``"segments-list"`` (``torch.cuda.memory_snapshot()``,
    no history). ``release_hint`` is the oldest release whose keys match (e.g.
    ``">=2.12"``). ``has_history``: some device has trace entries; ``has_time``:
    entries carry ``time_us``; ``has_stacks``: any block or entry carries frames.
    ``history_truncated``: the history does not reach back to the allocator's start
    (frees without allocs or live blocks without an alloc event: the ring buffer
    dropped the beginning, or recording started late).
    """

    path: str
    file_bytes: int
    protocol: int | None
    layout: str
    release_hint: str
    devices: tuple[int, ...]
    n_segments: int
    n_blocks: int
    n_trace_entries: int
    n_stacks: int
    has_history: bool
    has_time: bool
    has_stacks: bool
    history_truncated: bool
    allocator_settings: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "protocol": self.protocol,
            "layout": self.layout,
            "release_hint": self.release_hint,
            "devices": list(self.devices),
            "n_segments": self.n_segments,
            "n_blocks": self.n_blocks,
            "n_trace_entries": self.n_trace_entries,
            "n_stacks": self.n_stacks,
            "has_history": self.has_history,
            "has_time": self.has_time,
            "has_stacks": self.has_stacks,
            "history_truncated": self.history_truncated,
            "allocator_settings": self.allocator_settings,
            **({"extra": self.extra} if self.extra else {}),
        }


@dataclass(frozen=True)
class SnapshotModel:
    """A loaded memory snapshot; see the module docstring for each table."""

    meta: SnapshotMeta
    segments: pl.DataFrame
    blocks: pl.DataFrame
    trace: pl.DataFrame
    frames: pl.DataFrame
    annotations: pl.DataFrame
    warnings: tuple[str, ...] = ()

    kind = "snapshot"

    def trace_for(self, device: int) -> pl.DataFrame:
        """Trace entries of one device, in recording order."""
        return self.trace.filter(pl.col("device") == device).sort("event_idx")

    def table(self, name: str) -> pl.DataFrame:
        return getattr(self, name)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------
# export_memory_timeline
# ---------------------------------------------------------------------------------------

# torch.profiler._memory_profiler.Category order (index 0..7 in .raw.json.gz; +1 in .json).
TIMELINE_CATEGORIES: tuple[str, ...] = (
    "parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
    "autograd_detail", "unknown",
)

TIMELINE_SCHEMAS: dict[str, dict[str, pl.DataType | type[pl.DataType]]] = {
    # Wide: one row per sample, one ``<category>_bytes`` column per category + total.
    "samples": {
        "ts_ns": pl.Int64,
        **{f"{c}_bytes": pl.Int64 for c in TIMELINE_CATEGORIES},
        "total_bytes": pl.Int64,
    },
    # Raw export only: one row per allocator event of the memory profiler.
    "events": {
        "ts_ns": pl.Int64,
        "action": pl.String,
        "delta_bytes": pl.Int64,
        "category": pl.String,
    },
}


@dataclass(frozen=True)
class MemoryTimelineMeta:
    """``layout``: ``"stacked"`` (``.json``/``.json.gz``: ``[times_us, sizes]``) or
    ``"raw"`` (``.raw.json.gz``: ``[t_ns, action, delta, category]`` events).
    ``n_preexisting``: allocations that existed before profiling (time −1 in raw)."""

    path: str
    file_bytes: int
    layout: str
    n_samples: int
    n_events: int
    n_preexisting: int
    start_ns: int | None
    end_ns: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "layout": self.layout,
            "n_samples": self.n_samples,
            "n_events": self.n_events,
            "n_preexisting": self.n_preexisting,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
        }


@dataclass(frozen=True)
class MemoryTimelineModel:
    """A categorised memory timeline from ``prof.export_memory_timeline``.

    ``samples`` holds bytes held per category after each sample (the stacked plot's
    data); for raw exports it is rebuilt by cumulating ``events``.
    """

    meta: MemoryTimelineMeta
    samples: pl.DataFrame
    events: pl.DataFrame
    warnings: tuple[str, ...] = ()

    kind = "memory_timeline"

    def table(self, name: str) -> pl.DataFrame:
        return getattr(self, name)  # type: ignore[no-any-return]


__all__ = [
    "ACTIONS",
    "MemoryTimelineMeta",
    "MemoryTimelineModel",
    "SNAPSHOT_SCHEMAS",
    "SnapshotMeta",
    "SnapshotModel",
    "TIMELINE_CATEGORIES",
    "TIMELINE_SCHEMAS",
    "empty_snapshot_table",
]
