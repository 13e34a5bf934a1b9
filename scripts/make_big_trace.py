#!/usr/bin/env python3
"""Build large chrome traces for the benchmark by replicating a real trace's steps.

The source trace's *step window* — from the start of its first ``ProfilerStep#`` to
the end of its last one — is copied ``N`` times, each copy shifted in time by one
*period*, between the source's prologue (events before the window: metadata, the
profiler span) and its epilogue (events after the window, shifted past the last
copy). Every event goes with the copy of the window it belongs to:

* CPU events (ops, annotations, runtime calls, ``[memory]`` instants, flow starts)
  by their own ``ts``: ``first_step.ts <= ts < last_step.end``;
* GPU events (kernels, memcpy, memset) and flow ends by the ``ts`` of the runtime
  call that launched them (same ``correlation``), so a kernel that runs after the
  window's end still follows its launch.

The period is the span from the window's start to the latest end of any event in the
window (GPU work included) plus the source's own gap between two steps, so copies
never overlap on a thread or stream. In copy ``k`` (0-based):

* ``ts`` += ``k * period`` (int µs stay int; fractional µs stay fractional);
* ids get ``k * id_stride`` added, where ``id_stride`` is a power of ten above every
  id in the source: ``correlation``, ``External id``, ``Ev Idx``, ``Sequence
  number``, ``Python id``, ``Python parent id``, ``Record function id`` in ``args``
  and the flow ``id``, so launch↔kernel and flow joins stay 1:1;
* ``ProfilerStep#i`` becomes ``ProfilerStep#(i + k * n_steps)``;
* the profiler's whole-trace span (cat ``Trace``) is stretched over all copies.

The output is written streamingly, one copy at a time (only the source is held in
memory), as ``.json``, with ``--gz`` also as ``.json.gz`` and with ``--ndjson`` also as
``.ndjson``: the same events, one event object per line (each line the event's JSON as the
``.json`` writes it, without the indentation), which is what polars' own NDJSON reader takes:
the bench's decoder-floor case (``pl.read_ndjson``) reads it::

    python scripts/make_big_trace.py                      # 1x 4x 16x 40x of df_index_resolver
    python scripts/make_big_trace.py --copies 4 --gz
    python scripts/make_big_trace.py --copies 16 --ndjson # adds the .ndjson twin, keeps the .json
    python scripts/make_big_trace.py --source other.json.gz --copies 2 -o bench_data/

Files land in ``bench_data/`` (gitignored) as ``<source stem>_x<N>.json[.gz]`` and
``<source stem>_x<N>.ndjson``; an existing file of the right name is kept unless ``--force``
(only the missing ones are written). 40x of df_index_resolver
is about 2.1 GB and takes about a minute (2 cores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data" / "traces" / "hta" / "df_index_resolver" / \
    "df_index_resolver.json.gz"
DEFAULT_OUT = REPO_ROOT / "bench_data"
DEFAULT_COPIES = (1, 4, 16, 40)

ID_ARGS = ("correlation", "External id", "Ev Idx", "Sequence number", "Python id", "Python parent id",
           "Record function id")
GPU_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset",
                      "gpu_user_annotation", "gpu_user_Annotation"})
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

# Events serialised per write: keeps the transient bytes small while amortising calls.
_BATCH = 20_000


def stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def read_source(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        sys.exit(f"error: {path}: not a chrome trace with a traceEvents array")
    return doc


class Plan:
    """Which source events are prologue, window (replicated) and epilogue."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        steps = [e for e in events if e.get("ph") == "X" and _STEP_RE.match(str(e.get("name", "")))
                 and e.get("cat") != "gpu_user_annotation"]
        if not steps:
            sys.exit("error: source has no ProfilerStep# events; nothing to replicate")
        self.step_numbers = sorted({int(_STEP_RE.match(e["name"]).group(1)) for e in steps})  # type: ignore[union-attr]
        steps.sort(key=lambda e: e["ts"])
        self.w0 = steps[0]["ts"]
        self.w1 = max(e["ts"] + e.get("dur", 0) for e in steps)
        gaps = [b["ts"] - (a["ts"] + a.get("dur", 0)) for a, b in zip(steps, steps[1:])]
        step_gap = max(0, min(gaps)) if gaps else 0

        # The runtime call (or any CPU event) that carries a correlation decides where
        # its GPU activity and flow end go.
        launch_ts: dict[Any, Any] = {}
        for e in events:
            args = e.get("args")
            if args and "correlation" in args and e.get("cat") not in GPU_CATS:
                launch_ts.setdefault(args["correlation"], e["ts"])

        def anchor(e: dict[str, Any]) -> Any:
            args = e.get("args") or {}
            if e.get("cat") in GPU_CATS and "correlation" in args:
                return launch_ts.get(args["correlation"], e.get("ts", 0))
            if e.get("ph") == "f" and e.get("id") in launch_ts:
                return launch_ts[e["id"]]
            return e.get("ts", 0)

        self.prologue: list[dict[str, Any]] = []
        self.window: list[dict[str, Any]] = []
        self.epilogue: list[dict[str, Any]] = []
        self.trace_spans: list[dict[str, Any]] = []
        for e in events:
            if e.get("ph") == "M" or "ts" not in e:
                self.prologue.append(e)
                continue
            if e.get("cat") == "Trace" and e.get("ph") == "X":
                self.trace_spans.append(e)
                self.prologue.append(e)
                continue
            a = anchor(e)
            if a < self.w0:
                self.prologue.append(e)
            elif a < self.w1:
                self.window.append(e)
            else:
                self.epilogue.append(e)

        window_end = max((e["ts"] + e.get("dur", 0) for e in self.window), default=self.w1)
        self.period = math.ceil(window_end - self.w0) + step_gap
        max_id = 0
        for e in events:
            if isinstance(e.get("id"), int):
                max_id = max(max_id, e["id"])
            args = e.get("args")
            if args:
                for k in ID_ARGS:
                    v = args.get(k)
                    if isinstance(v, int):
                        max_id = max(max_id, v)
        self.id_stride = 10 ** len(str(max_id))  # a power of ten above every id


def _shifted_copy(events: list[dict[str, Any]], k: int, plan: Plan) -> Iterable[dict[str, Any]]:
    """Yield the window's events for copy ``k`` (shallow-copied, the source stays intact)."""
    dt = k * plan.period
    did = k * plan.id_stride
    n_steps = len(plan.step_numbers)
    for e in events:
        if k == 0:
            yield e
            continue
        c = dict(e)
        c["ts"] = e["ts"] + dt
        if isinstance(c.get("id"), int):
            c["id"] = c["id"] + did
        args = e.get("args")
        if args:
            a = None
            for key in ID_ARGS:
                v = args.get(key)
                if isinstance(v, int) and v >= 0:  # -1 means "none"
                    if a is None:
                        a = dict(args)
                    a[key] = v + did
            if a is not None:
                c["args"] = a
        name = c.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            m = _STEP_RE.match(name)
            if m:
                c["name"] = f"ProfilerStep#{int(m.group(1)) + k * n_steps}"
        yield c


# Kineto's own layout: ", " and ": " separators, one event per block. Keeps the bytes
# per event close to a real trace's (orjson's compact output is 20 % smaller), so
# RSS/size and s/GB compare with what users feed the tool.
_ENC = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=False, check_circular=False)


def _event_text(e: dict[str, Any]) -> str:
    return "  {\n    " + _ENC.encode(e)[1:-1] + "\n  }"


def _write_events(out: list[BinaryIO], events: Iterable[dict[str, Any]], first: list[bool],
                  ndjson: BinaryIO | None = None) -> int:
    """Append ``events`` to the open ``traceEvents`` array in every file of ``out``, and one line
    per event to ``ndjson`` when given."""
    n = 0
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        if not batch:
            return
        if out:
            body = ",\n".join(_event_text(e) for e in batch).encode()
            sep = b"\n" if first[0] else b",\n"
            first[0] = False
            for f in out:
                f.write(sep)
                f.write(body)
        if ndjson is not None:
            ndjson.write(("\n".join(_ENC.encode(e) for e in batch) + "\n").encode())
        batch.clear()

    for e in events:
        batch.append(e)
        n += 1
        if len(batch) >= _BATCH:
            flush()
    flush()
    return n


def write_trace(doc: dict[str, Any], plan: Plan, copies: int, json_path: Path | None, gz_path: Path | None,
                gz_level: int, ndjson_path: Path | None = None) -> int:
    """Write the replicated trace to each path given (``.json``, ``.json.gz``, ``.ndjson``: the
    same events from one stream); returns the number of events."""
    parts: list[tuple[Path, Path]] = []  # (temporary, final)
    files: list[BinaryIO] = []
    nd_file: BinaryIO | None = None
    for path in (json_path, gz_path, ndjson_path):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".part")
        parts.append((tmp, path))
        if path is gz_path:
            files.append(gzip.open(tmp, "wb", compresslevel=gz_level))  # type: ignore[arg-type]
        elif path is ndjson_path:
            nd_file = open(tmp, "wb")
        else:
            files.append(open(tmp, "wb"))
    stretch = (copies - 1) * plan.period
    try:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        prefix = _ENC.encode(head)[:-1].encode() + (b', "traceEvents": [' if head else b'"traceEvents": [')
        for f in files:
            f.write(prefix)
        first = [True]
        spans = {id(e) for e in plan.trace_spans}
        prologue = [dict(e, dur=e["dur"] + stretch) if id(e) in spans and "dur" in e else e
                    for e in plan.prologue]
        n = _write_events(files, prologue, first, nd_file)
        for k in range(copies):
            n += _write_events(files, _shifted_copy(plan.window, k, plan), first, nd_file)
        epi = [dict(e, ts=e["ts"] + stretch) for e in plan.epilogue]
        n += _write_events(files, epi, first, nd_file)
        for f in files:
            f.write(b"\n]}\n")
    finally:
        for f in files:
            f.close()
        if nd_file is not None:
            nd_file.close()
    for tmp, path in parts:
        tmp.replace(path)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace (.json or .json.gz)")
    ap.add_argument("--copies", type=int, nargs="+", default=list(DEFAULT_COPIES),
                    help="replication factors (default: 1 4 16 40)")
    ap.add_argument("-o", "--outdir", type=Path, default=DEFAULT_OUT, help="default: bench_data/")
    ap.add_argument("--gz", action="store_true", help="also write .json.gz (same stream)")
    ap.add_argument("--gz-level", type=int, default=6)
    ap.add_argument("--ndjson", action="store_true",
                    help="also write .ndjson: the same events, one per line (the bench's decoder floor)")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    a = ap.parse_args(argv)
    if not a.source.exists():
        print(f"error: {a.source}: no such file", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    doc = read_source(a.source)
    plan = Plan(doc["traceEvents"])
    print(f"{a.source.name}: {len(doc['traceEvents']):,} events; window {len(plan.window):,} events, "
          f"{len(plan.step_numbers)} steps, period {plan.period:,} µs, id stride {plan.id_stride:,}; "
          f"prologue {len(plan.prologue):,}, epilogue {len(plan.epilogue):,} "
          f"(read in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    for n in a.copies:
        jp = a.outdir / f"{stem(a.source)}_x{n}.json"
        gp = a.outdir / f"{stem(a.source)}_x{n}.json.gz" if a.gz else None
        np_ = a.outdir / f"{stem(a.source)}_x{n}.ndjson" if a.ndjson else None
        todo = [p for p in (jp, gp, np_) if p is not None and (a.force or not p.exists())]
        if not todo:
            print(f"  kept {jp} ({jp.stat().st_size / 1e6:,.0f} MB)", file=sys.stderr)
            continue
        t1 = time.perf_counter()
        events = write_trace(doc, plan, n, jp if jp in todo else None, gp if gp in todo else None, a.gz_level,
                             np_ if np_ in todo else None)
        print(f"  wrote {', '.join(f'{p.name} ({p.stat().st_size / 1e6:,.0f} MB)' for p in todo)}: "
              f"{events:,} events in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
