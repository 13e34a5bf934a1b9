"""``analyze RUN_DIR`` / several paths: a run's trace and snapshot in one report, the peak on the steps."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from support.events import Trace

from traceanalyzer.analyses.run_memory import MemoryPeak, place_memory_peaks
from traceanalyzer.cli import main

MiB = 1 << 20
EPOCH_NS = 1_700_000_000_000_000_000  # the trace's baseTimeNanoseconds: an epoch clock
EPOCH_US = EPOCH_NS // 1000


def _trace_doc(base_ns: int = EPOCH_NS) -> dict[str, Any]:
    """Three 1 ms steps, a kernel in each."""
    t = Trace()
    for i in range(3):
        s = i * 1000.0
        t.step(i + 1, s, 900)
        t.launch(s + 20, 5, s + 30, 400, name=f"k{i}")
    doc = t.doc()
    doc["baseTimeNanoseconds"] = base_ns
    return doc


def _snapshot(peak_us: int) -> dict[str, Any]:
    """A 64 MiB segment; 8 MiB allocated at ``peak_us`` (epoch µs) and freed 10 µs later."""
    base = 1 << 40
    ev = [{"action": "segment_alloc", "addr": base, "size": 64 * MiB, "stream": 0, "time_us": peak_us - 100},
          {"action": "alloc", "addr": base, "size": 8 * MiB, "stream": 0, "time_us": peak_us},
          {"action": "free_requested", "addr": base, "size": 8 * MiB, "stream": 0, "time_us": peak_us + 10},
          {"action": "free_completed", "addr": base, "size": 8 * MiB, "stream": 0, "time_us": peak_us + 10}]
    seg = {"device": 0, "address": base, "total_size": 64 * MiB, "allocated_size": 0, "active_size": 0,
           "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [],
           "blocks": [{"address": base, "size": 64 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}
    return {"segments": [seg], "device_traces": [ev]}


def _run_dir(tmp_path: Path, peak_us: int, base_ns: int = EPOCH_NS) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json").write_text(json.dumps(_trace_doc(base_ns)))
    (run / "snapshot.pickle").write_bytes(pickle.dumps(_snapshot(peak_us), protocol=4))
    (run / "notes.json").write_text('{"lr": 0.1}')  # not an input: ignored
    return run


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0), capsys.readouterr().err


def _summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def test_run_dir_one_report_with_the_peak_on_its_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, peak_us=EPOCH_US + 1_500)  # 500 µs into step 2
    code, err = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-f", "json", "-q"], capsys)
    assert code == 0, err
    s = _summary(tmp_path / "o")
    assert {"steps", "idle_gaps", "memory_peak", "run_memory"} <= set(s["analyses"])  # side by side
    rm = s["analyses"]["run_memory"]
    assert rm["clocks_comparable"] is True
    [p] = rm["placements"]
    assert (p["placed"], p["step"], p["offset_ns"], p["peak_bytes"], p["device"]) == (True, 2, 500_000, 8 * MiB,
                                                                                      "GPU 0")
    assert [i["kind"] for i in s["meta"]["run_inputs"]] == ["trace", "snapshot"]
    assert "memory_peak" not in s["skipped_analyses"]


def test_several_paths_same_as_the_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, peak_us=EPOCH_US + 2_100)
    code, err = run_main(["analyze", str(run / "snapshot.pickle"), str(run / "rank0.pt.trace.json"),
                          "-o", str(tmp_path / "o"), "-f", "json", "-q"], capsys)
    assert code == 0, err
    [p] = _summary(tmp_path / "o")["analyses"]["run_memory"]["placements"]
    assert (p["placed"], p["step"], p["offset_ns"]) == (True, 3, 100_000)


def test_peak_at_another_time_is_shown_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, peak_us=EPOCH_US - 5_000_000)  # 5 s before the trace
    code, _ = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-f", "json", "-q"], capsys)
    assert code == 0
    [p] = _summary(tmp_path / "o")["analyses"]["run_memory"]["placements"]
    assert p["placed"] is False and p["step"] is None
    assert p["note"] == "the peak lies 5.000 s before the trace: recorded at another time"


def test_relative_trace_clock_is_not_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, peak_us=1_500, base_ns=0)
    code, _ = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-f", "json", "-q"], capsys)
    assert code == 0
    rm = _summary(tmp_path / "o")["analyses"]["run_memory"]
    assert rm["clocks_comparable"] is False
    assert "relative to the profiler start" in rm["placements"][0]["note"]


def test_place_between_steps_and_without_time() -> None:
    peaks = [MemoryPeak("a", "snapshot", 0, 10, EPOCH_NS + 950_000), MemoryPeak("b", "snapshot", 1, 20, None)]
    r = place_memory_peaks("t", EPOCH_NS, EPOCH_NS + 3_000_000, None, peaks, "amd")
    rows = r.placements.to_dicts()
    assert (rows[0]["placed"], rows[0]["step"], rows[0]["note"]) == (True, None, "inside the trace, between step "
                                                                                 "windows")
    assert rows[1]["placed"] is False and rows[1]["device"] == "GPU 1" and "no time" in rows[1]["note"]


def test_dir_with_one_file_is_that_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "t.json").write_text(json.dumps(_trace_doc()))
    code, _ = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-f", "json", "-q"], capsys)
    assert code == 0
    s = _summary(tmp_path / "o")
    assert s["source"].endswith("t.json") and "run_memory" not in s["analyses"]


@pytest.mark.parametrize(("files", "says"), [
    ({}, "no trace or memory snapshot found"),
    ({"notes.json": "{}"}, "no trace or memory snapshot found (1 file(s) ignored, e.g. notes.json"),
    ({"a.pickle": "snap", "b.pickle": "snap"}, "2 inputs of kind snapshot"),
    ({"a.json": "trace", "b.json": "trace"}, "2 traces that are not the ranks of one run"),
])
def test_refusals_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str],
                              says: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name, what in files.items():
        if what == "snap":
            (run / name).write_bytes(pickle.dumps(_snapshot(EPOCH_US), protocol=4))
        elif what == "trace":
            (run / name).write_text(json.dumps(_trace_doc()))
        else:
            (run / name).write_text(what)
    code, err = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-q"], capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0], err


def test_the_perfetto_export_marks_the_placed_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    run = _run_dir(tmp_path, peak_us=EPOCH_US + 1_500)
    code, err = run_main(["analyze", str(run), "-o", str(tmp_path / "o"), "-f", "perfetto", "-q"], capsys)
    assert code == 0, err
    doc = json.loads(gzip.decompress((tmp_path / "o" / "trace.perfetto.json.gz").read_bytes()))
    [mark] = [e for e in doc["traceEvents"] if e["name"] == "snapshot peak: GPU 0"]
    assert (mark["ph"], mark["ts"], mark["args"]["peak bytes"], mark["args"]["step"]) == ("i", 1500.0, 8 * MiB, 2)
