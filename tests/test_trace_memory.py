"""[memory] events of chrome traces: peaks per device, per step, top ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.events import complete, memory

from traceanalyzer.analyses import run_analyses
from traceanalyzer.load import load

SHARED = Path(__file__).resolve().parents[2] / "shared"
CPU_TRACE = SHARED / "data" / "profiler_cpu" / "trace.json"


def _mem(ts: float, total: int, delta: int, dev: int = 0, dtype: int = 1) -> dict:
    return memory(ts, total, delta, dev=dev, dtype=dtype)


def _trace(tmp_path: Path, steps: int = 3, leak: int = 1 << 20) -> Path:
    ev: list[dict] = []
    total = 0
    for s in range(steps):
        t0 = 1000.0 * (s + 1)
        ev.append(complete("user_annotation", f"ProfilerStep#{s}", t0, 900, pid=1, tid=1))
        ev.append(complete("cpu_op", "aten::empty", t0 + 10, 20, pid=1, tid=1))
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


# -- 2021-era [memory] events: only Bytes (and Addr), no Total Allocated / Total Reserved --

def _mem_2021(ts: float, delta: int, addr: int, dev: int = 0, dtype: int = 1) -> dict:
    # The layout of torch <= 1.9 profilers: no running totals.
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Device Type": dtype, "Device Id": dev, "Addr": addr, "Bytes": delta}}


def _trace_2021(tmp_path: Path) -> Path:
    """4 steps; each allocates 8 MiB then frees it and keeps 1 MiB (a leak), on cuda:0. Before
    the first step, a 2 MiB block allocated before profiling is freed (the running sum dips to
    −2 MiB, so the reconstructed totals are raised by 2 MiB). Host memory: +4 KiB each step."""
    ev: list[dict] = [_mem_2021(500.0, -(2 << 20), 0x10)]
    for s in range(4):
        t0 = 1000.0 * (s + 1)
        ev.append({"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0,
                   "dur": 900})
        ev.append({"ph": "X", "cat": "Operator", "name": "aten::empty", "pid": 1, "tid": 1, "ts": t0 + 10,
                   "dur": 20})
        ev.append(_mem_2021(t0 + 15, 8 << 20, 0x1000 + s))
        ev.append(_mem_2021(t0 + 500, -(8 << 20), 0x1000 + s))
        ev.append(_mem_2021(t0 + 600, 1 << 20, 0x2000 + s))
        ev.append(_mem_2021(t0 + 700, 4096, 0x3000 + s, dtype=0))
    f = tmp_path / "t2021.json"
    f.write_text(json.dumps({"traceEvents": ev, "schemaVersion": 1}))
    return f


def test_2021_memory_events_totals_reconstructed(tmp_path: Path) -> None:
    from traceanalyzer.load.chrome_trace import load_chrome_trace_simple

    path = _trace_2021(tmp_path)
    m = load(path)
    assert any("running sum of Bytes" in w and "2 device(s)" in w for w in m.warnings)
    simple = load_chrome_trace_simple(path)
    assert m.memory_events.equals(simple.memory_events)  # both decode paths reconstruct alike
    cuda = m.memory_events.filter(m.memory_events["device_type"] == 1)
    mib = 1 << 20
    # raised by the 2 MiB deficit: 0 after the pre-profiling free, then 8, 0, 1, 9, 1, 2, ...
    assert cuda["total_allocated"].to_list()[:7] == [0, 8 * mib, 0, 1 * mib, 9 * mib, 1 * mib, 2 * mib]
    assert cuda["total_reserved"].null_count() == cuda.height
    r = run_analyses(m, only=("trace_memory",), strict=True)["trace_memory"]
    dev = {row["device"]: row for row in r.per_device.iter_rows(named=True)}
    assert dev["cuda:0"]["peak_allocated_bytes"] == 8 * mib + 3 * mib
    assert dev["cuda:0"]["peak_reserved_bytes"] is None
    assert dev["cpu"]["peak_allocated_bytes"] == 4 * 4096
    assert r.step_growth_bytes["cuda:0"] == 3 * mib


def test_2021_memory_events_recorded_totals_untouched(tmp_path: Path) -> None:
    m = load(_trace(tmp_path))
    assert not any("running sum of Bytes" in w for w in m.warnings)


def test_2021_memory_events_through_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from traceanalyzer.cli import cli

    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["analyze", str(_trace_2021(tmp_path)), "-o", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert "trace_memory" not in s["failed_analyses"]
    per = {r["device"]: r for r in s["analyses"]["trace_memory"]["per_device"]}
    assert per["cuda:0"]["peak_allocated_bytes"] == 11 << 20
    assert any("running sum of Bytes" in w for w in s["warnings"])


def test_top_sites_by_user_frame(tmp_path: Path) -> None:
    """[memory] events under Python frames: the notebook cell is the site, not ipykernel,
    runpy or torch; an allocation under library frames only is reported as such."""
    py = "python_function"
    ev = [
        {"ph": "X", "cat": py, "name": "<frozen runpy>(198): _run_module_as_main", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": py, "name": "/usr/lib/python3.10/site-packages/ipykernel/kernelbase.py(409): "
         "dispatch_shell", "pid": 1, "tid": 1, "ts": 1, "dur": 500},
        {"ph": "X", "cat": py, "name": "/tmp/ipykernel_42/123.py(7): train_step", "pid": 1, "tid": 1,
         "ts": 2, "dur": 400},
        {"ph": "X", "cat": py, "name": "torch/nn/modules/module.py(1501): _call_impl", "pid": 1, "tid": 1,
         "ts": 3, "dur": 300},
        {"ph": "X", "cat": py, "name": "torch/optim/adam.py(100): _init_group", "pid": 1, "tid": 1,
         "ts": 600, "dur": 100},
        _mem(10, 8 << 20, 8 << 20), _mem(20, 12 << 20, 4 << 20), _mem(650, 13 << 20, 1 << 20),
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev, "schemaVersion": 1}))
    r = run_analyses(load(f), only=("trace_memory",), strict=True)["trace_memory"]
    rows = r.top_sites.to_dicts()
    assert [(x["site"], x["site_kind"], x["allocated_bytes"], x["allocations"]) for x in rows] == [
        ("/tmp/ipykernel_42/123.py:7 (train_step)", "python", 12 << 20, 2),
        ("torch/optim/adam.py:100 (_init_group)", "library", 1 << 20, 1),
    ]
    assert rows[0]["via"] == "torch/nn/modules/module.py:1501 (_call_impl)"
