"""Syncs: where the host waited for the device, for how long, and which line asked for it.

Definitions (``docs/copies_and_syncs.md`` has the long form)
-----------------------------------------------------------
* A **sync call** is a runtime call that blocks the calling CPU thread until device work
  has finished:

  - explicit synchronisation: ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize`` (and ``cu*``/``hip*`` equivalents, XPU
    ``urQueueFinish``/``urEventWait``/``ze*HostSynchronize``, MTIA ``synchronizeStream``);
  - a **blocking copy**: a synchronous memcpy API (``cudaMemcpy``, ``hipMemcpy``,
    ``hipMemcpyWithStream`` …; a CUDA device-to-device ``cudaMemcpy`` does not block and
    is left out), or any copy from the device into *pageable* host memory, async API
    included (the driver returns only when the data has landed).

  Only the outermost of nested sync calls on one thread counts.
* **Blocked time** (``blocked_ns``) is the sync call's CPU duration.
* **GPU idle after** (``idle_after_ns``): from the call's end to the next GPU activity on
  the device the thread last launched to (0 if that device is still busy, e.g. another
  stream; null when nothing runs afterwards). A sync drains the queue; this is how long the
  GPU then waits for the CPU to feed it again.
* The **cause** is the outermost op implying a sync that encloses the call
  (``aten::item``, ``aten::_local_scalar_dense``, ``aten::nonzero``, ``aten::is_nonzero``,
  ``aten::masked_select``, ``aten::unique*``, ``aten::equal``, ``aten::index`` — the
  latter syncs only for boolean masks and is shown as ``aten::index (boolean mask)``),
  else the outermost CPU op around the call (``aten::to`` for ``.cpu()``), else the API
  itself (``torch.cuda.synchronize()`` has no op).
* **GPU idle after, per step** (``idle_after_ns`` of ``per_step``, ``by_cause``, ``by_site`` and
  the totals; ``idle_after_excl_ns`` of a point): the idle after each point counted once and
  inside its own step. Several points can drain into the same gap (two ``.item()`` in a row
  both see the idle up to the next kernel): a point's share stops where the next point (any
  thread) ends, and at the end of its step window. So the per-step figure never exceeds the
  step (``pct_idle_after`` is % of the step window).
* A **sync point** is one cause instance: an ``aten::item`` (or a ``.cpu()``'s ``aten::to``)
  that issued a DtoH copy and a stream sync is one point with two calls. Hotspot counts
  are sync points.
* Points are attributed to a call site like copies (:mod:`~traceanalyzer.analyses._callsites`)
  and counted per step window (by the point's first call).

Settings: ``syncs.top_n`` (15), ``syncs.max_events`` (5000),
``syncs.library_modules`` / ``syncs.user_modules``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._callsites import STACK_HINT, attribute, cpu_tree, has_stacks
from traceanalyzer.analyses._copysync import (
    SYNC_COPY_APIS,
    containing,
    csv_setting,
    outermost,
    step_windows,
    transfers,
)
from traceanalyzer.analyses._intervals import device_union, mean_of, pct
from traceanalyzer.analyses._rows import rows
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, gpu_activity, launches
from traceanalyzer.units import fmt_ns

#: Explicit host-device synchronisation APIs → kind.
SYNC_APIS: dict[str, str] = {
    "cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream", "hipStreamSynchronize": "stream",
    "cudaStreamSynchronize_ptsz": "stream", "cuStreamSynchronize_ptsz": "stream",
    "cudaDeviceSynchronize": "device", "cudaThreadSynchronize": "device", "cuCtxSynchronize": "device",
    "hipDeviceSynchronize": "device", "hipCtxSynchronize": "device",
    "cudaEventSynchronize": "event", "cuEventSynchronize": "event", "hipEventSynchronize": "event",
    # Intel XPU (Unified Runtime / Level Zero)
    "urQueueFinish": "stream", "zeCommandQueueSynchronize": "stream", "zeCommandListHostSynchronize": "stream",
    "urEventWait": "event", "zeEventHostSynchronize": "event", "zeFenceHostSynchronize": "event",
    # MTIA ("synchronize" with the same correlation is the driver process' side of it, not a host call)
    "synchronizeStream": "stream",
}

#: CPU ops that force a device→host sync when their tensor lives on the device.
IMPLIED_SYNC_OPS: tuple[str, ...] = (
    "aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::masked_select",
    "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::equal", "aten::index",
    "aten::index_put_", "aten::repeat_interleave", "aten::multinomial",
)


@dataclass(frozen=True)
class SyncsResult:
    """Host-device synchronisations of one trace. See the module docstring."""

    totals: dict[str, Any]
    by_cause: pl.DataFrame
    by_site: pl.DataFrame
    per_step: pl.DataFrame
    points: pl.DataFrame
    calls: pl.DataFrame
    has_stacks: bool
    has_steps: bool
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def stack_hint(self) -> str | None:
        return None if self.has_stacks else STACK_HINT

    def to_json(self) -> dict[str, Any]:
        cap = int(self.settings.get("max_events", 5000))
        return {
            "totals": self.totals,
            "has_stacks": self.has_stacks,
            "stack_hint": self.stack_hint,
            "has_steps": self.has_steps,
            "by_cause": rows(self.by_cause),
            "by_site": rows(self.by_site),
            "per_step": rows(self.per_step),
            "points": rows(self.points.head(cap)),
            "points_total": self.points.height,
            "calls": rows(self.calls.head(cap)),
            "calls_total": self.calls.height,
            "settings": self.settings,
        }

    def summary(self) -> list[tuple[str, str]]:
        t = self.totals
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(t["calls_by_kind"].items()))
        out = [
            ("Sync points", f"{t['sync_points']:,} ({t['sync_calls']:,} blocking calls: {kinds or 'none'})"),
            ("CPU blocked", f"{fmt_ns(t['blocked_ns'])}" + (
                f" ({t['pct_blocked_of_steps']:.2f} % of step time"
                + (f", summed over {t['blocking_threads']} threads" if t.get("blocking_threads", 0) > 1 else "") + ")"
                if t["pct_blocked_of_steps"] is not None else ""
            )),
            ("GPU idle after syncs", fmt_ns(t["idle_after_ns"]) + (
                f" ({t['pct_idle_after_of_steps']:.2f} % of step time)"
                if t["pct_idle_after_of_steps"] is not None else ""
            )),
        ]
        if self.has_steps and self.per_step.height:
            out.append(("Per step (mean)", f"{mean_of(self.per_step['sync_points']):,.1f} sync points, "
                        f"{fmt_ns(mean_of(self.per_step['blocked_ns']))} blocked"))
        if self.by_cause.height:
            top = self.by_cause.row(0, named=True)
            out.append(("Top cause", f"{top['cause']} ({top['count']:,}×, {fmt_ns(top['blocked_ns'])} blocked)"))
        if self.by_site.height and self.has_stacks:
            top = self.by_site.row(0, named=True)
            out.append(("Top call site", f"{top['site']} ({top['count']:,}×)"))
        if t["implied_ops_without_sync"]:
            out.append(("Sync-implying ops without a device sync", f"{t['implied_ops_without_sync']:,} "
                        "(aten::item etc. on CPU tensors: no cost)"))
        if not self.has_stacks:
            out.append(("Call sites", "no Python stacks: profile with with_stack=True to name the file and line"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        n = int(self.settings.get("top_n", 15))
        return {
            "Sync hotspots by cause": self.by_cause.head(n),
            "Sync hotspots by call site": self.by_site.head(n),
            "Syncs per step": self.per_step,
        }


def _sync_calls(t: TraceTables) -> pl.DataFrame:
    """Blocking runtime calls: ``api, sync_kind, ts_ns, dur_ns, end_ns, pid, tid, correlation, device``."""
    model = t.model
    rt = model.runtime.with_row_index("ev_order").with_columns(pl.col("ev_order").cast(pl.Int64))
    explicit = rt.filter(pl.col("name").is_in(list(SYNC_APIS))).with_columns(
        sync_kind=pl.col("name").replace_strict(SYNC_APIS, default="other"), device=pl.lit(None, pl.Int64)
    )
    tr = transfers(t).filter((pl.col("activity") == "memcpy") & pl.col("api").is_not_null())
    # One verdict per call: blocking if any of its copies is (a call issues one copy in practice).
    per_call = tr.group_by("correlation").agg(
        blocking=(
            (
                (pl.col("api_mode") == "sync")
                & ~(pl.col("kind").is_in(["DtoD", "PtoP"]) & pl.col("api").str.starts_with("cu"))
            )
            | ((pl.col("kind") == "DtoH") & (pl.col("host_memory") == "pageable"))
        ).any(),
        device=pl.col("device").first(),
    )
    memcpy_apis = [a for a in SYNC_COPY_APIS if "emset" not in a]
    copies = (
        rt.join(per_call, on="correlation", how="left")
        .filter(
            pl.col("blocking").fill_null(False)
            # a synchronous memcpy API whose copy was not recorded still blocked the host
            | (pl.col("blocking").is_null() & pl.col("name").is_in(memcpy_apis))
        )
        .with_columns(sync_kind=pl.lit("memcpy"))
        .drop("blocking")
    )
    cols = ["name", "sync_kind", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "correlation", "device", "ev_order"]
    calls = pl.concat([explicit.select(cols), copies.select(cols)]).unique("ev_order")
    return outermost(calls).rename({"name": "api"}).sort("ts_ns")


def _idle_after(t: TraceTables, calls: pl.DataFrame) -> pl.Series:
    """GPU idle from each call's end to the next activity on its device (0 if busy, null if none)."""
    gpu = gpu_activity(t).filter(pl.col("device").is_not_null())
    if gpu.is_empty() or calls.is_empty():
        return pl.Series("idle_after_ns", [None] * calls.height, dtype=pl.Int64)
    default_dev = int(gpu.group_by("device").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)["device"][0])
    lk = (
        launches(t)
        .select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col("cpu_ts_ns").alias("_t"),
                pl.col("device").alias("_last_dev"))
        .filter(pl.col("_last_dev").is_not_null())
        .sort("_t")
    )
    c = calls.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "ts_ns", "end_ns", "device")
    c = c.with_row_index("_row").sort("ts_ns")
    if lk.height:
        c = c.join_asof(lk, left_on="ts_ns", right_on="_t", by=["pid", "tid"], strategy="backward",
                        check_sortedness=False).drop("_t")
    else:
        c = c.with_columns(_last_dev=pl.lit(None, pl.Int64))
    c = c.with_columns(dev=pl.coalesce("device", "_last_dev", pl.lit(default_dev, pl.Int64))).sort("end_ns")
    merged = device_union(t).rename({"device": "dev"})  # = merge_intervals(gpu, by=["device"])
    busy = merged.select("dev", pl.col("start_ns").alias("_bs"), pl.col("end_ns").alias("_be")).sort("_bs")
    nxt = merged.select("dev", pl.col("start_ns").alias("_ns")).sort("_ns")
    c = c.join_asof(busy, left_on="end_ns", right_on="_bs", by="dev", strategy="backward", check_sortedness=False)
    c = c.join_asof(nxt, left_on="end_ns", right_on="_ns", by="dev", strategy="forward", check_sortedness=False)
    idle = (
        pl.when(pl.col("_be").is_not_null() & (pl.col("_be") > pl.col("end_ns")))
        .then(pl.lit(0, pl.Int64))
        .when(pl.col("_ns").is_not_null())
        .then(pl.col("_ns") - pl.col("end_ns"))
        .otherwise(None)
    )
    return c.with_columns(idle_after_ns=idle).sort("_row")["idle_after_ns"]


def _exclusive_idle(points: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Add ``idle_after_excl_ns``: the idle after each point, ``[end, end + idle_after)``, cut
    at the end of the next point (by end time, any thread) and at the end of the point's step
    window. The pieces of one window are disjoint, so their sum is at most the window."""
    w_end = windows.select("window", pl.col("end_ns").alias("_wend"))
    p = points.with_row_index("_r").join(w_end, on="window", how="left").sort("end_ns", "_r")
    hi = pl.col("end_ns") + pl.col("idle_after_ns")
    hi = pl.min_horizontal(hi, pl.col("end_ns").shift(-1).fill_null(hi))
    hi = pl.min_horizontal(hi, pl.col("_wend").fill_null(hi))
    p = p.with_columns(
        idle_after_excl_ns=pl.when(pl.col("idle_after_ns").is_null()).then(None)
        .otherwise((hi - pl.col("end_ns")).clip(lower_bound=0)).cast(pl.Int64))
    return p.sort("_r").drop("_r", "_wend")


def _hotspots(points: pl.DataFrame, keys: list[str], n_steps: int | None, extra: list[pl.Expr]) -> pl.DataFrame:
    per_step = (
        (pl.col("window").is_not_null().sum() / n_steps).round(2) if n_steps else pl.lit(None, dtype=pl.Float64)
    )
    return (
        points.group_by(keys)
        .agg(
            *extra,
            count=pl.len().cast(pl.Int64),
            per_step=per_step,
            calls=pl.col("n_calls").sum(),
            blocked_ns=pl.col("blocked_ns").sum(),
            mean_blocked_ns=pl.col("blocked_ns").mean().round(0).cast(pl.Int64),
            max_blocked_ns=pl.col("blocked_ns").max(),
            idle_after_ns=pl.col("idle_after_excl_ns").sum(),
        )
        .sort(["blocked_ns", "count", *keys], descending=[True, True, *([False] * len(keys))], nulls_last=True)
    )


@analysis(
    "syncs", title="Host-device syncs", order=61, depends_on=("steps",),
    shared=("cpu_tree", "device_union", "gpu_activity", "launches", "runtime_by_correlation", "transfers"),
    params={"top_n": 15, "max_events": 5000, "library_modules": "", "user_modules": ""},
)
def syncs(ctx: AnalysisContext[TraceModel]) -> SyncsResult:
    """Host-device synchronisations (explicit syncs, blocking copies, ops implying them): CPU blocked
    time, GPU idle that followed, grouped by cause, by call site and per step."""
    model = ctx.model
    top_n = ctx.params.top_n
    max_events = ctx.params.max_events
    libs = csv_setting(ctx.params.library_modules)
    users = csv_setting(ctx.params.user_modules)

    implied = model.cpu_ops.filter(pl.col("name").is_in(list(IMPLIED_SYNC_OPS)))
    if model.runtime.is_empty():
        what = f" ({implied.height:,} ops such as aten::item ran on CPU tensors)" if implied.height else ""
        raise NotApplicable(
            "no device runtime calls in this trace (CPU-only or runtime activity not recorded): "
            f"host-device syncs cannot occur or be seen{what}"
        )
    windows, has_steps = step_windows(ctx.need("steps", StepsResult))
    n_steps = windows.height if has_steps else None

    calls = _sync_calls(ctx.tables).with_row_index("call_id").with_columns(pl.col("call_id").cast(pl.Int64))
    calls = calls.with_columns(idle_after_ns=_idle_after(ctx.tables, calls))

    # Cause: the outermost sync-implying op around the call.
    imp = implied.with_row_index("ev_order").with_columns(pl.col("ev_order").cast(pl.Int64))
    imp_outer = outermost(imp).with_row_index("imp_id").with_columns(pl.col("imp_id").cast(pl.Int64))
    calls = calls.with_columns(imp_id=containing(calls, imp_outer, "ts_ns", "imp_id"))
    calls = calls.join(imp_outer.select("imp_id", pl.col("name").alias("implied_op")), on="imp_id", how="left")

    tree = cpu_tree(ctx.tables)
    att = attribute(ctx.tables, calls.select("pid", "tid", "ts_ns"), "ts_ns", libs, users, tree=tree)
    calls = pl.concat(
        [calls, att.select("site", "via", "site_kind", "outermost_op", "outermost_op_id", "chain")], how="horizontal"
    )
    calls = calls.with_columns(
        cause=pl.coalesce(
            pl.when(pl.col("implied_op") == "aten::index")
            .then(pl.lit("aten::index (boolean mask)"))
            .otherwise(pl.col("implied_op")),
            "outermost_op",
            "api",
        ),
        site=pl.coalesce("site", pl.lit("(outside any op or annotation)")),
        site_kind=pl.coalesce("site_kind", pl.lit("none")),
        # One point per implying-op instance, else per outermost-op instance, else per call.
        point=pl.coalesce(
            pl.format("i{}", "imp_id"), pl.format("o{}", "outermost_op_id"), pl.format("c{}", "call_id")
        ),
    )
    calls = assign_steps(calls, windows, "ts_ns")

    points = (
        calls.sort("ts_ns")
        .group_by("point", maintain_order=True)
        .agg(
            ts_ns=pl.col("ts_ns").first(),
            step=pl.col("step").first(),
            window=pl.col("window").first(),
            cause=pl.col("cause").first(),
            apis=pl.col("api").unique(maintain_order=True).str.join(", "),
            kinds=pl.col("sync_kind").unique(maintain_order=True).str.join(", "),
            n_calls=pl.len().cast(pl.Int64),
            blocked_ns=pl.col("dur_ns").sum(),
            idle_after_ns=pl.col("idle_after_ns").last(),
            end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).max(),
            site=pl.col("site").first(),
            via=pl.col("via").first(),
            site_kind=pl.col("site_kind").first(),
            chain=pl.col("chain").first(),
        )
        .drop("point")
    )
    points = _exclusive_idle(points, windows)

    by_cause = _hotspots(points, ["cause"], n_steps, [pl.col("apis").unique().sort().str.join(", ").alias("apis")])
    by_site = _hotspots(
        points,
        ["site", "via"],
        n_steps,
        [
            pl.col("site_kind").first().alias("site_kind"),
            pl.col("cause").unique().sort().str.join(", ").alias("causes"),
        ],
    ).select("site", "via", "site_kind", "causes", "count", "per_step", "calls", "blocked_ns", "mean_blocked_ns",
             "max_blocked_ns", "idle_after_ns")

    per_step = (
        windows.select("window", "step", pl.col("dur_ns").alias("step_ns"))
        .join(
            points.filter(pl.col("window").is_not_null())
            .group_by("window")
            .agg(
                sync_points=pl.len().cast(pl.Int64),
                sync_calls=pl.col("n_calls").sum(),
                blocked_ns=pl.col("blocked_ns").sum(),
                idle_after_ns=pl.col("idle_after_excl_ns").sum(),
            ),
            on="window",
            how="left",
        )
        .with_columns(pl.col(c).fill_null(0) for c in ("sync_points", "sync_calls", "blocked_ns", "idle_after_ns"))
        .with_columns(
            pct_blocked=pl.when(pl.col("step_ns") > 0).then(
                (pl.col("blocked_ns") * 100.0 / pl.col("step_ns")).round(3)),
            pct_idle_after=pl.when(pl.col("step_ns") > 0).then(
                (pl.col("idle_after_ns") * 100.0 / pl.col("step_ns")).round(3)
            ),
        )
        .sort("window")
        .drop("window")
    )

    window_total = int(windows["dur_ns"].sum())
    in_w = points.filter(pl.col("window").is_not_null())
    imp_with_sync = calls["imp_id"].drop_nulls().n_unique()
    totals: dict[str, Any] = {
        "sync_points": points.height,
        "sync_calls": calls.height,
        "calls_by_kind": dict(calls.group_by("sync_kind").len().sort("sync_kind").iter_rows()),
        "calls_by_api": dict(calls.group_by("api").len().sort("api").iter_rows()),
        "blocked_ns": int(calls["dur_ns"].sum() or 0),
        "blocking_threads": int(calls.select("pid", "tid").n_unique()) if calls.height else 0,
        "idle_after_ns": int(points["idle_after_excl_ns"].sum() or 0),
        "implied_ops": imp_outer.height,
        "implied_ops_with_sync": int(imp_with_sync),
        "implied_ops_without_sync": int(imp_outer.height - imp_with_sync),
        "gpu_sync_records": int(model.other_events.filter(pl.col("cat") == "cuda_sync").height),
        "window_ns": window_total,
        "pct_blocked_of_steps": pct(int(in_w["blocked_ns"].sum() or 0), window_total),
        "pct_idle_after_of_steps": pct(int(in_w["idle_after_excl_ns"].sum() or 0), window_total),
    }
    return SyncsResult(
        totals=totals,
        by_cause=by_cause,
        by_site=by_site,
        per_step=per_step,
        points=points.select(
            "step", "ts_ns", "cause", "apis", "kinds", "n_calls", "blocked_ns", "idle_after_ns", "idle_after_excl_ns",
            "site", "via",
            "site_kind", "chain",
        ),
        calls=calls.select(
            "step", "api", "sync_kind", "ts_ns", pl.col("dur_ns").alias("blocked_ns"), "idle_after_ns", "pid", "tid",
            "correlation", "cause", "site", "via",
        ),
        has_stacks=has_stacks(model),
        has_steps=has_steps,
        settings={"top_n": top_n, "max_events": max_events, "library_modules": libs, "user_modules": users},
    )
