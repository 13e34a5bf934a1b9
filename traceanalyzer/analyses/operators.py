"""Operators and modules: TensorBoard's operator and module views, with backward ops linked to
their forward op.

``ops`` keeps the bare op counts the rules read (``op_counts``); this analysis is the view a
user browses: where CPU and GPU time go per operator, per input shape and per ``nn.Module``.

Definitions (whole trace, every thread)
---------------------------------------
* **Host total** of an op: its duration. **Host self**: its duration less the durations of the
  CPU ops directly nested in it on its thread (runtime calls stay in the self time, as in
  TensorBoard). A recursive op (an op inside one of the same name) counts in both.
* **Device self** of an op: the device time (kernels, copies, memsets) launched by runtime calls
  whose deepest enclosing CPU op is this op; **device total**: its own plus that of every op
  nested in it. ``kernels``: the device activities it launched itself.
* ``by_name``: per op name, ``calls`` and the four times summed (``host_total_ns``,
  ``host_self_ns``, ``device_total_ns``, ``device_self_ns``); ``by_shape``: the same per
  (name, input dims) for traces recorded with ``record_shapes``.
* **Backward linked to forward**: an autograd node op of the backward pass
  (``autograd::engine::evaluate_function: XBackward0``, or a ``…Backward…`` op carrying a
  ``Fwd thread id``) is linked to the forward op that created it: by the trace's
  forward→backward flow events where there are any (the op starting at the flow's start and end
  on their threads), else by ``Sequence number`` (backward ops carry the forward op's sequence
  number and a non-zero ``Fwd thread id``; the forward op is the longest op with that number
  and ``Fwd thread id`` 0 or none: every op run while a number is current records it, the op
  that created the node encloses the others or outlasts them). ``backward``: per (forward
  op, backward node), ``calls`` and the node's host and device totals; ``by_name`` gains
  ``bwd_calls``, ``bwd_host_total_ns`` and ``bwd_device_total_ns`` for forward ops.
* **Modules** (``modules``): the ``nn.Module: Name_N`` Python frames of a trace recorded with
  ``with_modules``/``with_stack`` (``source`` ``module``); without them, the user's
  ``record_function`` ranges (``source`` ``record_function``: user annotations but
  ``ProfilerStep#``). Per module (``module``: the frame's name without ``nn.Module:``,
  ``module_type``: without the instance number, ``parent``: the enclosing module): ``calls``,
  host total/self (self less the nested modules) and device total/self, as for ops.
* ``call_site`` (traces with Python stacks, ``with_stack=True``): for the ``top_n`` op names, the
  call site most of their calls come from: the innermost user frame around the call
  (``file.py:12 (func)``; the tool's one frame filter, as for copies and syncs), or the innermost
  library frame where no user frame covers it.
* Tables keep the ``operators.top_n`` (50) largest rows by device total then host total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._callsites import has_stacks, innermost_frames, short_site
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import cover_index, launches, nest, op_index, op_links

MODULE_PREFIX = "nn.Module: "
_BACKWARD_NODE = r"^autograd::engine::evaluate_function: "
_TIMES = ("host_total_ns", "host_self_ns", "device_total_ns", "device_self_ns")


@dataclass(frozen=True)
class OperatorsResult:
    """TensorBoard's operator and module views. See the module docstring."""

    by_name: pl.DataFrame
    by_shape: pl.DataFrame
    backward: pl.DataFrame
    modules: pl.DataFrame
    module_source: str | None  # "module" / "record_function" / None (no modules)
    backward_link: str | None  # "flows" / "sequence_number" / None (no backward ops linked)
    n_ops: int
    top_n: int

    def to_json(self) -> dict[str, Any]:
        n = self.top_n
        return {"n_ops": self.n_ops, "module_source": self.module_source, "backward_link": self.backward_link,
                "by_name": self.by_name.head(n).to_dicts(), "by_shape": self.by_shape.head(n).to_dicts(),
                "backward": self.backward.head(n).to_dicts(), "modules": self.modules.head(n).to_dicts()}

    def summary(self) -> list[tuple[str, str]]:
        # One line: the tables hold the rest.
        if self.by_name.is_empty():
            return []
        r = self.by_name.row(0, named=True)
        text = (f"{r['name']} ({r['calls']:,} calls, device {r['device_total_ns'] / 1e6:,.3f} ms, host "
                f"{r['host_total_ns'] / 1e6:,.3f} ms)")
        if self.modules.height:
            m = self.modules.row(0, named=True)
            text += f"; top module {m['module']} (device {m['device_total_ns'] / 1e6:,.3f} ms)"
        if self.backward.height:
            text += f"; {int(self.backward['calls'].sum()):,} backward ops linked to their forward op"
        return [("Top operator (device time)", text)]

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"Operators": self.by_name.head(self.top_n)}
        if self.by_shape.height:
            out["Operators by input shape"] = self.by_shape.head(self.top_n)
        if self.backward.height:
            out["Backward ops by forward op"] = self.backward.head(self.top_n)
        if self.modules.height:
            out["Modules"] = self.modules.head(self.top_n)
        return out


def _tree_times(iv: pl.DataFrame, self_dev: pl.Series, links: pl.DataFrame | None = None) -> pl.DataFrame:
    """Host/device self and total times of nested intervals.

    ``iv``: ``id`` (row number 0…n−1), ``pid, tid, ts_ns, end_ns``; ``self_dev``: device
    time launched directly under each id (aligned with ``iv``). Returns ``iv`` with
    ``parent_id``, ``host_total_ns``, ``host_self_ns``, ``device_self_ns``,
    ``device_total_ns``. Device totals go up the tree one depth level at a time (a few tens
    of levels, each vectorised). ``links``: :func:`nest` of ``iv``'s positive-length intervals
    where the caller has it (the run's :func:`op_links` for the CPU ops)."""
    if links is None:
        links = nest(iv.filter(pl.col("end_ns") > pl.col("ts_ns")).select("id", "pid", "tid", "ts_ns", "end_ns"))
    n = iv.height
    depth = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(links["id"], links["depth"])
    parent = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(links["id"], links["parent_id"])
    dur = (iv["end_ns"] - iv["ts_ns"]).clip(lower_bound=0)
    t = pl.DataFrame({"id": iv["id"], "parent_id": parent, "depth": depth, "host_total_ns": dur,
                      "device_self_ns": self_dev.fill_null(0).cast(pl.Int64)})
    child_host = t.filter(pl.col("parent_id").is_not_null()).group_by("parent_id").agg(
        _c=pl.col("host_total_ns").sum())
    # Ids are row numbers: each parent's children's time is a scatter, not a join.
    children = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(child_host["parent_id"], child_host["_c"])
    t = t.with_columns(host_self_ns=(pl.col("host_total_ns") - children).clip(lower_bound=0))
    total = t["device_self_ns"].clone()
    max_depth = int(t["depth"].max() or 0)  # type: ignore[arg-type]  # an Int64 column's max
    for d in range(max_depth, 1, -1):  # deepest level first: a child's total is final before its parent's
        lvl = t.select("parent_id", pl.Series("v", total)).filter((t["depth"] == d) & (pl.Series("v", total) != 0))
        if lvl.height:
            up = lvl.group_by("parent_id").agg(pl.col("v").sum())
            total = total.scatter(up["parent_id"], total.gather(up["parent_id"]) + up["v"])
    return iv.hstack(t.select("parent_id", "host_total_ns", "host_self_ns", "device_self_ns").hstack(
        [total.alias("device_total_ns")]))


def _self_device(ctx: AnalysisContext[TraceModel], index: Any, n: int) -> tuple[pl.Series, pl.Series]:
    """Device time and activity count launched directly under each interval of ``index``
    (ids 0…n−1), from the launch calls' deepest covering interval."""
    lj = launches(ctx.tables).filter(pl.col("is_launch") & pl.col("gpu_dur_ns").is_not_null()).select(
        "pid", "tid", pl.col("cpu_ts_ns").alias("ts_ns"), "gpu_dur_ns")
    if lj.is_empty() or n == 0:
        zero = pl.repeat(0, n, dtype=pl.Int64, eager=True)
        return zero, zero
    owner = index.lookup(lj.select("pid", "tid", "ts_ns"))
    per = lj.select("gpu_dur_ns").with_columns(owner=owner).filter(pl.col("owner").is_not_null()).group_by(
        "owner").agg(ns=pl.col("gpu_dur_ns").sum(), k=pl.len().cast(pl.Int64))
    ns = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(per["owner"], per["ns"])
    k = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(per["owner"], per["k"])
    return ns, k


def _agg(df: pl.DataFrame, keys: list[str], top_n: int) -> pl.DataFrame:
    return (
        df.group_by(keys).agg(pl.len().cast(pl.Int64).alias("calls"), *[pl.col(c).sum() for c in _TIMES],
                              pl.col("kernels").sum())
        .sort(["device_total_ns", "host_total_ns", *keys], descending=[True, True] + [False] * len(keys),
              nulls_last=True)
    )


def _backward(model: TraceModel, ops: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """(forward op row, backward node row) pairs: by fwdbwd flows, else by sequence number."""
    # One op per backward node: evaluate_function wraps XBackward0 where the trace has it.
    nodes = ops.filter(pl.col("name").str.contains(_BACKWARD_NODE))
    if nodes.is_empty():
        nodes = ops.filter(pl.col("fwd_thread_id").is_not_null() & pl.col("name").str.contains("Backward"))
    empty = pl.DataFrame(schema={"fwd": pl.Int64, "bwd": pl.Int64})
    if nodes.is_empty():
        return empty, None
    fl = model.flows.filter(pl.col("kind") == "fwdbwd")
    if fl.height:
        s = fl.filter(pl.col("ph") == "s").select(pl.col("id").alias("fid"), "pid", "tid", "ts_ns")
        f = fl.filter(pl.col("ph") == "f").select(pl.col("id").alias("fid"), "pid", "tid", "ts_ns")
        # The op a flow end binds to: the outermost op starting at that instant on that thread.
        start_op = ops.sort("ts_ns", "end_ns", descending=[False, True]).unique(
            ["pid", "tid", "ts_ns"], keep="first").select("pid", "tid", "ts_ns", "id")
        pairs = (s.join(start_op, on=["pid", "tid", "ts_ns"]).select("fid", pl.col("id").alias("fwd"))
                 .join(f.join(start_op, on=["pid", "tid", "ts_ns"]).select("fid", pl.col("id").alias("op")), on="fid"))
        # The flow may end on XBackward0 inside evaluate_function: the node around it counts.
        node_ix = cover_index(nodes.select("id", "pid", "tid", "ts_ns", "end_ns"))
        at = ops.select("pid", "tid", "ts_ns").gather(pairs["op"])
        pairs = pairs.with_columns(bwd=node_ix.lookup(at)).filter(pl.col("bwd").is_not_null())
        if pairs.height:
            return pairs.select("fwd", "bwd").unique(), "flows"
    # Forward ops record "Fwd thread id" 0 (or none); every op run while a node's number was
    # current records it (aten::zero_ before a CompiledFunction …): the longest is the one around.
    fwd = ops.filter(pl.col("seq_num").is_not_null() & (pl.col("fwd_thread_id").fill_null(0) == 0)
                     & ~pl.col("name").str.contains(_BACKWARD_NODE))
    if fwd.is_empty():
        return empty, None
    fwd = fwd.sort(pl.col("end_ns") - pl.col("ts_ns"), "ts_ns", descending=[True, False]).unique(
        "seq_num", keep="first").select("seq_num", pl.col("id").alias("fwd"))
    pairs = nodes.filter(pl.col("seq_num").is_not_null()).select("seq_num", pl.col("id").alias("bwd")).join(
        fwd, on="seq_num")
    return (pairs.select("fwd", "bwd"), "sequence_number") if pairs.height else (empty, None)


@analysis("operators", input="trace", title="Operators and modules", order=44,
          shared=("op_nesting", "op_links", "gpu_activity", "launches"), params={"top_n": 50})
def operators(ctx: AnalysisContext[TraceModel]) -> OperatorsResult:
    """TensorBoard's operator and module views: self/total host and device time per op, per input shape, per
    nn.Module; backward ops linked to their forward op."""
    model = ctx.model
    top_n = int(ctx.params.top_n)
    if model.cpu_ops.is_empty():
        raise NotApplicable("no CPU ops in this trace (profile with activities including ProfilerActivity.CPU)")
    n = model.cpu_ops.height
    ops = model.cpu_ops.select("name", "pid", "tid", "ts_ns", "end_ns", "seq_num", "fwd_thread_id",
                               "input_dims").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    dev, k = _self_device(ctx, op_index(ctx.tables), n)
    t = _tree_times(ops.select("id", "pid", "tid", "ts_ns", "end_ns"), dev, op_links(ctx.tables))
    ops = ops.hstack(t.select(*_TIMES)).with_columns(kernels=k)
    by_name = _agg(ops, ["name"], top_n)
    shaped = ops.filter(pl.col("input_dims").is_not_null() & (pl.col("input_dims") != "[]"))
    by_shape = _agg(shaped, ["name", "input_dims"], top_n) if shaped.height else pl.DataFrame(
        schema={"name": pl.String, "input_dims": pl.String, "calls": pl.Int64, **dict.fromkeys(_TIMES, pl.Int64),
                "kernels": pl.Int64})

    pairs, link = _backward(model, ops)
    bwd_schema = {"forward": pl.String, "backward": pl.String, "calls": pl.Int64, "host_total_ns": pl.Int64,
                  "device_total_ns": pl.Int64}
    backward = pl.DataFrame(schema=bwd_schema)
    if pairs.height:
        names, host, devt = ops["name"], ops["host_total_ns"], ops["device_total_ns"]
        backward = (
            pairs.select(forward=names.gather(pairs["fwd"]),
                         backward=names.gather(pairs["bwd"]).str.replace(_BACKWARD_NODE, ""),
                         host_total_ns=host.gather(pairs["bwd"]), device_total_ns=devt.gather(pairs["bwd"]))
            .group_by("forward", "backward").agg(pl.len().cast(pl.Int64).alias("calls"), pl.col("host_total_ns").sum(),
                                                 pl.col("device_total_ns").sum())
            .sort(["device_total_ns", "host_total_ns", "forward", "backward"], descending=[True, True, False, False])
            .select(list(bwd_schema))
        )
        per_fwd = backward.group_by("forward").agg(bwd_calls=pl.col("calls").sum(),
                                                   bwd_host_total_ns=pl.col("host_total_ns").sum(),
                                                   bwd_device_total_ns=pl.col("device_total_ns").sum())
        by_name = by_name.join(per_fwd.rename({"forward": "name"}), on="name", how="left", maintain_order="left")

    by_name = _call_sites(model, ops, by_name, top_n)
    modules, source = _modules(ctx, top_n)
    return OperatorsResult(by_name=by_name, by_shape=by_shape, backward=backward, modules=modules,
                           module_source=source, backward_link=link if backward.height else None, n_ops=n,
                           top_n=top_n)


def _call_sites(model: TraceModel, ops: pl.DataFrame, by_name: pl.DataFrame, top_n: int) -> pl.DataFrame:
    """``by_name`` with ``call_site``: the most frequent call site of each of its first ``top_n``
    names (null without Python stacks)."""
    if not has_stacks(model) or by_name.is_empty():
        return by_name.with_columns(call_site=pl.lit(None, pl.String))
    calls = ops.filter(pl.col("name").is_in(by_name["name"].head(top_n).implode())).select(
        "name", "pid", "tid", "ts_ns")
    fr = innermost_frames(model, calls.select("pid", "tid", "ts_ns"))
    sites = (
        pl.concat([calls.select("name"), fr], how="horizontal")
        .select("name", site=pl.coalesce(short_site(pl.col("user_frame")), short_site(pl.col("any_frame"))))
        .group_by("name").agg(call_site=pl.col("site").drop_nulls().mode().sort().first())
    )
    return by_name.join(sites, on="name", how="left", maintain_order="left")


def _modules(ctx: AnalysisContext[TraceModel], top_n: int) -> tuple[pl.DataFrame, str | None]:
    model = ctx.model
    cols = ["name", "pid", "tid", "ts_ns", "end_ns"]
    frames = model.python_frames.filter(pl.col("name").str.starts_with(MODULE_PREFIX)).select(cols)
    source = "module"
    if frames.is_empty():
        frames = model.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#")).select(cols)
        source = "record_function"
    schema = {"module": pl.String, "module_type": pl.String, "parent": pl.String, "calls": pl.Int64,
              **dict.fromkeys(_TIMES, pl.Int64), "kernels": pl.Int64}
    if frames.is_empty():
        return pl.DataFrame(schema=schema), None
    iv = frames.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    index = cover_index(iv.select("id", "pid", "tid", "ts_ns", "end_ns"))
    dev, k = _self_device(ctx, index, iv.height)
    t = _tree_times(iv.select("id", "pid", "tid", "ts_ns", "end_ns"), dev)
    name = pl.col("name").str.replace(f"^{MODULE_PREFIX}", "")
    mods = iv.select(name.alias("module")).hstack(t.select("parent_id", *_TIMES)).with_columns(kernels=k)
    mods = mods.with_columns(parent=mods["module"].gather(mods["parent_id"]),
                             module_type=pl.col("module").str.replace(r"_\d+$", "") if source == "module"
                             else pl.col("module"))
    return _agg(mods, ["module", "module_type", "parent"], top_n).select(list(schema)), source
