"""Communication: collectives by type, process group and stream, bandwidth, and overlap with compute.

``docs/communication.md`` has the full definitions. In short:

* **Which kernels**: :func:`~traceanalyzer.analyses._comm.comm_classes` (collective metadata >
  launching communication CPU op > library name family), the same kernels ``gpu_time``,
  ``kernels``, ``ops`` and ``diagnosis`` count as communication. Copy-engine collectives
  (``Memcpy PtoP``) stay copies.
* **A collective** is one launching communication op (its External id): the kernels it
  launched count once (DeepEP's ``notify_dispatch`` + ``dispatch``, a coalesced group);
  a kernel with no launching op (CUDA-graph replay) is a collective of its own.
* **Type**: from the ``Collective name`` metadata, else the launching op's name, else the
  kernel name (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``send_recv``, ``broadcast``, ``dispatch``, ``combine``, ``barrier`` …; ``other``).
* **Bytes** (only where Kineto recorded sizes): message size S = ``Out msg nelems`` for
  all_gather (``In msg nelems`` × group size when only that is known), ``In msg nelems``
  otherwise, × the dtype's size. **algbw** = S / kernel time (GB/s = bytes/ns), **busbw** =
  algbw × factor for n ranks: all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all
  (n−1)/n; others 1 (nccl-tests). Per group: Σ bytes / Σ time of the collectives with sizes.
* **Overlap**, per device and step window: comm = union of communication kernels; exposed =
  the part of it with no compute kernel running on the device (the ``communication`` of
  ``gpu_time``, precedence compute > communication); hidden = comm − exposed;
  ``hidden_pct`` = hidden / comm (HTA's ``comp_comm_overlap_pctg``). Per stream the same
  with that stream's communication only (streams of one device overlap: they do not add up).
* **Per step**: mean over the steady steps (``steps``); ``*_pct_of_step`` against the median
  steady step. Totals are those of the device with the most communication.
* **Verdict** (``overlap_verdict``): ``exposed`` when exposed ≥ ``communication.exposed_pct``
  (5) % of the step; else ``large_but_hidden`` when communication ≥
  ``communication.large_pct`` (10) % of the step; else ``small``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._comm import DTYPE_BYTES, busbw_factor, collective_type, comm_classes
from traceanalyzer.analyses._intervals import gpu_activity_classes, ms, window_union_lengths
from traceanalyzer.analyses._kernels import normalize_kernel_names, on_distinct
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables
from traceanalyzer.units import device_name

SIGNALS = ("metadata", "cpu_op", "name")  # strongest first
SIGNAL_LABELS = {"metadata": "collective metadata", "cpu_op": "launching communication op",
                 "name": "library kernel name"}


@dataclass(frozen=True)
class CommunicationResult:
    """Communication totals, per type / process group / stream / device / step, and signals."""

    totals: dict[str, Any]
    by_type: pl.DataFrame
    by_group: pl.DataFrame
    by_stream: pl.DataFrame
    per_device: pl.DataFrame
    per_step: pl.DataFrame
    by_signal: pl.DataFrame
    top_kernels: pl.DataFrame
    thresholds: dict[str, float] = field(default_factory=dict)
    #: The trace's vendor (``TraceMeta.vendor``): how its devices are named in text (not in to_json).
    vendor: str = "unknown"

    def to_json(self) -> dict[str, Any]:
        return {
            "totals": self.totals,
            "by_type": self.by_type.to_dicts(),
            "by_group": self.by_group.to_dicts(),
            "by_stream": self.by_stream.to_dicts(),
            "per_device": self.per_device.to_dicts(),
            "per_step": self.per_step.to_dicts(),
            "by_signal": self.by_signal.to_dicts(),
            "top_kernels": self.top_kernels.to_dicts(),
            "thresholds": self.thresholds,
        }

    def verdict_line(self) -> str:
        t = self.totals
        comm, hid, exp = t["comm_ns_per_step"], t["hidden_pct"], t["exposed_ns_per_step"]
        dev = device_name(t["device"], self.vendor)
        head = (f"{ms(comm)}/step of communication on {dev} ({t['comm_pct_of_step'] or 0:.1f} % of the "
                f"step), {hid or 0:.1f} % of it hidden under compute")
        if t["overlap_verdict"] == "exposed":
            return f"{head}; {ms(exp)}/step exposed ({t['exposed_pct_of_step'] or 0:.1f} % of the step): exposed"
        if t["overlap_verdict"] == "large_but_hidden":
            return f"{head}: large but hidden, not the bottleneck"
        return f"{head}: small"

    def signal_line(self) -> str:
        t = self.totals
        sig = t["kernels_by_signal"]
        parts = [f"{sig.get(s, 0):,} by {SIGNAL_LABELS[s]}" for s in SIGNALS if sig.get(s)]
        line = f"{t['n_kernels']:,} communication kernel(s) recognised: " + ", ".join(parts)
        if t["weak_kernels"]:
            line += (f"; {t['weak_kernels']:,} ({ms(t['weak_ns'])}) rest on one weak signal only "
                     f"({', '.join(t['weak_reasons'])})")
        return line

    def summary(self) -> list[tuple[str, str]]:
        out = [("Communication", self.verdict_line()), ("Recognised by", self.signal_line())]
        for r in self.by_type.head(4).iter_rows(named=True):
            bw = ""
            if r["busbw_gbps"] is not None:
                bw = f", busbw {r['busbw_gbps']:,.1f} GB/s (algbw {r['algbw_gbps']:,.1f})"
            elif r["algbw_gbps"] is not None:
                bw = f", algbw {r['algbw_gbps']:,.1f} GB/s"
            out.append((f"  {r['type']}", f"{r['count']:,} collective(s), {ms(r['total_ns'])} kernel time{bw}"))
        if self.by_group.height:
            out.append(("Process groups", "; ".join(
                f"{r['pg']} of {r['group_size'] or '?'} ranks: {r['count']:,} collective(s), {ms(r['total_ns'])}"
                for r in self.by_group.head(4).iter_rows(named=True))))
        streams = self.by_stream.head(4)
        if streams.height:
            out.append(("Streams", "; ".join(
                f"{device_name(r['device'], self.vendor)} stream {r['stream']}: {ms(r['comm_ns_per_step'])}/step, "
                f"{r['hidden_pct'] or 0:.1f} % of it hidden under compute" for r in streams.iter_rows(named=True))))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "Communication per collective type": self.by_type,
            "Communication per process group": self.by_group,
            "Communication per stream (overlap with compute)": self.by_stream,
            "Communication per device": self.per_device,
            "Communication per step (main device)": self.per_step,
            "Communication kernels by recognition signal": self.by_signal,
            "Top communication kernels": self.top_kernels,
        }


def comm_kernels(t: TraceTables) -> pl.DataFrame:
    """The communication kernels with their collective: ``name, ts_ns, dur_ns, end_ns, device,
    stream, comm_signal, comm_family, comm_weak, comm_op, coll_key, coll_name, type, dtype,
    group_size, pg, bytes`` (bytes null where sizes are not recorded)."""
    model = t.model
    cc = comm_classes(t)
    k = pl.concat([model.kernels.select("name", "ts_ns", "dur_ns", "end_ns", "device", "stream", "comm_name",
                                        "comm_dtype", "comm_in_nelems", "comm_group_size"), cc], how="horizontal")
    k = k.with_row_index("_row").filter(pl.col("is_comm"))
    if k.is_empty():
        return k
    coll_name = pl.coalesce("comm_name", "op_comm_name")
    op_named = pl.when(pl.col("comm_op") != "record_param_comms").then(pl.col("comm_op"))
    k = k.with_columns(_ann=_gpu_annotation(model, k))
    ctype = pl.coalesce(collective_type(coll_name), collective_type(op_named), collective_type(pl.col("name")),
                        collective_type(pl.col("_ann")), pl.lit("other"))
    n = pl.coalesce("comm_group_size", "op_group_size")
    in_n = pl.coalesce("comm_in_nelems", "op_in_nelems")
    elem = pl.coalesce("comm_dtype", "op_dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    pg = pl.when(pl.col("op_pg_name").is_not_null()).then(
        pl.col("op_pg_name") + pl.when(pl.col("op_pg_desc").is_not_null()).then(
            pl.lit(" (") + pl.col("op_pg_desc") + pl.lit(")")).otherwise(pl.lit("")))
    # The type's regexes run once per distinct combination of the texts it reads.
    k = on_distinct(k, ["comm_name", "op_comm_name", "comm_op", "name", "_ann"], type=ctype)
    return k.with_columns(
        coll_name=coll_name, group_size=n, pg=pg, dtype=pl.coalesce("comm_dtype", "op_dtype"),
        # A kernel without a launching op is a collective of its own (keys below any External id).
        coll_key=pl.coalesce(pl.col("comm_op_ext"), -(10 ** 15) - pl.col("_row").cast(pl.Int64)),
    ).with_columns(
        bytes=(pl.when(pl.col("type") == "all_gather").then(pl.coalesce("op_out_nelems", in_n * n)).otherwise(in_n)
               * elem),
    ).select("name", "ts_ns", "dur_ns", "end_ns", "device", "stream", "comm_signal", "comm_family", "comm_weak",
             "comm_op", "coll_key", "coll_name", "type", "dtype", "group_size", "pg", "bytes")


def _gpu_annotation(model: TraceModel, k: pl.DataFrame) -> pl.Series:
    """The ``nccl:*`` / ``xccl:*`` GPU-side annotation covering each kernel's start on its stream
    (ProcessGroupNCCL's work span: it names the collective of kernels without metadata, such as
    RCCL's ``ncclDevKernel_Generic`` launched before the trace began)."""
    ga = model.gpu_annotations.filter(pl.col("name").str.contains(r"^(nccl|rccl|xccl|hccl):")).select(
        "device", "stream", pl.col("ts_ns").alias("_a_ts"), pl.col("end_ns").alias("_a_end"),
        pl.col("name").alias("_a"))
    if ga.is_empty():
        return pl.Series("_ann", [None] * k.height, dtype=pl.String)
    j = (k.select("device", "stream", "ts_ns").with_row_index("_i").drop_nulls(["device", "stream"]).sort("ts_ns")
         .join_asof(ga.sort("_a_ts"), left_on="ts_ns", right_on="_a_ts", by=["device", "stream"],
                    strategy="backward", check_sortedness=False)
         .filter(pl.col("ts_ns") < pl.col("_a_end")))
    out = k.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i")).join(
        j.select("_i", "_a"), on="_i", how="left", maintain_order="left")
    return out["_a"].alias("_ann")


def _bw_aggs() -> list[pl.Expr]:
    sized = pl.col("bytes").is_not_null() & (pl.col("dur_ns") > 0)
    fac = pl.col("_factor")
    return [
        pl.when(sized.any()).then(pl.col("bytes").filter(sized).sum()).alias("bytes"),
        sized.sum().cast(pl.Int64).alias("n_sized"),
        pl.when(pl.col("dur_ns").filter(sized).sum() > 0)
        .then(pl.col("bytes").filter(sized).sum() / pl.col("dur_ns").filter(sized).sum()).alias("algbw_gbps"),
        pl.when(pl.col("dur_ns").filter(sized & fac.is_not_null()).sum() > 0)
        .then((pl.col("bytes") * fac).filter(sized & fac.is_not_null()).sum()
              / pl.col("dur_ns").filter(sized & fac.is_not_null()).sum()).alias("busbw_gbps"),
    ]


@analysis("communication", depends_on=("steps",), title="Communication", order=25,
          shared=("comm_classes", "gpu_activity", "gpu_activity_classes", "op_nesting"),
          params={"exposed_pct": 5.0, "large_pct": 10.0})
def communication(ctx: AnalysisContext[TraceModel]) -> CommunicationResult:
    """Collectives per type, process group and stream (count, time, bytes, algbw/busbw) and the
    share of communication hidden under compute, per device and steady step."""
    model = ctx.model
    exposed_pct = float(ctx.params.exposed_pct)
    large_pct = float(ctx.params.large_pct)
    if model.kernels.is_empty():
        raise NotApplicable("no GPU kernels in this trace")
    k = comm_kernels(ctx.tables)
    if k.is_empty():
        raise NotApplicable("no communication kernels (no collective metadata, no kernel launched by a "
                            "communication op, no kernel of a communication library)")
    sr = ctx.need("steps", StepsResult)
    windows = sr.windows()
    steady = sr.steady_windows()
    n_steady = max(len(steady), 1)
    med = float((sr.stats or {}).get("median") or sr.window_ns or 0)

    def of_step(v: float | None) -> float | None:
        return round(v * 100.0 / med, 2) if v is not None and med > 0 else None

    k = assign_steps(k, windows, "ts_ns").with_columns(
        _steady=pl.col("window").is_in(steady).fill_null(False))
    # Collectives: the kernels of one launching op count once; bytes are the op's.
    coll = k.group_by("coll_key").agg(
        pl.col("type").first(), pl.col("pg").first(), pl.col("group_size").first(), pl.col("bytes").max(),
        pl.col("dur_ns").sum(), pl.len().cast(pl.Int64).alias("kernels"), pl.col("_steady").first(),
        pl.col("device").first(), pl.col("dtype").first(),
    ).with_columns(_factor=busbw_factor(pl.col("type"), pl.col("group_size")))

    def grouped(by: list[str]) -> pl.DataFrame:
        return coll.group_by(by).agg(
            pl.len().cast(pl.Int64).alias("count"), pl.col("kernels").sum(), pl.col("dur_ns").sum().alias("total_ns"),
            (pl.col("dur_ns").sum() / pl.len()).round(1).alias("mean_ns"),
            *_bw_aggs(),
            (pl.col("_steady").sum() / n_steady).round(2).alias("count_per_step"),
            (pl.col("dur_ns").filter(pl.col("_steady")).sum() / n_steady).round(1).alias("ns_per_step"),
        ).with_columns(pl.col("algbw_gbps").round(3), pl.col("busbw_gbps").round(3)).sort(
            ["total_ns", *by], descending=[True, *[False] * len(by)], nulls_last=True)

    by_type = grouped(["type"])
    by_group = (grouped(["pg", "group_size"]).filter(pl.col("pg").is_not_null())
                if coll["pg"].is_not_null().any() else pl.DataFrame())

    # Overlap with compute, per device and window.
    act = gpu_activity_classes(ctx.tables).filter(pl.col("device").is_not_null())
    comp = act.filter(pl.col("category") == "compute").select("device", "ts_ns", "end_ns")
    cm = k.filter(pl.col("device").is_not_null()).select("device", "stream", "ts_ns", "end_ns")
    if cm.is_empty():
        raise NotApplicable("the communication kernels carry no device: overlap cannot be measured")
    comm_len = window_union_lengths(cm.select("device", "ts_ns", "end_ns"), windows, ["device"]).rename(
        {"length_ns": "comm_ns"})
    both = window_union_lengths(pl.concat([cm.select("device", "ts_ns", "end_ns"), comp]), windows, ["device"])
    comp_len = window_union_lengths(comp, windows, ["device"]).rename({"length_ns": "_comp"})
    per_win = (comm_len.join(both, on=["device", "window"], how="left")
               .join(comp_len, on=["device", "window"], how="left")
               .with_columns(pl.col("length_ns").fill_null(0), pl.col("_comp").fill_null(0))
               .with_columns(exposed_ns=pl.col("length_ns") - pl.col("_comp"))
               .with_columns(hidden_ns=pl.col("comm_ns") - pl.col("exposed_ns"))
               .join(windows.select("window", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")),
                     on="window")
               .select("window", "step", "device", "dur_ns", "comm_ns", "hidden_ns", "exposed_ns")
               .sort("device", "window"))
    st = per_win.filter(pl.col("window").is_in(steady))
    per_device = st.group_by("device").agg(pl.col("comm_ns").sum(), pl.col("hidden_ns").sum(),
                                           pl.col("exposed_ns").sum()).with_columns(
        (pl.col(c) / n_steady).round(1).alias(f"{c[:-3]}_ns_per_step") for c in ("comm_ns", "hidden_ns", "exposed_ns")
    ).with_columns(
        hidden_pct=pl.when(pl.col("comm_ns") > 0).then((pl.col("hidden_ns") * 100.0 / pl.col("comm_ns")).round(2)),
        comm_pct_of_step=(pl.col("comm_ns_per_step") * 100.0 / med).round(2) if med > 0 else pl.lit(None),
        exposed_pct_of_step=(pl.col("exposed_ns_per_step") * 100.0 / med).round(2) if med > 0 else pl.lit(None),
    ).join(k.group_by("device").agg(kernels=pl.len().cast(pl.Int64), kernel_ns=pl.col("dur_ns").sum()),
           on="device", how="full", coalesce=True).sort(
        ["comm_ns", "device"], descending=[True, False], nulls_last=True).drop("comm_ns", "hidden_ns", "exposed_ns")
    main = per_device.row(0, named=True)
    device = main["device"]

    # Per stream: that stream's communication against the device's compute.
    streams = cm.select("device", "stream").unique()
    comp_s = comp.join(streams, on="device")
    s_len = window_union_lengths(cm, windows, ["device", "stream"]).rename({"length_ns": "comm_ns"})
    s_both = window_union_lengths(pl.concat([cm, comp_s.select(cm.columns)]), windows, ["device", "stream"])
    s_tab = (s_len.join(s_both, on=["device", "stream", "window"], how="left")
             .join(comp_len, on=["device", "window"], how="left")
             .with_columns(pl.col("length_ns").fill_null(0), pl.col("_comp").fill_null(0))
             .with_columns(exposed_ns=pl.col("length_ns") - pl.col("_comp"))
             .filter(pl.col("window").is_in(steady))
             .group_by("device", "stream").agg(pl.col("comm_ns").sum(), pl.col("exposed_ns").sum()))
    by_stream = (k.group_by("device", "stream").agg(
        kernels=pl.len().cast(pl.Int64), kernel_ns=pl.col("dur_ns").sum(),
        families=pl.col("comm_family").drop_nulls().unique().sort().str.join(", "),
        types=pl.col("type").unique().sort().str.join(", "))
        .join(s_tab, on=["device", "stream"], how="left")
        .with_columns(pl.col("comm_ns").fill_null(0), pl.col("exposed_ns").fill_null(0))
        .with_columns(
            comm_ns_per_step=(pl.col("comm_ns") / n_steady).round(1),
            exposed_ns_per_step=(pl.col("exposed_ns") / n_steady).round(1),
            hidden_pct=pl.when(pl.col("comm_ns") > 0).then(
                ((pl.col("comm_ns") - pl.col("exposed_ns")) * 100.0 / pl.col("comm_ns")).round(2)),
        ).drop("comm_ns", "exposed_ns").sort(["kernel_ns", "device", "stream"], descending=[True, False, False]))

    per_step = per_win.filter(pl.col("device") == device).with_columns(
        steady=pl.col("window").is_in(steady),
        hidden_pct=pl.when(pl.col("comm_ns") > 0).then((pl.col("hidden_ns") * 100.0 / pl.col("comm_ns")).round(2)),
    )

    by_signal = k.group_by("comm_signal", "comm_family", "comm_weak").agg(
        kernels=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
        example=pl.col("name").first(), launched_by=pl.col("comm_op").drop_nulls().mode().sort().first(),
    ).with_columns(_o=pl.col("comm_signal").replace_strict({s: i for i, s in enumerate(SIGNALS)}, default=9,
                                                           return_dtype=pl.Int64)).sort(
        ["_o", "total_ns"], descending=[False, True]).drop("_o")
    top_kernels = (on_distinct(k, ["name"], kernel=normalize_kernel_names(pl.col("name")))
                   .group_by("kernel").agg(count=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
                                           family=pl.col("comm_family").first(),
                                           type=pl.col("type").mode().sort().first(),
                                           signal=pl.col("comm_signal").mode().sort().first())
                   .sort(["total_ns", "kernel"], descending=[True, False]).head(20))

    comm_ps = main["comm_ns_per_step"] or 0.0
    exp_ps = main["exposed_ns_per_step"] or 0.0
    comm_pct, exp_pct = of_step(comm_ps), of_step(exp_ps)
    verdict = ("exposed" if (exp_pct or 0) >= exposed_pct else
               "large_but_hidden" if (comm_pct or 0) >= large_pct else "small")
    weak = k.filter(pl.col("comm_weak"))
    reasons = []
    if weak.filter(pl.col("comm_signal") == "cpu_op").height:
        reasons.append("launched by a communication op, name of no known library")
    if weak.filter(pl.col("comm_signal") == "name").height:
        reasons.append("library name only, no collective metadata or launching op")
    sized = coll.filter(pl.col("bytes").is_not_null())
    totals = {
        "device": device,
        "n_devices": int(per_device.height),
        "n_collectives": int(coll.height),
        "n_kernels": int(k.height),
        "comm_kernel_ns": int(k["dur_ns"].sum()),
        "collectives_per_step": round(float(coll["_steady"].sum()) / n_steady, 2),
        "comm_ns_per_step": comm_ps,
        "hidden_ns_per_step": main["hidden_ns_per_step"] or 0.0,
        "exposed_ns_per_step": exp_ps,
        "hidden_pct": main["hidden_pct"],
        "comm_pct_of_step": comm_pct,
        "exposed_pct_of_step": exp_pct,
        "median_step_ns": med,
        "n_steady_steps": len(steady),
        "overlap_verdict": verdict,
        "bytes": int(sized["bytes"].sum()) if sized.height else None,
        "n_sized_collectives": int(sized.height),
        "kernels_by_signal": {s: int(v) for s, v in k.group_by("comm_signal").len().sort("comm_signal").iter_rows()},
        "weak_kernels": int(weak.height),
        "weak_ns": int(weak["dur_ns"].sum()) if weak.height else 0,
        "weak_reasons": reasons,
        "families": sorted(k["comm_family"].drop_nulls().unique().to_list()),
    }
    return CommunicationResult(
        totals=totals, by_type=by_type, by_group=by_group, by_stream=by_stream, per_device=per_device,
        per_step=per_step, by_signal=by_signal, top_kernels=top_kernels,
        thresholds={"exposed_pct": exposed_pct, "large_pct": large_pct}, vendor=ctx.model.meta.vendor,
    )

