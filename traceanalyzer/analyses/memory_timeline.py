"""Memory timeline: replay a snapshot's allocator history into per-device time series.

The replay follows MemoryViz's semantics and reconstructs what existed before
recording started (ring buffer, late start) from the final segments, then checks
that the replayed end state equals the dumped one.

Definitions (per device; all byte counts are the trace's *requested* bytes, i.e. what
the program asked for, except reserved which is cudaMalloc'd segment bytes):

* ``allocated_bytes``: held by the program: an allocation counts from its ``alloc``
  to its ``free_requested`` (what ``torch.cuda.memory_allocated()`` tracks, before
  rounding to 512 B).
* ``active_bytes``: not reusable by the allocator: ``alloc`` → ``free_completed``
  (differs from allocated while a block freed on one stream is still in use by
  another: ``record_stream``).
* ``reserved_bytes``: segments held from CUDA: ``segment_alloc``/``segment_map`` →
  ``segment_free``/``segment_unmap``.
* Each series point is the state *after* the event with that ``event_idx``; the state
  before the first event is the baseline (``event_idx = -1``).
* The allocation table has one row per allocation, keyed by (address, version) since
  addresses are reused: ``alloc_idx``, ``free_requested_idx``, ``free_completed_idx``
  (event indices; ``-1`` = before the history starts; null = not freed at dump time).
  Allocations made before recording (frees without an ``alloc``, or blocks live at
  dump without one) get ``alloc_idx = -1`` and their size from the free entry or the
  dumped block.

The replay is vectorised: allocations are paired with their frees by a running count
of ``alloc`` per address (polars window), series are cumulative sums of signed deltas
(numpy). It is linear in the number of events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    import numpy as np

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memory import NO_STACK, STACKS_SCHEMA, decimate, stack_sites
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import SnapshotModel
from traceanalyzer.units import device_name

ALLOC_ACTIONS = ("alloc", "free_requested", "free_completed")
SEGMENT_PLUS = ("segment_alloc", "segment_map")
SEGMENT_MINUS = ("segment_free", "segment_unmap")

ALLOCATION_SCHEMA: dict[str, Any] = {
    "device": pl.Int64,
    "addr": pl.UInt64,
    "version": pl.Int64,
    "bytes": pl.Int64,
    "stream": pl.UInt64,
    "stack_id": pl.Int64,
    "alloc_idx": pl.Int64,
    "free_requested_idx": pl.Int64,
    "free_completed_idx": pl.Int64,
    "alloc_ts_ns": pl.Int64,
    "free_requested_ts_ns": pl.Int64,
    "site": pl.String,
    "category": pl.String,
}

SERIES_SCHEMA: dict[str, Any] = {
    "device": pl.Int64,
    "event_idx": pl.Int64,
    "ts_ns": pl.Int64,
    "action": pl.Categorical,
    "allocated_bytes": pl.Int64,
    "active_bytes": pl.Int64,
    "reserved_bytes": pl.Int64,
}

# ---------------------------------------------------------------------------------------
# Stacks → call sites and categories
# ---------------------------------------------------------------------------------------


def _categorise(alloc: pl.DataFrame) -> pl.DataFrame:
    """Final ``category`` per allocation: the stack category, with ``forward`` split into
    ``activation`` (still held when the next backward-pass allocation happens, i.e.
    saved for backward) and ``temporary`` (freed before it; with no backward pass in the
    history: freed at all). ``backward`` allocations are reported as ``gradient``.
    Allocations from before recording without a stack are ``pre_recording``."""
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    bw = np.sort(alloc.filter((pl.col("stack_category") == "backward") & (pl.col("alloc_idx") >= 0))
                 ["alloc_idx"].to_numpy())
    a_idx = alloc["alloc_idx"].to_numpy()
    if bw.size:
        pos = np.searchsorted(bw, a_idx, side="right")
        nxt = np.where(pos < bw.size, bw[np.minimum(pos, bw.size - 1)], np.iinfo(np.int64).max)
    else:
        nxt = np.full(a_idx.shape, np.iinfo(np.int64).max)
    free = alloc["free_requested_idx"].fill_null(np.iinfo(np.int64).max).to_numpy()
    temp = (free < nxt) & (free >= 0)
    return alloc.with_columns(_temp=pl.Series(temp)).with_columns(
        category=pl.when(pl.col("stack_category") == "forward")
        .then(pl.when(pl.col("_temp")).then(pl.lit("temporary")).otherwise(pl.lit("activation")))
        .when(pl.col("stack_category") == "backward").then(pl.lit("gradient"))
        .when(pl.col("stack_category").is_null() & (pl.col("alloc_idx") < 0)).then(pl.lit("pre_recording"))
        .otherwise(pl.col("stack_category").fill_null("unknown"))
    ).drop("_temp", "stack_category")


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------

_PAIR_SCHEMA: dict[str, Any] = {
    "addr": pl.UInt64, "version": pl.Int64, "bytes": pl.Int64, "stream": pl.UInt64, "stack_id": pl.Int64,
    "alloc_idx": pl.Int64, "alloc_ts_ns": pl.Int64, "free_requested_idx": pl.Int64,
    "free_requested_ts_ns": pl.Int64, "free_completed_idx": pl.Int64,
}


def _pair_allocations(t: pl.DataFrame) -> pl.DataFrame:
    """Pair alloc / free_requested / free_completed by (addr, version).

    ``version`` counts the allocs of an address so far, so an alloc opens a version and
    the frees that follow it belong to it. Per version: the alloc's fields, the earliest
    ``free_requested`` (index, earliest time; size and stream of that first one) and
    the earliest ``free_completed``; size and stream fall back to the frees' when the
    alloc is missing (allocated before recording: ``alloc_idx`` −1, no stack).

    Computed on the events sorted by (addr, version, event_idx) with one reduction per
    group (``np.minimum.reduceat``): three group-bys and two full joins held about
    four copies of the events at once (≈ 390 B per event).
    """
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    a = t.lazy().filter(pl.col("action").is_in(ALLOC_ACTIONS)).select(
        "addr", "event_idx", "action", "bytes", "stream", "stack_id", "ts_ns",
        version=(pl.col("action") == "alloc").cast(pl.Int64).cum_sum().over("addr", order_by="event_idx"),
    ).sort("addr", "version", "event_idx", nulls_last=False).collect()
    n = a.height
    if n == 0:
        return pl.DataFrame(schema=_PAIR_SCHEMA)
    start = a.select(pl.col("addr").ne_missing(pl.col("addr").shift(1))
                     | pl.col("version").ne_missing(pl.col("version").shift(1))).to_series().to_numpy()
    start[0] = True
    starts = np.flatnonzero(start)
    del start
    pos = np.arange(n, dtype=np.int64)
    big = np.iinfo(np.int64).max

    # The closures take the frame and positions as arguments: both are deleted below, as
    # soon as they are not needed (they are the largest arrays of a long history).
    def first(action: str, frame: pl.DataFrame, positions: np.ndarray) -> np.ndarray:
        mask = (frame["action"] == action).to_numpy()
        return np.minimum.reduceat(np.where(mask, positions, big), starts)

    ia, ifr, ifc = (first(act, a, pos) for act in ("alloc", "free_requested", "free_completed"))

    def take(frame: pl.DataFrame, col: str, idx: np.ndarray) -> pl.Series:
        ok = idx != big
        s = frame[col].gather(np.where(ok, idx, 0))
        return s if ok.all() else pl.select(pl.when(pl.Series(ok)).then(s)).to_series()

    fr_mask = (a["action"] == "free_requested") & a["ts_ns"].is_not_null()
    fr_ts = np.minimum.reduceat(np.where(fr_mask.to_numpy(), a["ts_ns"].fill_null(0).to_numpy(), big), starts)
    del fr_mask, pos
    out = pl.DataFrame({
        "addr": a["addr"].gather(starts),
        "version": a["version"].gather(starts),
        "a_bytes": take(a, "bytes", ia), "a_stream": take(a, "stream", ia), "stack_id": take(a, "stack_id", ia),
        "alloc_idx": take(a, "event_idx", ia), "alloc_ts_ns": take(a, "ts_ns", ia),
        "free_requested_idx": take(a, "event_idx", ifr),
        "free_requested_ts_ns": pl.Series(fr_ts).replace(big, None),
        "fr_bytes": take(a, "bytes", ifr), "fr_stream": take(a, "stream", ifr),
        "free_completed_idx": take(a, "event_idx", ifc),
        "fc_bytes": take(a, "bytes", ifc), "fc_stream": take(a, "stream", ifc),
    })
    del a
    ghost = pl.col("alloc_idx").is_null()
    return out.select(
        "addr", "version",
        bytes=pl.coalesce("a_bytes", "fr_bytes", "fc_bytes"),
        stream=pl.coalesce("a_stream", "fr_stream", "fc_stream"),
        # a free of a pre-recording allocation carries the block's alloc stack with
        # context="alloc", the free site with "all": ghosts get no stack here
        stack_id=pl.when(ghost).then(pl.lit(None, dtype=pl.Int64)).otherwise(pl.col("stack_id")),
        alloc_idx=pl.col("alloc_idx").fill_null(-1),
        alloc_ts_ns="alloc_ts_ns",
        # completed without a recorded request: the request happened before recording
        free_requested_idx=pl.when(ghost & pl.col("free_requested_idx").is_null()
                                   & pl.col("free_completed_idx").is_not_null())
        .then(pl.lit(-1, dtype=pl.Int64)).otherwise(pl.col("free_requested_idx")),
        free_requested_ts_ns=pl.col("free_requested_ts_ns").cast(pl.Int64),
        free_completed_idx="free_completed_idx",
    ).cast(_PAIR_SCHEMA)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DeviceReplay:
    """Replay outcome of one device (see the module docstring for definitions).

    ``invariants``: ``live_replayed`` allocations live at the end of the history;
    ``matched`` of them found as a dumped active block at the same address with
    ``size_mismatches`` where sizes differ; ``missing_in_dump`` replayed-live but absent
    from the dump; ``pre_recording_blocks`` dumped active blocks the history never
    allocated; ``state_mismatches`` pending-free disagreements; ``reserved_replayed`` vs
    ``reserved_dumped``; ``baseline_reserved`` reserved before the first event
    (negative would mean an inconsistent history); ``ok`` when all agree.
    """

    device: int
    n_events: int
    has_time: bool
    baseline_allocated: int
    baseline_active: int
    baseline_reserved: int
    peak_allocated: int
    peak_allocated_idx: int
    peak_active: int
    peak_reserved: int
    peak_reserved_idx: int
    final_allocated: int
    final_active: int
    final_reserved: int
    invariants: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _replay_device(model: SnapshotModel, device: int, sites: pl.DataFrame
                   ) -> tuple[DeviceReplay, pl.DataFrame, pl.DataFrame]:
    # Only the columns the replay reads: a whole-table copy is the largest transient.
    import numpy as np  # lazy: a trace run never needs numpy (0.14 s import)
    t = model.trace.lazy().filter(pl.col("device") == device).select(
        "event_idx", "action", "addr", "bytes", "stream", "stack_id", "ts_ns").collect()
    if not t["event_idx"].is_sorted():
        t = t.sort("event_idx")
    n = t.height
    blocks = model.blocks.filter(pl.col("device") == device)
    segs = model.segments.filter(pl.col("device") == device)
    alloc = _pair_allocations(t) if n else pl.DataFrame(schema={
        k: v for k, v in ALLOCATION_SCHEMA.items() if k not in ("device", "site", "category")})

    # -- final state: match live replayed allocations with the dumped active blocks --
    live_blocks = blocks.filter(pl.col("state") != "inactive").select(
        addr="address", dump_bytes="requested_bytes", dump_state="state", dump_stack="stack_id",
        dump_stream=pl.lit(None, dtype=pl.UInt64))
    live = alloc.filter(pl.col("free_completed_idx").is_null() & (pl.col("alloc_idx") >= 0))
    m = live.join(live_blocks, on="addr", how="left")
    matched = m.filter(pl.col("dump_state").is_not_null())
    size_mismatch = matched.filter(pl.col("bytes") != pl.col("dump_bytes")).height
    pending_replay = pl.col("free_requested_idx").is_not_null()
    state_mismatch = matched.filter(pending_replay != (pl.col("dump_state") == "active_pending_free")).height
    live_ghost_addrs = alloc.filter(pl.col("free_completed_idx").is_null())["addr"]
    ghosts_end = live_blocks.filter(~pl.col("addr").is_in(live_ghost_addrs.implode()))
    # Blocks live at dump that the history never allocated: allocated before recording.
    seg_stream = blocks.join(segs.select("segment_idx", "stream"), on="segment_idx").filter(
        pl.col("state") != "inactive").select(addr="address", seg_stream="stream")
    end_rows = ghosts_end.join(seg_stream, on="addr", how="left").select(
        addr="addr",
        version=pl.lit(0, dtype=pl.Int64),
        bytes="dump_bytes",
        stream="seg_stream",
        stack_id="dump_stack",
        alloc_idx=pl.lit(-1, dtype=pl.Int64),
        alloc_ts_ns=pl.lit(None, dtype=pl.Int64),
        free_requested_idx=pl.when(pl.col("dump_state") == "active_pending_free")
        .then(pl.lit(-1, dtype=pl.Int64)).otherwise(pl.lit(None, dtype=pl.Int64)),
        free_requested_ts_ns=pl.lit(None, dtype=pl.Int64),
        free_completed_idx=pl.lit(None, dtype=pl.Int64),
    )
    cols = [c for c in ALLOCATION_SCHEMA if c not in ("device", "site", "category")]
    alloc = pl.concat([alloc.select(cols), end_rows.select(cols)], how="vertical_relaxed")
    # context="state" records stacks on blocks only: lend a live allocation its block's stack
    alloc = alloc.join(live_blocks.select("addr", "dump_stack"), on="addr", how="left").with_columns(
        stack_id=pl.when(pl.col("stack_id").is_null() & pl.col("free_completed_idx").is_null())
        .then(pl.col("dump_stack")).otherwise(pl.col("stack_id"))).drop("dump_stack")
    alloc = alloc.with_columns(device=pl.lit(device, dtype=pl.Int64)).join(
        sites.select("stack_id", "site", "stack_category"), on="stack_id", how="left").with_columns(
        site=pl.col("site").fill_null(NO_STACK))
    alloc = _categorise(alloc).select(list(ALLOCATION_SCHEMA))

    # -- series: baseline + cumulative signed deltas --
    a_idx = alloc["alloc_idx"].to_numpy()
    fr = alloc["free_requested_idx"].fill_null(-2).to_numpy()
    fc = alloc["free_completed_idx"].fill_null(-2).to_numpy()
    size = alloc["bytes"].fill_null(0).to_numpy().astype(np.int64)
    base_alloc = int(size[(a_idx < 0) & (fr != -1)].sum())
    base_active = int(size[(a_idx < 0) & (fc != -1)].sum())

    def deltas(plus_idx: np.ndarray, plus_w: np.ndarray, minus_idx: np.ndarray, minus_w: np.ndarray) -> np.ndarray:
        d = np.zeros(n, dtype=np.int64)
        if n:
            np.add.at(d, plus_idx, plus_w)
            np.add.at(d, minus_idx, -minus_w)
        return d

    pa = a_idx >= 0
    d_alloc = deltas(a_idx[pa], size[pa], fr[fr >= 0], size[fr >= 0])
    d_active = deltas(a_idx[pa], size[pa], fc[fc >= 0], size[fc >= 0])
    # Vectorised in polars: action.to_numpy() would make one Python str per event.
    sb = pl.col("bytes").fill_null(0)
    d_res = t.select(pl.when(pl.col("action").is_in(SEGMENT_PLUS)).then(sb)
                     .when(pl.col("action").is_in(SEGMENT_MINUS)).then(-sb)
                     .otherwise(0).cast(pl.Int64)).to_series().to_numpy(writable=True) if n \
        else np.array([], dtype=np.int64)
    del a_idx, fr, fc, size, pa
    dumped_reserved = int(segs["total_bytes"].sum() or 0)
    base_res = dumped_reserved - int(d_res.sum())
    # Running totals in place: three event-length arrays instead of six.
    allocated = np.cumsum(d_alloc, out=d_alloc)
    allocated += base_alloc
    active = np.cumsum(d_active, out=d_active)
    active += base_active
    reserved = np.cumsum(d_res, out=d_res)
    reserved += base_res
    # event_idx, ts_ns and action share the trace's buffers (no copy).
    series = t.select(pl.lit(device, dtype=pl.Int64).alias("device"), "event_idx", "ts_ns", "action").with_columns(
        allocated_bytes=pl.Series(allocated), active_bytes=pl.Series(active), reserved_bytes=pl.Series(reserved),
    ).select(list(SERIES_SCHEMA)).cast(SERIES_SCHEMA)  # type: ignore[arg-type]

    # peak: the first event where allocated reaches its maximum (the baseline counts)
    if n and allocated.max() > base_alloc:
        p_idx = int(np.argmax(allocated))
        peak_alloc, peak_active = int(allocated[p_idx]), int(active[p_idx])
    else:
        p_idx, peak_alloc, peak_active = -1, base_alloc, base_active
    r_idx = int(np.argmax(reserved)) if n and reserved.max() > base_res else -1
    peak_res = int(reserved[r_idx]) if r_idx >= 0 else base_res

    final_alloc = int(allocated[-1]) if n else base_alloc
    final_active = int(active[-1]) if n else base_active
    dumped_alloc = int(blocks.filter(pl.col("state") == "active_allocated")["requested_bytes"].sum() or 0)
    dumped_active = int(blocks.filter(pl.col("state") != "inactive")["requested_bytes"].sum() or 0)
    inv = {
        "live_replayed": live.height,
        "matched": matched.height,
        "size_mismatches": size_mismatch,
        "missing_in_dump": live.height - matched.height,
        "pre_recording_blocks": ghosts_end.height,
        "state_mismatches": state_mismatch,
        "allocated_replayed": final_alloc,
        "allocated_dumped": dumped_alloc,
        "active_replayed": final_active,
        "active_dumped": dumped_active,
        "reserved_replayed": int(reserved[-1]) if n else base_res,
        "reserved_dumped": dumped_reserved,
        "baseline_reserved": base_res,
    }
    inv["ok"] = (size_mismatch == 0 and inv["missing_in_dump"] == 0 and state_mismatch == 0
                 and final_alloc == dumped_alloc and final_active == dumped_active and base_res >= 0)
    rep = DeviceReplay(
        device=device, n_events=n, has_time=bool(n) and t["ts_ns"].null_count() < n,
        baseline_allocated=base_alloc, baseline_active=base_active, baseline_reserved=base_res,
        peak_allocated=peak_alloc, peak_allocated_idx=p_idx, peak_active=peak_active,
        peak_reserved=peak_res, peak_reserved_idx=r_idx,
        final_allocated=final_alloc, final_active=final_active,
        final_reserved=int(reserved[-1]) if n else base_res, invariants=inv,
    )
    return rep, series, alloc


@dataclass(frozen=True)
class MemoryTimelineResult:
    """Per-device replay: time series, allocation table, invariant checks.

    ``series``: one row per trace event (state after it); ``allocations``: one row per
    allocation (see module docstring); ``devices``: per-device peaks, finals, baseline
    and invariants; ``x_axis`` is ``"time"`` when entries carry ``time_us`` (>= 2.2),
    else ``"event_idx"``.
    """

    devices: tuple[DeviceReplay, ...]
    series: pl.DataFrame
    allocations: pl.DataFrame
    x_axis: str
    history: bool
    notes: tuple[str, ...] = field(default=())
    #: One row per recorded stack (:func:`stack_sites`): site, site_kind, category, raw stack.
    stacks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STACKS_SCHEMA))

    def device(self, d: int) -> DeviceReplay:
        return next(r for r in self.devices if r.device == d)

    @property
    def primary(self) -> DeviceReplay:
        """The device with the highest allocated peak."""
        return max(self.devices, key=lambda r: (r.peak_allocated, -r.device))

    def to_json(self) -> dict[str, Any]:
        return {
            "x_axis": self.x_axis,
            "history": self.history,
            "devices": [d.to_json() for d in self.devices],
            "n_allocations": self.allocations.height,
            "series_decimated": decimate(self.series).to_dicts(),
            "notes": list(self.notes),
        }

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        out: list[tuple[str, str]] = []
        for d in self.devices:
            pre = f"{device_name(d.device)} " if len(self.devices) > 1 else ""
            out.append((f"{pre}peak allocated", fmt_bytes(d.peak_allocated)))
            out.append((f"{pre}peak reserved", fmt_bytes(d.peak_reserved)))
            out.append((f"{pre}at dump: allocated / reserved",
                        f"{fmt_bytes(d.final_allocated)} / {fmt_bytes(d.final_reserved)}"))
            out.append((f"{pre}events replayed", f"{d.n_events:,}"
                        + ("" if d.invariants["ok"] else "  (replay ≠ dump, see invariants)")))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        rows = [{"device": d.device, "events": d.n_events, "peak_allocated_bytes": d.peak_allocated,
                 "peak_reserved_bytes": d.peak_reserved, "final_allocated_bytes": d.final_allocated,
                 "final_reserved_bytes": d.final_reserved, "replay_matches_dump": d.invariants["ok"]}
                for d in self.devices]
        return {"Per device": pl.DataFrame(rows)} if rows else {}


@analysis("memory_timeline", input="snapshot", title="Memory timeline", order=10)
def memory_timeline(ctx: AnalysisContext[SnapshotModel]) -> MemoryTimelineResult:
    """Replay the allocator history into allocated/active/reserved series per device."""
    model = ctx.model
    if model.segments.is_empty() and model.trace.is_empty():
        raise NotApplicable("the snapshot holds no segments and no history (nothing was allocated)")
    sites = stack_sites(model.frames)
    devices = sorted(set(model.segments["device"].to_list()) | set(model.trace["device"].unique().to_list()))
    reps, series, allocs = [], [], []
    notes: list[str] = []
    for d in devices:
        rep, s, a = _replay_device(model, int(d), sites)
        reps.append(rep)
        series.append(s)
        allocs.append(a)
        if not rep.invariants["ok"] and rep.n_events:
            notes.append(f"{device_name(d)}: replayed end state differs from the dump ({rep.invariants})")
    return MemoryTimelineResult(
        devices=tuple(reps),
        series=pl.concat(series) if series else pl.DataFrame(schema=SERIES_SCHEMA),
        allocations=pl.concat(allocs) if allocs else pl.DataFrame(schema=ALLOCATION_SCHEMA),
        x_axis="time" if model.meta.has_time else "event_idx",
        history=model.meta.has_history,
        notes=tuple(notes),
        stacks=sites,
    )
