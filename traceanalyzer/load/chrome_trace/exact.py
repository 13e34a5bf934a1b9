"""The exact (reference) decoder: one Python loop over orjson-decoded events.

It defines the loader's semantics. The simple path runs it on the whole document; the
chunked path runs it on any region the columnar reader (:mod:`.ndjson`) cannot take
exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl

from traceanalyzer.load.chrome_trace.raw import (
    _OUT_OF_RANGE_FLOW,
    _OUT_OF_RANGE_MEM,
    _OUT_OF_RANGE_X,
    _RAW_COLS,
    MAX_ABS_US,
    _in_range,
    _int,
    _json_text,
    _num,
    _raw_frame,
    _Stats,
)
from traceanalyzer.load.chrome_trace.vocabulary import (
    CAT_TABLE,
    COUNTER_CAT,
    FLOW_KIND,
    KNOWN_OTHER_CATS,
    MEMCPY_ARG_KIND,
    MTIA_CCP_CAT,
    MTIA_DIRECTION,
    MTIA_DMA,
    MTIA_NOT_BUSY,
)
from traceanalyzer.model.trace import SCHEMAS


class _Collector:
    """Sorts decoded events into per-table row lists, counting what it skips."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in SCHEMAS}
        self.skipped: Counter[str] = Counter()
        self.unknown_cats: Counter[str] = Counter()
        self.runtime_names: set[str] = set()
        self.counters = 0
        self.record_window_end = False

    def add(self, events: list[Any], autograd_array: bool) -> None:
        rows = self.rows
        cpu_ops = rows["cpu_ops"]
        annotations = rows["annotations"]
        pyframes = rows["python_frames"]
        runtime = rows["runtime"]
        kernels = rows["kernels"]
        memcpy = rows["memcpy"]
        memset = rows["memset"]
        gpu_ann = rows["gpu_annotations"]
        flows = rows["flows"]
        mem = rows["memory_events"]
        other = rows["other_events"]
        threads = rows["threads"]
        skipped = self.skipped
        for e in events:
            if not isinstance(e, dict):
                skipped["items that are not JSON objects"] += 1
                continue
            ph = e.get("ph")
            if ph == "X":
                ts = e.get("ts")
                dur = e.get("dur")
                name = e.get("name")
                if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                    skipped["duration events without a numeric ts"] += 1
                    continue
                if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur != dur:
                    skipped["duration events without dur"] += 1
                    continue
                if dur < 0:
                    skipped["duration events with negative dur"] += 1
                    continue
                if not (_in_range(ts) and dur <= MAX_ABS_US):
                    skipped[_OUT_OF_RANGE_X] += 1
                    continue
                if not isinstance(name, str):
                    name = "" if name is None else str(name)
                cat = e.get("cat")
                table = CAT_TABLE.get(cat) if isinstance(cat, str) else None
                if cat == MTIA_CCP_CAT:
                    table = "memcpy" if name == MTIA_DMA else None if name in MTIA_NOT_BUSY else "kernels"
                if table is None and autograd_array and cat is None:
                    table = "kernels" if str(e.get("pid", "")).startswith("CUDA") else "cpu_ops"
                    cat = "Kernel" if table == "kernels" else "Operator"
                a = e.get("args") or {}
                if not isinstance(a, dict):
                    a = {}
                pid = e.get("pid")
                tid = e.get("tid")
                if table == "cpu_ops":
                    cpu_ops.append(
                        (
                            name, ts, dur, _int(pid), _int(tid), cat,
                            _int(a.get("External id", a.get("external id"))),
                            _int(a.get("Sequence number")),
                            _int(a.get("Fwd thread id")),
                            _int(a.get("Ev Idx", a.get("Profiler Event Index"))),
                            _json_text(a.get("Input Dims")),
                            _json_text(a.get("Input type")),
                            _json_text(a.get("Input Strides")),
                            _json_text(a.get("Concrete Inputs")),
                            a.get("Collective name"),
                            a.get("dtype") if "Collective name" in a else None,
                            _num(a.get("In msg nelems")),
                            _num(a.get("Out msg nelems")),
                            _num(a.get("Group size")),
                            a.get("Process Group Name"),
                            a.get("Process Group Description"),
                            _call_stack(a.get("Call stack")),
                        )
                    )
                elif table == "python_frames":
                    pyframes.append(
                        (name, ts, dur, _int(pid), _int(tid), _int(a.get("Python id")), _int(a.get("Python parent id")))
                    )
                elif table == "runtime":
                    self.runtime_names.add(name)
                    runtime.append(
                        (
                            name, ts, dur, _int(pid), _int(tid), cat,
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _int(a.get("cbid", a.get("cid"))),
                        )
                    )
                elif table == "kernels":
                    kernels.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _json_text(a.get("grid")),
                            _json_text(a.get("block")),
                            _num(a.get("registers per thread")),
                            _num(a.get("shared memory")),
                            _num(a.get("queued")),
                            _int(a.get("graph id")),
                            a.get("Collective name"),
                            a.get("dtype") if "Collective name" in a else None,
                            _num(a.get("In msg nelems")),
                            _num(a.get("Group size")),
                        )
                    )
                elif table == "memcpy":
                    if cat == MTIA_CCP_CAT:
                        d = a.get("direction")
                        kind = MTIA_DIRECTION.get(d) if isinstance(d, str) else None
                    else:
                        k = a.get("kind")
                        kind = MEMCPY_ARG_KIND.get(k) if isinstance(k, str) else None
                    memcpy.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _num(a.get("size") if cat == MTIA_CCP_CAT else a.get("bytes")),
                            kind,
                        )
                    )
                elif table == "memset":
                    memset.append(
                        (
                            name, ts, dur,
                            _int(a.get("device", pid)),
                            _int(a.get("stream", tid)),
                            _int(a.get("correlation")),
                            _int(a.get("External id", a.get("external id"))),
                            _num(a.get("bytes")),
                        )
                    )
                elif table == "annotations":
                    annotations.append(
                        (name, ts, dur, _int(pid), _int(tid), _int(a.get("External id", a.get("external id"))))
                    )
                elif table == "gpu_annotations":
                    gpu_ann.append((name, ts, dur, _int(a.get("device", pid)), _int(a.get("stream", tid))))
                else:
                    scat = str(cat) if cat is not None else "<no category>"
                    if scat not in KNOWN_OTHER_CATS:
                        self.unknown_cats[scat] += 1
                    other.append((scat, name, ts, dur, str(pid), str(tid),
                                  _json_text(a) if scat == COUNTER_CAT else None, _int(a.get("correlation")),
                                  _int(a.get("wait_on_stream")), _int(a.get("wait_on_cuda_event_record_corr_id"))))
            elif ph in ("s", "f", "t"):
                cat = e.get("cat")
                kind = FLOW_KIND.get(cat) if isinstance(cat, str) else None
                if kind is None:
                    kind = str(cat)
                ts = e.get("ts")
                if not isinstance(ts, (int, float)):
                    skipped["flow events without a numeric ts"] += 1
                    continue
                if not _in_range(ts):
                    skipped[_OUT_OF_RANGE_FLOW] += 1
                    continue
                flows.append((kind, ph, _int(e.get("id")), ts, _int(e.get("pid")), _int(e.get("tid"))))
            elif ph == "i" or ph == "I":
                name = e.get("name")
                if name == "[memory]" or name == "[OutOfMemory]":
                    a = e.get("args") or {}
                    ts = e.get("ts")
                    if not isinstance(ts, (int, float)) or not isinstance(a, dict):
                        skipped["[memory] events without ts or args"] += 1
                        continue
                    if not _in_range(ts):
                        skipped[_OUT_OF_RANGE_MEM] += 1
                        continue
                    mem.append(
                        (
                            ts, _int(e.get("pid")), _int(e.get("tid")),
                            _int(a.get("Device Type")), _int(a.get("Device Id")),
                            _int(a.get("Addr")), _int(a.get("Bytes")),
                            _int(a.get("Total Allocated")), _int(a.get("Total Reserved")),
                            name == "[OutOfMemory]",
                        )
                    )
                elif name == "Record Window End":
                    self.record_window_end = True
            elif ph == "M":
                if e.get("name") == "thread_name":
                    a = e.get("args") or {}
                    tname = a.get("name") if isinstance(a, dict) else None
                    threads.append((_int(e.get("pid")), _int(e.get("tid")), str(tname)))
            elif ph == "C":
                self.counters += 1
            elif ph is None:
                skipped["events without a phase (ph)"] += 1
            # Other phases (B/E pairs, async b/e, etc.) are not emitted by torch.profiler.
            else:
                skipped[f"events of phase {ph!r}"] += 1


def _collect_events(events: list[Any], autograd_array: bool) -> tuple[dict[str, pl.DataFrame], _Stats]:
    """The simple (reference) event pass: a Python loop over decoded events."""
    col = _Collector()
    col.add(events, autograd_array)
    frames = {t: _raw_frame(t, col.rows[t]) for t in _RAW_COLS}
    stats = _Stats(col.skipped, col.unknown_cats, col.counters, len(events))
    stats.no_ph_head = not any(isinstance(e, dict) and "ph" in e for e in events[:100])
    return frames, stats


def _call_stack(value: Any) -> str | None:
    """``args["Call stack"]`` (PyTorch 1.8-1.9): kept when a non-empty string."""
    return value if isinstance(value, str) and value else None
