"""Loading snapshot pickles of every release and layout into typed tables."""

from __future__ import annotations

import gzip
import pickle
import sys
from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.errors import InputError
from traceanalyzer.load import load, sniff
from traceanalyzer.load.snapshot import load_snapshot
from traceanalyzer.model.memory import SNAPSHOT_SCHEMAS, SnapshotModel

SHARED = Path(__file__).resolve().parents[2] / "shared"
SNAPS = SHARED / "data" / "snapshots"
DATA = Path(__file__).resolve().parent / "data"
needs_shared = pytest.mark.skipif(not SNAPS.exists(), reason="../shared/data/snapshots not available")

ALL_SHARED = sorted(SNAPS.glob("*.pickle")) + sorted(SNAPS.glob("synthetic/*.pickle")) if SNAPS.exists() else []


def _check_schema(m: SnapshotModel) -> None:
    for name, schema in SNAPSHOT_SCHEMAS.items():
        df = m.table(name)
        assert dict(df.schema) == schema, name


def _segment(addr: int, blocks: list[tuple[int, str, int]], device: int = 0, stream: int = 0) -> dict:
    out_blocks = []
    a = addr
    for size, state, req in blocks:
        out_blocks.append({"address": a, "size": size, "requested_size": req, "state": state, "frames": []})
        a += size
    return {
        "device": device, "address": addr, "total_size": sum(b[0] for b in blocks),
        "allocated_size": sum(b[0] for b in blocks if b[1] == "active_allocated"),
        "active_size": sum(b[0] for b in blocks if b[1] != "inactive"),
        "requested_size": sum(b[2] for b in blocks if b[1] != "inactive"),
        "stream": stream, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [], "blocks": out_blocks,
    }


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("path", ALL_SHARED, ids=lambda p: p.name)
def test_every_shared_snapshot_loads(path: Path) -> None:
    assert sniff(path) == "snapshot"
    m = load(path)
    assert isinstance(m, SnapshotModel) and m.kind == "snapshot"
    _check_schema(m)
    assert m.meta.n_segments == m.segments.height > 0
    assert m.meta.to_json()["path"] == str(path)
    # blocks tile their segments (synthetic mosaic file excepted: it is not allocator-consistent)
    if "mosaic" not in path.name:
        sums = m.blocks.group_by("segment_idx").agg(pl.col("bytes").sum())
        joined = m.segments.join(sums, on="segment_idx")
        assert (joined["total_bytes"] == joined["bytes"]).all()


@needs_shared
@pytest.mark.shared
def test_legacy_2_0_layout() -> None:
    m = load_snapshot(SNAPS / "Yiyi__oom_snapshot.pickle")
    assert m.meta.layout == "dict-legacy" and m.meta.release_hint == "2.0"
    # legacy blocks have no address: computed contiguously from the segment base
    first = m.segments.row(0, named=True)
    blocks = m.blocks.filter(pl.col("segment_idx") == first["segment_idx"])
    assert blocks["address"][0] == first["address"]
    # live legacy blocks take their stack from history
    assert m.blocks.filter(pl.col("state") == "active_allocated")["stack_id"].null_count() < 460
    assert m.frames.height > 0


@needs_shared
@pytest.mark.shared
def test_frames_are_deduplicated() -> None:
    m = load_snapshot(SNAPS / "MAGMA27__memory_snapshot.pickle")
    assert m.meta.n_stacks < m.trace.height / 10
    assert m.frames.group_by(["stack_id", "depth"]).len()["len"].max() == 1
    assert m.trace["ts_ns"].null_count() == 0
    assert m.trace["ts_ns"].min() > 1_700_000_000 * 10**9  # epoch ns


def test_bare_segment_list_protocol5_and_u64(tmp_path: Path) -> None:
    segs = [_segment(2**64 - 2**21, [(2**20, "active_allocated", 1000), (2**20, "inactive", 0)])]
    segs[0]["stream"] = 2**64 - 1  # some back-ends write uint64 streams
    segs[0]["blocks"][0]["frames"] = [{"name": "f", "filename": "x.py", "line": 2**64 - 1}]
    f = tmp_path / "segs.pickle"
    f.write_bytes(pickle.dumps(segs, protocol=5))
    m = load(f)
    _check_schema(m)
    assert m.meta.layout == "segments-list" and m.meta.protocol == 5
    assert m.segments["address"][0] == 2**64 - 2**21
    assert m.segments["stream"][0] == 2**64 - 1
    assert m.frames["line"][0] is None  # 2**64-1 = "no line info"
    assert m.trace.height == 0 and not m.meta.has_history


def test_gzip_pickle_and_missing_time(tmp_path: Path) -> None:
    doc = {
        "segments": [_segment(1 << 30, [(2 << 20, "active_allocated", 2 << 20)], device=1)],
        "device_traces": [[], [
            {"action": "segment_alloc", "addr": 1 << 30, "size": 2 << 20, "stream": 0},
            {"action": "alloc", "addr": 1 << 30, "size": 2 << 20, "stream": 0},
        ]],
    }
    f = tmp_path / "snap.pickle.gz"
    f.write_bytes(gzip.compress(pickle.dumps(doc, protocol=4)))
    assert sniff(f) == "snapshot"
    m = load_snapshot(f)
    assert m.meta.devices == (1,)
    assert m.trace["device"].to_list() == [1, 1]
    assert m.trace["ts_ns"].null_count() == 2 and not m.meta.has_time
    assert m.trace["event_idx"].to_list() == [0, 1]


def test_malformed_values_are_input_errors(tmp_path: Path) -> None:
    doc = {"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": "big", "stream": 0}] * 50]}
    f = tmp_path / "bad.pickle"
    f.write_bytes(pickle.dumps(doc, protocol=4))
    with pytest.raises(InputError, match="not integers"):
        load_snapshot(f)


def test_committed_tiny_snapshot_loads() -> None:
    for f in sorted(DATA.glob("*.pickle")):
        m = load(f)
        assert m.kind == "snapshot"


def test_cli_one_line_error_on_hostile_file(tmp_path: Path) -> None:
    import subprocess

    marker = tmp_path / "pwned"
    cmd = f"touch {marker}".encode()
    f = tmp_path / "evil.pickle"
    f.write_bytes(b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"q\x01\x85q\x02Rq\x03.")
    r = subprocess.run([sys.executable, "-m", "traceanalyzer", "analyze", str(f), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "refused" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


def test_a_list_of_non_segments_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    """torch.cuda.memory_snapshot() is a list of segment dicts, empty when nothing was
    allocated; a list of anything else is another pickle, refused with one line naming it."""
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps([1, "a", None], protocol=4))
    with pytest.raises(InputError, match=r"a pickle of a list, but not a memory snapshot \(its items are not "
                                         r"segments; the first is an int\)"):
        load_snapshot(other)
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(pickle.dumps([], protocol=4))
    m = load_snapshot(empty)
    assert m.meta.layout == "segments-list" and m.segments.height == 0
