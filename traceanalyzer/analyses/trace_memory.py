"""Memory from a chrome trace's ``[memory]`` events (``profile_memory=True``).

Each ``[memory]`` instant event carries the allocator's running totals after it:
``total_allocated`` and ``total_reserved`` (bytes, per device; device type 0 = CPU,
1 = CUDA). Per device:

* ``peak_allocated_bytes`` / ``peak_reserved_bytes`` and when (``peak_ts_ns``), with
  ``peak_op``: the innermost CPU op running on the same thread at that instant.
* ``per_step`` (when the trace has ``ProfilerStep#N``): for each step the peak
  allocated within it, allocated at its start and end, and ``growth_bytes`` = end −
  start; ``step_growth_bytes`` = allocated at the end of the last step − at the end of
  the first (steady training returns to the same level: growth means a leak or a
  cache filling up).
* ``top_ops``: CPU ops (innermost enclosing op of each allocation) by bytes allocated.
* ``top_sites`` (traces with Python stacks, ``with_stack=True``): the same by call site,
  the innermost covering Python frame in the user's code (the tool's one frame filter,
  :func:`~traceanalyzer.analyses._callsites.user_path_expr`: runtime, notebook and torch
  frames skipped); ``site_kind`` ``python``, or ``library`` when no user frame covers the
  allocation and the innermost library frame stands in; ``via``: that library frame below
  the user's line.
* ``ooms``: ``[OutOfMemory]`` events, one row each: ``device``, ``ts_ns``, ``bytes`` (the
  request that failed), ``total_allocated`` / ``total_reserved`` (the allocator's totals then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._memevents import memory_ops, with_device_by_time
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables
from traceanalyzer.units import device_name


def _enclosing_ops(t: TraceTables) -> pl.DataFrame:
    """The events but OOMs (:func:`memory_ops`) with ``op``: the name of the deepest CPU op on
    the same (pid, tid) whose span covers each event."""
    mem, ids = memory_ops(t)
    # Op ids are row numbers of model.cpu_ops: the name is a gather, not a join.
    return mem.with_columns(op=t.model.cpu_ops["name"].gather(ids))


SITES_SCHEMA = {"device": pl.String, "site": pl.String, "site_kind": pl.String, "via": pl.String,
                "allocated_bytes": pl.Int64, "allocations": pl.UInt32}
OOM_SCHEMA = {"device": pl.String, "ts_ns": pl.Int64, "bytes": pl.Int64, "total_allocated": pl.Int64,
              "total_reserved": pl.Int64}


@dataclass(frozen=True)
class TraceMemoryResult:
    """See the module docstring. ``per_device``: one row per device; ``per_step``: one
    row per (device, step); ``top_ops``: one row per (device, op)."""

    n_events: int
    n_ooms: int
    per_device: pl.DataFrame
    per_step: pl.DataFrame
    top_ops: pl.DataFrame
    step_growth_bytes: dict[str, int]
    ooms: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=OOM_SCHEMA))
    top_sites: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SITES_SCHEMA))

    def to_json(self) -> dict[str, Any]:
        return {"n_events": self.n_events, "n_ooms": self.n_ooms, "per_device": self.per_device.to_dicts(),
                "per_step": self.per_step.to_dicts(), "top_ops": self.top_ops.to_dicts(),
                "step_growth_bytes": self.step_growth_bytes, "ooms": self.ooms.to_dicts(),
                "top_sites": self.top_sites.to_dicts()}

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        out = []
        for r in self.per_device.iter_rows(named=True):
            op = f" in {r['peak_op']}" if r["peak_op"] else ""
            out.append((f"{device_name(r['device'])} peak allocated", f"{fmt_bytes(r['peak_allocated_bytes'])}{op}"))
            out.append((f"{device_name(r['device'])} peak reserved", fmt_bytes(r["peak_reserved_bytes"])))
        for dev, g in self.step_growth_bytes.items():
            out.append((f"{device_name(dev)} growth across steps", fmt_bytes(g)))
        if self.n_ooms:
            out.append(("OutOfMemory events", str(self.n_ooms)))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"Memory per device": _named(self.per_device)}
        if self.per_step.height:
            out["Memory per step"] = _named(self.per_step)
        if self.top_ops.height:
            out["Ops allocating the most"] = _named(self.top_ops.head(15))
        if self.top_sites.height:
            out["Call sites allocating the most"] = _named(self.top_sites.head(15))
        return out


def _named(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its ``device`` shown by its one name (``GPU 0``, :func:`~traceanalyzer.units.device_name`);
    summary.json keeps PyTorch's spelling (``cuda:0``, ``hip:2``)."""
    if "device" not in df.columns or df.is_empty():
        return df
    names = {d: device_name(d) for d in set(df["device"].to_list()) if d is not None}  # no polars query
    return df.with_columns(pl.col("device").replace_strict(names, default=None, return_dtype=pl.String))


def _top_sites(model: TraceModel, mem: pl.DataFrame, top_n: int) -> pl.DataFrame:
    """Bytes allocated per (device, call site), largest first; empty without Python stacks."""
    from traceanalyzer.analyses._callsites import has_stacks, innermost_frames, short_site

    allocs = mem.filter(pl.col("bytes") > 0)
    if not has_stacks(model) or allocs.is_empty():
        return pl.DataFrame(schema=SITES_SCHEMA)
    fr = innermost_frames(model, allocs.select("pid", "tid", "ts_ns"))
    return (
        pl.concat([allocs.select("device", "bytes"), fr], how="horizontal")
        .filter(pl.col("user_frame").is_not_null() | pl.col("any_frame").is_not_null())
        .select(
            "device", "bytes",
            site=pl.coalesce(short_site(pl.col("user_frame")), short_site(pl.col("any_frame"))),
            site_kind=pl.when(pl.col("user_frame").is_not_null()).then(pl.lit("python")).otherwise(pl.lit("library")),
            via=pl.when(pl.col("user_frame").is_not_null() & (pl.col("any_frame") != pl.col("user_frame")))
            .then(short_site(pl.col("any_frame"))),
        )
        .group_by("device", "site", "site_kind")
        .agg(via=pl.col("via").drop_nulls().mode().sort().first(), allocated_bytes=pl.col("bytes").sum(),
             allocations=pl.len())
        .sort(["allocated_bytes", "device", "site"], descending=[True, False, False]).head(top_n)
        .select(list(SITES_SCHEMA)).cast(SITES_SCHEMA)  # type: ignore[arg-type]
    )


@analysis("trace_memory", input="trace", title="Memory (profiler events)", order=60,
          shared=("op_nesting", "memory_ops"),
          params={"top_n": 15})
def trace_memory(ctx: AnalysisContext[TraceModel]) -> TraceMemoryResult:
    """Allocated/reserved per device from [memory] events: peaks, per step, top ops."""
    model = ctx.model
    top_n = ctx.params.top_n
    ev = model.memory_events
    if ev.is_empty():
        raise NotApplicable("no [memory] events: profile with profile_memory=True")
    ooms = with_device_by_time(ev.filter(pl.col("oom")))
    mem = _enclosing_ops(ctx.tables)

    peaks = mem.sort("ts_ns", maintain_order=True).group_by("device", maintain_order=True).agg(
        events=pl.len(),
        peak_allocated_bytes=pl.col("total_allocated").max(),
        peak_ts_ns=pl.col("ts_ns").get(pl.col("total_allocated").arg_max()),
        peak_op=pl.col("op").get(pl.col("total_allocated").arg_max()),
        peak_reserved_bytes=pl.col("total_reserved").max(),
        final_allocated_bytes=pl.col("total_allocated").last(),
        allocated_total_bytes=pl.col("bytes").filter(pl.col("bytes") > 0).sum(),
    ).sort("device")

    steps = model.steps.select("step", "ts_ns", "end_ns")
    per_step = pl.DataFrame(schema={"device": pl.String, "step": pl.Int64, "peak_allocated_bytes": pl.Int64,
                                    "start_allocated_bytes": pl.Int64, "end_allocated_bytes": pl.Int64,
                                    "growth_bytes": pl.Int64})
    growth: dict[str, int] = {}
    if steps.height:
        s = steps.sort("ts_ns")
        tagged = mem.sort("ts_ns").join_asof(s.rename({"ts_ns": "step_ts"}), left_on="ts_ns", right_on="step_ts",
                                             strategy="backward").filter(pl.col("ts_ns") <= pl.col("end_ns"))
        if tagged.height:
            per_step = tagged.group_by("device", "step").agg(
                peak_allocated_bytes=pl.col("total_allocated").max(),
                # before the step's first event: its total minus its own delta
                start_allocated_bytes=(pl.col("total_allocated") - pl.col("bytes")).first(),
                end_allocated_bytes=pl.col("total_allocated").last(),
            ).with_columns(growth_bytes=pl.col("end_allocated_bytes") - pl.col("start_allocated_bytes")
                           ).sort("device", "step")
            for (dev,), g in per_step.group_by(["device"]):
                if g.height >= 2:
                    growth[str(dev)] = int(g["end_allocated_bytes"][-1] - g["end_allocated_bytes"][0])
    top_ops = (
        mem.filter(pl.col("bytes") > 0).with_columns(pl.col("op").fill_null("<outside any op>"))
        .group_by("device", "op").agg(allocated_bytes=pl.col("bytes").sum(), allocations=pl.len())
        .sort(["allocated_bytes", "op"], descending=[True, False]).head(top_n)
    )
    return TraceMemoryResult(n_events=ev.height, n_ooms=ooms.height, per_device=peaks, per_step=per_step,
                             top_ops=top_ops, step_growth_bytes=growth, top_sites=_top_sites(model, mem, top_n),
                             ooms=ooms.select(list(OOM_SCHEMA)).cast(OOM_SCHEMA))  # type: ignore[arg-type]
