"""Snapshot analyses: replay, peak, fragmentation, leaks, OOM — checked against an
independent replay written here (plain dict bookkeeping, no project code)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._memory import live_at
from traceanalyzer.load.snapshot import load_snapshot

SHARED = Path(__file__).resolve().parents[2] / "shared"
SNAPS = SHARED / "data" / "snapshots"
needs_shared = pytest.mark.skipif(not SNAPS.exists(), reason="../shared/data/snapshots not available")
CONSISTENT = ([p for p in sorted(SNAPS.glob("*.pickle")) + sorted(SNAPS.glob("synthetic/*.pickle"))
               if "mosaic" not in p.name] if SNAPS.exists() else [])


def reference_replay(doc: Any, device: int) -> dict[str, int]:
    """Independent replay: MemoryViz-style backwards reconstruction of the initial
    state from the dumped blocks, then a forward walk keeping a dict of live blocks."""
    segs = doc if isinstance(doc, list) else doc["segments"]
    traces = [] if isinstance(doc, list) else doc.get("device_traces", [])
    entries = traces[device] if device < len(traces) else []
    final_alloc = sum(b["requested_size"] for s in segs if s["device"] == device for b in s["blocks"]
                      if b["state"] == "active_allocated")
    final_res = sum(s["total_size"] for s in segs if s["device"] == device)
    delta_alloc = delta_res = 0
    for e in entries:
        a = e["action"]
        if a == "alloc":
            delta_alloc += e["size"]
        elif a == "free_requested":
            delta_alloc -= e["size"]
        elif a in ("segment_alloc", "segment_map"):
            delta_res += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            delta_res -= e["size"]
    cur = final_alloc - delta_alloc
    res = final_res - delta_res
    peak, peak_res, peak_idx = cur, res, -1
    live: dict[int, int] = {}
    for i, e in enumerate(entries):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif a == "free_requested":
            live.pop(e["addr"], None)
            cur -= e["size"]
        elif a in ("segment_alloc", "segment_map"):
            res += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            res -= e["size"]
        if cur > peak:
            peak, peak_idx = cur, i
        peak_res = max(peak_res, res)
    return {"peak": peak, "peak_idx": peak_idx, "final": cur, "peak_reserved": peak_res}


def _unpickle_trusted_test_file(path: Path) -> Any:
    # Test-only: these are our own reference files; the product never does this.
    with path.open("rb") as f:
        return pickle.load(f)  # noqa: S301


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("path", CONSISTENT, ids=lambda p: p.name)
def test_peak_matches_independent_replay(path: Path) -> None:
    doc = _unpickle_trusted_test_file(path)
    m = load_snapshot(path)
    r = run_analyses(m, strict=True)
    tl = r["memory_timeline"]
    for dev in tl.devices:
        ref = reference_replay(doc, dev.device)
        assert dev.peak_allocated == ref["peak"], path.name
        assert dev.peak_allocated_idx == ref["peak_idx"]
        assert dev.final_allocated == ref["final"]
        assert dev.peak_reserved == ref["peak_reserved"]
        assert dev.invariants["ok"], dev.invariants
        # what is live at the peak adds up to the peak
        live = live_at(tl.allocations, dev.device, dev.peak_allocated_idx)
        assert int(live["bytes"].sum()) == dev.peak_allocated
    peak = r["memory_peak"]
    assert peak.peak_allocated_bytes == reference_replay(doc, peak.device)["peak"]
    assert abs(float(peak.categories["pct_of_peak"].sum()) - 100.0) < 0.1 or peak.peak_allocated_bytes == 0
    assert "memory_fragmentation" in r


@needs_shared
@pytest.mark.shared
def test_magma27_known_peak() -> None:
    r = run_analyses(load_snapshot(SNAPS / "MAGMA27__memory_snapshot.pickle"), strict=True)
    p = r["memory_peak"]
    assert p.peak_allocated_bytes == 13_923_997_700
    assert p.peak_event_idx == 1402
    assert p.top_sites["site"][0].startswith("forward (cs336_basics/model.py:")
    assert set(p.categories["category"]) <= {"activation", "pre_recording", "unknown", "temporary",
                                             "gradient", "parameter", "optimizer_state"}


@needs_shared
@pytest.mark.shared
def test_synthetic_oom_and_categories() -> None:
    r = run_analyses(load_snapshot(SNAPS / "synthetic" / "snap_2.13_state_oom.pickle"), strict=True)
    o = r["memory_oom"]
    assert o.requested_bytes == 80 << 30 and o.device_free_bytes == 123 << 20
    assert o.verdict == "capacity"
    assert o.allocated_bytes == int(o.categories["bytes"].sum())
    p = run_analyses(load_snapshot(SNAPS / "synthetic" / "snap_2.13.pickle"), strict=True)["memory_peak"]
    cats = dict(zip(p.categories["category"], p.categories["bytes"]))
    assert cats["optimizer_state"] == 6 * (8 << 20)
    assert cats["gradient"] == 6 * (4 << 20)
    assert "activation" in cats


@needs_shared
@pytest.mark.shared
def test_ring_buffer_truncation_reconstructs_initial_state() -> None:
    full = run_analyses(load_snapshot(SNAPS / "synthetic" / "snap_2.13.pickle"), strict=True)["memory_timeline"]
    ring = run_analyses(load_snapshot(SNAPS / "synthetic" / "snap_2.13_ring50.pickle"), strict=True)["memory_timeline"]
    # the last 50 events of the full history, replayed from a reconstructed start
    tail = full.series.tail(50)["allocated_bytes"].to_list()
    assert ring.series["allocated_bytes"].to_list() == tail
    assert ring.device(0).invariants["ok"]


# ---------------------------------------------------------------------------------------
# Hand-made snapshots
# ---------------------------------------------------------------------------------------

MiB = 1 << 20
FR = {"leak": [{"name": "remember", "filename": "/home/u/train.py", "line": 10}],
      "tmp": [{"name": "forward", "filename": "/home/u/model.py", "line": 5}]}


def _seg(addr: int, blocks: list[tuple[int, str, int, list]], device: int = 0, expandable: bool = False) -> dict:
    out, a = [], addr
    for size, state, req, frames in blocks:
        out.append({"address": a, "size": size, "requested_size": req, "state": state, "frames": frames})
        a += size
    return {"device": device, "address": addr, "total_size": a - addr,
            "allocated_size": sum(b[0] for b in blocks if b[1] == "active_allocated"),
            "active_size": sum(b[0] for b in blocks if b[1] != "inactive"),
            "requested_size": sum(b[2] for b in blocks if b[1] != "inactive"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": [], "blocks": out}


def _write(tmp_path: Path, doc: Any, name: str = "s.pickle") -> Path:
    f = tmp_path / name
    f.write_bytes(pickle.dumps(doc, protocol=4))
    return f


def _leaky_doc(steps: int = 8) -> dict:
    """Each step: a 4 MiB temporary allocated and freed, and a 1 MiB block that is kept."""
    base = 1 << 40
    ev: list[dict] = [{"action": "segment_alloc", "addr": base, "size": 64 * MiB, "stream": 0}]
    kept = []
    t = 1_700_000_000_000_000
    for s in range(steps):
        tmp = base + 32 * MiB
        ev += [{"action": "alloc", "addr": tmp, "size": 4 * MiB, "stream": 0, "frames": FR["tmp"]},
               {"action": "free_requested", "addr": tmp, "size": 4 * MiB, "stream": 0, "frames": FR["tmp"]},
               {"action": "free_completed", "addr": tmp, "size": 4 * MiB, "stream": 0, "frames": FR["tmp"]}]
        k = base + s * MiB
        ev.append({"action": "alloc", "addr": k, "size": MiB, "stream": 0, "frames": FR["leak"]})
        kept.append(k)
    for i, e in enumerate(ev):
        e["time_us"] = t + i
    blocks = [(MiB, "active_allocated", MiB, FR["leak"]) for _ in kept] + [(64 * MiB - steps * MiB, "inactive", 0, [])]
    return {"segments": [_seg(base, blocks)], "device_traces": [ev]}


def test_leak_suspect_found(tmp_path: Path) -> None:
    r = run_analyses(load_snapshot(_write(tmp_path, _leaky_doc())), strict=True)
    leaks = r["memory_leaks"]
    assert leaks.suspects.height == 1
    row = leaks.suspects.row(0, named=True)
    assert row["site"].startswith("remember (u/train.py:10)")
    assert row["end_bytes"] == 8 * MiB
    assert leaks.live_at_end_bytes == 8 * MiB and leaks.floor_growth_bytes > 0
    peak = r["memory_peak"]
    assert peak.peak_allocated_bytes == 7 * MiB + 4 * MiB  # 7 kept + the last temporary
    assert r["memory_timeline"].device(0).invariants["ok"]


def test_two_devices_expandable_and_pending_free(tmp_path: Path) -> None:
    base0, base1 = 1 << 40, 2 << 40
    ev0 = [{"action": "segment_map", "addr": base0, "size": 2 * MiB, "stream": 0},
           {"action": "alloc", "addr": base0, "size": 2 * MiB, "stream": 7},
           {"action": "free_requested", "addr": base0, "size": 2 * MiB, "stream": 7}]  # pending at dump
    ev1 = [{"action": "segment_alloc", "addr": base1, "size": 20 * MiB, "stream": 0},
           {"action": "alloc", "addr": base1, "size": 10 * MiB, "stream": 0},
           {"action": "alloc", "addr": base1 + 10 * MiB, "size": 6 * MiB, "stream": 0},
           {"action": "free_requested", "addr": base1 + 10 * MiB, "size": 6 * MiB, "stream": 0},
           {"action": "free_completed", "addr": base1 + 10 * MiB, "size": 6 * MiB, "stream": 0},
           {"action": "oom", "device_free": 3 * MiB, "size": 12 * MiB, "stream": 0}]
    doc = {"segments": [_seg(base0, [(2 * MiB, "active_pending_free", 2 * MiB, [])], expandable=True),
                        _seg(base1, [(10 * MiB, "active_allocated", 10 * MiB, []),
                                     (10 * MiB, "inactive", 0, [])], device=1)],
           "device_traces": [ev0, ev1]}
    m = load_snapshot(_write(tmp_path, doc))
    r = run_analyses(m, strict=True)
    tl = r["memory_timeline"]
    d0, d1 = tl.device(0), tl.device(1)
    assert d0.invariants["ok"] and d1.invariants["ok"]
    assert d0.final_allocated == 0 and d0.final_active == 2 * MiB and d0.final_reserved == 2 * MiB
    assert d1.peak_allocated == 16 * MiB and tl.primary.device == 1
    for dev in (0, 1):
        ref = reference_replay(doc, dev)
        assert tl.device(dev).peak_allocated == ref["peak"]
    o = r["memory_oom"]
    assert o.device == 1 and o.requested_bytes == 12 * MiB and o.cached_free_bytes == 10 * MiB
    assert o.verdict == "capacity"
    frag = r["memory_fragmentation"]
    assert frag.expandable_segments and frag.largest_free_block_bytes == 10 * MiB


def test_oom_fragmentation_verdict(tmp_path: Path) -> None:
    base = 1 << 40
    ev = [{"action": "segment_alloc", "addr": base, "size": 40 * MiB, "stream": 0},
          {"action": "alloc", "addr": base, "size": 10 * MiB, "stream": 0},
          {"action": "alloc", "addr": base + 10 * MiB, "size": 10 * MiB, "stream": 0},
          {"action": "alloc", "addr": base + 20 * MiB, "size": 10 * MiB, "stream": 0},
          {"action": "free_requested", "addr": base, "size": 10 * MiB, "stream": 0},
          {"action": "free_completed", "addr": base, "size": 10 * MiB, "stream": 0},
          {"action": "oom", "device_free": 0, "size": 12 * MiB, "stream": 0}]
    doc = {"segments": [_seg(base, [(10 * MiB, "inactive", 0, []), (10 * MiB, "active_allocated", 10 * MiB, []),
                                    (10 * MiB, "active_allocated", 10 * MiB, []), (10 * MiB, "inactive", 0, [])])],
           "device_traces": [ev]}
    r = run_analyses(load_snapshot(_write(tmp_path, doc)), strict=True)
    assert r["memory_oom"].verdict == "fragmentation"
    frag = r["memory_fragmentation"]
    assert frag.free_bytes == 20 * MiB and frag.largest_free_block_bytes == 10 * MiB
    assert frag.fragmentation_pct == 50.0 and frag.inactive_split_blocks == 2


def test_no_history_snapshot_uses_dump_state(tmp_path: Path) -> None:
    doc = [_seg(1 << 40, [(4 * MiB, "active_allocated", 4 * MiB - 100, FR["tmp"]), (2 * MiB, "inactive", 0, [])])]
    r = run_analyses(load_snapshot(_write(tmp_path, doc)), strict=True)
    p = r["memory_peak"]
    assert p.source == "dump" and p.peak_allocated_bytes == 4 * MiB - 100
    assert "memory_leaks" in r.skipped and "memory_oom" in r.skipped
    assert r["memory_fragmentation"].rounding_waste_bytes == 100


def test_cli_memory_command(tmp_path: Path) -> None:
    import json
    import subprocess

    f = _write(tmp_path, _leaky_doc())
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "traceanalyzer", "memory", str(f), "-o", str(out), "-f", "json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Peak allocated" in r.stdout and "Leak suspects" in r.stdout
    doc = json.loads((out / "summary.json").read_text())
    assert doc["kind"] == "snapshot"
    assert doc["analyses"]["memory_peak"]["peak_allocated_bytes"] == 11 * MiB
    # analyze detects the snapshot by content, whatever the extension
    g = tmp_path / "renamed.json"
    g.write_bytes(f.read_bytes())
    r = subprocess.run([sys.executable, "-m", "traceanalyzer", "analyze", str(g), "-o", str(tmp_path / "o2"),
                        "-f", "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o2" / "summary.json").read_text())["kind"] == "snapshot"


def test_allocation_table_schema(tmp_path: Path) -> None:
    r = run_analyses(load_snapshot(_write(tmp_path, _leaky_doc(3))), strict=True)
    a = r["memory_timeline"].allocations
    assert a.schema["addr"] == pl.UInt64 and a.schema["bytes"] == pl.Int64
    assert a.filter(pl.col("alloc_idx") >= 0)["alloc_ts_ns"].null_count() == 0
