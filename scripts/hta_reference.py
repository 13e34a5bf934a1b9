#!/usr/bin/env python3
"""Produce reference figures from HolisticTraceAnalysis (HTA) 0.5.0 for every chrome trace.

The output (``tests/data/hta_reference.json``) lets traceanalyzer's own analyses be
checked for agreement with HTA *without* installing HTA in CI.  See
``docs/hta_reference.md`` for what every field means and how HTA defines it.

Run it with the Python of a virtualenv that has ``holistictraceanalysis==0.5.0``::

    python3 -m venv /work/hta-venv
    /work/hta-venv/bin/pip install holistictraceanalysis==0.5.0
    /work/hta-venv/bin/python scripts/hta_reference.py

Every file is analysed in its own subprocess (``--worker``), alone in a temporary
directory (HTA's ``TraceAnalysis`` loads a directory of rank files), so that a crash,
a hang (``--timeout``) or the memory of one file cannot affect another, and so that
the peak RSS measured with ``resource.getrusage`` belongs to that file only.

This script is a development tool: it is not imported by the package or the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO_ROOT.parent / "shared" / "data" / "traces"
DEFAULT_OUTPUT = REPO_ROOT / "tests" / "data" / "hta_reference.json"
GENERATED_BY = "scripts/hta_reference.py"
EXPECTED_HTA_VERSION = "0.5.0"

# Files under the traces root that are not chrome traces (relative paths, "/"-separated).
SKIP_FILES = {
    "hta/execution_trace/benchmark_simple_add_et.json.gz": "PyTorch Execution Trace, not a chrome trace",
}
SKIP_DIRS = {
    "hta/memory_analysis": "export_memory_timeline raw output, not a chrome trace",
}
TRACE_SUFFIXES = (".json", ".json.gz")

# HTA's consecutive_kernel_delay default in TraceAnalysis.get_idle_time_breakdown (µs in practice).
KERNEL_WAIT_THRESHOLD = 30
TOP_KERNELS = 10

# Category names (cat) as HTA's trace DataFrame carries them; used only for the counts we report.
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
RUNTIME_CAT_RE = re.compile(r"^(.+_runtime|Runtime|cuda_driver)$")


# --------------------------------------------------------------------------------------
# helpers shared by parent and worker
# --------------------------------------------------------------------------------------


def _num(x: Any) -> Any:
    """Convert numpy/pandas scalars to JSON numbers: ints stay ints, floats get 3 decimals."""
    if x is None:
        return None
    if isinstance(x, bool):
        return x
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        if x.is_integer() and abs(x) < 2**53:
            return int(x)
        return round(x, 3)
    return x


def _clean(obj: Any) -> Any:
    """Recursively make obj JSON-serialisable and deterministic."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, str):
        return obj
    return _num(obj)


def _err(exc: BaseException) -> dict[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 300:  # pandas puts whole arrays into some messages
        text = text[:300] + " ..."
    tb = traceback.extract_tb(exc.__traceback__)
    where = ""
    if tb:
        # the innermost frame inside HTA (or the last frame) tells where it failed
        hta_frames = [f for f in tb if "/hta/" in f.filename]
        f = hta_frames[-1] if hta_frames else tb[-1]
        where = f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}"
    return {"error": text, "where": where}


def _guard(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the failure is data
        return _err(exc)


def discover(root: Path) -> tuple[list[str], dict[str, str]]:
    """Return (trace files, skipped files with reasons), as sorted paths relative to root."""
    traces: list[str] = []
    skipped: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        dir_skip = next((r for d, r in SKIP_DIRS.items() if rel.startswith(d + "/")), None)
        if dir_skip:
            skipped[rel] = dir_skip
        elif rel in SKIP_FILES:
            skipped[rel] = SKIP_FILES[rel]
        elif not rel.endswith(TRACE_SUFFIXES):
            skipped[rel] = "not a .json/.json.gz file"
        else:
            traces.append(rel)
    return traces, skipped


# --------------------------------------------------------------------------------------
# worker: runs inside the HTA virtualenv, one file per process
# --------------------------------------------------------------------------------------


def _rss_mb() -> float:
    # Linux: ru_maxrss is in KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _decode(ids, sym_table) -> list[str]:
    return [sym_table[int(i)] if 0 <= int(i) < len(sym_table) else "" for i in ids]


def _cat_counts(df, sym_table) -> dict[str, int]:
    vc = df["cat"].value_counts()
    return {sym_table[int(k)]: int(v) for k, v in vc.items()}


def _counts(df, sym_table) -> dict[str, Any]:
    by_cat = _cat_counts(df, sym_table)
    return {
        "rows": int(len(df)),
        "kernels": sum(v for k, v in by_cat.items() if k in KERNEL_CATS),
        "memcpy": sum(v for k, v in by_cat.items() if k in MEMCPY_CATS),
        "memset": sum(v for k, v in by_cat.items() if k in MEMSET_CATS),
        "runtime": sum(v for k, v in by_cat.items() if RUNTIME_CAT_RE.match(k)),
        "gpu_rows": int((df["stream"] != -1).sum()),
        # HTA's ns rounding (ts=ceil, end=floor) turns sub-µs events into dur 0 or -1
        "negative_dur_rows": int((df["dur"] < 0).sum()),
        "zero_dur_rows": int((df["dur"] == 0).sum()),
        "gpu_negative_dur_rows": int(((df["dur"] < 0) & (df["stream"] != -1)).sum()),
        "by_cat": dict(sorted(by_cat.items())),
    }


def _temporal(analyzer, rank: int) -> dict[str, Any]:
    df = analyzer.get_temporal_breakdown(visualize=False)
    row = df[df["rank"] == rank].iloc[0]
    return {
        "idle_us": row["idle_time(us)"],
        "compute_us": row["compute_time(us)"],
        "non_compute_us": row["non_compute_time(us)"],
        "kernel_time_us": row["kernel_time(us)"],
        "idle_pct": row["idle_time_pctg"],
        "compute_pct": row["compute_time_pctg"],
        "non_compute_pct": row["non_compute_time_pctg"],
    }


def _idle(analyzer, rank: int) -> dict[str, Any]:
    df, stats = analyzer.get_idle_time_breakdown(
        ranks=[rank],
        visualize=False,
        show_idle_interval_stats=True,
        consecutive_kernel_delay=KERNEL_WAIT_THRESHOLD,
    )
    streams: dict[str, dict[str, Any]] = {}
    for rec in df.to_dict("records"):
        s = streams.setdefault(str(int(rec["stream"])), {"idle_us": {}, "ratio": {}, "intervals": {}})
        s["idle_us"][rec["idle_category"]] = rec["idle_time"]
        s["ratio"][rec["idle_category"]] = rec["idle_time_ratio"]
    if stats is not None:
        for cat, rec in stats.iterrows():
            s = streams.setdefault(str(int(rec["stream"])), {"idle_us": {}, "ratio": {}, "intervals": {}})
            s["intervals"][str(cat)] = {
                "count": rec["count"],
                "mean": rec["mean"],
                "median": rec["50%"],
                "min": rec["min"],
                "max": rec["max"],
            }
    for s in streams.values():
        s["total_idle_us"] = sum(v for v in s["idle_us"].values() if v == v)
    return {
        "consecutive_kernel_delay_us": KERNEL_WAIT_THRESHOLD,
        "streams": dict(sorted(streams.items(), key=lambda kv: int(kv[0]))),
    }


def _kernel_breakdown(analyzer, rank: int, df, sym_table) -> dict[str, Any]:
    from hta.utils.utils import get_kernel_type

    kt_df, all_df = analyzer.get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=0.8, num_kernels=10, include_memory_kernels=True
    )
    # HTA's own kernel-type table: union time of each exclusive type state (may include
    # "X overlapping Y" states).  Single rank per run, so this is this rank's figure.
    kernel_type_union = {
        str(r["kernel_type"]): {"sum_us": r["sum"], "percentage": r["percentage"]}
        for r in kt_df.to_dict("records")
    }
    hta_rows = [
        {
            "name": r["name"],
            "kernel_type": r["kernel_type"],
            "sum_us": r["sum (us)"],
            "max_us": r["max (us)"],
            "min_us": r["min (us)"],
            "mean_us": r["mean (us)"],
        }
        for r in all_df[all_df["rank"] == rank].to_dict("records")
    ]
    hta_rows.sort(key=lambda r: (r["kernel_type"], -(r["sum_us"] or 0), r["name"]))

    # The same population HTA's breakdown uses (stream != -1), aggregated by name.
    gpu = df[df["stream"] != -1][["name", "cat", "dur"]].copy()
    names = _decode(gpu["name"].unique(), sym_table)
    name_map = dict(zip(gpu["name"].unique(), names))
    gpu["s_name"] = gpu["name"].map(name_map)
    gpu["kernel_type"] = gpu["s_name"].map({n: get_kernel_type(n) for n in names})
    by_type = gpu.groupby("kernel_type")["dur"].agg(["count", "sum"])
    type_dur_sum = {
        str(k): {"count": int(v["count"]), "sum_us": v["sum"]} for k, v in by_type.iterrows()
    }
    by_name = gpu.groupby(["s_name", "kernel_type"])["dur"].agg(["count", "sum"]).reset_index()
    by_name = by_name.sort_values(["sum", "s_name"], ascending=[False, True]).head(TOP_KERNELS)
    top = [
        {"name": r["s_name"], "kernel_type": r["kernel_type"], "count": r["count"], "sum_us": r["sum"]}
        for r in by_name.to_dict("records")
    ]
    return {
        "kernel_type_union_us": kernel_type_union,
        "kernel_type_dur_sum": type_dur_sum,
        "top_kernels": top,
        "hta_all_kernel_df": hta_rows,
    }


def _launch_stats(analyzer, rank: int) -> dict[str, Any]:
    res = analyzer.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)
    ev = res[rank]
    out: dict[str, Any] = {"joined_launches": int(len(ev))}
    for col in ("cpu_duration", "gpu_duration", "launch_delay"):
        s = ev[col]
        out[col] = (
            {
                "median": s.median(),
                "mean": s.mean(),
                "p90": s.quantile(0.9),
                "min": s.min(),
                "max": s.max(),
                "sum": s.sum(),
            }
            if len(s)
            else None
        )
    # HTA's histogram classes (runtime_cutoff=50, launch_delay_cutoff=100)
    out["short_gpu_kernels"] = int(((ev.cpu_duration <= 50) & (ev.gpu_duration < ev.cpu_duration)).sum())
    out["runtime_outliers_gt_50us"] = int((ev.cpu_duration > 50).sum())
    out["launch_delay_outliers_gt_100us"] = int((ev.launch_delay > 100).sum())
    out["duplicate_correlations"] = int(ev["correlation"].duplicated().sum())
    return out


def _window(df, min_ts: int) -> dict[str, Any]:
    """Window of the rows HTA kept (ts is shifted by min_ts in HTA; we report absolute µs)."""
    if len(df) == 0:
        return {}
    end = df["ts"] + df["dur"]  # HTA's own "end" column is stale after alignment
    gpu = df[df["stream"] != -1]
    out = {
        "min_ts": int(df["ts"].min()) + min_ts,
        "max_end": int(end.max()) + min_ts,
        "span_us": int(end.max() - df["ts"].min()),
    }
    if len(gpu):
        gend = gpu["ts"] + gpu["dur"]
        out["gpu_min_ts"] = int(gpu["ts"].min()) + min_ts
        out["gpu_max_end"] = int(gend.max()) + min_ts
        out["gpu_span_us"] = int(gend.max() - gpu["ts"].min())
    return out


def worker_load_only(trace_path: str) -> dict[str, Any]:
    """Only time HTA's load (import + TraceAnalysis(trace_dir)), nothing else in the process."""
    t_start = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t_imported = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        os.symlink(os.path.abspath(trace_path), os.path.join(tmp, os.path.basename(trace_path)))
        c0, t0 = _cpu_s(), time.perf_counter()
        TraceAnalysis(trace_dir=tmp)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    return {
        "status": "ok",
        "load": {
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "import_s": round(t_imported - t_start, 3),
            "peak_rss_mb": round(_rss_mb(), 1),
        },
    }


def worker(trace_path: str) -> dict[str, Any]:
    t_start = time.perf_counter()
    result: dict[str, Any] = {}
    import hta
    import pandas as pd  # noqa: F401  (import cost counted in import_s)
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    t_imported = time.perf_counter()
    rss_after_import = _rss_mb()
    result["hta_version"] = getattr(hta, "__version__", None)

    pre: dict[int, dict[str, Any]] = {}
    snap_cost = [0.0]
    orig_align = Trace.align_and_filter_trace

    def align_and_filter_trace(self, include_last_profiler_step=False):
        # Snapshot what HTA parsed before it aligns and drops the last step.
        t0 = time.perf_counter()
        sym = self.symbol_table.get_sym_table()
        for rank, df in self.traces.items():
            steps_mask = df["name"].isin(
                [i for i, s in enumerate(sym) if s.startswith("ProfilerStep")]
            )
            steps = df[steps_mask][["ts", "dur", "name", "cat"]].sort_values(["ts", "name"])
            pre[rank] = {
                "counts": _counts(df, sym),
                "min_ts": int(df["ts"].min()) if len(df) else None,
                "max_end": int((df["ts"] + df["dur"]).max()) if len(df) else None,
                "profiler_steps": [
                    {"name": sym[int(r.name)], "cat": sym[int(r.cat)], "ts": int(r.ts), "dur": int(r.dur)}
                    for r in steps.itertuples()
                ],
            }
        snap_cost[0] += time.perf_counter() - t0
        return orig_align(self, include_last_profiler_step)

    Trace.align_and_filter_trace = align_and_filter_trace

    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        # HTA loads every *.json / *.gz file of a directory; give it this file alone.
        link = os.path.join(tmp, os.path.basename(trace_path))
        os.symlink(os.path.abspath(trace_path), link)
        c0, t0 = _cpu_s(), time.perf_counter()
        try:
            analyzer = TraceAnalysis(trace_dir=tmp)
        except Exception as exc:  # noqa: BLE001
            result["status"] = "load_failed"
            result["load_error"] = _err(exc)
            result["load"] = {
                "wall_s": round(time.perf_counter() - t0 - snap_cost[0], 3),
                "peak_rss_mb": round(_rss_mb(), 1),
            }
            return result
        load_s = time.perf_counter() - t0 - snap_cost[0]
        load_cpu_s = _cpu_s() - c0 - snap_cost[0]
        rss_after_load = _rss_mb()
        ranks = analyzer.t.get_ranks()
        result["status"] = "ok"
        result["load"] = {
            "wall_s": round(load_s, 3),
            "cpu_s": round(load_cpu_s, 3),
            "import_s": round(t_imported - t_start, 3),
            "peak_rss_mb": round(rss_after_load, 1),
            "rss_after_import_mb": round(rss_after_import, 1),
        }
        result["ranks"] = ranks
        result["min_ts"] = int(analyzer.t.min_ts)
        sym = analyzer.t.symbol_table.get_sym_table()
        per_rank: dict[str, Any] = {}
        for rank in ranks:
            df = analyzer.t.get_trace(rank)
            r: dict[str, Any] = {}
            p = pre.get(rank, {})
            steps = p.get("profiler_steps", [])
            step_names = sorted({s for s in sym if "ProfilerStep" in s})
            filtered = len(step_names) >= 2
            last = max(steps, key=lambda s: s["ts"]) if steps else None
            r["steps"] = {
                "profiler_steps_in_trace": steps,
                "profiler_step_symbols": len(step_names),
                "filter_applied": filtered,
                # the ProfilerStep row with the latest ts: rows from it on are dropped
                "last_step_marker": last["name"] if (filtered and last) else None,
                "cpu_kept_before_ts": last["ts"] if (filtered and last) else None,
                "iterations_kept": _guard(lambda rank=rank: analyzer.t.get_iterations(rank)),
                "get_profiler_steps": _guard(lambda: analyzer.get_profiler_steps()),
            }
            dist = (analyzer.t.meta_data.get(rank) or {}).get("distributedInfo")
            r["meta_distributed_info_rank"] = dist.get("rank") if isinstance(dist, dict) else None
            r["counts_parsed"] = p.get("counts")
            r["window_parsed"] = {"min_ts": p.get("min_ts"), "max_end": p.get("max_end")}
            r["counts"] = _guard(lambda df=df: dict(_counts(df, sym),
                                                    duplicate_index_rows=int(df.index.duplicated().sum())))
            r["window"] = _guard(lambda df=df: _window(df, int(analyzer.t.min_ts)))
            r["temporal_breakdown"] = _guard(lambda rank=rank: _temporal(analyzer, rank))
            r["idle_time_breakdown"] = _guard(lambda rank=rank: _idle(analyzer, rank))
            r["kernel_breakdown"] = _guard(lambda rank=rank, df=df: _kernel_breakdown(analyzer, rank, df, sym))
            r["launch_stats"] = _guard(lambda rank=rank: _launch_stats(analyzer, rank))
            per_rank[str(rank)] = r
        result["per_rank"] = per_rank
        result["load"]["peak_rss_end_mb"] = round(_rss_mb(), 1)
    return result


# --------------------------------------------------------------------------------------
# parent: discovery, one subprocess per file, output
# --------------------------------------------------------------------------------------


def run_one(python: str, root: Path, rel: str, timeout: int, load_only: bool = False) -> dict[str, Any]:
    res: dict[str, Any]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out_path = fh.name
    cmd = [python, str(Path(__file__).resolve()), "--worker", str(root / rel), "--worker-out", out_path]
    if load_only:
        cmd.append("--load-only")
    loadavg = os.getloadavg()[0]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONHASHSEED="0")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        wall = time.perf_counter() - t0
        try:
            with open(out_path) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = {
                "status": "worker_crashed",
                "returncode": proc.returncode,
                "stderr_tail": proc.stderr[-3000:],
            }
        res.setdefault("load", {})["process_wall_s"] = round(wall, 3)
        res["load"]["loadavg_1m_at_start"] = round(loadavg, 2)
    except subprocess.TimeoutExpired:
        res = {"status": "timeout", "timeout_s": timeout}
    finally:
        try:
            os.unlink(out_path)
        except OSError:
            pass
    res["file_bytes"] = (root / rel).stat().st_size
    return res


def _repeat_timing(res: dict[str, Any], python: str, root: Path, rel: str, timeout: int, repeats: int) -> None:
    """Re-time the load in fresh load-only processes; keep the best wall time."""
    load = res["load"]
    keys = ("wall_s", "cpu_s", "peak_rss_mb")
    runs = [dict({k: load[k] for k in keys}, loadavg=load.get("loadavg_1m_at_start"))]
    for _ in range(repeats - 1):
        r = run_one(python, root, rel, timeout, load_only=True)
        if r.get("status") == "ok":
            runs.append(dict({k: r["load"][k] for k in keys}, loadavg=r["load"]["loadavg_1m_at_start"]))
    load["wall_s_first_run"] = load["wall_s"]
    load["wall_s"] = min(x["wall_s"] for x in runs)
    load["cpu_s"] = min(x["cpu_s"] for x in runs)
    load["wall_s_runs"] = [x["wall_s"] for x in runs]
    load["cpu_s_runs"] = [x["cpu_s"] for x in runs]
    load["peak_rss_mb_runs"] = [x["peak_rss_mb"] for x in runs]
    load["loadavg_1m_runs"] = [x["loadavg"] for x in runs]


def _environment(python: str) -> tuple[str | None, dict[str, Any]]:
    code = (
        "import importlib.metadata as m, sys, pandas, numpy; "
        "print(m.version('holistictraceanalysis'), sys.version.split()[0], pandas.__version__, numpy.__version__)"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    if len(out) != 4:
        return None, {}
    return out[0], {"python": out[1], "pandas": out[2], "numpy": out[3], "platform": platform.machine()}


# --------------------------------------------------------------------------------------
# --queue-length: HTA's queue-length analysis, one small JSON per trace
# --------------------------------------------------------------------------------------

QUEUE_LENGTH_DIR = REPO_ROOT / "tests" / "data" / "hta_reference"
#: HTA's own default for get_time_spent_blocked_on_full_queue (CUDA's launch queue limit).
HTA_MAX_QUEUE = 1024


def queue_length_reference(trace_path: str) -> dict[str, Any]:
    """HTA's queue length of every rank of ``trace_path``, per stream: its summary
    (``get_queue_length_summary``: pandas ``describe`` of the series values), its
    ``get_time_spent_blocked_on_full_queue`` at 1024 and at the stream's own maximum, and
    figures read off its time series (a step function, one row per change): the series'
    span, the time-weighted mean over that span and the time at length 0."""
    from hta.analyzers.trace_counters import TraceCounters
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        os.symlink(os.path.abspath(trace_path), os.path.join(tmp, os.path.basename(trace_path)))
        analyzer = TraceAnalysis(trace_dir=tmp)
        ranks = analyzer.t.get_ranks()
        series = analyzer.get_queue_length_time_series(ranks=ranks)
        summary = TraceCounters.get_queue_length_summary_from_time_series(
            {r: df.copy() for r, df in series.items()})
        out: dict[str, Any] = {"ranks": ranks, "min_ts": int(analyzer.t.min_ts), "per_rank": {}}
        for rank, ql in series.items():
            streams: dict[str, Any] = {}
            for stream, g in ql.groupby("stream"):
                g = g.sort_values("ts", kind="stable")
                ts = g["ts"].to_numpy()
                qv = g["queue_length"].to_numpy()
                dur = ts[1:] - ts[:-1]  # each value holds until the next change
                span = int(ts[-1] - ts[0]) if len(ts) else 0
                desc = summary.loc[(rank, stream)]["queue_length"] if summary is not None else None
                one = {int(rank): ql[ql["stream"] == stream].copy()}
                full = {}
                for limit in sorted({HTA_MAX_QUEUE, int(qv.max())}):
                    b = TraceCounters.get_time_spent_blocked_on_full_queue(analyzer.t, one, limit)
                    full[str(limit)] = (None if b is None or b.empty
                                        else _num(b["duration_at_max_queue_length"].iloc[0]))
                streams[str(int(stream))] = {
                    "pid": _num(g["pid"].iloc[0]),
                    "describe": {k: _num(v) for k, v in desc.items()} if desc is not None else None,
                    "series_rows": len(g),
                    "first_ts": _num(ts[0]), "last_ts": _num(ts[-1]), "span": span,
                    "time_weighted_mean": round(float((qv[:-1] * dur).sum()) / span, 4) if span else None,
                    "time_at_zero": _num(dur[qv[:-1] == 0].sum()),
                    "max": _num(qv.max()),
                    "duration_at_max_queue_length": full,
                }
            out["per_rank"][str(rank)] = {"streams": streams}
    return out


def main_queue_length(paths: list[str], outdir: Path) -> int:
    """Write ``<outdir>/queue_length_<name>.json`` for every trace of ``paths``."""
    import hta

    outdir.mkdir(parents=True, exist_ok=True)
    for p in paths:
        rel = os.path.relpath(os.path.abspath(p), DEFAULT_ROOT)
        name = Path(p).name.split(".json")[0]
        if name.startswith("rank"):  # a generic file name: the folder says which trace it is
            name = Path(p).parent.name
        t0 = time.perf_counter()
        res = queue_length_reference(p)
        doc = {"generated_by": GENERATED_BY + " --queue-length", "hta_version": getattr(hta, "__version__", None),
               "trace": rel, "time_unit": "µs since min_ts (HTA aligns a trace to its first event and keeps µs)",
               **res}
        target = outdir / f"queue_length_{name}.json"
        with open(target, "w") as f:
            json.dump(_clean(doc), f, indent=1, sort_keys=True, allow_nan=False)
            f.write("\n")
        print(f"{time.perf_counter() - t0:7.2f}s  wrote {target}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--queue-length"]:
        # python scripts/hta_reference.py --queue-length TRACE... (with the HTA venv's python)
        return main_queue_length(argv[1:], QUEUE_LENGTH_DIR)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(DEFAULT_ROOT), help="traces root (default: ../shared/data/traces)")
    ap.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT))
    ap.add_argument("--python", default=sys.executable, help="python of the HTA virtualenv (default: this one)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per file (default 300)")
    ap.add_argument(
        "--fallback-python",
        help="python of a second HTA 0.5.0 virtualenv (e.g. with pandas<3): files that fail to load "
        "with --python are re-run with it and its result stored under 'fallback'",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="time HTA's load this many times in all (extra load-only processes); "
        "load.wall_s is the best run (default 3)",
    )
    ap.add_argument("--only", action="append", default=[], help="substring filter on relative paths (repeatable)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        try:
            res = worker_load_only(args.worker) if args.load_only else worker(args.worker)
        except Exception as exc:  # noqa: BLE001
            res = {"status": "worker_error", **_err(exc)}
        with open(args.worker_out, "w") as f:
            json.dump(_clean(res), f)
        return 0

    root = Path(args.root).resolve()
    traces, skipped = discover(root)
    if args.only:
        traces = [t for t in traces if any(s in t for s in args.only)]
    hta_version, environment = _environment(args.python)
    if hta_version != EXPECTED_HTA_VERSION:
        print(f"warning: HTA version {hta_version!r}, expected {EXPECTED_HTA_VERSION}", file=sys.stderr)

    files: dict[str, Any] = {}
    for rel in traces:
        t0 = time.perf_counter()
        res = run_one(args.python, root, rel, args.timeout)
        res.pop("hta_version", None)
        if res.get("status") == "ok" and args.repeats > 1:
            _repeat_timing(res, args.python, root, rel, args.timeout, args.repeats)
        if args.fallback_python and res.get("status") != "ok":
            fb = run_one(args.fallback_python, root, rel, args.timeout)
            fb.pop("hta_version", None)
            if fb.get("status") == "ok" and args.repeats > 1:
                _repeat_timing(fb, args.fallback_python, root, rel, args.timeout, args.repeats)
            res["fallback"] = fb
        files[rel] = res
        print(f"{time.perf_counter() - t0:7.2f}s  {res.get('status'):14s} {rel}", file=sys.stderr, flush=True)

    if args.fallback_python:
        fb_version, fb_env = _environment(args.fallback_python)
        out_fallback = dict(fb_env, hta_version=fb_version)
    else:
        out_fallback = None
    out = {
        "fallback_environment": out_fallback,
        "hta_version": hta_version,
        "generated_by": GENERATED_BY,
        "command": "python scripts/hta_reference.py"
        + (" --fallback-python PYTHON" if args.fallback_python else "")
        + "".join(f" --only {s}" for s in args.only),
        "environment": environment,
        "settings": {
            "consecutive_kernel_delay_us": KERNEL_WAIT_THRESHOLD,
            "include_last_profiler_step": False,
            "kernel_breakdown": {"duration_ratio": 0.8, "num_kernels": 10, "include_memory_kernels": True},
            "launch_stats": {"runtime_cutoff": 50, "launch_delay_cutoff": 100, "include_memory_events": True},
            "parser_backend": "json (HTA 0.5.0 default)",
            "timeout_s": args.timeout,
            "timing_repeats": args.repeats,
        },
        "traces_root": "../shared/data/traces",
        "skipped": skipped,
        "files": files,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(_clean(out), f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    print(f"wrote {args.output}: {len(files)} files, {len(skipped)} skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
