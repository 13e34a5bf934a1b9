"""Perfetto output: ``trace.perfetto.json.gz``, the exported window as a chrome trace with our
findings on annotation tracks; it opens in ui.perfetto.dev and chrome://tracing.

What the file holds (all from the report; nothing is recomputed here):

* the events of the ``trace_window`` result (the steady steps, or ``--window``), written back
  in the Kineto layout (categories, ``args`` keys, ``pid``/``tid``; GPU work on ``pid`` =
  device, ``tid`` = stream as Kineto writes it), so ``traceanalyzer analyze`` reads the file
  like any trace; times are µs from the window's start, and ``baseTimeNanoseconds`` gives
  the original clock back;
* a process **traceanalyzer findings** (:data:`FINDINGS_PID`): one thread per device with the
  ``idle_gaps`` device gaps of the window as slices named ``idle: <cause>`` and coloured by
  cause (chrome-trace ``cname``, :data:`CAUSE_COLOURS`; Perfetto colours by name), then one
  thread per finding: a slice over the window named by the rule id (title, cost, fix,
  evidence in its args), an instant event at the start of each step its evidence names
  (``…_by_step`` maps, lists of ``{"step": …}``) and, for the rules about one kind of idle gap
  (:data:`RULE_GAP_CAUSES`), the window's gaps of that cause again, under the finding;
* counter tracks (``"ph": "C"``): GPU busy % of each step (``gpu_time``), and allocated /
  reserved bytes per device from the window's ``[memory]`` events, where the trace has them;
* in the one report of a run (``analyze RUN_DIR``), a process-wide instant event at the memory
  snapshot's peak when ``run_memory`` placed it inside the window;
* ``process_name`` / ``thread_name`` / sort-index metadata for every pid and tid.

Our own slices use the category ``traceanalyzer``, which the loader keeps aside quietly.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import CAUSES, IdleGapsResult
from traceanalyzer.analyses.run_memory import RunMemoryResult
from traceanalyzer.analyses.trace_window import TraceWindowResult
from traceanalyzer.report import renderer
from traceanalyzer.report.document import Report
from traceanalyzer.report.fsutil import atomic_write_bytes
from traceanalyzer.units import device_name, fmt_cost

#: The file written (gzip: Perfetto and chrome://tracing open it as it is).
FILE_NAME = "trace.perfetto.json.gz"
#: The pid of our annotation process (above any OS pid, below 2^31).
FINDINGS_PID = 2_000_000_000
FINDINGS_PROCESS = "traceanalyzer findings"
#: Category of every event we add (the loader keeps it aside without a warning).
OUR_CAT = "traceanalyzer"
#: Idle-gap cause → chrome-trace reserved colour name.
CAUSE_COLOURS = {"host_bound": "terrible", "sync": "bad", "memcpy": "yellow", "data_loader": "olive",
                 "stream_dependency": "rail_animation", "other": "grey"}
assert set(CAUSE_COLOURS) == set(CAUSES)
#: The idle-gap causes a rule's finding is about: its thread repeats those gaps of the window, so
#: the evidence sits under the finding (the host-blocking rules share sync and copy gaps).
RULE_GAP_CAUSES: dict[str, tuple[str, ...]] = {
    "host_bound_gaps": ("host_bound",), "dataloader_bottleneck": ("data_loader",),
    "explicit_sync": ("sync",), "item_sync": ("sync",), "pageable_memcpy": ("memcpy",), "blocking_copies": ("memcpy",),
}


def _us(col: str, base: int) -> pl.Expr:
    """A ns column as µs from ``base`` (float, exact to the ns)."""
    return (pl.col(col) - base) / 1000.0


def _encode(df: pl.DataFrame, fields: dict[str, pl.Expr], args: dict[str, pl.Expr],
            raw: dict[str, str] | None = None) -> str:
    """One JSON object per row, joined by ``,\n``: ``fields`` and ``args`` (nulls written as
    null); ``raw`` maps an args key to a column already holding JSON text (shapes, grid),
    spliced in as is. Polars writes the JSON (its NDJSON writer; ``json_encode`` where text is
    spliced), so no Python loop runs per event."""
    if df.is_empty():
        return ""
    named: dict[str, pl.Expr] = dict(fields)
    if args:
        named["args"] = pl.struct(*(e.alias(k) for k, e in args.items()))
    if not raw:
        # NDJSON escapes newlines inside strings, so the only raw newlines separate the events.
        return df.select(*(e.alias(k) for k, e in named.items())).write_ndjson().rstrip("\n").replace("\n", ",\n")
    enc = pl.struct(*(e.alias(k) for k, e in named.items())).struct.json_encode()
    for key, col in raw.items():
        enc = pl.when(pl.col(col).is_not_null()).then(
            pl.concat_str([enc.str.strip_suffix("}}"), pl.lit(f',{orjson.dumps(key).decode()}:'),
                           pl.col(col), pl.lit("}}")])).otherwise(enc)
    return ",\n".join(df.select(enc.alias("e")).to_series().to_list())


def _x(cat: str | pl.Expr, base: int, pid: str | pl.Expr, tid: str | pl.Expr) -> dict[str, pl.Expr]:
    """The common fields of a duration event."""
    return {"ph": pl.lit("X"), "cat": cat if isinstance(cat, pl.Expr) else pl.lit(cat), "name": pl.col("name"),
            "pid": pl.col(pid) if isinstance(pid, str) else pid, "tid": pl.col(tid) if isinstance(tid, str) else tid,
            "ts": _us("ts_ns", base), "dur": pl.col("dur_ns") / 1000.0}


def _window_events(w: TraceWindowResult, base: int) -> list[str]:
    """The window's recorded events in the Kineto layout."""
    ev = w.events
    c = pl.col
    out = [
        _encode(ev["cpu_ops"], _x(c("cat"), base, "pid", "tid"), {
            "External id": c("external_id"), "Sequence number": c("seq_num"), "Fwd thread id": c("fwd_thread_id"),
            "Ev Idx": c("ev_idx"), "Collective name": c("comm_name"), "dtype": c("comm_dtype"),
            "In msg nelems": c("comm_in_nelems"), "Out msg nelems": c("comm_out_nelems"),
            "Group size": c("comm_group_size"), "Process Group Name": c("comm_pg_name"),
            "Process Group Description": c("comm_pg_desc")},
            {"Input Dims": "input_dims", "Input type": "input_types"}),
        _encode(ev["annotations"], _x("user_annotation", base, "pid", "tid"), {"External id": c("external_id")}),
        _encode(ev["python_frames"], _x("python_function", base, "pid", "tid"),
                {"Python id": c("python_id"), "Python parent id": c("python_parent_id")}),
        _encode(ev["runtime"], _x(c("cat"), base, "pid", "tid"),
                {"correlation": c("correlation"), "External id": c("external_id"), "cbid": c("cbid")}),
        _encode(ev["kernels"], _x("kernel", base, "device", "stream"), {
            "device": c("device"), "stream": c("stream"), "correlation": c("correlation"),
            "External id": c("external_id"), "registers per thread": c("registers_per_thread"),
            "shared memory": c("shared_memory"), "queued": c("queued_ns"), "graph id": c("graph_id"),
            "Collective name": c("comm_name"), "dtype": c("comm_dtype"), "In msg nelems": c("comm_in_nelems"),
            "Group size": c("comm_group_size")},
            {"grid": "grid", "block": "block"}),
        _encode(ev["memcpy"], _x("gpu_memcpy", base, "device", "stream"), {
            "device": c("device"), "stream": c("stream"), "correlation": c("correlation"),
            "External id": c("external_id"), "bytes": c("bytes")}),
        _encode(ev["memset"], _x("gpu_memset", base, "device", "stream"), {
            "device": c("device"), "stream": c("stream"), "correlation": c("correlation"),
            "External id": c("external_id"), "bytes": c("bytes")}),
        _encode(ev["gpu_annotations"], _x("gpu_user_annotation", base, "device", "stream"),
                {"device": c("device"), "stream": c("stream")}),
        _encode(ev["flows"], {"ph": c("ph"), "cat": c("kind"), "name": c("kind"), "id": c("id"),
                              "pid": c("pid"), "tid": c("tid"), "ts": _us("ts_ns", base),
                              "bp": pl.lit("e")}, {}),
        _encode(ev["memory_events"], {
            "ph": pl.lit("i"), "cat": pl.lit("cpu_instant_event"),
            "name": pl.when(c("oom")).then(pl.lit("[OutOfMemory]")).otherwise(pl.lit("[memory]")),
            "pid": c("pid"), "tid": c("tid"), "ts": _us("ts_ns", base), "s": pl.lit("t")}, {
            "Device Type": c("device_type"), "Device Id": c("device_id"), "Addr": c("addr"), "Bytes": c("bytes"),
            "Total Allocated": c("total_allocated"), "Total Reserved": c("total_reserved")}),
    ]
    return out


def _devices(w: TraceWindowResult) -> list[int]:
    ids: set[int] = set()
    for t in ("kernels", "memcpy", "memset", "gpu_annotations"):
        ids.update(int(d) for d in w.events[t]["device"].drop_nulls().unique().to_list())
    return sorted(ids)


def _metadata(w: TraceWindowResult, vendor: str, devices: list[int], finding_threads: list[tuple[int, str]],
              gap_threads: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """process_name / thread_name / sort indexes of every pid and tid the file uses."""
    ev = w.events
    meta: list[dict[str, Any]] = []

    def m(name: str, pid: int, tid: int, args: dict[str, Any]) -> None:
        meta.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args})

    m("process_name", FINDINGS_PID, 0, {"name": FINDINGS_PROCESS})
    m("process_sort_index", FINDINGS_PID, 0, {"sort_index": -1})
    for i, (tid, name) in enumerate([*gap_threads, *finding_threads]):
        m("thread_name", FINDINGS_PID, tid, {"name": name})
        m("thread_sort_index", FINDINGS_PID, tid, {"sort_index": i})
    cpu = pl.concat([ev[t].select("pid", "tid")
                     for t in ("cpu_ops", "annotations", "python_frames", "runtime", "memory_events")])
    cpu = cpu.drop_nulls().unique().sort("pid", "tid")
    names = {(int(r["pid"]), int(r["tid"])): str(r["name"]) for r in w.threads.drop_nulls(["pid", "tid"]).iter_rows(
        named=True)}
    rank = w.distributed_info.get("rank") if w.distributed_info else None
    for pid in cpu["pid"].unique().sort().to_list():
        m("process_name", pid, 0, {"name": f"host process {pid}" + (f" (rank {rank})" if rank is not None else "")})
        m("process_sort_index", pid, 0, {"sort_index": 0})
    for pid, tid in cpu.iter_rows():
        m("thread_name", pid, tid, {"name": names.get((pid, tid), f"thread {tid}")})
    props = {int(p["id"]): str(p.get("name", "")) for p in w.device_properties if isinstance(p.get("id"), int)}
    gpu = pl.concat([ev[t].select("device", "stream") for t in ("kernels", "memcpy", "memset", "gpu_annotations")])
    for d in devices:
        label = device_name(d, vendor) + (f" ({props[d]})" if props.get(d) else "")
        m("process_name", d, 0, {"name": label})
        m("process_sort_index", d, 0, {"sort_index": 1 + d})
    for d, s in gpu.drop_nulls().unique().sort("device", "stream").iter_rows():
        m("thread_name", d, s, {"name": f"stream {s}"})
    return meta


def _evidence_steps(evidence: dict[str, Any]) -> list[tuple[int, str, Any]]:
    """(step, key, value) for each step the evidence names: ``…_by_step`` maps and lists of
    objects with a ``step``."""
    out: list[tuple[int, str, Any]] = []
    for key, value in evidence.items():
        if isinstance(value, dict) and key.endswith("_by_step"):
            for step, v in value.items():
                if str(step).lstrip("-").isdigit():
                    out.append((int(step), key, v))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and isinstance(item.get("step"), int):
                    out.append((int(item["step"]), key, item))
    return out


def _annotations(report: Report, w: TraceWindowResult, base: int, vendor: str,
                 devices: list[int]) -> tuple[list[dict[str, Any]], list[str],
                                              list[tuple[int, str]], list[tuple[int, str]]]:
    """Our tracks: idle gaps by cause, findings, counters."""
    us = 1000.0
    small: list[dict[str, Any]] = []
    series: list[str] = []
    gap_threads = [(1 + i, f"idle gaps · {device_name(d, vendor)}") for i, d in enumerate(devices)]
    gaps = report.results.typed("idle_gaps", IdleGapsResult)
    c = pl.col
    g: pl.DataFrame | None = None

    def gap_slices(df: pl.DataFrame, tid: pl.Expr, prefix: str) -> str:
        return _encode(df, {
            "ph": pl.lit("X"), "cat": pl.lit(OUR_CAT), "name": pl.lit(prefix) + c("cause"),
            "pid": pl.lit(FINDINGS_PID), "tid": tid, "ts": _us("start_ns", base), "dur": c("dur_ns") / us,
            "cname": c("cause").replace_strict(CAUSE_COLOURS, default="grey", return_dtype=pl.String)}, {
            "cause": c("cause"), "device": c("device"), "step": c("step"), "queued": c("queued"),
            "next kernel": c("next_name"), "launch api": c("launch_api"), "cpu context": c("cpu_context")})

    if gaps is not None and gaps.device_gaps.height and devices:
        g = gaps.device_gaps.filter((pl.col("start_ns") >= w.start_ns) & (pl.col("start_ns") < w.end_ns))
        g = g.join(pl.DataFrame({"device": devices, "_tid": [t for t, _ in gap_threads]},
                                schema={"device": pl.Int64, "_tid": pl.Int64}), on="device", how="inner")
        series.append(gap_slices(g, c("_tid"), "idle: "))
    first = len(gap_threads) + 1
    finding_threads: list[tuple[int, str]] = []
    step_start = {int(r["step"]): int(r["start_ns"]) for r in w.step_windows.iter_rows(named=True)
                  if r["step"] is not None}
    ts0, dur = (w.start_ns - base) / us, (w.end_ns - w.start_ns) / us
    for i, f in enumerate(report.findings):
        tid = first + i
        finding_threads.append((tid, f.rule_id))
        cost = fmt_cost(f.cost_ms_per_step, f.cost_pct_of_step, f.cost_bytes)
        causes = RULE_GAP_CAUSES.get(f.rule_id, ())
        mine = g.filter(pl.col("cause").is_in(causes)) if g is not None and causes else None
        f_dur = dur
        if mine is not None and mine.height:
            series.append(gap_slices(mine, pl.lit(tid), f"{f.rule_id}: idle "))
            # The finding's slice holds its gap slices whole (the last gap may run past the window).
            f_dur = (max(w.end_ns, int(mine["end_ns"].max())) - w.start_ns) / us  # type: ignore[arg-type]
        small.append({"ph": "X", "cat": OUR_CAT, "name": f.rule_id, "pid": FINDINGS_PID, "tid": tid, "ts": ts0,
                      "dur": f_dur, "cname": {3: "terrible", 2: "bad"}.get(int(f.severity), "yellow"),
                      "args": {"title": f.title, "severity": str(f.severity), "cost": cost, "fix": f.fix,
                               "evidence": dict(f.evidence)}})
        for step, key, value in _evidence_steps(dict(f.evidence)):
            if step in step_start:
                small.append({"ph": "i", "s": "t", "cat": OUR_CAT, "name": f"{f.rule_id}: step {step}",
                              "pid": FINDINGS_PID, "tid": tid, "ts": (step_start[step] - base) / us,
                              "args": {key: value}})
    rm = report.results.typed("run_memory", RunMemoryResult)
    if rm is not None:  # a run's snapshot peak, where the clocks allow placing it
        for r in rm.placements.filter(pl.col("placed")).iter_rows(named=True):
            if w.start_ns <= r["ts_ns"] < w.end_ns:
                small.append({"ph": "i", "s": "p", "cat": OUR_CAT, "name": f"{r['kind']} peak: {r['device']}",
                              "pid": FINDINGS_PID, "tid": 0, "ts": (r["ts_ns"] - base) / us,
                              "args": {"peak bytes": r["peak_bytes"], "source": r["source"], "step": r["step"]}})
    gt = report.results.typed("gpu_time", GpuTimeResult)
    if gt is not None and gt.per_step.height and w.step_windows.height:
        ps = gt.per_step.join(w.step_windows.select("window", "start_ns", "end_ns"), on="window", how="inner")
        for (dev,), part in ps.sort("start_ns").group_by(["device"], maintain_order=True):
            name = f"{device_name(int(dev), vendor)} busy % of step"
            pts = [(r["start_ns"], r["busy_pct"]) for r in part.iter_rows(named=True)]
            pts.append((int(part["end_ns"].max()), 0.0))  # type: ignore[arg-type]
            small += [{"ph": "C", "cat": OUR_CAT, "name": name, "pid": FINDINGS_PID, "tid": 0,
                       "ts": (t - base) / us, "args": {"busy %": v}} for t, v in pts if v is not None]
    mem = w.events["memory_events"].filter((pl.col("device_type") != 0) & pl.col("device_id").is_not_null())
    if mem.height:
        c = pl.col
        names = {d: f"{device_name(d, vendor)} memory" for d in mem["device_id"].unique().to_list()}
        series.append(_encode(mem.sort("ts_ns"), {
            "ph": pl.lit("C"), "cat": pl.lit(OUR_CAT),
            "name": c("device_id").replace_strict(names, return_dtype=pl.String),
            "pid": pl.lit(FINDINGS_PID), "tid": pl.lit(0), "ts": _us("ts_ns", base)},
            {"allocated bytes": c("total_allocated"), "reserved bytes": c("total_reserved")}))
    return small, series, finding_threads, gap_threads


def document(report: Report) -> bytes | None:
    """The chrome-trace JSON of the report's window, or None when there is no window."""
    w = report.results.typed("trace_window", TraceWindowResult)
    if w is None:
        return None
    base = w.start_ns
    vendor = str(report.meta.get("vendor") or "unknown")
    devices = _devices(w)
    small, ours, finding_threads, gap_threads = _annotations(report, w, base, vendor, devices)
    parts = [s for s in (*_window_events(w, base), *ours) if s]
    lines = [orjson.dumps(e).decode() for e in (*_metadata(w, vendor, devices, finding_threads, gap_threads), *small)]
    body = ",\n".join([*lines, *parts])
    top: dict[str, Any] = {
        "schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
        "deviceProperties": list(w.device_properties),
        "traceName": f"{Path(report.source).name} ({w.spec})",
        "traceanalyzer": {"source": report.source, **w.to_json()},
    }
    if w.distributed_info:
        top["distributedInfo"] = w.distributed_info
    head = orjson.dumps(top, option=orjson.OPT_NON_STR_KEYS)
    return head[:-1] + b',"traceEvents":[\n' + body.encode() + b"\n]}"


def perfetto_link(outdir: Path) -> str:
    """The HTML line by which report.html links to the export, when it was written into ``outdir``
    (``pipeline.resolve_formats`` writes it before the page); empty otherwise."""
    if not (outdir / FILE_NAME).is_file():
        return ""
    return (f'<p class="note">Timeline: <a href="{FILE_NAME}">{FILE_NAME}</a>, the exported window with the '
            "findings as tracks; open it in ui.perfetto.dev or chrome://tracing.</p>\n")


@renderer("perfetto", description="trace.perfetto.json.gz: the steady steps (or --window) with the findings "
          "as tracks, for ui.perfetto.dev", default=False)
def render(report: Report, outdir: Path) -> list[Path]:
    data = document(report)
    if data is None:
        return []
    path = outdir / FILE_NAME
    atomic_write_bytes(path, gzip.compress(data, compresslevel=3, mtime=0))  # half the time of 6, 25 % larger
    return [path]
