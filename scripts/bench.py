#!/usr/bin/env python3
"""Benchmark traceanalyzer against HolisticTraceAnalysis 0.5.0 and plain orjson.

Every measurement runs in its own subprocess; the parent times it (wall seconds,
from spawn to exit) and takes its CPU seconds and peak RSS from ``os.wait4``'s
resource usage (that child alone, so runs do not contaminate each other). Each case
is repeated and the **median** is reported. A child whose RSS passes
``--max-rss-gb`` is killed and reported as such (the box is shared).

Cases (``FILE`` = the real trace, by default ``hta/df_index_resolver``):

* ``ours analyze``  — ``traceanalyzer analyze FILE -o TMP --format json -q``, the CLI
  itself (run in-process by the worker so that it can also time the phases:
  import, load, analyses+rules, JSON output);
* ``ours load``     — ``traceanalyzer.load.load(FILE)`` alone;
* ``HTA``           — HTA 0.5.0 in ``--hta-python`` (default ``/work/hta-venv``):
  ``TraceAnalysis(trace_dir=DIR)`` on a directory holding only FILE, then
  ``get_temporal_breakdown``, ``get_idle_time_breakdown``,
  ``get_gpu_kernel_breakdown`` and ``get_cuda_kernel_launch_stats`` for every rank
  (the arguments of ``scripts/hta_reference.py``); skipped with a note when absent;
* ``orjson``        — read FILE (gunzip if ``.gz``) and ``orjson.loads`` it: the
  floor for any loader that parses JSON in Python;
* ``msgspec``       — the typed decoding issue 9 suggests trying: read FILE and decode
  it with ``msgspec.json.Decoder`` into Structs of only the fields the model reads
  (unknown keys skipped in C, no dict per event), then take those fields out as one
  Python list per column (what any columnar build from such objects must do first).
  Runs in ``--msgspec-python`` (default: ours) when msgspec imports there; skipped
  with a note otherwise (``pip install msgspec``; not a dependency of the tool).

and a scaling series on ``bench_data/<stem>_x{1,4,16,40}.json`` (and ``.json.gz``),
which ``scripts/make_big_trace.py`` builds when missing (40x ≈ 2 GB), and the default run:

* ``ours default formats`` — ``traceanalyzer analyze FILE -o TMP -q`` (json, md, html and
  png: every chart drawn), beside ``ours json only`` (the ``ours analyze`` case), on FILE
  (1x) and ``bench_data/<stem>_x16.json.gz`` (``--report-sizes``); writing the reports is
  everything the command does after the analyses (charts, matplotlib's import, every
  format's files), the worker's in-process time less load and analyses.

Issue 23's targets, on ``bench_data/<stem>_xN.json`` (make_big_trace.py; 1x is the source's
steps once), each case its own process, interleaved, median of ``--repeats``:

* ``targets``       — per size of ``--target-sizes`` (default 1 4 16): the default ``analyze``
  (every default format), ``analyze --format json`` and HTA (above); at ``--floor-sizes``
  (default 16) also ``pl.read_ndjson`` of the ``.ndjson`` twin (the same events, one per line;
  make_big_trace.py ``--ndjson``), polars' own reader with its defaults: the decoder floor.
  HTA is not run above a size where it was killed (``--max-rss-gb``, ``--timeout``); the rows
  say so;
* ``stages``        — one default run taken apart in one process (model cache off): import,
  decode, model build, analyses, rules, each output format, and the model cache's key,
  write and read on that model;
* ``model cache``   — ``analyze --format json`` with the cache off, the first run with it on
  (writes the entry), a second run of the unchanged file with other thresholds (a hit), at
  ``--cache-sizes`` (default 1x and 16x).
  Every other case runs with the model cache off.

The targets (issue 23), marked pass/MISS in one table:

* default ``analyze`` wall ÷ HTA wall ≤ 0.5 at 1x, ≤ 0.25 at 4x and 16x;
* ``analyze --format json`` wall ÷ HTA wall ≤ 0.33 at 1x, ≤ 0.2 at 4x;
* ``--format json`` peak RSS ÷ HTA's ≤ 0.5 at 1x, ≤ 0.33 at 4x (the default run's: info);
* decoder floor at 16x: MB/s of ``--format json`` ÷ MB/s of ``pl.read_ndjson`` ≥ 0.5, where
  MB/s = the ``.json``'s MB ÷ process wall on both sides (so the ratio is floor wall ÷ ours);
* at the largest size of the scaling series (40x, 2 GB): peak RSS ≤ 1.5 × the JSON size, and
  s/GB no more than 1.25 × the s/GB at 4x (linear growth);
* model cache: the second run ÷ the first ≤ 0.4 at 1x, ≤ 0.25 at 16x.

Issue 9's former targets (HTA wall ÷ ours ≥ 5, RSS ≤ 1/3 of HTA's, load ≤ 2 × orjson,
analyses ≤ 25 % of load) stay as (info) rows of the same-file comparison; issue 22's share of
writing the reports (≤ 25 % of the default run, at 1x and 16x) keeps its pass/MISS.

Usage::

    python scripts/bench.py                 # everything (≈ 25-30 min on an idle 2-core box)
    python scripts/bench.py --quick         # comparison on the .json.gz + 1x/4x
    python scripts/bench.py --repeats 5 --json bench.json
    python scripts/bench.py --sizes 1 4 --no-hta
    python scripts/bench.py --only-issue23 --cache-sizes 1 16
    python scripts/bench.py --only-issue23 --target-sizes 1 4 --floor-sizes 16 --no-stages --cache-sizes
    python scripts/bench.py --reports-only --report-sizes 1     # the default run's report share

Only the standard library is imported here: the same file is the worker for the
HTA virtualenv, our venv and the orjson case.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data" / "traces" / "hta" / "df_index_resolver" / \
    "df_index_resolver.json.gz"
BENCH_DATA = REPO_ROOT / "bench_data"
DEFAULT_HTA_PYTHON = Path("/work/hta-venv/bin/python")

# Issue 23's targets (per size, ×N copies of the source's steps): ours ÷ HTA 0.5.0, process wall
# or peak RSS, and the decoder floor (ours' MB/s ÷ polars' own NDJSON read's MB/s).
TARGET_DEFAULT_VS_HTA = {1: 0.5, 4: 0.25, 16: 0.25}
TARGET_JSON_VS_HTA = {1: 0.33, 4: 0.2}
TARGET_RSS_VS_HTA = {1: 0.5, 4: 0.33}
TARGET_FLOOR = {16: 0.5}
TARGET_RSS_PER_SIZE = 1.5  # at the largest size of the scaling series (40x, 2 GB)
TARGET_LINEARITY = 1.25
# Issue 22: writing the reports ≤ 25 % of the default run.
TARGET_REPORTS_FRACTION = 0.25
# Issue 9's targets, now shown for information only (issue 23 replaced them).
ISSUE9_HTA_SPEEDUP = 5.0
ISSUE9_HTA_RSS_RATIO = 1 / 3
ISSUE9_ORJSON_RATIO = 2.0
ISSUE9_ANALYSES_FRACTION = 0.25


# --------------------------------------------------------------------------------------
# workers (run in a child process; only stdlib at module level)
# --------------------------------------------------------------------------------------


def _worker_ours_analyze(path: str) -> dict[str, Any]:
    return _analyze_cli(path, ["--format", "json"])


def _worker_ours_default(path: str) -> dict[str, Any]:
    """``traceanalyzer analyze FILE -o TMP -q``: every default format (json, md, html; png is opt-in)."""
    return _analyze_cli(path, [])


def _analyze_cli(path: str, format_args: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import traceanalyzer.commands.analyze as cmd
    from traceanalyzer.cli import main

    t_import = time.perf_counter()
    phases: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    # The command imported these names; wrapping them times the phases of the real CLI.
    names = vars(cmd)
    for name, phase in (("load", "load_s"), ("build_report", "analyses_s"), ("write_outputs", "write_s")):
        names[name] = timed(phase, names[name])
    out = tempfile.mkdtemp(prefix="ta_bench_")
    try:
        t1 = time.perf_counter()
        try:
            main(["analyze", path, "-o", out, *format_args, "-q"])
        except SystemExit as exc:  # the CLI always exits; only a non-zero code is a failure
            if exc.code not in (0, None):
                raise
        work = time.perf_counter() - t1
        summary = Path(out) / "summary.json"
        out_bytes = summary.stat().st_size if summary.exists() else 0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    # Writing the reports: everything the command does after the analyses (charts drawn while
    # other formats are written, matplotlib's import, every format's files).
    phases["reports_s"] = work - phases.get("load_s", 0.0) - phases.get("analyses_s", 0.0)
    return {"import_s": t_import - t0, "work_s": work, **phases, "output_bytes": out_bytes}


def _worker_ours_load(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    from traceanalyzer.load import load

    t_import = time.perf_counter()
    model = load(path)
    t1 = time.perf_counter()
    rows = sum(getattr(model, name).height for name in ("cpu_ops", "runtime", "kernels") if hasattr(model, name))
    return {"import_s": t_import - t0, "work_s": t1 - t_import, "load_s": t1 - t_import, "rows_ops_rt_k": rows}


def _worker_orjson(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    import orjson

    t_import = time.perf_counter()
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    t_read = time.perf_counter()
    doc = orjson.loads(raw)
    t1 = time.perf_counter()
    n = len(doc["traceEvents"]) if isinstance(doc, dict) else len(doc)
    return {"import_s": t_import - t0, "read_s": t_read - t_import, "loads_s": t1 - t_read,
            "work_s": t1 - t_import, "load_s": t1 - t_import, "events": n}


def _worker_msgspec(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()

    import msgspec

    from traceanalyzer.load.chrome_trace.ndjson import _DIMS_ARGS, _INT_ARGS, _STR_ARGS

    # The fields the chunked loader reads, typed as leniently as the traces write them
    # (ids as numbers or strings, dims as lists), so that one decode covers the file.
    def field(name: str, tp: Any) -> tuple[str, Any, Any]:
        return ("f_" + "".join(c if c.isalnum() else "_" for c in name), tp | None,
                msgspec.field(default=None, name=name))

    args_fields = ([field(k, int | str) for k in _INT_ARGS] + [field(k, str) for k in _STR_ARGS]
                   + [field(k, list) for k in _DIMS_ARGS] + [field("Input type", list)])
    args_t = msgspec.defstruct("Args", args_fields)
    event_t = msgspec.defstruct("Event", [
        field("ph", str), field("cat", str), field("name", str), field("ts", int | float),
        field("dur", int | float), field("pid", int | str), field("tid", int | str),
        field("id", int | str), field("args", args_t)])
    doc_t = msgspec.defstruct("Doc", [("traceEvents", list[event_t])])  # type: ignore[valid-type]
    decoder = msgspec.json.Decoder(doc_t)
    t_import = time.perf_counter()
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    t_read = time.perf_counter()
    events = decoder.decode(raw).traceEvents
    del raw
    t_decoded = time.perf_counter()
    columns = {f: [getattr(e, f) for e in events] for f in event_t.__struct_fields__ if f != "f_args"}
    args = [e.f_args for e in events]
    columns.update({f: [getattr(a, f) if a is not None else None for a in args] for f in args_t.__struct_fields__})
    t1 = time.perf_counter()
    return {"import_s": t_import - t0, "read_s": t_read - t_import, "decode_s": t_decoded - t_read,
            "columns_s": t1 - t_decoded, "work_s": t1 - t_import, "load_s": t1 - t_import,
            "events": len(events), "columns": len(columns)}


def _worker_hta(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    import logging

    logging.disable(logging.WARNING)  # HTA logs every step at INFO/WARNING
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-not-found]  # HTA's own venv, not ours

    t_import = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hta_bench_") as tmp:
        os.symlink(os.path.abspath(path), os.path.join(tmp, os.path.basename(path)))
        t1 = time.perf_counter()
        analyzer = TraceAnalysis(trace_dir=tmp)
        t2 = time.perf_counter()
        ranks = sorted(analyzer.t.traces.keys())
        # ranks= explicitly: the idle and launch analyses default to [0] and fail on a
        # rank-1 file such as df_index_resolver (see docs/hta_reference.md).
        analyzer.get_temporal_breakdown(visualize=False)
        analyzer.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True,
                                         consecutive_kernel_delay=30)
        analyzer.get_gpu_kernel_breakdown(visualize=False, duration_ratio=0.8, num_kernels=10,
                                          include_memory_kernels=True)
        launches = analyzer.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)
        t3 = time.perf_counter()
    return {"import_s": t_import - t0, "load_s": t2 - t1, "analyses_s": t3 - t2, "work_s": t3 - t1,
            "ranks": ranks, "joined_launches": int(sum(len(v) for v in launches.values()))}


def _worker_ndjson_floor(path: str) -> dict[str, Any]:
    """The decoder floor: polars' own NDJSON reader, ``pl.read_ndjson(FILE)`` with its defaults,
    on the ``.ndjson`` twin of a trace (the same events, one per line: make_big_trace.py
    ``--ndjson``). Its process wall is compared with ``analyze --format json`` of the ``.json``."""
    t0 = time.perf_counter()
    import polars as pl

    t_import = time.perf_counter()
    df = pl.read_ndjson(path)
    t1 = time.perf_counter()
    return {"import_s": t_import - t0, "work_s": t1 - t_import, "load_s": t1 - t_import, "events": df.height,
            "columns": df.width}


# Per-stage and model-cache rows (issue 23): workers of their own, tables further down.
#: ``--set`` of the second run of the cache rows: other thresholds, the same input.
OTHER_THRESHOLDS = ("idle_gaps.long_gap_us=250", "rules.min_cost_pct=0.5")


def _worker_ours_analyze_other(path: str) -> dict[str, Any]:
    """``ours-analyze`` with other thresholds (:data:`OTHER_THRESHOLDS`): the re-run the model
    cache serves. The same phase times as ``_worker_ours_analyze``."""
    return _analyze_cli(path, ["--format", "json", *(arg for item in OTHER_THRESHOLDS for arg in ("--set", item))])


def _worker_ours_stages(path: str) -> dict[str, Any]:
    """One default run taken apart, in one process, model cache off: import, decode (bytes →
    raw tables), model build (raw tables → TraceModel: ``assembly._assemble``), analyses, rules
    (and the Report), each output format written alone; then the model cache's own costs on
    this model: key (content hash), write, read."""
    os.environ["TRACEANALYZER_NO_CACHE"] = "1"
    t0 = time.perf_counter()
    import traceanalyzer.cli  # noqa: F401  (what the CLI imports before it reads a byte)

    t_import = time.perf_counter()
    import traceanalyzer.load.chrome_trace as chrome_trace
    from traceanalyzer import pipeline
    from traceanalyzer.analyses import run_analyses
    from traceanalyzer.config import Config
    from traceanalyzer.load.chrome_trace import framing
    from traceanalyzer.report import registry as renderers
    from traceanalyzer.store.cache import ModelCache, key_of, key_parts

    build = {"s": 0.0}
    assemble = vars(framing)["_assemble"]

    def timed_assemble(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return assemble(*a, **kw)
        finally:
            build["s"] += time.perf_counter() - t

    # Both callers of the model build (the chunked and the simple path) imported it by name.
    vars(framing)["_assemble"] = vars(chrome_trace)["_assemble"] = timed_assemble
    t1 = time.perf_counter()
    model = pipeline.load(path, use_cache=False)
    t2 = time.perf_counter()
    config = Config()
    results = run_analyses(model, config)
    t3 = time.perf_counter()
    report = pipeline.report_from_results(model, results, config, source=path)
    t4 = time.perf_counter()
    out = Path(tempfile.mkdtemp(prefix="ta_bench_"))
    formats: dict[str, float] = {}
    try:
        for fmt in renderers():
            t = time.perf_counter()
            pipeline.write_outputs(report, out / "report", [fmt])
            formats[fmt] = time.perf_counter() - t
        cache = ModelCache(out / "cache", max_bytes=1 << 50)
        t = time.perf_counter()
        parts = key_parts(Path(path), model.kind)
        key = key_of(parts)
        t_key = time.perf_counter()
        cache.put(key, parts, model)
        t_put = time.perf_counter()
        again = cache.get(key, path)
        t_get = time.perf_counter()
        cache_bytes = sum(e.bytes for e in cache.entries())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"import_s": t_import - t0, "load_s": t2 - t1, "decode_s": t2 - t1 - build["s"], "build_s": build["s"],
            "analyses_s": t3 - t2, "rules_s": t4 - t3, "format_s": formats, "cache_key_s": t_key - t,
            "cache_write_s": t_put - t_key, "cache_read_s": t_get - t_put, "cache_bytes": cache_bytes,
            "cache_hit": again is not None, "work_s": t_get - t1}


#: Workers that run the console command (``cli.main``) and end as it does.
_CLI_MODES = frozenset({"ours-analyze", "ours-default", "ours-analyze-other"})

WORKERS = {
    "ours-analyze": _worker_ours_analyze,
    "ours-default": _worker_ours_default,
    "ours-load": _worker_ours_load,
    "orjson": _worker_orjson,
    "msgspec": _worker_msgspec,
    "hta": _worker_hta,
    "ours-analyze-other": _worker_ours_analyze_other,
    "ours-stages": _worker_ours_stages,
    "ndjson-floor": _worker_ndjson_floor,
}


# --------------------------------------------------------------------------------------
# parent: spawn, measure, repeat
# --------------------------------------------------------------------------------------


def _rss_now_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_once(python: str, mode: str, path: Path, max_rss_kb: int, timeout_s: float) -> dict[str, Any]:
    """Run one worker; returns wall/cpu/peak RSS and the worker's own phase times."""
    fd, out_path = tempfile.mkstemp(suffix=".json", prefix="bench_")
    os.close(fd)
    cmd = [python, str(Path(__file__).resolve()), "--worker", mode, str(path), "--worker-out", out_path]
    env = dict(os.environ, PYTHONHASHSEED="0")
    loadavg = os.getloadavg()[0]
    t0 = time.perf_counter()
    # stderr to a file, not a pipe: nobody reads a pipe while we poll, and a chatty
    # child (HTA logs) would block on a full one.
    err_file = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, env=env)
    killed = None
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if _rss_now_kb(proc.pid) > max_rss_kb:
            killed = f"killed: RSS > {max_rss_kb / 2**20:.1f} GB"
            os.kill(proc.pid, signal.SIGKILL)
        elif time.perf_counter() - t0 > timeout_s:
            killed = f"killed: over {timeout_s:.0f} s"
            os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err_file.seek(0)
    stderr = err_file.read().decode(errors="replace")
    err_file.close()
    res: dict[str, Any] = {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "peak_rss_mb": ru.ru_maxrss / 1024.0,  # Linux: KiB
        "loadavg_1m": loadavg,
    }
    try:
        with open(out_path) as f:
            res.update(json.load(f))
        res["ok"] = True
    except (OSError, ValueError):
        res["ok"] = False
        res["error"] = killed or f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:] or ''}"
    finally:
        os.unlink(out_path)
    return res


def measure(label: str, python: str, mode: str, path: Path, repeats: int, args: argparse.Namespace,
            size_bytes: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        r = run_once(python, mode, path, int(args.max_rss_gb * 2**20), args.timeout)
        runs.append(r)
        if not r["ok"]:
            break
    return _aggregate(label, mode, path, runs, size_bytes)


def measure_interleaved(cases: list[tuple[str, str, str, Path]], repeats: int, args: argparse.Namespace,
                        size_bytes: int) -> dict[str, dict[str, Any]]:
    """``cases`` (label, python, mode, file), ``repeats`` rounds of one run each, in turn (so a
    change of load on the shared box falls on every case alike); label → aggregated case. A case
    that fails (killed above --max-rss-gb or --timeout) is not run again."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in cases}
    for _ in range(repeats):
        for label, python, mode, path in cases:
            if runs[label] and not runs[label][-1]["ok"]:
                continue
            runs[label].append(run_once(python, mode, path, int(args.max_rss_gb * 2**20), args.timeout))
    return {label: _aggregate(label, mode, path, runs[label], size_bytes) for label, _py, mode, path in cases}


def _aggregate(label: str, mode: str, path: Path, runs: list[dict[str, Any]], size_bytes: int) -> dict[str, Any]:
    ok = [r for r in runs if r["ok"]]
    case: dict[str, Any] = {"case": label, "mode": mode, "file": str(path), "file_bytes": path.stat().st_size,
                            "json_bytes": size_bytes, "repeats": len(runs), "runs": runs}
    if not ok:
        case["error"] = runs[-1].get("error", "failed")
    else:
        for key in ("wall_s", "cpu_s", "peak_rss_mb", "import_s", "load_s", "analyses_s", "write_s", "work_s",
                    "loads_s", "read_s", "decode_s", "columns_s", "reports_s"):
            vals = [r[key] for r in ok if key in r]
            if vals:
                case[key] = statistics.median(vals)
        case["rss_per_size"] = case["peak_rss_mb"] * 2**20 / size_bytes
    shown = (f"{case['wall_s']:7.2f} s wall {case['cpu_s']:7.2f} s cpu {case['peak_rss_mb']:8.0f} MB"
             if "wall_s" in case else case["error"])
    print(f"  {label:<34} {path.name:<36} {shown}", file=sys.stderr, flush=True)
    return case


def uncompressed_size(path: Path) -> int:
    """Bytes of JSON behind ``path``: its size, or for a .gz the sibling .json's, else streamed."""
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    sibling = path.with_name(path.name[:-3])
    if sibling.exists():
        return sibling.stat().st_size
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n


def ensure_unpacked(source: Path) -> Path:
    """The real trace as plain .json under bench_data/ (what a user gets after gunzip)."""
    if not source.name.endswith(".gz"):
        return source
    dest = BENCH_DATA / source.name[:-3]
    if not dest.exists():
        BENCH_DATA.mkdir(exist_ok=True)
        tmp = dest.with_suffix(".part")
        with gzip.open(source, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        tmp.replace(dest)
    return dest


def ensure_big(source: Path, sizes: list[int], gz: bool,
               ndjson_sizes: list[int] | tuple[int, ...] = ()) -> dict[int, tuple[Path, Path | None]]:
    """``bench_data/<stem>_x{N}.json`` (and ``.json.gz`` with ``gz``; the ``.ndjson`` twin, see
    :func:`ndjson_twin`, at ``ndjson_sizes``), built by make_big_trace.py where missing."""
    files = {n: (BENCH_DATA / f"{_stem(source)}_x{n}.json",
                 BENCH_DATA / f"{_stem(source)}_x{n}.json.gz" if gz else None) for n in sizes}
    missing = [n for n, (j, g) in files.items() if not j.exists() or (g is not None and not g.exists())]
    missing_nd = [n for n in ndjson_sizes if not ndjson_twin(source, n).exists()]
    for todo, extra in ((missing, ["--gz"] if gz else []), (missing_nd, ["--ndjson"])):
        if todo:
            cmd = [sys.executable, str(REPO_ROOT / "scripts" / "make_big_trace.py"), "--source", str(source),
                   "--copies", *map(str, todo), *extra]
            print("building " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
    return files


def _stem(source: Path) -> str:
    return source.name.removesuffix(".gz").removesuffix(".json")


def ndjson_twin(source: Path, copies: int) -> Path:
    """``bench_data/<stem>_x{N}.ndjson``: the events of ``<stem>_x{N}.json``, one per line."""
    return BENCH_DATA / f"{_stem(source)}_x{copies}.ndjson"


# --------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("pass" if ok else "**MISS**")


def comparison_table(cases: list[dict[str, Any]]) -> str:
    head = ("| case | file | size MB (json) | wall s | cpu s | peak RSS MB | RSS/size | import s | load s "
            "| analyses s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for c in cases:
        if "error" in c:
            rows.append(f"| {c['case']} | {Path(c['file']).name} | {c['json_bytes'] / 1e6:.1f} | {c['error']} "
                        "| | | | | | |")
            continue
        analyses = c.get("analyses_s")
        if analyses is not None and "write_s" in c:
            analyses += c["write_s"]
        rows.append(
            f"| {c['case']} | {Path(c['file']).name} | {c['json_bytes'] / 1e6:.1f} | {c['wall_s']:.2f} "
            f"| {c['cpu_s']:.2f} | {c['peak_rss_mb']:.0f} | {c['rss_per_size']:.2f} | {_f(c.get('import_s'))} "
            f"| {_f(c.get('load_s'))} | {_f(analyses)} |")
    return head + "\n" + "\n".join(rows)


def ratio_rows(by: dict[str, dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """Target ratios for one file variant (suffix: 'json' or 'json.gz')."""
    out: list[dict[str, Any]] = []

    def get(name: str) -> dict[str, Any] | None:
        c = by.get(f"{name} ({suffix})")
        return c if c and "error" not in c else None

    ours, ours_load, hta, oj = get("ours analyze"), get("ours load"), get("HTA 0.5.0"), get("orjson.loads")
    ms = get("msgspec typed")
    if ours and hta:
        v = hta["wall_s"] / ours["wall_s"]
        out.append({"ratio": f"HTA wall / ours wall ({suffix})", "value": v,
                    "target": f"(info; issue 9: ≥ {ISSUE9_HTA_SPEEDUP:g})", "ok": None})
        v = hta["cpu_s"] / ours["cpu_s"]
        out.append({"ratio": f"HTA cpu / ours cpu ({suffix})", "value": v, "target": "(info)", "ok": None})
        v = ours["peak_rss_mb"] / hta["peak_rss_mb"]
        out.append({"ratio": f"ours RSS / HTA RSS ({suffix})", "value": v,
                    "target": f"(info; issue 9: ≤ {ISSUE9_HTA_RSS_RATIO:.3f})", "ok": None})
    if ours_load and oj:
        v = ours_load["load_s"] / oj["work_s"]
        out.append({"ratio": f"ours load / orjson read+loads, in-process ({suffix})", "value": v,
                    "target": f"(info; issue 9: ≤ {ISSUE9_ORJSON_RATIO:g})", "ok": None})
        v = ours_load["wall_s"] / oj["wall_s"]
        out.append({"ratio": f"ours load / orjson, process wall ({suffix})", "value": v, "target": "(info)",
                    "ok": None})
        v = ours_load["peak_rss_mb"] / oj["peak_rss_mb"]
        out.append({"ratio": f"ours load RSS / orjson RSS ({suffix})", "value": v, "target": "(info)", "ok": None})
    if ours_load and ms:
        v = ours_load["load_s"] / ms["work_s"]
        out.append({"ratio": f"ours load / msgspec typed decode + columns, in-process ({suffix})", "value": v,
                    "target": "(info)", "ok": None})
        v = ms["decode_s"] / oj["loads_s"] if oj else None
        if v is not None:
            out.append({"ratio": f"msgspec typed decode alone / orjson.loads alone ({suffix})", "value": v,
                        "target": "(info)", "ok": None})
    if ours and "analyses_s" in ours and ours.get("load_s"):
        v = (ours["analyses_s"] + ours.get("write_s", 0.0)) / ours["load_s"]
        out.append({"ratio": f"ours (analyses+rules+json) / load ({suffix})", "value": v,
                    "target": f"(info; issue 9: ≤ {ISSUE9_ANALYSES_FRACTION:g})", "ok": None})
    return out


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """One row per ratio; a ratio that could not be measured shows why (``note``) instead of a value."""
    head = "| ratio | value | target | |\n|---|---:|---|---|"
    return head + "\n" + "\n".join(
        f"| {r['ratio']} | {_f(r['value']) if r['value'] is not None else r.get('note', '—')} | {r['target']} "
        f"| {_mark(r['ok'])} |" for r in rows)


# --------------------------------------------------------------------------------------
# issue 23's targets: ours vs HTA 0.5.0 and vs polars' own NDJSON read, per size
# --------------------------------------------------------------------------------------


def _target(table: dict[int, float], n: int, op: str = "≤") -> str:
    return f"{op} {table[n]:g}" if n in table else "(info)"


def target_measurements(args: argparse.Namespace, hta_python: Path | None) -> list[dict[str, Any]]:
    """Issue 23's cases, per size N of ``--target-sizes`` (and ``--floor-sizes``), on
    ``bench_data/<stem>_xN.json``, interleaved (each its own process, ``--repeats`` rounds; 16x and
    above ``--repeats-big``): the default ``analyze`` (every default format), ``analyze --format
    json``, HTA 0.5.0 (load + 4 analyses) and, at the floor sizes, ``pl.read_ndjson`` of the
    ``.ndjson`` twin. HTA is not run above a size where it was killed (RSS or time limit)."""
    sizes = args.target_sizes if args.target_sizes is not None else ([1, 4] if args.quick else [1, 4, 16])
    floor_sizes = args.floor_sizes if args.floor_sizes is not None else ([] if args.quick else [16])
    run_sizes = sorted(set(sizes) | set(floor_sizes))
    if not run_sizes:
        return []
    files = ensure_big(args.source, run_sizes, gz=False, ndjson_sizes=floor_sizes)
    print(f"issue 23 targets, sizes {run_sizes} (floor at {floor_sizes})", file=sys.stderr)
    hta_skip = None if hta_python is not None else "HTA not installed (--hta-python)"
    out = []
    for n in run_sizes:
        path = files[n][0]
        size = path.stat().st_size
        cases: list[tuple[str, str, str, Path]] = []
        if n in sizes:
            cases.append(("default", args.python, "ours-default", path))
        cases.append(("json", args.python, "ours-analyze", path))
        if n in floor_sizes:
            cases.append(("floor", args.python, "ndjson-floor", ndjson_twin(args.source, n)))
        if n in sizes and hta_python is not None and hta_skip is None:
            cases.append(("hta", str(hta_python), "hta", path))
        labels = {"default": "ours analyze (default formats)", "json": "ours analyze --format json",
                  "floor": "polars read_ndjson (floor)", "hta": "HTA 0.5.0 (load + 4 analyses)"}
        got = measure_interleaved([(f"{labels[k]} {n}x", py, mode, p) for k, py, mode, p in cases],
                                  args.repeats if n < 16 else args.repeats_big, args, size)
        entry: dict[str, Any] = {"copies": n, "file": str(path), "json_bytes": size,
                                 "cases": {k: got[f"{labels[k]} {n}x"] for k, *_ in cases}}
        for c in entry["cases"].values():
            c["case"] = c["case"].removesuffix(f" {n}x")
        if n in sizes:
            hta = entry["cases"].get("hta")
            if hta is None:
                entry["hta_note"] = hta_skip
            elif "error" in hta:
                entry["hta_note"] = f"HTA {hta['error']}"
                hta_skip = f"HTA not run: {hta['error']} at {n}x"
        out.append(entry)
    return out


def target_ratios(entries: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The issue's rows from :func:`target_measurements`, each with its target and pass/MISS."""
    rows: list[dict[str, Any]] = []
    sizes = args.target_sizes if args.target_sizes is not None else ([1, 4] if args.quick else [1, 4, 16])

    def ok(c: dict[str, Any] | None) -> bool:
        return c is not None and "error" not in c

    def add(name: str, n: int, num: dict[str, Any] | None, den: dict[str, Any] | None, key: str,
            table: dict[int, float], note: str | None) -> None:
        target = _target(table, n)
        if ok(num) and ok(den):
            assert num is not None and den is not None
            v = num[key] / den[key]
            rows.append({"ratio": f"{name} ({n}x)", "value": v, "target": target,
                         "ok": v <= table[n] if n in table else None})
        else:
            errors = [f"{who} {c['error']}" for who, c in (("ours", num), ("HTA", den))
                      if c is not None and "error" in c]
            why = "; ".join(errors) if errors else (note or "not run")
            rows.append({"ratio": f"{name} ({n}x)", "value": None, "note": why, "target": target, "ok": None})

    for e in entries:
        n, c = e["copies"], e["cases"]
        d, j, h, fl = c.get("default"), c.get("json"), c.get("hta"), c.get("floor")
        if n in sizes:
            note = e.get("hta_note") if not ok(h) else None
            add("default `analyze` wall ÷ HTA wall", n, d, h, "wall_s", TARGET_DEFAULT_VS_HTA, note)
            add("`analyze --format json` wall ÷ HTA wall", n, j, h, "wall_s", TARGET_JSON_VS_HTA, note)
            add("`--format json` peak RSS ÷ HTA's", n, j, h, "peak_rss_mb", TARGET_RSS_VS_HTA, note)
            add("default `analyze` peak RSS ÷ HTA's", n, d, h, "peak_rss_mb", {}, note)
            # CPU seconds: steadier than wall on a loaded box (information only).
            add("default `analyze` CPU s ÷ HTA's", n, d, h, "cpu_s", {}, note)
            add("`analyze --format json` CPU s ÷ HTA's", n, j, h, "cpu_s", {}, note)
        if fl is not None:
            target = _target(TARGET_FLOOR, n, "≥")
            name = f"`--format json` MB/s ÷ `pl.read_ndjson` MB/s, decoder floor ({n}x)"
            if ok(fl) and ok(j):
                assert fl is not None and j is not None
                v = fl["wall_s"] / j["wall_s"]  # (MB / ours wall) ÷ (MB / floor wall), the same MB
                rows.append({"ratio": name, "value": v, "target": target,
                             "ok": v >= TARGET_FLOOR[n] if n in TARGET_FLOOR else None})
            else:
                why = next((x["error"] for x in (j, fl) if x is not None and "error" in x), "not run")
                rows.append({"ratio": name, "value": None, "note": why, "target": target, "ok": None})
    return rows


def target_table(entries: list[dict[str, Any]]) -> str:
    """Every case behind the target rows: wall, CPU, peak RSS, MB/s of the trace's JSON."""
    head = ("| size | file | JSON MB | case | wall s | cpu s | peak RSS MB | MB/s (JSON MB ÷ wall) | load s "
            "| analyses s | reports s |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    body = []
    for e in entries:
        mb = e["json_bytes"] / 1e6
        for c in e["cases"].values():
            name = Path(c["file"]).name
            if "error" in c:
                body.append(f"| {e['copies']}x | {name} | {mb:.0f} | {c['case']} | {c['error']} | | | | | | |")
                continue
            body.append(f"| {e['copies']}x | {name} | {mb:.0f} | {c['case']} | {c['wall_s']:.2f} | {c['cpu_s']:.2f} "
                        f"| {c['peak_rss_mb']:.0f} | {mb / c['wall_s']:.1f} | {_f(c.get('load_s'))} "
                        f"| {_f(c.get('analyses_s'))} | {_f(c.get('reports_s'))} |")
        if e.get("hta_note") and "hta" not in e["cases"]:
            body.append(f"| {e['copies']}x | | {mb:.0f} | HTA 0.5.0 | {e['hta_note']} | | | | | | |")
    return head + "\n" + "\n".join(body)


def cache_ratio_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The model-cache rows (second ÷ first) in the issue's target table."""
    rows = []
    for r in data.get("cache", []):
        n = r["copies"]
        target = TARGET_CACHE_RATIO.get(n)
        name = f"second `analyze --format json`, other thresholds, ÷ the first (model cache, {n}x)"
        rows.append({"ratio": name, "value": r.get("ratio"), "note": r.get("error", "—"),
                     "target": f"≤ {target:g}" if target else "(info)", "ok": r.get("ok")})
    return rows


def scaling_table(series: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    head = ("| trace | file | size GB (json) | wall s | cpu s | s/GB | s/GB ÷ 4x | load s | analyses s "
            "| peak RSS MB | RSS/size | |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rows, checks = [], []
    for suffix in ("json", "json.gz"):
        sub = [c for c in series if c["file"].endswith("." + suffix)]
        if not sub:
            continue
        ok_sub = [c for c in sub if "error" not in c]
        ref = next((c for c in ok_sub if c["copies"] == 4), ok_sub[0] if ok_sub else None)
        ref_spg = ref["wall_s"] / (ref["json_bytes"] / 1e9) if ref else None
        largest = max(ok_sub, key=lambda c: c["copies"]) if ok_sub else None
        for c in sub:
            gb = c["json_bytes"] / 1e9
            if "error" in c:
                rows.append(f"| {c['copies']}x | {Path(c['file']).name} | {gb:.2f} | {c['error']} "
                            "| | | | | | | | |")
                continue
            spg = c["wall_s"] / gb
            lin = spg / ref_spg if ref_spg else None
            mark = ""
            if c is largest:
                rss_ok = c["rss_per_size"] <= TARGET_RSS_PER_SIZE
                lin_ok = lin is not None and lin <= TARGET_LINEARITY
                mark = f"RSS {_mark(rss_ok)}, linear {_mark(lin_ok)}"
                checks.append({"ratio": f"peak RSS / size at {c['copies']}x ({suffix})",
                               "value": c["rss_per_size"], "target": f"≤ {TARGET_RSS_PER_SIZE:g}", "ok": rss_ok})
                ref_copies = ref["copies"] if ref else "?"
                checks.append({"ratio": f"s/GB at {c['copies']}x ÷ s/GB at {ref_copies}x ({suffix})",
                               "value": lin, "target": f"≤ {TARGET_LINEARITY:g}", "ok": lin_ok})
            analyses = (c.get("analyses_s") or 0.0) + (c.get("write_s") or 0.0)
            rows.append(
                f"| {c['copies']}x | {Path(c['file']).name} | {gb:.2f} | {c['wall_s']:.1f} | {c['cpu_s']:.1f} "
                f"| {spg:.1f} | {_f(lin)} | {_f(c.get('load_s'), '{:.1f}')} | {analyses:.1f} "
                f"| {c['peak_rss_mb']:.0f} | {c['rss_per_size']:.2f} | {mark} |")
    return head + "\n" + "\n".join(rows), checks


def reports_table(pairs: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> tuple[str, list[dict[str, Any]]]:
    """The default run (every default format) beside the json-only run, per size: how much of the
    default run's wall time writing the reports takes (charts + every format's files)."""
    head = ("| trace | file | default run wall s | json-only wall s | load s | analyses s | reports s "
            "| reports ÷ default run | target | |\n|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    rows, checks = [], []
    for n, d, j in pairs:
        name = Path(d["file"]).name
        if "error" in d:
            rows.append(f"| {n}x | {name} | {d['error']} | | | | | | | |")
            continue
        share = d["reports_s"] / d["wall_s"] if d.get("reports_s") is not None else None
        ok = share is not None and share <= TARGET_REPORTS_FRACTION
        rows.append(
            f"| {n}x | {name} | {d['wall_s']:.2f} | {_f(j.get('wall_s'))} | {_f(d.get('load_s'))} "
            f"| {_f(d.get('analyses_s'))} | {_f(d.get('reports_s'))} "
            f"| {_f(share, '{:.0%}')} | ≤ {TARGET_REPORTS_FRACTION:.0%} | {_mark(ok if share is not None else None)} |")
        if share is not None:
            checks.append({"ratio": f"reports ÷ default run ({n}x, {name})", "value": share,
                           "target": f"≤ {TARGET_REPORTS_FRACTION:g}", "ok": ok})
    return head + "\n" + "\n".join(rows), checks


def environment(hta_python: Path | None) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                           "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()}
    try:
        with open("/proc/meminfo") as f:
            env["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            env["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    code = ("import importlib.metadata as m\n"
            "for p in {pkgs!r}:\n"
            "    try: print(p, m.version(p))\n"
            "    except Exception: pass\n")
    ours = subprocess.run([sys.executable, "-c", code.format(pkgs=("traceanalyzer", "polars", "orjson", "numpy"))],
                          capture_output=True, text=True).stdout.split()
    env["ours"] = dict(zip(ours[::2], ours[1::2]))
    if hta_python:
        hta = subprocess.run([str(hta_python), "-c", code.format(pkgs=("holistictraceanalysis", "pandas", "numpy"))],
                             capture_output=True, text=True).stdout.split()
        env["hta"] = dict(zip(hta[::2], hta[1::2]))
    try:
        env["git_commit"] = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
        # What was measured is the working tree: name the package files that differ from HEAD.
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "traceanalyzer"],
                               capture_output=True, text=True).stdout.split("\n")
        env["uncommitted"] = [ln[3:] for ln in dirty if ln.strip()]
    except OSError:
        pass
    return env


# --------------------------------------------------------------------------------------
# per-stage and model-cache sections (issue 23)
# --------------------------------------------------------------------------------------

TARGET_CACHE_RATIO = {1: 0.4, 16: 0.25}


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def stage_rows(path: Path, repeats: int, args: argparse.Namespace) -> dict[str, Any]:
    """Medians of ``repeats`` ``ours-stages`` runs of ``path`` (each its own process)."""
    runs = [run_once(args.python, "ours-stages", path, int(args.max_rss_gb * 2**20), args.timeout)
            for _ in range(repeats)]
    ok = [r for r in runs if r["ok"]]
    out: dict[str, Any] = {"file": str(path), "json_bytes": uncompressed_size(path), "runs": runs}
    if not ok:
        out["error"] = runs[-1].get("error", "failed")
        return out
    for key in ("wall_s", "import_s", "load_s", "decode_s", "build_s", "analyses_s", "rules_s", "cache_key_s",
                "cache_write_s", "cache_read_s", "cache_bytes", "peak_rss_mb"):
        out[key] = _median([r[key] for r in ok if key in r])
    out["format_s"] = {f: _median([r["format_s"][f] for r in ok if f in r.get("format_s", {})])
                       for f in ok[0].get("format_s", {})}
    print(f"  {'stages':<34} {path.name:<36} {out['wall_s']:7.2f} s wall", file=sys.stderr, flush=True)
    return out


def stage_table(st: dict[str, Any]) -> str:
    """Stage → seconds and share of the stages' sum."""
    if "error" in st:
        return f"stages failed: {st['error']}"
    rows = [("import (`traceanalyzer.cli`)", st["import_s"]), ("decode (bytes → raw tables)", st["decode_s"]),
            ("model build (raw tables → TraceModel)", st["build_s"]), ("analyses", st["analyses_s"]),
            ("rules + Report", st["rules_s"])]
    rows += [(f"format `{f}`", v) for f, v in st["format_s"].items() if v is not None]
    total = sum(v for _, v in rows if v is not None)
    cache = [("model cache: key (SHA-256 of the file)", st["cache_key_s"]),
             ("model cache: write (Arrow IPC, lz4)", st["cache_write_s"]),
             ("model cache: read back", st["cache_read_s"])]
    head = "| stage | s | % of the stages |\n|---|---:|---:|"
    body = [f"| {name} | {_f(v)} | {_f(100 * v / total if v is not None and total else None, '{:.0f}')} |"
            for name, v in rows]
    body.append(f"| **sum of the stages** | {total:.2f} | 100 |")
    body += [f"| {name} | {_f(v)} | |" for name, v in cache]
    size = st.get("cache_bytes")
    note = (f"\n\n{Path(st['file']).name}, {st['json_bytes'] / 1e6:.0f} MB of JSON; cache entry "
            f"{size / 1e6:.1f} MB on disk. Each format written alone: `html` draws its charts as SVG, `png` "
            "(opt-in) draws every chart with matplotlib." if size else "")
    return head + "\n" + "\n".join(body) + note


@contextmanager
def _model_cache_env(root: str | None) -> Iterator[None]:
    """The children started inside use the model cache in ``root`` (None: cache off)."""
    saved = {k: os.environ.get(k) for k in ("TRACEANALYZER_NO_CACHE", "TRACEANALYZER_CACHE_DIR")}
    if root is None:
        os.environ["TRACEANALYZER_NO_CACHE"] = "1"
    else:
        os.environ.pop("TRACEANALYZER_NO_CACHE", None)
        os.environ["TRACEANALYZER_CACHE_DIR"] = root
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cache_rows(path: Path, copies: int, repeats: int, args: argparse.Namespace) -> dict[str, Any]:
    """The re-run the model cache serves, ``repeats`` times interleaved, each in a fresh cache
    directory: ``analyze --format json`` with the cache off, then the first run with it on (it
    writes the entry), then a second run of the unchanged file with other thresholds (a hit)."""
    limit = int(args.max_rss_gb * 2**20)
    runs: dict[str, list[dict[str, Any]]] = {"first": [], "second": []} if args.cache_skip_off else \
        {"off": [], "first": [], "second": []}
    for _ in range(repeats):
        if "off" in runs:
            with _model_cache_env(None):
                runs["off"].append(run_once(args.python, "ours-analyze", path, limit, args.timeout))
        root = tempfile.mkdtemp(prefix="ta_bench_cache_")
        try:
            with _model_cache_env(root):
                runs["first"].append(run_once(args.python, "ours-analyze", path, limit, args.timeout))
                runs["second"].append(run_once(args.python, "ours-analyze-other", path, limit, args.timeout))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {"copies": copies, "file": str(path), "json_bytes": uncompressed_size(path), "runs": runs}
    for name, rs in runs.items():
        ok = [r for r in rs if r["ok"]]
        if not ok:
            out["error"] = f"{name}: {rs[-1].get('error', 'failed')}"
            return out
        out[name] = {k: _median([r[k] for r in ok if k in r])
                     for k in ("wall_s", "import_s", "load_s", "analyses_s", "write_s", "peak_rss_mb")}
    out["ratio"] = out["second"]["wall_s"] / out["first"]["wall_s"]
    if "off" in out:
        out["write_overhead"] = out["first"]["wall_s"] / out["off"]["wall_s"]
    target = TARGET_CACHE_RATIO.get(copies)
    out["ok"] = None if target is None else out["ratio"] <= target
    print(f"  {'cache ' + str(copies) + 'x':<34} {path.name:<36} second/first {out['ratio']:.2f}", file=sys.stderr,
          flush=True)
    return out


def cache_table(rows: list[dict[str, Any]]) -> str:
    head = ("| size | JSON MB | no cache s | first (writes the entry) s | second (hit, other thresholds) s "
            "| load s (first → second) | second ÷ first | target | |\n"
            "|---|---:|---:|---:|---:|---:|---:|---|---|")
    body = []
    for r in rows:
        if "error" in r:
            body.append(f"| {r['copies']}x | {r['json_bytes'] / 1e6:.0f} | {r['error']} | | | | | | |")
            continue
        target = TARGET_CACHE_RATIO.get(r["copies"])
        body.append(f"| {r['copies']}x | {r['json_bytes'] / 1e6:.0f} | {_f(r.get('off', {}).get('wall_s'))} "
                    f"| {r['first']['wall_s']:.2f} | {r['second']['wall_s']:.2f} "
                    f"| {_f(r['first']['load_s'])} → {_f(r['second']['load_s'])} | {r['ratio']:.2f} "
                    f"| {'≤ ' + format(target, 'g') if target else '(info)'} | {_mark(r['ok'])} |")
    return head + "\n" + "\n".join(body)


def _bytecode_like_an_install(python: str) -> list[str]:
    """Byte-compile the package the measured interpreter imports, as ``pip install`` does at
    install time (HTA, pandas and polars are measured with theirs). An editable checkout
    under ``PYTHONDONTWRITEBYTECODE`` would otherwise compile every module from source in
    every process (0.2-0.5 s of each run's import here). Returns the notes to print."""
    code = ("import compileall, os, sys, traceanalyzer; "
            "d = os.path.dirname(traceanalyzer.__file__); "
            "sys.exit(0 if compileall.compile_dir(d, quiet=1) else 1)")
    rc = subprocess.run([python, "-c", code], capture_output=True).returncode
    return [] if rc == 0 else ["_could not byte-compile traceanalyzer: its imports include compiling it_"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace (default df_index_resolver)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case, median reported (default 3)")
    ap.add_argument("--repeats-big", type=int, default=1, help="runs per case at 16x and above (default 1)")
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="scaling series (default 1 4 16 40)")
    ap.add_argument("--quick", action="store_true", help="comparison on the .json.gz only, sizes 1 4")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA")
    ap.add_argument("--no-gz", action="store_true", help="scaling series on .json only")
    ap.add_argument("--report-sizes", type=int, nargs="*", default=None,
                    help="sizes of the default-format rows (default 1 16; none: skip them)")
    ap.add_argument("--reports-only", action="store_true",
                    help="only the default-format rows (default run vs json-only, report-writing share)")
    ap.add_argument("--hta-python", type=Path, default=DEFAULT_HTA_PYTHON)
    ap.add_argument("--python", default=sys.executable, help="python of our venv (default: this one)")
    ap.add_argument("--msgspec-python", default=None,
                    help="python with traceanalyzer and msgspec for the msgspec case (default: --python)")
    ap.add_argument("--no-msgspec", action="store_true", help="skip the msgspec case")
    ap.add_argument("--max-rss-gb", type=float, default=6.0, help="kill a child above this RSS (default 6)")
    ap.add_argument("--orjson-max-gb", type=float, default=0.25,
                    help="orjson case only on files up to this many GB of JSON (its objects take ~10x)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per run (default 1200)")
    ap.add_argument("--json", type=Path, default=None, help="save every number here")
    ap.add_argument("--no-stages", action="store_true", help="skip the per-stage rows")
    ap.add_argument("--cache-sizes", type=int, nargs="*", default=None,
                    help="sizes of the model-cache rows (default 1 16; --quick: 1; none: skip)")
    ap.add_argument("--cache-skip-off", action="store_true",
                    help="model-cache rows without the cache-off run (its wall is for information only)")
    ap.add_argument("--only-issue23", action="store_true",
                    help="only issue 23's sections: targets, per-stage and model-cache rows (skip the "
                         "same-file comparison, the scaling series and the report-share rows)")
    ap.add_argument("--target-sizes", type=int, nargs="*", default=None,
                    help="sizes of issue 23's rows vs HTA (default 1 4 16; --quick: 1 4; none: skip)")
    ap.add_argument("--floor-sizes", type=int, nargs="*", default=None,
                    help="sizes of the decoder-floor rows, pl.read_ndjson (default 16; --quick: none)")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        mode, path = args.worker
        res = WORKERS[mode](path)
        with open(args.worker_out, "w") as f:
            json.dump(res, f)
        if mode in _CLI_MODES:
            # The console command ends with os._exit once its outputs are written
            # (traceanalyzer.cli._leave); main(argv), which these workers call, raises SystemExit
            # instead, so the worker leaves the same way, and its wall time is what users wait for.
            sys.stderr.flush()
            os._exit(0)
        return 0

    if not args.source.exists():
        print(f"error: {args.source}: no such file", file=sys.stderr)
        return 2
    sizes = args.sizes if args.sizes is not None else ([1, 4] if args.quick else [1, 4, 16, 40])
    hta_python = None if args.no_hta else args.hta_python
    notes: list[str] = []
    if hta_python is not None and not hta_python.exists():
        notes.append(f"HTA skipped: {hta_python} not found (python3 -m venv /work/hta-venv && "
                     "/work/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0)")
        hta_python = None
    msgspec_python = None if args.no_msgspec else (args.msgspec_python or args.python)
    if msgspec_python is not None and subprocess.run([msgspec_python, "-c", "import msgspec, traceanalyzer"],
                                                     capture_output=True).returncode != 0:
        notes.append(f"msgspec skipped: it does not import in {msgspec_python} (pip install msgspec)")
        msgspec_python = None
    env = environment(hta_python)
    notes.extend(_bytecode_like_an_install(args.python))
    t_start = time.perf_counter()
    # The model cache would make repeats 2 and 3 of every case a cache hit: off for every child,
    # except in the cache rows, which give it a private directory (_model_cache_env).
    os.environ["TRACEANALYZER_NO_CACHE"] = "1"
    targets = [] if args.reports_only else target_measurements(args, hta_python)
    if args.only_issue23:
        return issue23_sections(args, env, t_start, targets)

    # 1. the real trace, as shipped (.json.gz) and unpacked (.json)
    variants = [] if args.reports_only else [args.source] if args.quick else [args.source,
                                                                              ensure_unpacked(args.source)]
    comparison: list[dict[str, Any]] = []
    print(f"comparison on {args.source.name} ({args.repeats} runs each)", file=sys.stderr)
    for path in variants:
        suffix = "json.gz" if path.name.endswith(".gz") else "json"
        size = uncompressed_size(path)
        comparison.append(measure(f"ours analyze ({suffix})", args.python, "ours-analyze", path, args.repeats,
                                  args, size))
        comparison.append(measure(f"ours load ({suffix})", args.python, "ours-load", path, args.repeats, args, size))
        comparison.append(measure(f"orjson.loads ({suffix})", args.python, "orjson", path, args.repeats, args, size))
        if msgspec_python is not None:
            comparison.append(measure(f"msgspec typed ({suffix})", msgspec_python, "msgspec", path, args.repeats,
                                      args, size))
        if hta_python is not None:
            comparison.append(measure(f"HTA 0.5.0 ({suffix})", str(hta_python), "hta", path, args.repeats, args,
                                      size))
    by = {c["case"]: c for c in comparison}
    ratios = ratio_rows(by, "json.gz") + ratio_rows(by, "json")

    # 2. scaling
    series: list[dict[str, Any]] = []
    if sizes and not args.reports_only:
        files = ensure_big(args.source, sizes, gz=not args.no_gz)
        print(f"scaling series {sizes}", file=sys.stderr)
        for n in sorted(sizes):
            reps = args.repeats if n < 16 else args.repeats_big
            for path in (p for p in files[n] if p is not None):
                size = uncompressed_size(path)
                c = measure(f"ours analyze {n}x", args.python, "ours-analyze", path, reps, args, size)
                c["copies"] = n
                series.append(c)
                if path.suffix == ".json" and size <= args.orjson_max_gb * 1e9:
                    oj = measure(f"orjson.loads {n}x", args.python, "orjson", path, reps, args, size)
                    ol = measure(f"ours load {n}x", args.python, "ours-load", path, reps, args, size)
                    if "error" not in oj and "error" not in ol:
                        ratios.append({"ratio": f"ours load / orjson read+loads, in-process ({n}x json)",
                                       "value": ol["load_s"] / oj["work_s"],
                                       "target": f"(info; issue 9: ≤ {ISSUE9_ORJSON_RATIO:g})", "ok": None})
                    c["orjson"], c["ours_load"] = oj, ol
    scaling_md, scaling_checks = scaling_table(series) if series else ("", [])  # issue 23's 40x rows

    # 3. the default run (every default format) vs json only: the share of writing the reports
    report_sizes = args.report_sizes if args.report_sizes is not None else ([1] if args.quick else [1, 16])
    pairs: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    if report_sizes:
        print(f"default formats vs json only, sizes {report_sizes}", file=sys.stderr)
        big = [n for n in report_sizes if n != 1]
        files = ensure_big(args.source, big, gz=True) if big else {}
        for n in sorted(report_sizes):
            path = args.source if n == 1 else (files[n][1] or files[n][0])
            size = uncompressed_size(path)
            reps = args.repeats if n < 16 else args.repeats_big
            d = measure(f"ours default formats {n}x", args.python, "ours-default", path, reps, args, size)
            j = measure(f"ours json only {n}x", args.python, "ours-analyze", path, reps, args, size)
            pairs.append((n, d, j))
    reports_md, reports_checks = reports_table(pairs) if pairs else ("", [])
    ratios += reports_checks

    report_cases = [c for _n, d, j in pairs for c in (d, j)]
    target_cases = [c for e in targets for c in e["cases"].values()]
    extra_md, extra_json = stage_and_cache_sections(args)
    issue23 = target_ratios(targets, args) + scaling_checks + cache_ratio_rows(extra_json)
    md = [machine_line(env, args, comparison + series + report_cases + target_cases)]
    if issue23:
        md += ["", "### Issue 23's targets", "", ratio_table(issue23)]
    if targets:
        md += ["", "### The cases behind them (`bench_data/<stem>_xN.json`, interleaved)", "", target_table(targets)]
    md += [*(["", "### Same file: traceanalyzer vs HTA 0.5.0 vs orjson", "", comparison_table(comparison)]
             if comparison else []),
           *(["", "### Other ratios (issue 9's former targets, for information; issue 22's report share)", "",
              ratio_table(ratios)] if ratios else [])]
    if scaling_md:
        md += ["", "### Scaling (replicated steps, `ours analyze`)", "", scaling_md]
    md += extra_md
    if reports_md:
        md += ["", "### Default run (json, md, html) vs json only: writing the reports", "", reports_md]
    md += [f"\n_{n}_" for n in notes]
    md.append(f"\n_bench took {time.perf_counter() - t_start:.0f} s_")
    print("\n".join(md))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "notes": notes, "targets": targets,
                                         "issue23_ratios": issue23, "comparison": comparison,
                                         "scaling": series, "reports": report_cases, "ratios": ratios, **extra_json,
                                         "argv": sys.argv[1:]}, indent=1) + "\n")
    return 0


def machine_line(env: dict[str, Any], args: argparse.Namespace, cases: list[dict[str, Any]]) -> str:
    """The machine, the load average during the runs, the repeats, the commit and the versions."""
    load_avgs = [r["loadavg_1m"] for c in cases for r in c.get("runs", [])]
    if not load_avgs:
        return ""
    return (f"Machine: {env.get('cpus')} CPUs ({env.get('cpu_model', '?')}), {env.get('mem_total_gb', '?')} GB RAM; "
            f"1-min load average during runs {min(load_avgs):.1f}–{max(load_avgs):.1f}; "
            f"median of {args.repeats} runs ({args.repeats_big} at 16x and above); commit "
            f"{env.get('git_commit', '?')}"
            f"{' + uncommitted ' + ', '.join(env['uncommitted']) if env.get('uncommitted') else ''}; "
            f"ours {env.get('ours')}, HTA {env.get('hta', 'skipped')}.")


def stage_and_cache_sections(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The per-stage table (1x, median of --repeats) and the model-cache table (--cache-sizes)."""
    md: list[str] = []
    data: dict[str, Any] = {}
    if not args.no_stages:
        print(f"stages on {args.source.name} ({args.repeats} runs)", file=sys.stderr)
        st = stage_rows(args.source, args.repeats, args)
        data["stages"] = st
        md += ["", "### Where the time goes (1x, one process, model cache off)", "", stage_table(st)]
    sizes = args.cache_sizes if args.cache_sizes is not None else ([1] if args.quick else [1, 16])
    if sizes:
        rows = []
        big = ensure_big(args.source, [n for n in sizes if n != 1], gz=False) if any(n != 1 for n in sizes) else {}
        print(f"model cache rows {sizes}", file=sys.stderr)
        for n in sorted(sizes):
            path = args.source if n == 1 else big[n][0]
            rows.append(cache_rows(path, n, args.repeats if n < 16 else args.repeats_big, args))
        data["cache"] = rows
        md += ["", "### Model cache: second `analyze --format json` of an unchanged file, other thresholds",
               "", cache_table(rows)]
    return md, data


def issue23_sections(args: argparse.Namespace, env: dict[str, Any], t_start: float,
                     targets: list[dict[str, Any]]) -> int:
    """``--only-issue23``: the target rows vs HTA and the decoder floor, the per-stage and the
    model-cache sections (the 40x RSS row needs the scaling series: not run here)."""
    extra_md, data = stage_and_cache_sections(args)
    rows = target_ratios(targets, args) + cache_ratio_rows(data)
    md = [machine_line(env, args, [c for e in targets for c in e["cases"].values()])]
    if rows:
        md += ["", "### Issue 23's targets", "", ratio_table(rows)]
    if targets:
        md += ["", "### The cases behind them (`bench_data/<stem>_xN.json`, interleaved)", "", target_table(targets)]
    md += extra_md
    md.append(f"\n_bench took {time.perf_counter() - t_start:.0f} s; commit {env.get('git_commit', '?')}_")
    print("\n".join(md))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "targets": targets, "issue23_ratios": rows, **data,
                                         "argv": sys.argv[1:]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
