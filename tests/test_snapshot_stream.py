"""The streaming snapshot reader gives the same model as the C unpickler, refuses the
same hostile files, and does not keep the trace entries it has converted."""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceanalyzer.load.snapshot as snapshot_mod
from traceanalyzer.errors import InputError
from traceanalyzer.load.pickle_stream import stream_load
from traceanalyzer.load.safe_pickle import UnsafePickleError
from traceanalyzer.load.snapshot import load_snapshot
from traceanalyzer.model.memory import SnapshotModel
from traceanalyzer.pipeline import run_analyses

SHARED = Path(__file__).resolve().parents[2] / "shared"
SNAPS = SHARED / "data" / "snapshots"
TOOLS = SHARED / "tools"
DATA = Path(__file__).resolve().parent / "data"
needs_shared = pytest.mark.skipif(not SNAPS.exists(), reason="../shared/data/snapshots not available")

ALL_SHARED = (sorted(SNAPS.glob("*.pickle")) + sorted(SNAPS.glob("synthetic/*.pickle"))) if SNAPS.exists() else []
TABLES = ("segments", "blocks", "trace", "frames", "annotations")
MEMORY_ANALYSES = ("memory_timeline", "memory_peak", "memory_fragmentation", "memory_leaks", "memory_oom")


def _assert_same(a: SnapshotModel, b: SnapshotModel) -> None:
    for t in TABLES:
        assert a.table(t).equals(b.table(t)), t
    assert a.meta == b.meta
    assert a.warnings == b.warnings


def _analyses_json(m: SnapshotModel) -> dict[str, Any]:
    r = run_analyses(m)
    return {k: r[k].to_json() for k in MEMORY_ANALYSES if k in r and hasattr(r[k], "to_json")}


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("path", ALL_SHARED + sorted(DATA.glob("*.pickle")), ids=lambda p: p.name)
def test_streaming_equals_c_unpickler_on_shared_snapshots(path: Path) -> None:
    old = load_snapshot(path, streaming=False)
    new = load_snapshot(path, streaming=True)
    _assert_same(old, new)
    assert _analyses_json(old) == _analyses_json(new)


def _generated(tmp_path: Path, version: str, steps: int, **kw: Any) -> Path:
    sys.path.insert(0, str(TOOLS))
    try:
        from make_snapshot_like import make_snapshot  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TOOLS))
    snap = make_snapshot(version, "all", "python", steps, 4, seed=3, **kw)
    f = tmp_path / f"gen_{version}.pickle"
    f.write_bytes(pickle.dumps(snap, protocol=kw.pop("protocol", 4)))
    return f


@needs_shared
@pytest.mark.parametrize("version,kw", [
    ("2.13", {"with_oom": True, "device_count": 2}),
    ("2.6", {}),
    ("2.0", {}),
    ("2.13", {"max_entries": 300}),
])
def test_streaming_equals_c_unpickler_on_generated_snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             version: str, kw: dict[str, Any]) -> None:
    # Small conversion chunks: several flushes per device, and stacks met in a
    # different order than the C path meets them (canonical renumbering).
    monkeypatch.setattr(snapshot_mod, "_CHUNK", 97)
    f = _generated(tmp_path, version, 40, **kw)
    old = load_snapshot(f, streaming=False)
    new = load_snapshot(f, streaming=True)
    assert new.trace.height > 300 or kw
    _assert_same(old, new)
    assert _analyses_json(old) == _analyses_json(new)


def _entry(i: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": "alloc" if i % 2 == 0 else "free_requested", "addr": 4096 * (i // 2), "size": 512,
            "stream": 0, "time_us": 1000 + i, "frames": frames}


def test_stream_load_hands_entries_to_the_sink_and_keeps_none() -> None:
    # GIVEN 2,500 entries (3 APPENDS batches) sharing one frames list, on two devices
    frames = [{"name": "f", "filename": "a.py", "line": 3}]
    doc = {"segments": [], "device_traces": [[_entry(i, frames) for i in range(2500)], [_entry(0, frames)]],
           "other": [[1, 2], (3, "x")]}
    got: list[tuple[int, int]] = []
    seen: dict[int, int] = {}

    def sink(target: list[Any], items: list[Any]) -> None:
        got.append((seen.setdefault(id(target), len(seen)), len(items)))

    # WHEN streamed
    out = stream_load(io.BytesIO(pickle.dumps(doc, protocol=4)), sink)
    # THEN the device lists come back empty, the sink saw every entry in order, the rest is intact
    assert out["device_traces"] == [[], []]
    assert got == [(0, 1000), (0, 1000), (0, 500), (1, 1)]
    assert out["other"] == [[1, 2], (3, "x")] and out["segments"] == []


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_stream_load_round_trips_plain_data(protocol: int) -> None:
    shared = ["shared"]
    doc = {"ints": [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**63, 2**64 - 1, -(2**70), 10**40],
           "floats": [0.5, -1e300, float("inf")], "s": ["", "é", "x" * 300, "y" * 70000],
           "t": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
           "none": None, "bools": [True, False], "same": [shared, shared],
           "nested": {"k": [{"a": {"b": [1]}}]}}
    # Older protocols pickle these through a class (REDUCE), which is refused by design.
    if protocol >= 3:
        doc["b"] = [b"\x00\xff", b"z" * 300]
    if protocol >= 4:
        doc.update(set={1, 2}, fs=frozenset({3}))
    if protocol >= 5:
        doc["ba"] = bytearray(b"ab")
    out = stream_load(io.BytesIO(pickle.dumps(doc, protocol=protocol)), lambda t, i: t.extend(i))
    assert out == doc
    assert out["same"][0] is out["same"][1]


def _hostile(kind: str, marker: Path) -> bytes:
    cmd = f"touch {marker}".encode()
    if kind == "global_reduce":
        return b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"q\x01\x85q\x02Rq\x03."
    if kind == "stack_global":
        def u(s: bytes) -> bytes:
            return b"\x8c" + bytes([len(s)]) + s
        inner = u(b"os") + u(b"system") + b"\x93" + b"X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R"
        return b"\x80\x04}" + u(b"segments") + b"]" + u(b"device_traces") + inner + b"\x86u."
    if kind == "inst":
        return b"\x80\x02(S'" + cmd + b"'\nios\nsystem\n."
    if kind == "persid":
        return b"\x80\x02P1\n."
    if kind == "ext1":
        return b"\x80\x02\x82\x01."
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,opcode", [("global_reduce", "GLOBAL 'os system'"), ("stack_global", "STACK_GLOBAL"),
                                         ("inst", "INST 'os system'"), ("persid", "PERSID"), ("ext1", "EXT1")])
def test_streaming_refuses_hostile_pickles(tmp_path: Path, kind: str, opcode: str) -> None:
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.pickle"
    f.write_bytes(_hostile(kind, marker))
    with pytest.raises(UnsafePickleError, match=opcode):
        stream_load(io.BytesIO(f.read_bytes()), lambda t, i: None)
    with pytest.raises(InputError) as info:
        load_snapshot(f, streaming=True)
    msg = str(info.value)
    assert "refused" in msg and opcode in msg and "\n" not in msg and str(f) in msg
    assert not marker.exists()


@pytest.mark.parametrize("data", [b"\x80\x04", b"\x80\x04\xff\xff\xff", b"\x80\x04}\x94(\x8c\x08segments",
                                  pickle.dumps({"segments": [1, 2, 3]}, protocol=4)[:-5],
                                  b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"abc",  # forged length
                                  b"\x80\x04r" + (1 << 31).to_bytes(4, "little") + b"."])       # memo index far off
def test_streaming_corrupt_files_give_one_line_errors(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "bad.pickle"
    f.write_bytes(data)
    with pytest.raises(InputError) as info:
        load_snapshot(f, streaming=True)
    msg = str(info.value)
    assert "\n" not in msg and ("corrupt" in msg or "truncated" in msg)


def test_reference_to_an_absorbed_entry_falls_back_to_the_c_unpickler(tmp_path: Path) -> None:
    # GIVEN a (legal but unusual) pickle whose annotations list re-uses a trace entry object
    frames = [{"name": "f", "filename": "a.py", "line": 3}]
    entries = [_entry(i, frames) for i in range(1500)]
    doc = {"segments": [], "device_traces": [entries], "external_annotations": [entries[3]]}
    f = tmp_path / "odd.pickle"
    f.write_bytes(pickle.dumps(doc, protocol=4))
    # WHEN loaded with streaming requested THEN the result is the C unpickler's
    new = load_snapshot(f, streaming=True)
    old = load_snapshot(f, streaming=False)
    _assert_same(old, new)
    assert new.trace.height == 1500
    assert new.trace["event_idx"].to_list() == list(range(1500))
    assert new.trace.filter(pl.col("action") == "alloc").height == 750


def test_stream_load_across_tiny_read_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Refills land inside strings, long ints and frames: same result as pickle.loads.
    import traceanalyzer.load.pickle_stream as ps
    monkeypatch.setattr(ps, "_BLOCK", 1000)
    monkeypatch.setattr(ps, "_MARGIN", 300)
    frames = [{"name": "f" * 40, "filename": "a.py", "line": 3}]
    doc = {"segments": [{"x": "s" * 5000, "n": 2**200}], "device_traces": [[_entry(i, frames) for i in range(3000)]]}
    got: list[Any] = []
    out = stream_load(io.BytesIO(pickle.dumps(doc, protocol=4)), lambda t, i: got.extend(i))
    assert out["segments"] == doc["segments"]
    assert got == doc["device_traces"][0]
