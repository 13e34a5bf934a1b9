"""Snapshots pickled with protocol 0 (text) and 1 (binary, no PROTO opcode) load exactly as
protocols 2-5 do, on both readers; hostile protocol 0/1 pickles are refused with one line."""

from __future__ import annotations

import gzip
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceanalyzer.errors import InputError
from traceanalyzer.load import load, sniff
from traceanalyzer.load.safe_pickle import UnsafePickleError, legacy_protocol, safe_loads, scan_opcodes
from traceanalyzer.load.snapshot import load_snapshot, read_snapshot_object
from traceanalyzer.model.memory import SnapshotModel
from traceanalyzer.pipeline import build_memory_report
from traceanalyzer.report.json_report import summary

SNAPS = Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots"
DATA = Path(__file__).resolve().parent / "data"
TABLES = ("segments", "blocks", "trace", "frames", "annotations")

# The committed snapshot and a few shared ones of different layouts (legacy 2.0, 2.13 with
# C++ frames, two devices, a real one with traces).
SOURCES = [DATA / "snapshot_2.13_oom_small.pickle"] + [
    SNAPS / n for n in ("Yiyi__oom_snapshot.pickle", "MAGMA27__memory_snapshot.pickle",
                        "synthetic/snap_2.0.pickle", "synthetic/snap_2.13_cpp.pickle",
                        "synthetic/snap_2.13_2dev.pickle", "synthetic/snap_2.13_ring50.pickle")
    if (SNAPS / n).exists()]


def _same(a: SnapshotModel, b: SnapshotModel) -> None:
    for t in TABLES:
        assert a.table(t).equals(b.table(t)), t
    assert a.warnings == b.warnings
    ja, jb = a.meta.to_json(), b.meta.to_json()
    for k in ("path", "file_bytes", "protocol"):
        ja.pop(k), jb.pop(k)
    assert ja == jb


def _summary_without_input(m: SnapshotModel) -> dict[str, Any]:
    doc = summary(build_memory_report(m))
    doc.pop("source")
    for k in ("path", "file_bytes", "protocol"):  # the file itself
        doc["meta"].pop(k)
    return doc


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
@pytest.mark.parametrize("protocol", [0, 1])
def test_protocol_0_and_1_load_like_protocol_4(tmp_path: Path, source: Path, protocol: int) -> None:
    # GIVEN a snapshot, and the same object re-pickled with protocol 0 or 1
    ref = load_snapshot(source)
    obj, _, _ = read_snapshot_object(source)
    f = tmp_path / f"p{protocol}.pickle"
    f.write_bytes(pickle.dumps(obj, protocol=protocol))
    assert f.read_bytes()[:1] != b"\x80"
    # WHEN it is sniffed and loaded by the C unpickler (after the scan) and by the streaming reader
    assert sniff(f) == "snapshot"
    for streaming in (False, True):
        m = load_snapshot(f, streaming=streaming)
        # THEN the tables, warnings and meta are those of the original; the protocol is named
        _same(m, ref)
        assert m.meta.protocol == protocol
    # and summary.json is the same apart from the input's own description
    assert _summary_without_input(load(f)) == _summary_without_input(ref)  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", [0, 1])
def test_gzip_and_truncated_protocol_0_1(tmp_path: Path, protocol: int) -> None:
    src = DATA / "snapshot_2.13_oom_small.pickle"
    ref = load_snapshot(src)
    obj, _, _ = read_snapshot_object(src)
    raw = pickle.dumps(obj, protocol=protocol)
    gz = tmp_path / "p.pickle.gz"
    gz.write_bytes(gzip.compress(raw))
    assert sniff(gz) == "snapshot"
    _same(load_snapshot(gz), ref)
    # cut in the middle: what precedes the cut is kept with a warning, as for protocol 4
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(raw[: len(raw) * 3 // 4])
    m = load_snapshot(cut)
    assert m.meta.protocol == protocol
    assert any("cut short" in w for w in m.warnings)


def test_legacy_protocol_heads() -> None:
    doc = {"segments": [{"address": 1}], "device_traces": [[]]}
    assert legacy_protocol(pickle.dumps(doc, protocol=0)) == 0
    assert legacy_protocol(pickle.dumps(doc, protocol=1)) == 1
    assert legacy_protocol(pickle.dumps([], protocol=0)) == 0
    assert legacy_protocol(pickle.dumps([], protocol=1)) == 1
    assert legacy_protocol(pickle.dumps(doc, protocol=0)[:7]) == 0  # a head cut mid-file
    assert legacy_protocol(pickle.dumps(doc, protocol=4)) is None
    for text in (b"(hello world", b"]]]", b"}{", b"cat\ndog\nbird\n", b"", b"name,value\n"):
        assert legacy_protocol(text) is None, text


@pytest.mark.parametrize("protocol", [0, 1])
def test_plain_data_round_trips_protocol_0_1(protocol: int) -> None:
    doc = {"segments": [{"address": 2**64 - 1, "pool": (0, 0), "f": 1.5, "b": True, "c": False, "n": None,
                         "s": "é\n\\x", "big": -(2**70), "t": (), "t1": (1,), "e": []}],
           "device_traces": [[], []]}
    data = pickle.dumps(doc, protocol=protocol)
    assert scan_opcodes(data) is None  # no PROTO opcode
    assert safe_loads(data) == doc
    assert safe_loads(data, scan_limit=0) == doc


def _p0_reduce(marker: Path) -> bytes:
    # A snapshot-looking protocol-0 dict whose value is os.system(...) via GLOBAL + REDUCE.
    return (b"(dp0\nVsegments\np1\n(lp2\nsVdevice_traces\np3\ncos\nsystem\n(S'touch "
            + str(marker).encode() + b"'\ntRp4\ns.")


def _p0_inst(marker: Path) -> bytes:
    return b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n."


def _p0_obj(marker: Path) -> bytes:
    return b"(cos\nsystem\nS'touch " + str(marker).encode() + b"'\no."


def _p0_build(marker: Path) -> bytes:
    # BUILD on a dict (would call __setstate__ / update a class instance's state).
    return b"(dp0\n(dp1\nVa\nI1\nsb."


def _p1_reduce(marker: Path) -> bytes:
    cmd = f"touch {marker}".encode()
    return b"}q\x00(X\x08\x00\x00\x00segmentsq\x01cos\nsystem\nq\x02X" + len(cmd).to_bytes(4, "little") + cmd \
        + b"\x85Rq\x03u."


HOSTILE = {"p0_global_reduce": (_p0_reduce, "GLOBAL 'os system'"), "p0_inst": (_p0_inst, "INST 'os system'"),
           "p0_obj": (_p0_obj, "GLOBAL 'os system'"), "p0_build": (_p0_build, "BUILD"),
           "p1_global_reduce": (_p1_reduce, "GLOBAL 'os system'")}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("streaming", [False, True], ids=["scan", "stream"])
def test_hostile_protocol_0_1_refused_by_name(tmp_path: Path, name: str, streaming: bool) -> None:
    make, opcode = HOSTILE[name]
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.pickle"
    f.write_bytes(make(marker))
    assert sniff(f) == "snapshot"
    with pytest.raises(InputError) as info:
        load_snapshot(f, streaming=streaming)
    msg = str(info.value)
    assert "\n" not in msg and str(f) in msg
    assert f"refused: opcode {opcode}" in msg
    assert not marker.exists()
    with pytest.raises(UnsafePickleError, match=opcode):
        scan_opcodes(f.read_bytes())


def test_hostile_protocol_0_cli_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.pickle"
    f.write_bytes(_p0_reduce(marker))
    r = subprocess.run([sys.executable, "-m", "traceanalyzer", "memory", str(f), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and not marker.exists()
    assert r.stderr.strip().splitlines() == [
        f"error: {f}: refused: opcode GLOBAL 'os system' at byte 42 can import or call code; "
        "a memory snapshot never contains it"]


def test_protocol_0_budget_is_checked(tmp_path: Path) -> None:
    """The memo ('billion laughs') limit holds for the text PUT/GET of protocol 0 too."""
    from traceanalyzer.load.pickle_budget import PickleBudget

    big = list(range(2000))
    f = tmp_path / "laughs.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "extra": [big] * 600}, protocol=0))
    for streaming in (False, True):
        with pytest.raises(InputError, match="max_objects = 1,000,000"):
            load_snapshot(f, streaming=streaming, budget=PickleBudget(max_objects=1_000_000))
