"""[memory] events of chrome traces: peaks per device, per step, top ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceanalyzer.analyses import run_analyses
from traceanalyzer.load import load

SHARED = Path(__file__).resolve().parents[2] / "shared"
CPU_TRACE = SHARED / "data" / "profiler_cpu" / "trace.json"


def _mem(ts: float, total: int, delta: int, dev: int = 0, dtype: int = 1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Total Reserved": 64 << 20, "Total Allocated": total, "Bytes": delta, "Device Id": dev,
                     "Device Type": dtype, "Addr": 1000 + int(ts)}}


def _trace(tmp_path: Path, steps: int = 3, leak: int = 1 << 20) -> Path:
    ev: list[dict] = []
    total = 0
    for s in range(steps):
        t0 = 1000.0 * (s + 1)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": 900})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": t0 + 10, "dur": 20})
        total += 8 << 20
        ev.append(_mem(t0 + 15, total, 8 << 20))
        total -= 8 << 20
        ev.append(_mem(t0 + 500, total, -(8 << 20)))
        total += leak
        ev.append(_mem(t0 + 600, total, leak))
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev, "schemaVersion": 1}))
    return f


def test_per_step_peaks_and_growth(tmp_path: Path) -> None:
    m = load(_trace(tmp_path))
    r = run_analyses(m, only=("trace_memory",), strict=True)["trace_memory"]
    dev = r.per_device.row(0, named=True)
    assert dev["device"] == "cuda:0"
    assert dev["peak_allocated_bytes"] == (8 << 20) + 2 * (1 << 20)
    assert dev["peak_op"] == "aten::empty"
    assert r.per_step["peak_allocated_bytes"].to_list() == [(8 << 20) + i * (1 << 20) for i in range(3)]
    assert r.per_step["growth_bytes"].to_list() == [1 << 20] * 3
    assert r.step_growth_bytes == {"cuda:0": 2 << 20}
    assert r.top_ops.row(0, named=True)["op"] == "aten::empty"


def test_not_applicable_without_memory_events(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                              "tid": 1, "ts": 1, "dur": 2}]}))
    r = run_analyses(load(f), only=("trace_memory",))
    assert "profile_memory=True" in r.skipped["trace_memory"]


@pytest.mark.skipif(not CPU_TRACE.exists(), reason="../shared not available")
@pytest.mark.shared
def test_real_cpu_trace_matches_running_total() -> None:
    m = load(CPU_TRACE)
    r = run_analyses(m, only=("trace_memory",), strict=True)["trace_memory"]
    # independent: the max of the "Total Allocated" arg over the raw events
    raw = json.loads(CPU_TRACE.read_text())
    ref = max(e["args"]["Total Allocated"] for e in raw["traceEvents"] if e.get("name") == "[memory]")
    assert r.per_device["peak_allocated_bytes"][0] == ref
    assert r.n_events == sum(1 for e in raw["traceEvents"] if e.get("name") == "[memory]")
