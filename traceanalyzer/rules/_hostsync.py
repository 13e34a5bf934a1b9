"""Who owns each host-blocking call, and what it costs (private: shared by the copy and sync rules).

Four rules price time the CPU spent blocked: ``item_sync``, ``explicit_sync``,
``blocking_copies`` and ``pageable_memcpy``. Each blocking runtime call belongs to exactly one of
them, so their costs never count the same blocked time twice:

1. every call under an op that implies a sync (``aten::item``, ``nonzero`` …) → ``item_sync``;
2. a memcpy into/from **pageable** host memory → ``pageable_memcpy``;
3. a memcpy/memset issued by a **synchronous API** (``cudaMemcpy``, ``hipMemcpyWithStream`` …)
   → ``blocking_copies``; so is the stream/event sync a copy op makes itself (``.cpu()`` /
   ``copy_`` with ``non_blocking=False`` waits on the stream after the copy);
4. any other stream/device/event synchronize → ``explicit_sync``.

Sync-point costs (rules 1, 4 and the copy op's own stream sync in 3) are the GPU idle after the
points that the CPU, freed of the blocked time, could have covered (:func:`priced`; one point
alone: ``min(GPU idle after it, CPU blocked in it)``).
The idle is made **exclusive**: it stops where the thread enters its next blocking call (another
sync point or a blocking copy), which owns what follows. Copy costs (2, 3) are the CPU time of
the memcpy/memset calls.
"""

from __future__ import annotations

from typing import Any, Mapping

import polars as pl

from traceanalyzer.analyses._copysync import COPY_OPS
from traceanalyzer.rules._util import implied_sync, steady

EXPLICIT_KINDS = ("stream", "device", "event")

_POINT_SCHEMA = {
    "step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
    "cause": pl.String, "site": pl.String, "apis": pl.String, "n_calls": pl.Int64, "blocked_ns": pl.Int64,
    "explicit_blocked_ns": pl.Int64, "idle_after_ns": pl.Int64, "idle_excl_ns": pl.Int64, "owner": pl.String,
}


def sync_points(results: Mapping[str, Any]) -> pl.DataFrame:
    """Sync points of the steady steps with their owner rule and exclusive idle.

    Columns: ``step, ts_ns, end_ns, pid, tid, cause, site, apis, n_calls, blocked_ns``
    (all calls), ``explicit_blocked_ns`` (its stream/device/event calls only), ``idle_after_ns``
    (as the ``syncs`` analysis gives it), ``idle_excl_ns`` (clipped at the thread's next blocking
    call) and ``owner``: ``item_sync``, ``explicit_sync``, ``blocking_copies`` (the sync a copy op
    makes) or ``copies`` (only memcpy calls: priced by the copy rules from their CPU time).
    """
    s = results.get("syncs") if hasattr(results, "get") else None
    if s is None or s.calls.is_empty() or s.points.is_empty():
        return pl.DataFrame(schema=_POINT_SCHEMA)
    calls = s.calls.with_columns(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
        end_ns=pl.col("ts_ns") + pl.col("blocked_ns").fill_null(0),
    ).sort("ts_ns")
    # A point starts at its first call: find that call's thread, then give every call the latest
    # point that started on its thread at or before it (points of one thread never interleave).
    first = calls.unique(["ts_ns", "cause", "site"], keep="first", maintain_order=True).select(
        "ts_ns", "cause", "site", "pid", "tid")
    pts = s.points.with_row_index("pt").with_columns(pl.col("pt").cast(pl.Int64)).join(
        first, on=["ts_ns", "cause", "site"], how="left")
    starts = pts.filter(pl.col("pid").is_not_null()).select("pid", "tid", pl.col("ts_ns").alias("_ps"), "pt").sort("_ps")
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
    )
    # Next blocking call on the same thread after the point ends: a later sync call, or a
    # host-blocking copy (pageable HtoD copies are no sync calls but block the thread too).
    # A DataLoader wait is no such boundary: with the sync gone it would overlap the GPU's
    # backlog, so the lead covers it (dataloader_bottleneck reports the same idle as the other fix).
    nxt = [calls.select("pid", "tid", pl.col("ts_ns").alias("_n"))]
    c = results.get("copies") if hasattr(results, "get") else None
    if c is not None and c.copies.height:
        nxt.append(c.copies.filter(pl.col("host_blocking").fill_null(False) & pl.col("pid").is_not_null()).select(
            pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col("t_ns").alias("_n")))
    nxt_df = pl.concat(nxt).sort("_n")
    pts = pts.sort("end_ns").join_asof(nxt_df, left_on="end_ns", right_on="_n", by=["pid", "tid"],
                                       strategy="forward", allow_exact_matches=True, check_sortedness=False)
    idle = pl.col("idle_after_ns")
    pts = pts.with_columns(
        idle_excl_ns=pl.when(idle.is_null()).then(None)
        .when(pl.col("_n").is_not_null()).then(pl.min_horizontal(idle, (pl.col("_n") - pl.col("end_ns")).clip(0)))
        .otherwise(idle).cast(pl.Int64),
    ).sort("pt")
    return steady(pts.select(list(_POINT_SCHEMA)), results, by="step")


def priced(points: pl.DataFrame, owner: str, blocked: str = "blocked_ns") -> pl.DataFrame:
    """The points of ``owner`` with ``cost_ns``: the exclusive idle after each point that the CPU
    lead gained by removing this rule's syncs would have covered.

    Without the syncs the CPU runs ahead by the time it was blocked (``blocked``); that lead
    covers the idle after the point and, unused, the idle after the next points of the same
    run (consecutive points of this owner on one thread within one step; a point of another
    owner drains the queue anyway and ends the run). With ``b`` blocked and ``d`` idle per point,
    the covered total after point i is ``C_i = min(C_{i-1} + d_i, B_i)`` (``B`` = cumulative
    blocked), i.e. ``C = D + min(0, cummin(B - D))`` (``D`` = cumulative idle); a point alone
    costs ``min(d, b)``.
    """
    if points.is_empty():
        return points.with_columns(cost_ns=pl.lit(None, pl.Int64))
    thread = ["pid", "tid"]
    p = points.with_row_index("_i").sort([*thread, "ts_ns"]).with_columns(
        _seg=((pl.col("owner") != pl.col("owner").shift(1)).fill_null(True)
              | (pl.col("step").fill_null(-1) != pl.col("step").fill_null(-1).shift(1)).fill_null(True))
        .cum_sum().over(thread))
    g = [*thread, "_seg"]
    b, d = pl.col(blocked).fill_null(0), pl.col("idle_excl_ns").fill_null(0)
    p = p.filter(pl.col("owner") == owner).with_columns(_B=b.cum_sum().over(g), _D=d.cum_sum().over(g))
    p = p.with_columns(_C=pl.col("_D") + pl.min_horizontal(pl.lit(0), (pl.col("_B") - pl.col("_D")).cum_min().over(g)))
    p = p.with_columns(cost_ns=(pl.col("_C") - pl.col("_C").shift(1).over(g).fill_null(0)).cast(pl.Int64))
    return p.sort("_i").drop("_i", "_seg", "_B", "_D", "_C")


def implied_correlations(results: Mapping[str, Any]) -> list[int]:
    """Correlation ids of runtime calls under an op implying a sync: ``item_sync`` owns them."""
    s = results.get("syncs") if hasattr(results, "get") else None
    if s is None or s.calls.is_empty():
        return []
    return s.calls.filter(implied_sync(pl.col("cause")))["correlation"].drop_nulls().to_list()
