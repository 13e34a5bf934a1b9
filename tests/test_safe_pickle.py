"""The snapshot reader must refuse every pickle that could run code, without running it."""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from traceanalyzer.errors import InputError
from traceanalyzer.load.safe_pickle import UnsafePickleError, safe_loads, scan_opcodes
from traceanalyzer.load.snapshot import _TooLargeToBuild, load_snapshot, read_snapshot_object


def _reduce_os_system(marker: Path) -> bytes:
    # Hand-made protocol-2 pickle: GLOBAL os.system, args tuple, REDUCE.
    cmd = f"touch {marker}".encode()
    return (b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd
            + b"q\x01\x85q\x02Rq\x03.")


def _stack_global_eval(marker: Path) -> bytes:
    # Protocol-4 STACK_GLOBAL builtins.exec + REDUCE, wrapped in a snapshot-looking dict.
    code = f"open({str(marker)!r}, 'w').write('pwned')".encode()

    def u(s: bytes) -> bytes:
        return b"\x8c" + bytes([len(s)]) + s

    inner = u(b"builtins") + u(b"exec") + b"\x93" + b"X" + len(code).to_bytes(4, "little") + code + b"\x85R"
    return b"\x80\x04}" + u(b"segments") + b"]" + u(b"device_traces") + inner + b"\x86u."


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        import os
        return (os.system, (f"touch {self.marker}",))


HOSTILE: dict[str, Callable[[Path], bytes]] = {
    "reduce_os_system": _reduce_os_system,
    "stack_global_exec": _stack_global_eval,
    "pickled_object_p4": lambda m: pickle.dumps({"segments": [], "device_traces": [[_Evil(m)]]}, protocol=4),
    "pickled_object_p5": lambda m: pickle.dumps([_Evil(m)], protocol=5),
    "pickled_object_p0": lambda m: pickle.dumps(_Evil(m), protocol=0),
    "inst_opcode": lambda m: b"(S'touch " + str(m).encode() + b"'\nios\nsystem\n.",
    "persistent_id": lambda m: b"\x80\x02P1\n.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unpickler-only"])
def test_hostile_pickles_are_refused_without_side_effects(tmp_path: Path, name: str, scan: bool) -> None:
    # GIVEN a hostile pickle whose payload would create a marker file
    marker = tmp_path / "pwned"
    data = HOSTILE[name](marker)
    # WHEN it is loaded with or without the opcode pre-scan
    with pytest.raises((UnsafePickleError, pickle.UnpicklingError)) as info:
        safe_loads(data, scan_limit=(1 << 30) if scan else 0)
    # THEN it is refused and nothing ran
    assert "refused" in str(info.value) or "persistent" in str(info.value).lower()
    assert not marker.exists()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_loader_reports_hostile_file_as_input_error(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    f = tmp_path / "snap.pickle"
    f.write_bytes(HOSTILE[name](marker))
    with pytest.raises(InputError) as info:
        load_snapshot(f)
    assert str(f) in str(info.value)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_hostile_gzip_streamed_path_refused(tmp_path: Path) -> None:
    # Large-file path (the streaming reader, through gzip) must refuse too; the C unpickler
    # never takes bytes the scan has not passed.
    marker = tmp_path / "pwned"
    f = tmp_path / "snap.pickle.gz"
    f.write_bytes(gzip.compress(HOSTILE["pickled_object_p4"](marker)))
    with pytest.raises(InputError, match="refused"):
        load_snapshot(f, streaming=True)
    with pytest.raises(_TooLargeToBuild):
        read_snapshot_object(f, scan_limit=0)
    assert not marker.exists()


def test_scan_names_the_opcode() -> None:
    with pytest.raises(UnsafePickleError, match="GLOBAL 'os system'"):
        scan_opcodes(_reduce_os_system(Path("/nonexistent")))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_round_trips(protocol: int) -> None:
    doc = {"segments": [{"address": 2**64 - 1, "pool": (0, 0), "f": 1.5, "b": True, "n": None,
                         "s": "é", "big": -(2**70)}], "device_traces": [[], []]}
    assert safe_loads(pickle.dumps(doc, protocol=protocol)) == doc
    assert safe_loads(pickle.dumps(doc, protocol=protocol), scan_limit=0) == doc


@pytest.mark.parametrize("data,problem", [
    (b"\x80\x04", "corrupt"),
    (pickle.dumps({"segments": [1, 2, 3]}, protocol=4)[:-5], "corrupt"),
    (b"\x80\x04\xff\xff\xff", "corrupt"),
    (b"hello", "not a pickle"),
])
def test_corrupt_files_give_one_line_errors(tmp_path: Path, data: bytes, problem: str) -> None:
    f = tmp_path / "bad.pickle"
    f.write_bytes(data)
    with pytest.raises(InputError) as info:
        load_snapshot(f)
    msg = str(info.value)
    assert "\n" not in msg and str(f) in msg
    assert problem in msg or "truncated" in msg


def test_not_a_snapshot(tmp_path: Path) -> None:
    f = tmp_path / "x.pickle"
    f.write_bytes(pickle.dumps({"weights": [1, 2]}, protocol=4))
    with pytest.raises(InputError, match="not a memory snapshot"):
        load_snapshot(f)
