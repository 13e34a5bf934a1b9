"""Memory rules (memory_capacity, oom, fragmentation, memory_growth, activation_peak) on
hand-built traces, snapshots and memory-timeline exports whose numbers are known: each rule
fires with exact evidence and cost in bytes, stays silent below its threshold, and says why
when it cannot decide."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from support.events import complete, memory

from traceanalyzer.analyses import run_analyses
from traceanalyzer.config import Config
from traceanalyzer.load import load
from traceanalyzer.rules import Finding, RuleOutcome, Severity, run_rules

MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------

def _mem(ts: float, total: int, delta: int, reserved: int, dev: int = 0, dtype: int = 1,
         name: str = "[memory]") -> dict[str, Any]:
    """One allocator instant event as Kineto writes it (totals are after the event)."""
    return memory(ts, total, delta, reserved, dev, dtype, name)


def _trace(tmp_path: Path, mem_events: list[dict[str, Any]], steps: int = 0,
           capacities: dict[int, int] | None = None, name: str = "t.json") -> Path:
    """``steps`` equal ProfilerStep# windows at 1000·(s+1) µs (900 µs long, one op each), the given
    [memory] events, and ``deviceProperties`` with ``totalGlobalMem`` per device id."""
    ev: list[dict[str, Any]] = []
    for s in range(steps):
        t0 = 1000.0 * (s + 1)
        ev.append(complete("user_annotation", f"ProfilerStep#{s}", t0, 900, pid=1, tid=1))
        ev.append(complete("cpu_op", "aten::empty", t0 + 10, 20, pid=1, tid=1))
    ev += mem_events
    props = [{"id": d, "name": "Test GPU", "totalGlobalMem": c} for d, c in sorted((capacities or {}).items())]
    f = tmp_path / name
    f.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev}))
    return f


def _step_trace(tmp_path: Path, steps: int, kept: int, temp: int, reserved: int, **kw: Any) -> Path:
    """Each step allocates ``temp`` bytes and frees them, then keeps ``kept`` bytes (a leak)."""
    ev, total = [], 0
    for s in range(steps):
        t0 = 1000.0 * (s + 1)
        ev.append(_mem(t0 + 15, total + temp, temp, reserved))
        ev.append(_mem(t0 + 500, total, -temp, reserved))
        total += kept
        ev.append(_mem(t0 + 600, total, kept, reserved))
    return _trace(tmp_path, ev, steps=steps, **kw)


FR = {
    "param": [{"name": "__init__", "filename": "/home/u/model.py", "line": 3}],
    "fwd": [{"name": "forward", "filename": "/home/u/model.py", "line": 9}],
    "leak": [{"name": "remember", "filename": "/home/u/train.py", "line": 10}],
    "tmp": [{"name": "step", "filename": "/home/u/train.py", "line": 20}],
}


def _seg(addr: int, blocks: list[tuple[int, str, int, list]], device: int = 0) -> dict[str, Any]:
    """A dumped segment from (size, state, requested, frames) blocks laid out from ``addr``."""
    out, a = [], addr
    for size, state, req, frames in blocks:
        out.append({"address": a, "size": size, "requested_size": req, "state": state, "frames": frames})
        a += size
    return {"device": device, "address": addr, "total_size": a - addr,
            "allocated_size": sum(b[0] for b in blocks if b[1] == "active_allocated"),
            "active_size": sum(b[0] for b in blocks if b[1] != "inactive"),
            "requested_size": sum(b[2] for b in blocks if b[1] != "inactive"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "blocks": out}


def _ev(action: str, addr: int, size: int, frames: list | None = None, **kw: Any) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames or [], **kw}


def _timed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, e in enumerate(events):
        e["time_us"] = 1_700_000_000_000_000 + 10 * i
    return events


def _write(tmp_path: Path, doc: Any, name: str = "s.pickle") -> Path:
    f = tmp_path / name
    f.write_bytes(pickle.dumps(doc, protocol=4))
    return f


def _rules(path: Path, config: Config | None = None) -> tuple[Any, RuleOutcome]:
    results = run_analyses(load(path), config, strict=True)
    return results, run_rules(results, config, strict=True)


def _only(outcome: RuleOutcome, rule_id: str) -> list[Finding]:
    return [f for f in outcome.findings if f.rule_id == rule_id]


def _silent(outcome: RuleOutcome, rule_id: str) -> None:
    """Ran and decided there is nothing to report (neither a finding nor 'could not run')."""
    assert not _only(outcome, rule_id)
    assert rule_id not in outcome.not_run and rule_id not in outcome.failed


# --------------------------------------------------------------------------------------
# memory_capacity
# --------------------------------------------------------------------------------------

def test_memory_capacity_warning_and_critical_with_exact_cost(tmp_path: Path) -> None:
    cap = 1000 * MiB
    ev = [_mem(10, 950 * MiB, 950 * MiB, 960 * MiB, dev=0), _mem(20, 980 * MiB, 980 * MiB, 990 * MiB, dev=1),
          _mem(30, 0, -950 * MiB, 960 * MiB, dev=0), _mem(40, 0, -980 * MiB, 990 * MiB, dev=1),
          _mem(50, 4096, 4096, 0, dev=-1, dtype=0)]  # host memory: no capacity, never reported
    _, out = _rules(_trace(tmp_path, ev, capacities={0: cap, 1: cap}))
    f1, f0 = _only(out, "memory_capacity")  # ranked by bytes: the 80 MiB overshoot first
    assert f1.severity == Severity.CRITICAL and f0.severity == Severity.WARNING
    assert f1.cost_bytes == 80 * MiB and f0.cost_bytes == 50 * MiB  # peak − 90 % of 1000 MiB
    assert f0.cost_ms_per_step is None and f0.confidence == 0.9
    assert f0.evidence["device"] == "cuda:0" and f0.evidence["capacity_bytes"] == cap
    assert f0.evidence["peak_allocated_bytes"] == 950 * MiB and f0.evidence["peak_reserved_bytes"] == 960 * MiB
    assert f0.evidence["pct_of_capacity"] == 95.0 and f1.evidence["pct_of_capacity"] == 98.0
    assert f0.title.startswith("GPU 0 peaks at 95.0 % of its 1.0 GiB")
    assert "checkpoint" in f0.code_hint and f0.fix


def test_memory_capacity_threshold_override_and_silence(tmp_path: Path) -> None:
    cap = 1000 * MiB
    ev = [_mem(10, 950 * MiB, 950 * MiB, 960 * MiB), _mem(30, 0, -950 * MiB, 960 * MiB)]
    path = _trace(tmp_path, ev, capacities={0: cap})
    _, out = _rules(path, Config({"memory_capacity.max_pct": 96}))
    _silent(out, "memory_capacity")  # 95 % < 96 %
    _, out = _rules(path, Config({"memory_capacity.max_pct": 80, "memory_capacity.critical_pct": 95}))
    (f,) = _only(out, "memory_capacity")
    assert f.severity == Severity.CRITICAL and f.cost_bytes == 150 * MiB  # 950 − 800 MiB

    low = _trace(tmp_path, [_mem(10, 500 * MiB, 500 * MiB, 512 * MiB)], capacities={0: cap}, name="low.json")
    _silent(_rules(low)[1], "memory_capacity")


def test_memory_capacity_cannot_decide_without_capacity_or_device_memory(tmp_path: Path) -> None:
    _, out = _rules(_trace(tmp_path, [_mem(10, 950 * MiB, 950 * MiB, 960 * MiB)], name="noprops.json"))
    assert "totalGlobalMem" in out.not_run["memory_capacity"] and "GPU 0" in out.not_run["memory_capacity"]
    _, out = _rules(_trace(tmp_path, [_mem(10, 4096, 4096, 0, dev=-1, dtype=0)], capacities={0: GiB},
                           name="host.json"))
    assert out.not_run["memory_capacity"].startswith("only host (cpu) [memory] events")
    _, out = _rules(_trace(tmp_path, [], steps=2, capacities={0: GiB}, name="nomem.json"))
    assert "profile_memory=True" in out.not_run["memory_capacity"]


# --------------------------------------------------------------------------------------
# oom
# --------------------------------------------------------------------------------------

def test_oom_snapshot_capacity_cost_is_the_shortfall(tmp_path: Path) -> None:
    base = 1 << 40
    ev = _timed([_ev("segment_alloc", base, 20 * MiB), _ev("alloc", base, 10 * MiB, FR["fwd"]),
                 _ev("alloc", base + 10 * MiB, 6 * MiB, FR["tmp"]),
                 _ev("free_requested", base + 10 * MiB, 6 * MiB, FR["tmp"]),
                 _ev("free_completed", base + 10 * MiB, 6 * MiB, FR["tmp"]),
                 {"action": "oom", "device_free": 3 * MiB, "size": 12 * MiB, "stream": 0, "frames": FR["fwd"]}])
    doc = {"segments": [_seg(base, [(10 * MiB, "active_allocated", 10 * MiB, FR["fwd"]),
                                    (10 * MiB, "inactive", 0, [])])], "device_traces": [ev]}
    _, out = _rules(_write(tmp_path, doc))
    (f,) = _only(out, "oom")
    assert f.severity == Severity.CRITICAL and f.confidence == 1.0
    assert f.cost_bytes == 9 * MiB  # 12 MiB requested − 3 MiB free on the device
    e = f.evidence
    assert (e["requested_bytes"], e["device_free_bytes"], e["shortfall_bytes"]) == (12 * MiB, 3 * MiB, 9 * MiB)
    assert (e["allocated_bytes"], e["reserved_bytes"], e["cached_free_bytes"]) == (10 * MiB, 20 * MiB, 10 * MiB)
    assert e["verdict"] == "capacity" and e["n_ooms"] == 1 and e["device"] == 0
    assert e["failing_site"].startswith("forward (u/model.py:9)")
    assert e["top_sites"][0]["bytes"] == 10 * MiB
    assert f.title == "Out of memory on GPU 0: 12.0 MiB requested with 3.0 MiB free (capacity)"
    assert "checkpoint" in f.code_hint


def test_oom_snapshot_fragmentation_verdict(tmp_path: Path) -> None:
    base = 1 << 40
    ev = _timed([_ev("segment_alloc", base, 40 * MiB), _ev("alloc", base, 10 * MiB),
                 _ev("alloc", base + 10 * MiB, 10 * MiB), _ev("alloc", base + 20 * MiB, 10 * MiB),
                 _ev("free_requested", base, 10 * MiB), _ev("free_completed", base, 10 * MiB),
                 {"action": "oom", "device_free": 0, "size": 12 * MiB, "stream": 0, "frames": []}])
    doc = {"segments": [_seg(base, [(10 * MiB, "inactive", 0, []), (10 * MiB, "active_allocated", 10 * MiB, []),
                                    (10 * MiB, "active_allocated", 10 * MiB, []), (10 * MiB, "inactive", 0, [])])],
           "device_traces": [ev]}
    _, out = _rules(_write(tmp_path, doc))
    (f,) = _only(out, "oom")
    assert f.evidence["verdict"] == "fragmentation" and f.evidence["cached_free_bytes"] == 20 * MiB
    assert f.cost_bytes == 12 * MiB  # nothing free on the device: the whole request did not fit
    assert "expandable_segments:True" in f.code_hint and "expandable_segments" in f.fix


def test_oom_trace_events(tmp_path: Path) -> None:
    ev = [_mem(10, 700 * MiB, 700 * MiB, 800 * MiB),
          _mem(20, 700 * MiB, 300 * MiB, 800 * MiB, name="[OutOfMemory]"),
          _mem(30, 700 * MiB, 500 * MiB, 800 * MiB, name="[OutOfMemory]")]
    _, out = _rules(_trace(tmp_path, ev))
    (f,) = _only(out, "oom")
    assert f.severity == Severity.CRITICAL and f.confidence == 0.9
    assert f.cost_bytes == 500 * MiB  # the largest failed request
    assert f.evidence["n_ooms"] == 2 and f.evidence["largest_request_bytes"] == 500 * MiB
    assert [o["bytes"] for o in f.evidence["ooms"]] == [300 * MiB, 500 * MiB]  # in time order
    assert f.evidence["ooms"][0]["device"] == "cuda:0" and f.evidence["ooms"][0]["total_reserved"] == 800 * MiB
    assert f.title.startswith("2 out-of-memory event(s) during the profile on GPU 0: largest request 500.0 MiB")


def test_oom_silent_or_cannot_decide(tmp_path: Path) -> None:
    # Memory-profiled trace without [OutOfMemory]: no OOM happened.
    _silent(_rules(_trace(tmp_path, [_mem(10, MiB, MiB, 2 * MiB)]))[1], "oom")
    # Snapshot with history and no oom entry: no OOM happened while recording.
    base = 1 << 40
    ev = _timed([_ev("segment_alloc", base, 2 * MiB), _ev("alloc", base, MiB)])
    doc = {"segments": [_seg(base, [(MiB, "active_allocated", MiB, []), (MiB, "inactive", 0, [])])],
           "device_traces": [ev]}
    _silent(_rules(_write(tmp_path, doc))[1], "oom")
    # Snapshot without history: an OOM would leave no entry, so the rule cannot tell.
    nohist = _write(tmp_path, [_seg(base, [(MiB, "active_allocated", MiB, [])])], "nohist.pickle")
    assert "no allocation history" in _rules(nohist)[1].not_run["oom"]
    # A trace without [memory] events: the analysis' own reason.
    _, out = _rules(_trace(tmp_path, [], steps=2, name="nomem.json"))
    assert "profile_memory=True" in out.not_run["oom"]


# --------------------------------------------------------------------------------------
# fragmentation
# --------------------------------------------------------------------------------------

def test_fragmentation_snapshot_at_dump(tmp_path: Path) -> None:
    doc = [_seg(1 << 40, [(GiB, "active_allocated", GiB, FR["fwd"]), (3 * GiB, "inactive", 0, [])])]
    _, out = _rules(_write(tmp_path, doc))
    (f,) = _only(out, "fragmentation")
    assert f.severity == Severity.WARNING and f.cost_bytes == 3 * GiB and f.confidence == 0.8
    e = f.evidence
    assert e["measured"] == "at dump" and e["unused_bytes"] == 3 * GiB and e["unused_pct_of_reserved"] == 75.0
    assert e["reserved_bytes"] == 4 * GiB and e["allocated_bytes"] == GiB
    assert e["largest_free_block_bytes"] == 3 * GiB and e["fragmentation_pct"] == 0.0
    assert f.title.startswith("3.00 GiB reserved but unused (75 % of reserved, at dump)")
    assert "expandable_segments:True" in f.code_hint


def test_fragmentation_snapshot_history_maximum(tmp_path: Path) -> None:
    """2 GiB reserved, all of it freed mid-run (100 % unused then), 1.5 GiB reallocated by the dump
    (0.5 GiB = 25 % unused at dump: below the threshold on its own)."""
    base = 1 << 40
    ev = _timed([_ev("segment_alloc", base, 2 * GiB), _ev("alloc", base, 2 * GiB),
                 _ev("free_requested", base, 2 * GiB), _ev("free_completed", base, 2 * GiB),
                 _ev("alloc", base, 3 * GiB // 2)])
    doc = {"segments": [_seg(base, [(3 * GiB // 2, "active_allocated", 3 * GiB // 2, []),
                                    (GiB // 2, "inactive", 0, [])])], "device_traces": [ev]}
    r, out = _rules(_write(tmp_path, doc))
    assert r["memory_fragmentation"].reserved_at_max_unused_bytes == 2 * GiB
    (f,) = _only(out, "fragmentation")
    assert f.cost_bytes == 2 * GiB
    assert f.evidence["measured"] == "max over the history" and f.evidence["unused_pct_of_reserved"] == 100.0
    assert f.evidence["free_bytes"] == GiB // 2


def test_fragmentation_churn_alone_has_no_byte_cost(tmp_path: Path) -> None:
    base = 1 << 40
    ev: list[dict[str, Any]] = []
    for _i in range(11):  # empty_cache() in the loop: the segment goes back to CUDA and comes again
        ev += [_ev("segment_alloc", base, 2 * MiB), _ev("segment_free", base, 2 * MiB)]
    ev += [_ev("segment_alloc", base, 2 * MiB), _ev("alloc", base, MiB)]
    doc = {"segments": [_seg(base, [(MiB, "active_allocated", MiB, []), (MiB, "inactive", 0, [])])],
           "device_traces": [_timed(ev)]}
    _, out = _rules(_write(tmp_path, doc))
    (f,) = _only(out, "fragmentation")
    assert f.evidence["churn_reallocs"] == 11 and f.evidence["churn_realloc_bytes"] == 22 * MiB
    assert f.cost_bytes is None and f.confidence == 0.7
    assert f.title == "11 cudaMalloc calls after segment frees (empty_cache churn)"
    _silent(_rules(_write(tmp_path, doc, "c.pickle"), Config({"fragmentation.min_churn": 12}))[1], "fragmentation")


def test_fragmentation_snapshot_silent_below_threshold_and_override(tmp_path: Path) -> None:
    doc = [_seg(1 << 40, [(32 * MiB, "active_allocated", 32 * MiB, []), (32 * MiB, "inactive", 0, [])])]
    path = _write(tmp_path, doc)
    _silent(_rules(path)[1], "fragmentation")  # 32 MiB unused < 1 GiB
    _, out = _rules(path, Config({"fragmentation.min_unused_bytes": 16 * MiB}))
    (f,) = _only(out, "fragmentation")
    assert f.cost_bytes == 32 * MiB and f.evidence["unused_pct_of_reserved"] == 50.0
    _silent(_rules(path, Config({"fragmentation.min_unused_bytes": 16 * MiB,
                                 "fragmentation.min_unused_pct": 60}))[1], "fragmentation")


def test_fragmentation_trace_peak_reserved_vs_peak_allocated(tmp_path: Path) -> None:
    ev = [_mem(10, GiB, GiB, 3 * GiB), _mem(20, 0, -GiB, 3 * GiB)]
    _, out = _rules(_trace(tmp_path, ev))
    (f,) = _only(out, "fragmentation")
    assert f.cost_bytes == 2 * GiB and f.confidence == 0.6
    assert f.evidence == {"device": "cuda:0", "peak_reserved_bytes": 3 * GiB, "peak_allocated_bytes": GiB,
                          "unused_bytes": 2 * GiB, "unused_pct_of_reserved": 66.67}
    ev = [_mem(10, GiB, GiB, GiB + 200 * MiB), _mem(20, 0, -GiB, GiB + 200 * MiB)]
    _silent(_rules(_trace(tmp_path, ev, name="tight.json"))[1], "fragmentation")


# --------------------------------------------------------------------------------------
# memory_growth
# --------------------------------------------------------------------------------------

def test_memory_growth_trace_exact(tmp_path: Path) -> None:
    _, out = _rules(_step_trace(tmp_path, steps=5, kept=32 * MiB, temp=256 * MiB, reserved=GiB))
    (f,) = _only(out, "memory_growth")
    assert f.severity == Severity.WARNING and f.confidence == 0.7
    assert f.cost_bytes == 128 * MiB  # end of step 4 − end of step 0
    e = f.evidence
    assert e["end_allocated_bytes"] == [32 * MiB * k for k in range(1, 6)]
    assert e["growth_per_step_bytes"] == 32 * MiB and e["steps_that_grew"] == 4 and e["steps"] == [0, 1, 2, 3, 4]
    assert e["peak_allocated_bytes"] == 128 * MiB + 256 * MiB and e["pct_of_peak"] == 33.33
    assert f.title == "GPU 0: allocated memory grows 32.0 MiB per step (+128.0 MiB over 5 steps, 33 % of the peak)"


def test_memory_growth_trace_silent_and_cannot_decide(tmp_path: Path) -> None:
    # 1 MiB per step: 4 MiB over 5 steps is below 16 MiB.
    _silent(_rules(_step_trace(tmp_path, steps=5, kept=MiB, temp=256 * MiB, reserved=GiB))[1], "memory_growth")
    # Steady memory: allocated returns to the same level after every step.
    _silent(_rules(_step_trace(tmp_path, steps=5, kept=0, temp=256 * MiB, reserved=GiB, name="flat.json"))[1],
            "memory_growth")
    # Two steps are not a trend.
    _, out = _rules(_step_trace(tmp_path, steps=2, kept=64 * MiB, temp=MiB, reserved=GiB, name="two.json"))
    assert out.not_run["memory_growth"].startswith("fewer than 3 steady steps")
    _, out = _rules(_step_trace(tmp_path, steps=2, kept=64 * MiB, temp=MiB, reserved=GiB, name="two2.json"),
                    Config({"memory_growth.min_steps": 2}))
    assert _only(out, "memory_growth")[0].cost_bytes == 64 * MiB
    # No steps at all.
    _, out = _rules(_trace(tmp_path, [_mem(10, MiB, MiB, 2 * MiB)], name="nosteps.json"))
    assert out.not_run["memory_growth"].startswith("no ProfilerStep# windows")


def test_memory_growth_trace_matches_synthetic_generator_truth(tmp_path: Path) -> None:
    from support.synthetic import scenario_memory_growth

    doc, truth = scenario_memory_growth(seed=3, steps=6, leak_bytes=24 << 20)
    results, out = _rules(_trace_doc(tmp_path, doc))
    planted = truth["planted"]
    (f,) = _only(out, "memory_growth")
    steady = results["steps"].steady_windows()
    ends = [planted["allocated_at_step_end_bytes"][w] for w in steady]
    assert f.evidence["end_allocated_bytes"] == ends
    assert f.cost_bytes == ends[-1] - ends[0] == planted["leak_bytes_per_step"] * (len(ends) - 1)


def _trace_doc(tmp_path: Path, doc: dict[str, Any]) -> Path:
    f = tmp_path / "synthetic.json"
    f.write_text(json.dumps(doc))
    return f


def _leaky_steps(kept: int, temp: int, steps: int = 8) -> dict[str, Any]:
    """A snapshot whose history has ``steps`` ProfilerStep# annotations; each step allocates and
    frees ``temp`` bytes and keeps ``kept`` bytes at ``remember (train.py:10)``."""
    base = 1 << 40
    seg = 64 * MiB
    ev: list[dict[str, Any]] = [_ev("segment_alloc", base, seg)]
    anns = []
    t = 1_700_000_000_000_000
    for s in range(steps):
        t += 100
        anns.append({"device": 0, "name": f"ProfilerStep#{s}", "stage": "START", "time_us": t})
        tmp = base + 48 * MiB
        for e in (_ev("alloc", tmp, temp, FR["tmp"]), _ev("free_requested", tmp, temp, FR["tmp"]),
                  _ev("free_completed", tmp, temp, FR["tmp"]), _ev("alloc", base + s * kept, kept, FR["leak"])):
            t += 10
            e["time_us"] = t
            ev.append(e)
    ev[0]["time_us"] = 1_700_000_000_000_000
    blocks = [(kept, "active_allocated", kept, FR["leak"]) for _ in range(steps)]
    blocks.append((seg - steps * kept, "inactive", 0, []))
    return {"segments": [_seg(base, blocks)], "device_traces": [ev], "external_annotations": anns}


def test_memory_growth_snapshot_steps(tmp_path: Path) -> None:
    r, out = _rules(_write(tmp_path, _leaky_steps(kept=4 * MiB, temp=4 * MiB)))
    assert r["memory_leaks"].window_kind == "steps" and r["memory_leaks"].n_windows == 8
    (f,) = _only(out, "memory_growth")
    assert f.cost_bytes == 28 * MiB  # held at the end of step 7 (32 MiB) − at the end of step 0 (4 MiB)
    assert f.confidence == 0.8
    e = f.evidence
    assert e["peak_allocated_bytes"] == 32 * MiB and e["pct_of_peak"] == 87.5
    assert e["suspects"][0]["site"].startswith("remember (u/train.py:10)")
    assert e["suspects"][0]["end_bytes"] == 32 * MiB
    assert f.title.startswith("1 call site(s) on GPU 0 keep growing over 8 steps: +28.0 MiB, most at remember")


def test_memory_growth_snapshot_below_threshold_and_no_history(tmp_path: Path) -> None:
    # A suspect site of memory_leaks, but 7 MiB of growth is below 16 MiB: silent.
    r, out = _rules(_write(tmp_path, _leaky_steps(kept=MiB, temp=4 * MiB)))
    assert r["memory_leaks"].suspects.height == 1
    _silent(out, "memory_growth")
    _, out = _rules(_write(tmp_path, _leaky_steps(kept=MiB, temp=4 * MiB), "b.pickle"),
                    Config({"memory_growth.min_growth_bytes": 4 * MiB}))
    assert _only(out, "memory_growth")[0].cost_bytes == 7 * MiB
    nohist = _write(tmp_path, [_seg(1 << 40, [(MiB, "active_allocated", MiB, [])])], "nohist.pickle")
    assert "no allocation history" in _rules(nohist)[1].not_run["memory_growth"]


# --------------------------------------------------------------------------------------
# activation_peak
# --------------------------------------------------------------------------------------

def _timeline(tmp_path: Path, rows: list[list[int]], name: str = "timeline.json") -> Path:
    """A stacked ``export_memory_timeline`` JSON: [times_us, sizes] with 9 columns per sample
    (0 unused; parameter, optimizer_state, input, temporary, activation, gradient,
    autograd_detail, unknown)."""
    f = tmp_path / name
    f.write_text(json.dumps([[10 * i for i in range(len(rows))], rows]))
    return f


def test_activation_peak_from_export(tmp_path: Path) -> None:
    rows = [[0, 100 * MiB, 0, 0, 0, 0, 0, 0, 0],
            [0, 100 * MiB, 0, 0, 20 * MiB, 300 * MiB, 0, 0, 0],  # the peak: 420 MiB
            [0, 100 * MiB, 0, 0, 0, 0, 100 * MiB, 0, 0]]
    r, out = _rules(_timeline(tmp_path, rows))
    (f,) = _only(out, "activation_peak")
    assert f.severity == Severity.INFO and f.cost_bytes == 300 * MiB and f.confidence == 0.9
    # one figure for the fact: the finding reads the analysis' table
    table = r["export_timeline"].at_peak.filter(pl.col("category") == "activation")["pct_of_peak"][0]
    assert f.evidence["peak_bytes"] == 420 * MiB and f.evidence["pct_of_peak"] == table == 71.43
    assert f.evidence["source"] == "export_memory_timeline"
    assert f.title == "Activations are 71 % of the memory peak (300 MiB of 420 MiB)"
    # Only the memory rules that read an export apply; the others say what they need.
    assert "from a memory snapshot" in out.not_run["fragmentation"]
    quiet = [[0, 300 * MiB, 0, 0, 20 * MiB, 100 * MiB, 0, 0, 0]]
    _silent(_rules(_timeline(tmp_path, quiet, "quiet.json"))[1], "activation_peak")  # 24 %


def test_activation_peak_from_snapshot_categories(tmp_path: Path) -> None:
    base = 1 << 40
    ev = _timed([_ev("segment_alloc", base, 64 * MiB), _ev("alloc", base, 10 * MiB, FR["param"]),
                 _ev("alloc", base + 10 * MiB, 30 * MiB, FR["fwd"])])
    doc = {"segments": [_seg(base, [(10 * MiB, "active_allocated", 10 * MiB, FR["param"]),
                                    (30 * MiB, "active_allocated", 30 * MiB, FR["fwd"]),
                                    (24 * MiB, "inactive", 0, [])])], "device_traces": [ev]}
    _, out = _rules(_write(tmp_path, doc))
    (f,) = _only(out, "activation_peak")
    assert f.cost_bytes == 30 * MiB and f.confidence == 0.6
    assert f.evidence["peak_bytes"] == 40 * MiB and f.evidence["pct_of_peak"] == 75.0
    assert {c["category"]: c["bytes"] for c in f.evidence["categories"]} == {"activation": 30 * MiB,
                                                                             "parameter": 10 * MiB}
    _, out = _rules(_write(tmp_path, doc, "b.pickle"), Config({"activation_peak.min_pct_of_peak": 80}))
    _silent(out, "activation_peak")


def test_activation_peak_cannot_decide(tmp_path: Path) -> None:
    # No stacks: every live byte is "unknown"/"pre_recording", so no category can be judged.
    nostack = _write(tmp_path, [_seg(1 << 40, [(8 * MiB, "active_allocated", 8 * MiB, [])])])
    assert "no stacks" in _rules(nostack)[1].not_run["activation_peak"]
    # A plain trace has no memory categories.
    _, out = _rules(_trace(tmp_path, [_mem(10, MiB, MiB, 2 * MiB)]))
    assert out.not_run["activation_peak"] == ("needs export_timeline (from an export_memory_timeline file) or "
                                              "memory_peak (from a memory snapshot)")


# --------------------------------------------------------------------------------------
# All five, on one input: ranking among memory findings
# --------------------------------------------------------------------------------------

def test_memory_findings_rank_by_bytes(tmp_path: Path) -> None:
    cap = 2 * GiB
    ev = []
    total = 0
    for s in range(5):  # leak 64 MiB per step, temporaries up to 1.8 GiB, 3.9 GiB reserved
        t0 = 1000.0 * (s + 1)
        temp = 1800 * MiB - total
        ev += [_mem(t0 + 15, total + temp, temp, 3900 * MiB), _mem(t0 + 500, total, -temp, 3900 * MiB)]
        total += 64 * MiB
        ev.append(_mem(t0 + 600, total, 64 * MiB, 3900 * MiB))
    _, out = _rules(_trace(tmp_path, ev, steps=5, capacities={0: cap}))
    got = [(f.rule_id, f.cost_bytes) for f in out.findings]
    # fragmentation 3900 − 1800 = 2100 MiB; memory_growth 4 × 64 = 256 MiB;
    # memory_capacity 1800 MiB − 90 % of 2048 MiB = 1800 − 1843.2 < 0: silent.
    assert got == [("fragmentation", 2100 * MiB), ("memory_growth", 256 * MiB)]


@pytest.mark.parametrize("rule_id", ["memory_capacity", "oom", "fragmentation", "memory_growth", "activation_peak"])
def test_docstring_shape(rule_id: str) -> None:
    from traceanalyzer.rules import registry

    doc = registry()[rule_id].doc
    positions = [doc.find(f"\n{h}\n") for h in ("Signal", "Threshold", "Cost", "Fix")]
    assert all(p > 0 for p in positions) and positions == sorted(positions), doc
    for p in registry()[rule_id].params:
        assert f"``{p}``" in doc, f"{rule_id}: parameter {p} undocumented"
