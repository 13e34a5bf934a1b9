"""Hostile and degenerate snapshot pickles: bounded time and memory, one-line refusals,
damage counted instead of an internal error (issue 19). Each file is a few KB; limits are
lowered through the budget instead of building gigabytes."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceanalyzer.errors import InputError
from traceanalyzer.load.pickle_budget import PickleBudget
from traceanalyzer.load.snapshot import load_snapshot
from traceanalyzer.pipeline import analyze

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, obj: object, name: str = "s.pickle") -> Path:
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=4))
    return p


def _laughs(levels: int) -> list[Any]:
    """A list whose expanded size doubles per level (each level names the previous twice)."""
    x: list[Any] = [1]
    for _ in range(levels):
        x = [x, x]
    return x


@pytest.mark.parametrize("streaming", [False, True])
def test_memo_references_count_toward_the_object_budget(tmp_path: Path, streaming: bool) -> None:
    big = list(range(1000))  # memoized once, referenced 100 times: 100,000 objects counted
    p = _write(tmp_path, {"segments": [], "device_traces": [], "extra": [big] * 100})
    assert p.stat().st_size < 5000
    with pytest.raises(InputError) as e:
        load_snapshot(p, streaming=streaming, budget=PickleBudget(max_objects=50_000))
    msg = str(e.value)
    assert "max_objects = 50,000" in msg and "TRACEANALYZER_SNAPSHOT_MAX_OBJECTS" in msg and str(p) in msg
    assert "\n" not in msg
    # under the default budget the same file loads (and the memo copies are never expanded)
    m = load_snapshot(p, streaming=streaming)
    assert m.meta.n_segments == 0


def test_exponential_memo_nesting_is_refused_by_default(tmp_path: Path) -> None:
    p = _write(tmp_path, {"segments": [{"address": 0, "total_size": 0, "blocks": [],
                                        "segment_pool_id": _laughs(40)}]})
    assert p.stat().st_size < 1000
    with pytest.raises(InputError, match="max_objects"):
        load_snapshot(p)


def test_nested_pool_id_and_frame_fields_are_missing_not_printed(tmp_path: Path) -> None:
    """With the object budget lifted, the loader itself stays linear: a nested pool id is
    never str()-ed (2**40 elements), frame names that are not strings are counted."""
    frames = [{"name": [i], "filename": "a.py", "line": 3} for i in range(3)]
    frames.append({"name": "ok", "filename": {"x": 1}, "line": "7"})
    seg = {"device": 0, "address": 4096, "total_size": 512, "segment_pool_id": _laughs(40),
           "frames": [], "blocks": [{"address": 4096, "size": 512, "state": "active_allocated",
                                     "requested_size": 512, "frames": frames}]}
    p = _write(tmp_path, {"segments": [seg], "device_traces": [[]], "allocator_settings": 5})
    m = load_snapshot(p, budget=PickleBudget(max_objects=10**15))
    w = "\n".join(m.warnings)
    assert "3 frames with a non-string name (treated as missing)" in w
    assert "1 frames with a non-string filename (treated as missing)" in w
    assert "1 frames with a non-integer line (treated as missing)" in w
    assert "1 values of segment_pool_id not a flat pair of integers" in w
    assert m.segments["pool_id"].to_list() == ["0,0"]
    assert m.frames["name"].to_list() == [None, None, None, "ok"]
    assert m.frames["line"].to_list() == [3, 3, 3, None]


def test_wrong_typed_segment_and_block_fields_are_counted(tmp_path: Path) -> None:
    seg = {"device": "cuda:0", "address": 4096, "total_size": [512], "stream": {"s": 1},
           "segment_type": 7, "blocks": [{"address": 4096, "size": "512", "state": ["active"]}]}
    p = _write(tmp_path, {"segments": [seg], "device_traces": [[{"action": ["alloc"], "addr": 4096,
                                                                "size": 512, "frames": []}]]})
    m = load_snapshot(p)
    w = "\n".join(m.warnings)
    for what in ("segment device not an integer", "segment total_size not an integer",
                 "segment stream not an integer", "segment_type not a string", "block size not an integer",
                 "block state not a string", "action not a string"):
        assert f"1 values of {what} (treated as missing" in w, what
    assert m.blocks["bytes"].to_list() == [0] and m.blocks["state"].to_list() == [None]


def test_memo_repeated_segments_are_read_once(tmp_path: Path) -> None:
    blocks = [{"address": 4096 + 512 * i, "size": 512, "state": "inactive"} for i in range(100)]
    seg = {"device": 0, "address": 4096, "total_size": 51200, "blocks": blocks}
    other = {"device": 0, "address": 1 << 30, "total_size": 51200, "blocks": blocks}  # shares the list
    p = _write(tmp_path, {"segments": [seg] * 1000 + [other], "device_traces": [[]]})
    m = load_snapshot(p)
    assert m.meta.n_segments == 2 and m.meta.n_blocks == 100
    assert any("999 segments and 100 blocks repeat an object already read" in x for x in m.warnings)


def test_blocks_sharing_an_address_are_dropped_and_analysis_stays_small(tmp_path: Path) -> None:
    """1,000 live blocks at one address made the replay's address joins 10⁹ rows (aborted)."""
    a = 1 << 30
    blocks = [{"address": a, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": []}
              for _ in range(1000)]
    segs = [{"device": 0, "address": a, "total_size": 512, "blocks": [b]} for b in blocks]
    tr: list[dict[str, Any]] = [{"action": act, "addr": a, "size": 512, "stream": 0, "time_us": i, "frames": []}
          for i in range(500) for act in ("alloc", "free_completed")]
    p = _write(tmp_path, {"segments": segs, "device_traces": [tr]})
    m = load_snapshot(p)
    assert m.meta.n_blocks == 1
    assert any(x.startswith("999 blocks share a device and address") for x in m.warnings)
    rep = analyze(p)
    assert not rep.results.failed
    assert sorted(rep.results.values) == ["memory_fragmentation", "memory_leaks", "memory_peak", "memory_timeline"]
    from traceanalyzer.compare.diff import compare_paths

    q = _write(tmp_path, {"segments": segs[:500], "device_traces": [tr]}, "b.pickle")
    cmp = compare_paths(str(p), str(q))
    assert not cmp.baseline.errors and not cmp.candidate.errors


@pytest.mark.parametrize("streaming", [False, True])
def test_string_and_container_limits(tmp_path: Path, streaming: bool) -> None:
    seg = {"device": 0, "address": 0, "total_size": 0, "blocks": [], "frames": [{"name": "x" * 1000}]}
    p = _write(tmp_path, {"segments": [seg], "device_traces": [[]]})
    with pytest.raises(InputError, match="max_string_bytes = 100.*TRACEANALYZER_SNAPSHOT_MAX_STRING_BYTES"):
        load_snapshot(p, streaming=streaming, budget=PickleBudget(max_string_bytes=100))
    p = _write(tmp_path, {"segments": [], "device_traces": [[]], "x": list(range(1000))})
    with pytest.raises(InputError, match="max_items = 500"):
        load_snapshot(p, streaming=streaming, budget=PickleBudget(max_items=500))


@pytest.mark.parametrize("streaming", [False, True])
def test_nesting_depth_limit(tmp_path: Path, streaming: bool) -> None:
    x: list[Any] = []
    for _ in range(50):
        x = [x]
    p = _write(tmp_path, {"segments": [], "deep": x})
    with pytest.raises(InputError, match="max_depth = 20"):
        load_snapshot(p, streaming=streaming, budget=PickleBudget(max_depth=20))
    assert load_snapshot(p, streaming=streaming).meta.n_segments == 0


def _raw_pickle(body: bytes) -> bytes:
    """A protocol-4 pickle of ``{"segments": [], "x": <body>}`` (``body`` pushes one object)."""
    return (b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x01x\x94" + body + b"u.")


@pytest.mark.parametrize("shape", ["appends", "marks", "tuples", "memo"])
def test_streaming_reader_refuses_deep_nesting_at_once(tmp_path: Path, shape: str) -> None:
    # GIVEN 100,000 levels built four ways: EMPTY_LIST pushes closed by single APPENDs (no
    # MARK at all), nested MARK ... LIST, nested 1-tuples (whose hashing once cost depth
    # squared), and lists built one memo reference inside the next
    n = 100_000
    if shape == "appends":
        body = b"]" * n + b"a" * (n - 1)
    elif shape == "marks":
        body = b"(" * n + b"l" * n
    elif shape == "tuples":
        body = b"K\x01" + b"\x85" * n
    else:  # memo slot 0 holds the last level; each new list appends it, then takes the slot
        body = b"]q\x000" + b"]h\x00aq\x000" * n + b"h\x00"
    p = tmp_path / "deep.pickle"
    p.write_bytes(_raw_pickle(body))
    # WHEN streamed THEN refused by the depth limit in well under a second of work
    with pytest.raises(InputError, match="max_depth = 100") as e:
        load_snapshot(p, streaming=True)
    assert "TRACEANALYZER_SNAPSHOT_MAX_DEPTH" in str(e.value) and "\n" not in str(e.value)
    # and the small-file path (opcode scan) refuses it the same way
    with pytest.raises(InputError, match="max_depth = 100"):
        load_snapshot(p, streaming=False)


def test_streaming_reader_counts_memo_references_of_nested_containers(tmp_path: Path) -> None:
    # GIVEN billion laughs: 40 levels, each a list naming the previous level twice
    p = _write(tmp_path, {"segments": [], "x": _laughs(40)})
    # WHEN streamed THEN refused by max_objects while reading, in a moment
    with pytest.raises(InputError, match="max_objects = 500,000,000"):
        load_snapshot(p, streaming=True)
    # and a lowered limit trips on a flat list referenced a few times
    big = list(range(1000))
    p = _write(tmp_path, {"segments": [], "x": [big] * 20}, "flat.pickle")
    with pytest.raises(InputError, match="max_objects = 10,000"):
        load_snapshot(p, streaming=True, budget=PickleBudget(max_objects=10_000))
    assert load_snapshot(p, streaming=True, budget=PickleBudget(max_objects=30_000)).meta.n_segments == 0


def test_every_snapshot_path_is_budgeted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The C unpickler only takes bytes the opcode scan passed: a plain file over the scan
    # limit is never unpickled by it, but streamed (with the same budget).
    from traceanalyzer.load import snapshot as snapshot_mod
    from traceanalyzer.load.safe_pickle import DEFAULT_SCAN_LIMIT
    from traceanalyzer.load.snapshot import _TooLargeToBuild, read_snapshot_object

    p = _write(tmp_path, {"segments": [], "x": _laughs(40), "pad": "p" * 4000})
    with pytest.raises(_TooLargeToBuild):
        read_snapshot_object(p, scan_limit=1000)
    assert snapshot_mod.STREAM_MIN_BYTES == DEFAULT_SCAN_LIMIT
    monkeypatch.setattr(snapshot_mod, "STREAM_MIN_BYTES", 1000)
    with pytest.raises(InputError, match="max_objects"):
        load_snapshot(p)  # streamed by size


def test_gzip_bomb_refused_by_ratio(tmp_path: Path) -> None:
    p = tmp_path / "bomb.pickle.gz"
    p.write_bytes(gzip.compress(pickle.dumps({"segments": [], "pad": b"\0" * (40 << 20)}, protocol=4), 6))
    assert p.stat().st_size < 100_000
    with pytest.raises(InputError, match="max_gzip_ratio = 100"):
        load_snapshot(p)


def test_env_var_raises_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEANALYZER_SNAPSHOT_MAX_OBJECTS", "123")
    monkeypatch.setenv("TRACEANALYZER_SNAPSHOT_MAX_DEPTH", "bogus")
    b = PickleBudget.from_env()
    assert b.max_objects == 123 and b.max_depth == PickleBudget().max_depth


def test_cli_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    p = _write(tmp_path, {"segments": [{"address": 0, "blocks": [], "segment_pool_id": _laughs(40)}]})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "traceanalyzer", "analyze", str(p), "-o", str(tmp_path / "o"),
                        "--format", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "max_objects" in r.stderr


def _snapshot(n_segs: int = 40, n_entries: int = 300) -> dict[str, Any]:
    segs = [{"device": 0, "address": 1 << 20 * (i + 1), "total_size": 1024, "segment_pool_id": (0, 0),
             "blocks": [{"address": 1 << 20 * (i + 1), "size": 1024, "state": "inactive", "frames": []}]}
            for i in range(n_segs)]
    tr: list[dict[str, Any]] = [{"action": "alloc" if i % 2 == 0 else "free_completed", "addr": 1 << 20, "size": 1024,
           "stream": 0, "time_us": i, "frames": []} for i in range(n_entries)]
    return {"segments": segs, "device_traces": [tr]}


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
def test_cut_short_keeps_what_precedes_the_cut(tmp_path: Path, gz: bool, streaming: bool) -> None:
    data = pickle.dumps(_snapshot(), protocol=4)
    full = load_snapshot(_write(tmp_path, _snapshot(), "full.pickle"))
    assert full.meta.n_segments == 40 and full.meta.n_trace_entries == 300
    for frac, seg_range, entry_range in ((0.2, (5, 39), (0, 0)), (0.8, (40, 40), (100, 299))):
        cut = data[: int(len(data) * frac)]
        p = tmp_path / f"cut{frac}.pickle"
        p.write_bytes(gzip.compress(data)[: int(len(gzip.compress(data)) * frac)] if gz else cut)
        if gz and frac == 0.2:
            continue  # deflate blocks: a gzip cut this early may hold nothing unpacked
        m = load_snapshot(p, streaming=streaming)
        assert seg_range[0] <= m.meta.n_segments <= seg_range[1], (frac, m.meta.n_segments)
        assert entry_range[0] <= m.meta.n_trace_entries <= entry_range[1], (frac, m.meta.n_trace_entries)
        assert any(w.startswith("snapshot cut short at byte") for w in m.warnings)


def test_cut_before_anything_usable_is_refused(tmp_path: Path) -> None:
    data = pickle.dumps(_snapshot(), protocol=4)
    p = tmp_path / "head.pickle"
    p.write_bytes(data[:12])
    with pytest.raises(InputError, match="truncated"):
        load_snapshot(p)


def test_gzip_appends_bomb_refused_before_parsing(tmp_path: Path) -> None:
    """A gzip of one pending APPENDS over 50 M opcodes (≈ 50 KB): refused from its declared
    size after a bare unpack, not after parsing every opcode (a 10⁹ version ran minutes)."""
    import time

    p = tmp_path / "appends.pickle.gz"
    p.write_bytes(gzip.compress(b"\x80\x04}(\x8c\x08segments](" + b"N" * (50 << 20) + b"eu.", 9))
    assert p.stat().st_size < 200_000
    t = time.perf_counter()
    for streaming in (False, True):
        with pytest.raises(InputError, match="max_gzip_ratio"):
            load_snapshot(p, streaming=streaming)
    assert time.perf_counter() - t < 20


def _small_snapshot() -> dict[str, Any]:
    fr = [{"name": "f", "filename": "a.py", "line": 1}]
    seg = {"device": 0, "address": 4096, "total_size": 512, "segment_type": "large", "segment_pool_id": (0, 0),
           "frames": [], "blocks": [{"address": 4096, "size": 512, "state": "active_allocated",
                                     "requested_size": 512, "frames": fr}]}
    tr = [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "frames": fr,
           "compile_context": "c", "user_metadata": "u"}]
    return {"segments": [seg], "device_traces": [tr], "allocator_settings": {"expandable_segments": False},
            "external_annotations": [{"device": 0, "time_us": 1, "name": "n", "stage": "START"}]}


_PLACES = {
    "action": lambda d, x: d["device_traces"][0][0].__setitem__("action", x),
    "addr": lambda d, x: d["device_traces"][0][0].__setitem__("addr", x),
    "compile_context": lambda d, x: d["device_traces"][0][0].__setitem__("compile_context", x),
    "user_metadata": lambda d, x: d["device_traces"][0][0].__setitem__("user_metadata", x),
    "allocator_setting": lambda d, x: d["allocator_settings"].__setitem__("expandable_segments", x),
    "annotation_name": lambda d, x: d["external_annotations"][0].__setitem__("name", x),
    "segment_type": lambda d, x: d["segments"][0].__setitem__("segment_type", x),
    "block_state": lambda d, x: d["segments"][0]["blocks"][0].__setitem__("state", x),
    "trace_frames": lambda d, x: d["device_traces"][0][0].__setitem__("frames", x),
    "device_trace": lambda d, x: d["device_traces"].append(x),
}


@pytest.mark.parametrize("place", sorted(_PLACES))
def test_memo_shared_nested_value_in_any_field_stays_cheap(tmp_path: Path, place: str) -> None:
    """A 2**27-element memo-shared list (≈ 400 bytes, under the object budget) in a field
    that expects a scalar: treated as missing, in well under a second of loading (str() or
    polars' conversion of it took minutes and gigabytes)."""
    import time

    d = _small_snapshot()
    _PLACES[place](d, _laughs(27))
    p = _write(tmp_path, d)
    t = time.perf_counter()
    m = load_snapshot(p)
    assert time.perf_counter() - t < 10
    assert m.meta.n_segments == 1
    if place == "allocator_setting":
        assert m.meta.allocator_settings == {} and any("allocator_settings entries" in w for w in m.warnings)
