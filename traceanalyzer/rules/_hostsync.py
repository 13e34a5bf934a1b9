"""Who owns each host-blocking call, and what GPU time it costs (private: shared by the copy and sync rules).

Four rules price host-blocking calls: ``item_sync``, ``explicit_sync``, ``blocking_copies``
and ``pageable_memcpy``. Each blocking event of the steady steps belongs to exactly one of them:

1. a sync point caused by an op that implies a sync (``aten::item``, ``nonzero`` …), its DtoH
   copy included → ``item_sync``;
2. a memcpy into/from **pageable** host memory → ``pageable_memcpy``;
3. a memcpy/memset issued by a **synchronous API** (``cudaMemcpy``, ``hipMemcpyWithStream`` …)
   → ``blocking_copies``; so is the stream/event sync a copy op makes itself (``.cpu()`` /
   ``copy_`` with ``non_blocking=False`` waits on the stream after the copy);
4. any other stream/device/event synchronize → ``explicit_sync``.

What a blocking event costs is **GPU time**, never the CPU's wait: a CPU blocked on a busy
GPU loses nothing. The GPU idle these rules own is the idle of the ``idle_gaps`` device gaps
whose cause is ``sync`` or ``memcpy`` (a blocking call overlapped the gap; ``data_loader`` and
``host_bound`` gaps belong to ``dataloader_bottleneck`` and ``host_bound_gaps``), on the primary
device. Each event covers the time from its start until the GPU gets work again after it
(the end of the gap it ends in), the start of the next blocking event (any thread) or the
end of its step window, whichever is first; these spans are disjoint, so every instant of
owned idle goes to at most one event (:func:`blocking_events`, ``idle_ns``).

An event's cost is that idle, capped by the lead the CPU would gain without the block: the
CPU time it was blocked (:func:`priced`; consecutive events of one owner on one thread pool
their lead). So the four rules together never price more than the sync/memcpy idle of the
step, and a sync on a GPU that stays busy costs ~0 whatever the CPU waited. The CPU wait is
evidence (``cpu_wait_ms_per_step``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses._copysync import COPY_OPS
from traceanalyzer.analyses._intervals import covered_before
from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.syncs import SyncsResult
from traceanalyzer.rules import shared
from traceanalyzer.rules._util import implied_sync, steady, steps_of

EXPLICIT_KINDS = ("stream", "device", "event")
#: idle_gaps causes whose idle the host-blocking rules own.
OWNED_CAUSES = ("sync", "memcpy")

_EVENT_SCHEMA = {
    "step": pl.Int64, "window": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64,
    "tid": pl.Int64, "owner": pl.String, "cause": pl.String, "site": pl.String, "apis": pl.String,
    "n_calls": pl.Int64, "blocked_ns": pl.Int64, "idle_ns": pl.Int64,
}


def sync_points(results: Results) -> pl.DataFrame:
    """Sync points of the steady steps with their owner rule.

    Columns: ``step, ts_ns, end_ns, pid, tid, cause, site, apis, n_calls, blocked_ns`` (all
    calls), ``explicit_blocked_ns`` (its stream/device/event calls only) and ``owner``:
    ``item_sync``, ``explicit_sync``, ``blocking_copies`` (the sync a copy op makes) or
    ``copies`` (only memcpy calls: the copy rules price those calls from ``copies``).
    """
    schema = {"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
              "cause": pl.String, "site": pl.String, "apis": pl.String, "n_calls": pl.Int64,
              "blocked_ns": pl.Int64, "explicit_blocked_ns": pl.Int64, "owner": pl.String}
    s = results.typed("syncs", SyncsResult)
    if s is None or s.calls.is_empty() or s.points.is_empty():
        return pl.DataFrame(schema=schema)
    # One lazy query up to the steady filter: each eager step would be a polars query of its own.
    calls = s.calls.lazy().with_columns(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
        end_ns=pl.col("ts_ns") + pl.col("blocked_ns").fill_null(0),
    ).sort("ts_ns")
    # A point starts at its first call: find that call's thread, then give every call the latest
    # point that started on its thread at or before it (points of one thread never interleave).
    first = calls.unique(["ts_ns", "cause", "site"], keep="first", maintain_order=True).select(
        "ts_ns", "cause", "site", "pid", "tid")
    pts = s.points.lazy().with_row_index("pt").with_columns(pl.col("pt").cast(pl.Int64)).join(
        first, on=["ts_ns", "cause", "site"], how="left")
    if "end_ns" in s.points.columns:  # the points' own column (``first`` has none)
        pts = pts.drop("end_ns")
    starts = (pts.filter(pl.col("pid").is_not_null())
              .select("pid", "tid", pl.col("ts_ns").alias("_ps"), "pt").sort("_ps"))
    calls = calls.join_asof(starts, left_on="ts_ns", right_on="_ps", by=["pid", "tid"], strategy="backward",
                            check_sortedness=False)
    explicit = pl.col("sync_kind").is_in(list(EXPLICIT_KINDS))
    per = calls.group_by("pt").agg(
        end_ns=pl.col("end_ns").max(),
        explicit_blocked_ns=pl.col("blocked_ns").filter(explicit).sum().cast(pl.Int64),
        has_explicit=explicit.any(),
    )
    pts = pts.join(per, on="pt", how="left")
    cause = pl.col("cause").str.replace(r" \(boolean mask\)$", "")
    pts = pts.with_columns(
        owner=pl.when(implied_sync(pl.col("cause"))).then(pl.lit("item_sync"))
        .when(~pl.col("has_explicit").fill_null(False)).then(pl.lit("copies"))
        .when(cause.is_in(list(COPY_OPS))).then(pl.lit("blocking_copies"))
        .otherwise(pl.lit("explicit_sync")),
        end_ns=pl.coalesce("end_ns", pl.col("ts_ns") + pl.col("blocked_ns")),
    ).sort("pt")
    return steady(pts.select(list(schema)).collect(), results, by="step")


def _device(value: Any) -> int | None:
    """A device id read from a frame (polars gives ``Any``): an int, or None when null."""
    return None if value is None else int(value)


def primary_device(results: Results) -> int | None:
    """The busiest device (``gpu_time``), else the one with the most gap idle; None without GPU."""
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is not None and gt.per_device.height:
        return _device(gt.per_device.sort(["busy_ns", "device"], descending=[True, False])["device"][0])
    ig = results.typed("idle_gaps", IdleGapsResult)
    if ig is not None and ig.per_device.height:
        return _device(ig.per_device.sort(["idle_ns", "device"], descending=[True, False])["device"][0])
    return None


def _copy_events(results: Results) -> pl.DataFrame:
    """Host-blocking memcpy/memset calls of the steady steps (one row per call) with owner
    ``pageable_memcpy`` / ``blocking_copies``; calls under an op implying a sync are left out
    (they are in ``item_sync``'s points)."""
    c = results.typed("copies", CopiesResult)
    if c is None or c.transfers.is_empty() or "api_ts_ns" not in c.transfers.columns:
        return pl.DataFrame(schema={k: _EVENT_SCHEMA[k] for k in _EVENT_SCHEMA if k not in ("window", "idle_ns")})
    tr = steady(c.transfers, results, by="step").filter(
        pl.col("host_blocking").fill_null(False) & pl.col("api_ts_ns").is_not_null())
    tr = tr.filter(~pl.col("correlation").is_in(implied_correlations(results)).fill_null(False))
    pageable = (pl.col("activity") == "memcpy") & (pl.col("host_memory") == "pageable")
    return tr.unique("correlation", keep="first", maintain_order=True).select(
        "step", pl.col("api_ts_ns").alias("ts_ns"),
        (pl.col("api_ts_ns") + pl.col("cpu_ns").fill_null(0)).alias("end_ns"),
        "pid", "tid",
        pl.when(pageable).then(pl.lit("pageable_memcpy")).otherwise(pl.lit("blocking_copies")).alias("owner"),
        pl.format("{} {}", "activity", "kind").alias("cause"),
        pl.lit(None, pl.String).alias("site"),
        pl.col("api").alias("apis"),
        pl.lit(1, pl.Int64).alias("n_calls"),
        pl.col("cpu_ns").fill_null(0).cast(pl.Int64).alias("blocked_ns"),
    )


def blocking_events(results: Results) -> pl.DataFrame:
    """Every host-blocking event of the steady steps, its owner rule and the owned GPU idle
    it covers (``idle_ns``; see the module docstring). ``blocked_ns`` is what the owner counts
    as the CPU wait: every call of an ``item_sync`` point, the synchronize calls of an
    ``explicit_sync`` / copy-op point, the call itself for a copy. Built once per rules run
    (the four owners read it)."""
    inputs = (results.typed("syncs", SyncsResult), results.typed("copies", CopiesResult), steps_of(results),
              results.typed("idle_gaps", IdleGapsResult), results.typed("gpu_time", GpuTimeResult))
    return shared(("blocking_events", *map(id, inputs)), lambda: _blocking_events(results))


def _blocking_events(results: Results) -> pl.DataFrame:
    pts = sync_points(results)
    syncs = pts.filter(pl.col("owner") != "copies").select(
        "step", "ts_ns", "end_ns", "pid", "tid", "owner", "cause", "site", "apis", "n_calls",
        pl.when(pl.col("owner") == "item_sync").then(pl.col("blocked_ns"))
        .otherwise(pl.col("explicit_blocked_ns")).fill_null(0).cast(pl.Int64).alias("blocked_ns"),
    )
    ev = pl.concat([syncs, _copy_events(results)], how="vertical_relaxed")
    sr = steps_of(results)
    w = sr.windows().select("window", "step", pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"))
    if ev.is_empty():
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    # The window of each event (from its start): ``step`` is null in a trace without steps.
    ev = ev.with_row_index("_r").sort("ts_ns").join_asof(
        w.drop("step").sort("_ws"), left_on="ts_ns", right_on="_ws", strategy="backward", check_sortedness=False)
    ig, dev = results.typed("idle_gaps", IdleGapsResult), primary_device(results)
    if ig is None or dev is None or ig.device_gaps.is_empty():
        return ev.sort("_r").with_columns(idle_ns=pl.lit(0, pl.Int64)).select(list(_EVENT_SCHEMA))
    gaps = ig.device_gaps.filter(pl.col("device") == dev).select("start_ns", "end_ns", "cause").sort("start_ns")
    # Its span: from its start until the GPU gets work again after it (the end of the gap
    # holding its end; its end when the GPU is busy then), the next event's start (any thread)
    # or its window's end, whichever is first.
    ev = ev.sort("end_ns").join_asof(
        gaps.select(pl.col("start_ns").alias("_gs"), pl.col("end_ns").alias("_ge")),
        left_on="end_ns", right_on="_gs", strategy="backward", check_sortedness=False,
    ).with_columns(_fed=pl.when(pl.col("_ge") > pl.col("end_ns")).then(pl.col("_ge")).otherwise(pl.col("end_ns")))
    ev = ev.sort("ts_ns", "_r")
    nxt = pl.col("ts_ns").shift(-1)
    ev = ev.with_columns(_hi=pl.min_horizontal("_fed", pl.col("_we").fill_null(pl.col("_fed")),
                                               nxt.fill_null(pl.col("_fed"))))
    ev = ev.with_columns(_hi=pl.max_horizontal("_hi", "ts_ns"))
    g = gaps.filter(pl.col("cause").is_in(list(OWNED_CAUSES))).select("start_ns", "end_ns")
    lo = covered_before(g, ev.select(pl.col("ts_ns").alias("t")), presorted=True)
    hi = covered_before(g, ev.select(pl.col("_hi").alias("t")), presorted=True)
    ev = ev.with_columns((hi - lo).fill_null(0).alias("idle_ns"))
    return ev.sort("_r").select(list(_EVENT_SCHEMA))


def priced(events: pl.DataFrame, owner: str) -> pl.DataFrame:
    """The events of ``owner`` with ``cost_ns``: the owned idle each covers that the CPU lead
    gained by removing the block would have covered.

    Without the block the CPU runs ahead by the time it was blocked (``blocked_ns``); that lead
    covers the owned idle of the event and, unused, that of the next events of the same run
    (consecutive events of this owner on one thread within one step; an event of another owner
    ends the run). With ``b`` blocked and ``d`` idle per event, the covered total after event i
    is ``C_i = min(C_{i-1} + d_i, B_i)`` (``B`` = cumulative blocked), i.e.
    ``C = D + min(0, cummin(B - D))`` (``D`` = cumulative idle); an event alone costs
    ``min(d, b)``. So Σ cost ≤ Σ owned idle.
    """
    if events.is_empty():
        return events.with_columns(cost_ns=pl.lit(None, pl.Int64))
    thread = ["pid", "tid"]
    p = events.with_row_index("_i").sort([*thread, "ts_ns"]).with_columns(
        _seg=((pl.col("owner") != pl.col("owner").shift(1)).fill_null(True)
              | (pl.col("window").fill_null(-1) != pl.col("window").fill_null(-1).shift(1)).fill_null(True))
        .cum_sum().over(thread))
    g = [*thread, "_seg"]
    b, d = pl.col("blocked_ns").fill_null(0), pl.col("idle_ns").fill_null(0)
    p = p.filter(pl.col("owner") == owner).with_columns(_B=b.cum_sum().over(g), _D=d.cum_sum().over(g))
    p = p.with_columns(_C=pl.col("_D") + pl.min_horizontal(pl.lit(0), (pl.col("_B") - pl.col("_D")).cum_min().over(g)))
    p = p.with_columns(cost_ns=(pl.col("_C") - pl.col("_C").shift(1).over(g).fill_null(0)).cast(pl.Int64))
    return p.sort("_i").drop("_i", "_seg", "_B", "_D", "_C")


def owned(results: Results, owner: str) -> pl.DataFrame:
    """:func:`priced` events of ``owner`` (steady steps)."""
    return priced(blocking_events(results), owner)


def implied_correlations(results: Results) -> list[int]:
    """Correlation ids of runtime calls under an op implying a sync: ``item_sync`` owns them."""
    s = results.typed("syncs", SyncsResult)
    if s is None or s.calls.is_empty():
        return []
    return s.calls.filter(implied_sync(pl.col("cause")))["correlation"].drop_nulls().to_list()
