"""Copies: every tensor copy and GPU transfer, what it costs, and which line made it.

Definitions (``docs/copies_and_syncs.md`` has the long form)
-----------------------------------------------------------
* A **transfer** is one GPU ``memcpy`` or ``memset`` record. Its ``kind`` (HtoD, DtoH,
  DtoD, PtoP, HtoH) and host memory (``pinned``/``pageable``; ``unknown`` on ROCm, whose
  names only say ``Host``; ``n/a`` on device) come from the record's name; ``bytes``
  from its args; ``gpu_ns`` is its duration; ``gbps`` = bytes / duration (GB/s, 10⁹ B).
  It is joined by correlation id to the runtime call that issued it: the call's name
  says **sync or async API**, its duration is the **CPU time** the transfer cost.
  ``host_blocking``: a sync API, or pageable host memory (an async copy from/to
  pageable memory is staged synchronously by the driver).
* A **copy op** is an outermost ``aten::copy_``/``aten::to``/``aten::_to_copy``/
  ``aten::contiguous``/``aten::clone`` on its thread (``aten::to > _to_copy > copy_``
  counts once). Its CPU time is its duration; its GPU time is the duration of every
  memcpy, memset and kernel launched from inside it; its bytes are the bytes of those
  memcpys; its direction is their kinds (``on device (kernel)`` when it only launched
  kernels, ``host`` when it launched nothing: a CPU tensor copy).
* A **copy** (hotspot unit) is a copy op, or a memcpy issued outside any copy op
  (DataLoader pinning, NCCL, library code …).
* Copies are attributed to the **CPU op** (the copy op itself; for a loose memcpy the
  outermost CPU op around its runtime call) and to the **call site**
  (:mod:`traceanalyzer.analyses._callsites`: innermost user Python frame with
  ``with_stack=True``, else the record_function/op chain).
* Per **step** (the ``steps`` analysis' windows; one whole-trace window without steps)
  each copy counts in the window holding its CPU start (a loose memcpy: its call's start,
  or its GPU start when no call is known). ``pct_gpu`` / ``pct_cpu`` are copy GPU / CPU
  time over the window length.

Settings: ``copies.top_n`` (15) rows per hotspot table, ``copies.max_events`` (5000)
per-event rows kept in JSON, ``copies.library_modules`` / ``copies.user_modules``
(comma-separated top-level modules to treat as library / as user code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._callsites import STACK_HINT, attribute, cpu_tree, has_stacks
from traceanalyzer.analyses._copysync import (
    COPY_OPS,
    api_mode,
    containing,
    csv_setting,
    kind_from_api,
    outermost,
    step_windows,
    transfers,
)
from traceanalyzer.analyses._intervals import mean_of, pct
from traceanalyzer.analyses._rows import rows
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import launches
from traceanalyzer.units import fmt_bytes, fmt_ns


@dataclass(frozen=True)
class CopiesResult:
    """Copies and transfers of one trace. See the module docstring for each number."""

    totals: dict[str, Any]
    by_kind: pl.DataFrame
    by_op: pl.DataFrame
    by_site: pl.DataFrame
    per_step: pl.DataFrame
    copies: pl.DataFrame
    transfers: pl.DataFrame
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
            "by_kind": rows(self.by_kind),
            "by_op": rows(self.by_op),
            "by_site": rows(self.by_site),
            "per_step": rows(self.per_step),
            "copies": rows(self.copies.head(cap)),
            "copies_total": self.copies.height,
            "transfers": rows(self.transfers.head(cap)),
            "transfers_total": self.transfers.height,
            "settings": self.settings,
        }

    def summary(self) -> list[tuple[str, str]]:
        t = self.totals
        out = [
            (
                "GPU memcpy",
                f"{t['memcpy_count']:,} ({fmt_bytes(t['memcpy_bytes'])}, {fmt_ns(t['memcpy_gpu_ns'])} GPU)",
            ),
            (
                "GPU memset",
                f"{t['memset_count']:,} ({fmt_bytes(t['memset_bytes'])}, {fmt_ns(t['memset_gpu_ns'])} GPU)",
            ),
        ]
        for d in ("HtoD", "DtoH", "DtoD", "PtoP"):
            k = t["by_direction"].get(d)
            if k:
                bw = f", {k['gbps']:.1f} GB/s" if k.get("gbps") is not None else ""
                out.append((f"{d} copies", f"{k['count']:,}: {fmt_bytes(k['bytes'])} in {fmt_ns(k['gpu_ns'])}{bw}"))
        if t["pageable_count"]:
            out.append(
                ("Pageable host memory", f"{t['pageable_count']:,} transfers, {fmt_bytes(t['pageable_bytes'])} "
                 "(pin_memory() / DataLoader(pin_memory=True) would make them async)")
            )
        if t["unknown_memory_count"]:
            out.append(
                ("Host memory unknown", f"{t['unknown_memory_count']:,} host transfers (the trace does not say "
                 "pinned or pageable, e.g. ROCm)")
            )
        if t["sync_api_count"]:
            out.append(("Synchronous copy APIs", f"{t['sync_api_count']:,} calls (cudaMemcpy/hipMemcpy…)"))
        out.append(
            ("Copy ops", f"{t['copy_ops']:,} (CPU {fmt_ns(t['copy_ops_cpu_ns'])}, GPU {fmt_ns(t['copy_ops_gpu_ns'])})")
        )
        if self.has_steps and self.per_step.height:
            ps = self.per_step
            out.append(
                (
                    "Per step (mean)",
                    f"{mean_of(ps['copies']):,.1f} copies, {fmt_bytes(mean_of(ps['bytes']))}, "
                    f"GPU {fmt_ns(mean_of(ps['gpu_ns']))} ({(mean_of(ps['pct_gpu']) or 0):.2f} % of step), "
                    f"CPU {fmt_ns(mean_of(ps['cpu_ns']))} ({(mean_of(ps['pct_cpu']) or 0):.2f} % of step)",
                )
            )
        if self.by_site.height:
            top = self.by_site.row(0, named=True)
            out.append(("Top call site", f"{top['site']} ({top['count']:,} copies)"))
        if not self.has_stacks:
            out.append(("Call sites", "no Python stacks: profile with with_stack=True to name the file and line"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        n = int(self.settings.get("top_n", 15))
        return {
            "Transfers by kind": self.by_kind,
            "Copy hotspots by CPU op": self.by_op.head(n),
            "Copy hotspots by call site": self.by_site.head(n),
            "Copies per step": self.per_step,
        }


def _hotspots(copies: pl.DataFrame, keys: list[str], n_steps: int | None, extra: list[pl.Expr]) -> pl.DataFrame:
    per_step = (
        (pl.col("window").is_not_null().sum() / n_steps).round(2) if n_steps else pl.lit(None, dtype=pl.Float64)
    )
    return (
        copies.group_by(keys)
        .agg(
            *extra,
            count=pl.len().cast(pl.Int64),
            per_step=per_step,
            bytes=pl.col("bytes").sum(),
            gpu_ns=pl.col("gpu_ns").sum(),
            cpu_ns=pl.col("cpu_ns").sum(),
            blocking=pl.col("host_blocking").sum().cast(pl.Int64),
        )
        .with_columns(_cost=pl.col("gpu_ns") + pl.col("cpu_ns"))
        .sort(["_cost", "count", *keys], descending=[True, True, *([False] * len(keys))], nulls_last=True)
        .drop("_cost")
    )


@analysis(
    "copies", title="Copies and transfers", order=60, depends_on=("steps",),
    shared=("cpu_tree", "gpu_activity", "launches", "runtime_by_correlation", "transfers"),
    params={"top_n": 15, "max_events": 5000, "library_modules": "", "user_modules": ""},
)
def copies(ctx: AnalysisContext[TraceModel]) -> CopiesResult:
    """Every copy op and GPU memcpy/memset: direction, bytes, bandwidth, pinned/pageable, sync/async,
    GPU and CPU time, grouped by CPU op, by call site and per step."""
    model = ctx.model
    top_n = ctx.params.top_n
    max_events = ctx.params.max_events
    libs = csv_setting(ctx.params.library_modules)
    users = csv_setting(ctx.params.user_modules)

    tr = transfers(ctx.tables)
    ops = model.cpu_ops.filter(pl.col("name").is_in(list(COPY_OPS)))
    if tr.is_empty() and ops.is_empty():
        raise NotApplicable(
            "no GPU memcpy/memset events and no aten::copy_/to/_to_copy/contiguous/clone ops in this trace"
        )
    windows, has_steps = step_windows(ctx.need("steps", StepsResult))
    n_steps = windows.height if has_steps else None

    # Outermost copy ops and everything launched from inside them.
    ops = ops.with_row_index("ev_order").with_columns(pl.col("ev_order").cast(pl.Int64))
    outer = outermost(ops).with_row_index("copy_id").with_columns(pl.col("copy_id").cast(pl.Int64))
    # aten::to / aten::contiguous that return their input (already the right dtype, device or
    # layout) copy nothing: no nested copy op. They are counted apart, not as copies.
    members = ops.select("pid", "tid", "ts_ns").with_columns(copy_id=containing(ops, outer, "ts_ns"))
    n_members = members.group_by("copy_id").agg(_members=pl.len())
    outer = outer.join(n_members, on="copy_id", how="left")
    noop = pl.col("name").is_in(["aten::to", "aten::contiguous"]) & (pl.col("_members").fill_null(1) <= 1)
    n_noop = int(outer.select(noop.sum()).item() or 0)
    outer = outer.filter(~noop).drop("_members")
    tr = tr.with_columns(copy_id=containing(tr.with_columns(pl.col("api_ts_ns").fill_null(-1)), outer, "api_ts_ns"))
    tr = tr.with_columns(pl.when(pl.col("api").is_null()).then(None).otherwise(pl.col("copy_id")).alias("copy_id"))
    rt = model.runtime.select("name", "ts_ns", "pid", "tid", "correlation")
    rt = rt.with_columns(copy_id=containing(rt, outer, "ts_ns")).filter(pl.col("copy_id").is_not_null())
    # The columns read below, then the rows: a filter copies every column it is given.
    lk = launches(ctx.tables).select("activity", "pid", "tid", "cpu_ts_ns", "gpu_dur_ns").filter(
        pl.col("activity") == "kernel"
    )
    lk = lk.with_columns(copy_id=containing(lk, outer, "cpu_ts_ns")).filter(pl.col("copy_id").is_not_null())

    is_mc = pl.col("activity") == "memcpy"
    per_tr = tr.filter(pl.col("copy_id").is_not_null()).group_by("copy_id").agg(
        bytes=pl.col("bytes").filter(is_mc).sum(),
        n_memcpy=is_mc.sum().cast(pl.Int64),
        xfer_gpu_ns=pl.col("dur_ns").sum(),
        kinds=pl.col("kind").filter(is_mc).unique().sort(),
        mems=pl.col("host_memory").filter(is_mc & (pl.col("host_memory") != "n/a")).unique().sort(),
        blocking=pl.col("host_blocking").filter(is_mc).any(),
    )
    per_rt = rt.group_by("copy_id").agg(
        n_calls=pl.len().cast(pl.Int64),
        api_kinds=kind_from_api(pl.col("name")).drop_nulls().unique().sort(),
        modes=api_mode(pl.col("name")).filter(pl.col("name").str.contains("(?i)mem(cpy|set)")).unique().sort(),
    )
    per_k = lk.group_by("copy_id").agg(kernel_gpu_ns=pl.col("gpu_dur_ns").sum(), n_kernels=pl.len().cast(pl.Int64))
    co = (
        outer.join(per_tr, on="copy_id", how="left")
        .join(per_rt, on="copy_id", how="left")
        .join(per_k, on="copy_id", how="left")
        .with_columns(
            gpu_ns=pl.col("xfer_gpu_ns").fill_null(0) + pl.col("kernel_gpu_ns").fill_null(0),
            kinds=pl.col("kinds").fill_null([]),
            api_kinds=pl.col("api_kinds").fill_null([]),
        )
        .with_columns(
            direction=pl.when(pl.col("kinds").list.len() > 0)
            .then(pl.col("kinds").list.join("+"))
            .when(pl.col("api_kinds").list.len() > 0)
            .then(pl.col("api_kinds").list.join("+"))
            .when(pl.col("n_kernels").fill_null(0) > 0)
            .then(pl.lit("on device (kernel)"))
            .when(pl.col("n_calls").fill_null(0) > 0)
            .then(pl.lit("unknown"))
            .otherwise(pl.lit("host")),
            host_memory=pl.when(pl.col("mems").list.len() > 0).then(pl.col("mems").list.join("+")).otherwise(None),
            api_mode=pl.when(pl.col("modes").list.len() > 0).then(pl.col("modes").list.join("+")).otherwise(None),
            host_blocking=pl.col("blocking").fill_null(False),
        )
    )
    copy_rows = co.select(
        pl.lit("copy op").alias("source"),
        "copy_id",
        pl.col("name").alias("op"),
        pl.col("ts_ns").alias("t_ns"),
        "pid",
        "tid",
        "direction",
        "host_memory",
        "api_mode",
        pl.col("bytes"),
        "gpu_ns",
        pl.col("dur_ns").alias("cpu_ns"),
        "host_blocking",
        pl.col("n_memcpy").fill_null(0),
    )
    loose = tr.filter(is_mc & pl.col("copy_id").is_null())
    loose_rows = loose.select(
        pl.lit("memcpy").alias("source"),
        pl.lit(None, dtype=pl.Int64).alias("copy_id"),
        pl.lit(None, dtype=pl.String).alias("op"),
        "t_ns",
        pl.col("pid").cast(pl.Int64),
        pl.col("tid").cast(pl.Int64),
        pl.col("kind").alias("direction"),
        pl.when(pl.col("host_memory") == "n/a").then(None).otherwise(pl.col("host_memory")).alias("host_memory"),
        pl.when(pl.col("api").is_null()).then(None).otherwise(pl.col("api_mode")).alias("api_mode"),
        "bytes",
        pl.col("dur_ns").alias("gpu_ns"),
        pl.col("api_dur_ns").fill_null(0).alias("cpu_ns"),
        "host_blocking",
        pl.lit(1, dtype=pl.Int64).alias("n_memcpy"),
    )
    allc = pl.concat([copy_rows, loose_rows], how="vertical_relaxed").with_row_index("_i")

    # Attribution: one call for every copy with a CPU thread.
    tree = cpu_tree(ctx.tables)
    pts = allc.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null())
    att = attribute(ctx.tables, pts.select("pid", "tid", "t_ns"), "t_ns", libs, users, tree=tree)
    att = pl.concat(
        [pts.select("_i"), att.select("site", "via", "site_kind", "outermost_op", "chain")], how="horizontal"
    )
    allc = (
        allc.join(att, on="_i", how="left")
        .with_columns(
            op=pl.coalesce("op", "outermost_op", pl.lit("(no CPU op)")),
            site=pl.coalesce(
                "site",
                pl.when(pl.col("pid").is_null())
                .then(pl.lit("(no runtime call recorded)"))
                .otherwise(pl.lit("(outside any op or annotation)")),
            ),
            site_kind=pl.coalesce("site_kind", pl.lit("none")),
        )
        .drop("_i", "outermost_op")
        .sort("t_ns")
    )
    allc = assign_steps(allc, windows, "t_ns")
    tr = assign_steps(tr, windows, "t_ns")

    by_op = _hotspots(allc, ["op", "direction"], n_steps, [])
    by_site = _hotspots(
        allc,
        ["site", "via"],
        n_steps,
        [
            pl.col("site_kind").first().alias("site_kind"),
            pl.col("op").unique().sort().str.join(", ").alias("ops"),
            pl.col("direction").unique().sort().str.join(", ").alias("directions"),
        ],
    ).select("site", "via", "site_kind", "ops", "directions", "count", "per_step", "bytes", "gpu_ns", "cpu_ns",
             "blocking")

    by_kind = (
        tr.group_by("activity", "kind", "host_memory", "api_mode")
        .agg(
            count=pl.len().cast(pl.Int64),
            bytes=pl.col("bytes").sum(),
            gpu_ns=pl.col("dur_ns").sum(),
            cpu_ns=pl.col("api_dur_ns").sum(),
            max_bytes=pl.col("bytes").max(),
        )
        .with_columns(
            gbps=pl.when(pl.col("gpu_ns") > 0).then((pl.col("bytes") / pl.col("gpu_ns")).round(3)).otherwise(None)
        )
        .sort(["activity", "gpu_ns", "kind"], descending=[False, True, False])
    )

    in_w = allc.filter(pl.col("window").is_not_null())
    mc_w = tr.filter(is_mc & pl.col("window").is_not_null())
    per_step = (
        windows.select("window", "step", pl.col("dur_ns").alias("step_ns"))
        .join(
            in_w.group_by("window").agg(
                copies=pl.len().cast(pl.Int64),
                copy_ops=(pl.col("source") == "copy op").sum().cast(pl.Int64),
                bytes=pl.col("bytes").sum(),
                gpu_ns=pl.col("gpu_ns").sum(),
                cpu_ns=pl.col("cpu_ns").sum(),
                blocking=pl.col("host_blocking").sum().cast(pl.Int64),
            ),
            on="window",
            how="left",
        )
        .join(
            mc_w.group_by("window").agg(
                memcpy=pl.len().cast(pl.Int64),
                memcpy_bytes=pl.col("bytes").sum(),
                memcpy_gpu_ns=pl.col("dur_ns").sum(),
            ),
            on="window",
            how="left",
        )
        .with_columns(
            pl.col(c).fill_null(0)
            for c in ("copies", "copy_ops", "bytes", "gpu_ns", "cpu_ns", "blocking", "memcpy", "memcpy_bytes",
                      "memcpy_gpu_ns")
        )
        .with_columns(
            pct_gpu=pl.when(pl.col("step_ns") > 0).then((pl.col("gpu_ns") * 100.0 / pl.col("step_ns")).round(3)),
            pct_cpu=pl.when(pl.col("step_ns") > 0).then((pl.col("cpu_ns") * 100.0 / pl.col("step_ns")).round(3)),
        )
        .sort("window")
        .drop("window")
    )

    mc = tr.filter(is_mc)
    ms = tr.filter(~is_mc)
    by_dir: dict[str, dict[str, Any]] = {}
    for row in (
        mc.group_by("kind")
        .agg(count=pl.len(), bytes=pl.col("bytes").sum(), gpu_ns=pl.col("dur_ns").sum())
        .sort("kind", nulls_last=True)  # a mapping in one order whatever the group-by's threads did
        .iter_rows(named=True)
    ):  # one row per direction (≤ 6)
        by_dir[row["kind"]] = {
            "count": int(row["count"]),
            "bytes": int(row["bytes"] or 0),
            "gpu_ns": int(row["gpu_ns"] or 0),
            "gbps": round(row["bytes"] / row["gpu_ns"], 3) if row["gpu_ns"] and row["bytes"] else None,
        }
    host = mc.filter(pl.col("kind").is_in(["HtoD", "DtoH", "HtoH"]))
    window_total = int(windows["dur_ns"].sum())
    totals: dict[str, Any] = {
        "memcpy_count": mc.height,
        "memcpy_bytes": int(mc["bytes"].sum() or 0),
        "memcpy_gpu_ns": int(mc["dur_ns"].sum() or 0),
        "memset_count": ms.height,
        "memset_bytes": int(ms["bytes"].sum() or 0),
        "memset_gpu_ns": int(ms["dur_ns"].sum() or 0),
        "memcpy_api_cpu_ns": int(mc["api_dur_ns"].sum() or 0),
        "memcpy_without_call": int(mc["api"].is_null().sum()),
        "by_direction": by_dir,
        "pageable_count": int((host["host_memory"] == "pageable").sum()),
        "pageable_bytes": int(host.filter(pl.col("host_memory") == "pageable")["bytes"].sum() or 0),
        "pinned_count": int((host["host_memory"] == "pinned").sum()),
        "unknown_memory_count": int((host["host_memory"] == "unknown").sum()),
        "sync_api_count": int((tr["api_mode"] == "sync").sum()),
        "host_blocking_count": int(mc["host_blocking"].sum()),
        "copy_ops": co.height,
        "noop_copy_ops": n_noop,
        "copy_ops_cpu_ns": int(co["dur_ns"].sum() or 0),
        "copy_ops_gpu_ns": int(co["gpu_ns"].sum() or 0),
        "copy_ops_by_direction": dict(co.group_by("direction").len().sort("direction").iter_rows()),
        "copies": allc.height,
        "copies_gpu_ns": int(allc["gpu_ns"].sum() or 0),
        "copies_cpu_ns": int(allc["cpu_ns"].sum() or 0),
        "window_ns": window_total,
        "pct_gpu_of_steps": pct(int(allc.filter(pl.col("window").is_not_null())["gpu_ns"].sum() or 0), window_total),
        "pct_cpu_of_steps": pct(int(allc.filter(pl.col("window").is_not_null())["cpu_ns"].sum() or 0), window_total),
    }
    events = tr.select(
        "step", "activity", "name", "kind", "host_memory", "bytes", pl.col("ts_ns").alias("gpu_ts_ns"),
        pl.col("dur_ns").alias("gpu_ns"), "gbps", "device", "stream", "correlation", "api", "api_mode",
        pl.col("api_dur_ns").alias("cpu_ns"), "host_blocking", "copy_id",
        # the issuing call on its thread: where the host blocked (the copy rules' cost windows)
        "api_ts_ns", pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
    ).sort("gpu_ts_ns")
    return CopiesResult(
        totals=totals,
        by_kind=by_kind,
        by_op=by_op,
        by_site=by_site,
        per_step=per_step,
        copies=allc.select(
            "step", "source", "copy_id", "op", "direction", "host_memory", "api_mode", "bytes", "gpu_ns", "cpu_ns",
            "host_blocking", "n_memcpy", "t_ns", "pid", "tid", "site", "via", "site_kind", "chain",
        ),
        transfers=events,
        has_stacks=has_stacks(model),
        has_steps=has_steps,
        settings={
            "top_n": top_n,
            "max_events": max_events,
            "library_modules": libs,
            "user_modules": users,
        },
    )
