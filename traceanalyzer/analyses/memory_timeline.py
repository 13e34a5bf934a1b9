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

from traceanalyzer.analyses import Results, analysis
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import SnapshotModel

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

# C++ frames MemoryViz hides (its frameFilter) and C++ runtime frames: allocator, unwinder,
# interpreter, dispatcher, ATen/c10/torch internals, shared objects, unresolved addresses.
# Matched at the start of the name: ``my_ext::op(at::Tensor const&)`` is not an ATen internal.
_NOISE_NAME = (r"(^(c10::|at::|torch::|_Py|Py[A-Z]|\?\?|<built-in|<unknown|0x[0-9a-fA-F]+)|"
               r"unwind::unwind|CapturedTraceback|PyEval_|ceval\.c|core/boxing|/Register)")
_NOISE_FILE = r"(\.so(\.\d+)*$|^\?\?|^$)"
# Python runtime wrappers: the frames every stack starts with (interpreter entry, threads,
# notebooks, event loops), never where the memory is used.
_WRAPPER_FILE = (r"(threading\.py$|runpy\.py$|^<frozen|[/\\]asyncio[/\\]|[/\\]ipykernel[/\\]|[/\\]IPython[/\\]|"
                 r"[/\\]tornado[/\\]|[/\\]zmq[/\\]|[/\\]traitlets[/\\]|^<string>|[/\\]concurrent[/\\]|"
                 r"[/\\](multiprocessing|pydevd|debugpy|_pydev_bundle)[/\\])")
_OPTIM = r"(?i)([\\/]optim[\\/]|optimizer)"
_BACKWARD_NAME = r"(?i)([\\/]autograd[\\/]|backward)"
_AUTOGRAD_FILE = r"[\\/]autograd[\\/]"
_PARAM_FUNCS = ["__init__", "_apply", "to", "cuda", "load_state_dict", "_load_from_state_dict",
                "reset_parameters", "build_model", "from_pretrained", "to_empty", "register_parameter"]
_FORWARD_FUNCS = ["forward", "_call_impl", "_wrapped_call_impl", "__call__"]
#: Rank of a frame as a call site, best first: the innermost frame of the lowest rank is the site.
SITE_KINDS = ("python", "library", "runtime", "native", "native_internal")

NO_STACK = "<no stack: allocated before recording or recorded without context>"

STACKS_SCHEMA: dict[str, Any] = {
    "stack_id": pl.Int64, "site": pl.String, "site_kind": pl.String, "stack_category": pl.String,
    "stack": pl.List(pl.String),
}


def _short_path_expr(path: pl.Expr) -> pl.Expr:
    """The last two components of a path (``dir/file.py``), Windows separators as ``/``."""
    p = path.str.replace_all(r"\\", "/").str.replace_all("/+", "/").str.strip_chars("/")
    return pl.coalesce(p.str.extract(r"([^/]+/[^/]+)$", 1), p)


def stack_sites(frames: pl.DataFrame) -> pl.DataFrame:
    """One row per stack: ``site`` (the chosen frame, "func (dir/file.py:line)"), its
    ``site_kind``, the frame-inferred ``stack_category`` and the raw ``stack``.

    The site is the innermost frame of the best kind present (:data:`SITE_KINDS`):

    * ``python``: user code, by the tool's one frame filter
      (:func:`~traceanalyzer.analyses.callsites.user_path_expr`): not torch/site-packages,
      not the standard library, not a C++ frame. Jupyter cells count as user code.
    * ``library``: no user frame; the innermost Python frame of a library (``torch/optim/…``).
    * ``runtime``: only Python runtime wrappers (``threading.py``, ``runpy.py``, ``<frozen …>``,
      ``ipykernel``/``IPython``, ``asyncio`` …).
    * ``native``: a C++-only stack; the innermost frame outside the allocator, unwinder,
      interpreter and ``c10::``/``at::``/``torch::`` internals (a C++ extension's function).
    * ``native_internal``: nothing but those; the innermost frame.

    Anything but ``python`` says the stack has no frame in the user's code (the ``site``
    is the best there is). ``stack`` lists every frame, innermost first, as
    ``"func (file:line)"`` with the full path: the raw evidence behind the site.
    Categories: ``optimizer_state`` (a frame in ``*/optim/*``), ``backward`` (a
    backward/autograd frame: gradients and backward temporaries), ``parameter`` (module
    construction/loading: ``__init__``, ``to``, ``cuda``, ``load_state_dict`` …),
    ``forward`` (a module ``forward``), else ``unknown``.

    Vectorised over frames (one row per (stack, depth)); stacks are deduplicated.
    """
    from traceanalyzer.analyses.callsites import user_path_expr

    if frames.is_empty():
        return pl.DataFrame(schema=STACKS_SCHEMA)
    file = pl.col("filename").fill_null("")
    name = pl.col("name").fill_null("")
    py = file.str.contains(r"\.py[cwx]?$|^<") & ~file.str.contains(r"^<(built-in|unknown)")
    rank = (
        pl.when(user_path_expr(pl.col("filename"))).then(0)
        .when(py & ~file.str.contains(_WRAPPER_FILE)).then(1)
        .when(py).then(2)
        .when(~name.str.contains(_NOISE_NAME) & ~file.str.contains(_NOISE_FILE) & (name != "")).then(3)
        .otherwise(4)
    )
    fn = file.str.replace(r"^$", "?")
    where = pl.when(file.is_in(["", "??"])).then(fn).otherwise(
        pl.format("{}:{}", _short_path_expr(file), pl.col("line").cast(pl.String).fill_null("?")))
    f = frames.sort("stack_id", "depth").with_columns(
        _rank=rank.cast(pl.Int64),
        _label=pl.format("{} ({})", name, where),
        _raw=pl.format("{} ({}:{})", name, fn, pl.col("line").cast(pl.String).fill_null("?")),
    )
    out = f.group_by("stack_id", maintain_order=True).agg(
        site=pl.col("_label").sort_by("_rank", "depth").first(),
        _kind=pl.col("_rank").min(),
        _optim=file.str.contains(_OPTIM).any(),
        _backward=name.str.contains(_BACKWARD_NAME).any() | file.str.contains(_AUTOGRAD_FILE).any(),
        _param=name.is_in(_PARAM_FUNCS).any(),
        _forward=name.is_in(_FORWARD_FUNCS).any(),
        stack=pl.col("_raw"),
    )
    return out.select(
        pl.col("stack_id").cast(pl.Int64),
        "site",
        site_kind=pl.col("_kind").replace_strict(dict(enumerate(SITE_KINDS)), return_dtype=pl.String),
        stack_category=pl.when("_optim").then(pl.lit("optimizer_state"))
        .when("_backward").then(pl.lit("backward"))
        .when(pl.col("_param") & ~pl.col("_forward")).then(pl.lit("parameter"))
        .when("_forward").then(pl.lit("forward"))
        .otherwise(pl.lit("unknown")),
        stack="stack",
    ).cast(STACKS_SCHEMA)  # type: ignore[arg-type]


def attach_stacks(df: pl.DataFrame, stacks: pl.DataFrame | None) -> pl.DataFrame:
    """Add ``site_kind`` and the raw ``stack`` (of the row's ``stack_id``) to a grouped table;
    rows without a stack get ``site_kind = "none"``. Drops ``stack_id``."""
    if stacks is None or "stack_id" not in df.columns:
        return df.with_columns(site_kind=pl.lit("none"), stack=pl.lit(None, dtype=pl.List(pl.String))).drop(
            "stack_id", strict=False)
    return df.join(stacks.select("stack_id", "site_kind", "stack"), on="stack_id", how="left",
                   maintain_order="left").with_columns(pl.col("site_kind").fill_null("none")).drop("stack_id")


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

    def first(action: str) -> np.ndarray:
        mask = (a["action"] == action).to_numpy()
        return np.minimum.reduceat(np.where(mask, pos, big), starts)

    ia, ifr, ifc = first("alloc"), first("free_requested"), first("free_completed")

    def take(col: str, idx: np.ndarray) -> pl.Series:
        ok = idx != big
        s = a[col].gather(np.where(ok, idx, 0))
        return s if ok.all() else pl.select(pl.when(pl.Series(ok)).then(s)).to_series()

    fr_mask = (a["action"] == "free_requested") & a["ts_ns"].is_not_null()
    fr_ts = np.minimum.reduceat(np.where(fr_mask.to_numpy(), a["ts_ns"].fill_null(0).to_numpy(), big), starts)
    del fr_mask, pos
    out = pl.DataFrame({
        "addr": a["addr"].gather(starts),
        "version": a["version"].gather(starts),
        "a_bytes": take("bytes", ia), "a_stream": take("stream", ia), "stack_id": take("stack_id", ia),
        "alloc_idx": take("event_idx", ia), "alloc_ts_ns": take("ts_ns", ia),
        "free_requested_idx": take("event_idx", ifr),
        "free_requested_ts_ns": pl.Series(fr_ts).replace(big, None),
        "fr_bytes": take("bytes", ifr), "fr_stream": take("stream", ifr),
        "free_completed_idx": take("event_idx", ifc),
        "fc_bytes": take("bytes", ifc), "fc_stream": take("stream", ifc),
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


def live_at(allocations: pl.DataFrame, device: int, event_idx: int) -> pl.DataFrame:
    """Allocations held by the program just after event ``event_idx`` (``-1`` = before
    the first event) on ``device``: ``alloc_idx <= i < free_requested_idx``."""
    return allocations.filter(
        (pl.col("device") == device) & (pl.col("alloc_idx") <= event_idx)
        & (pl.col("free_requested_idx").is_null() | (pl.col("free_requested_idx") > event_idx))
    )


def decimate(series: pl.DataFrame, max_points: int = 1000) -> pl.DataFrame:
    """At most ``max_points`` rows per device, keeping each bucket's maxima (so peaks
    survive); ``event_idx``/``ts_ns`` are the bucket's first event."""
    if series.is_empty():
        return series.drop("action")
    out = []
    for (_dev,), g in series.group_by(["device"], maintain_order=True):
        k = max(1, -(-g.height // max_points))
        out.append(
            g.with_columns(_b=pl.int_range(pl.len()) // k).group_by("_b", maintain_order=True).agg(
                pl.col("device").first(), pl.col("event_idx").first(), pl.col("ts_ns").first(),
                pl.col("allocated_bytes").max(), pl.col("active_bytes").max(), pl.col("reserved_bytes").max(),
            ).drop("_b")
        )
    return pl.concat(out)


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
            pre = f"cuda:{d.device} " if len(self.devices) > 1 else ""
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
def memory_timeline(model: SnapshotModel, results: Results, config: Config) -> MemoryTimelineResult:
    """Replay the allocator history into allocated/active/reserved series per device."""
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
            notes.append(f"cuda:{d}: replayed end state differs from the dump ({rep.invariants})")
    return MemoryTimelineResult(
        devices=tuple(reps),
        series=pl.concat(series) if series else pl.DataFrame(schema=SERIES_SCHEMA),
        allocations=pl.concat(allocs) if allocs else pl.DataFrame(schema=ALLOCATION_SCHEMA),
        x_axis="time" if model.meta.has_time else "event_idx",
        history=model.meta.has_history,
        notes=tuple(notes),
        stacks=sites,
    )
