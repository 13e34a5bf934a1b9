"""The Perfetto export: the trace_window analysis and report/perfetto.py, on a hand-built trace."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, needs_shared
from support.events import Trace, memory, ns

from traceanalyzer.analyses.trace_window import TraceWindowResult, WindowSpec, parse_window
from traceanalyzer.cli import cli, main
from traceanalyzer.config import Config
from traceanalyzer.load import load
from traceanalyzer.model import TraceModel
from traceanalyzer.pipeline import build_report, resolve_formats, write_outputs
from traceanalyzer.report.perfetto import FILE_NAME, FINDINGS_PID, FINDINGS_PROCESS, document


def _trace(steps: int = 4) -> Trace:
    """``steps`` steps of 1 ms: a GEMM at +30 µs (400 µs), then the CPU launches a ReLU only at
    +600 µs, so each step has a 180 µs host-bound device gap (430 → 610 µs); memory events."""
    t = Trace()
    for i in range(steps):
        s = i * 1000.0
        t.step(i + 1, s, 900)
        t.op("aten::mm", s + 10, 100)
        t.launch(s + 20, 5, s + 30, 400, name=f"gemm{i}")
        t.op("aten::relu", s + 590, 30)
        t.launch(s + 600, 5, s + 610, 200, name=f"relu{i}")
        t.events.append(memory(s + 25, total=(i + 1) << 20, delta=1 << 20))
    return t


def _report(t: Trace, **overrides: Any) -> Any:
    return build_report(t.model(), Config({f"trace_window.{k}": v for k, v in overrides.items()}), source="t.json")


def _doc(report: Any) -> dict[str, Any]:
    data = document(report)
    assert data is not None
    parsed: dict[str, Any] = orjson.loads(data)
    return parsed


def _importer_problems(doc: dict[str, Any], nested_pids: set[int] | None = None) -> list[str]:
    """What Perfetto's JSON importer would reject or misdraw (its documented rules): every event
    has ``ph`` and ``name``; every non-metadata event a finite ``ts``; ``X`` a finite ``dur`` ≥ 0;
    counters numeric args; instants a scope in g/p/t; process/thread names strings; and, on the
    threads of ``nested_pids`` (all when None), ``X`` slices that nest perfectly (the importer
    rounds µs to whole ns, ``llround(ts * 1000)``, and does not support partial overlap)."""
    problems: list[str] = []
    slices: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if not isinstance(ph, str) or not isinstance(e.get("name"), str):
            problems.append(f"no ph/name: {e}")
            continue
        if ph == "M":
            if e["name"] in ("process_name", "thread_name") and not isinstance(e.get("args", {}).get("name"), str):
                problems.append(f"metadata without a name: {e}")
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or not math.isfinite(ts):
            problems.append(f"bad ts: {e}")
            continue
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
                problems.append(f"bad dur: {e}")
                continue
            start = round(ts * 1000.0)
            slices.setdefault((e["pid"], e["tid"]), []).append((start, start + round(dur * 1000.0), e["name"]))
        elif ph == "C":
            args = e.get("args") or {}
            if not args or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in args.values()):
                problems.append(f"counter args not numeric: {e}")
        elif ph == "i" and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"instant scope: {e}")
    for key, xs in slices.items():
        if nested_pids is not None and key[0] not in nested_pids:
            continue
        xs.sort(key=lambda x: (x[0], -x[1]))
        open_: list[tuple[int, int, str]] = []
        for start, end, name in xs:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                problems.append(f"partial overlap on {key}: {open_[-1]} and {(start, end, name)}")
                break
            open_.append((start, end, name))
    return problems


def _kernels(doc: dict[str, Any]) -> list[str]:
    return sorted(e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel")


@pytest.mark.parametrize(("text", "spec"), [
    ("", WindowSpec("steady")),
    ("1.5:3", WindowSpec("time", start_ms=1.5, end_ms=3.0)),
    ("step:4", WindowSpec("steps", first_step=4, last_step=4)),
    (" STEP: 2 - 5 ", WindowSpec("steps", first_step=2, last_step=5)),
])
def test_parse_window(text: str, spec: WindowSpec) -> None:
    assert parse_window(text) == spec


@pytest.mark.parametrize(("text", "says"), [
    ("3:1", "END_MS must be after START_MS"), ("2:2", "END_MS must be after"), ("step:5-2", "N <= M"),
    ("abc", "expected START_MS:END_MS"), ("-1:4", "expected"), ("1:nan", "expected"), ("1:1e99", "expected"),
    ("0:99999999999", "beyond"),
])
def test_parse_window_refuses(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as exc:
        parse_window(text)
    assert "\n" not in str(exc.value)


def test_default_window_is_the_steady_steps_capped() -> None:
    w = _report(_trace(), max_steps=2).results.typed("trace_window", TraceWindowResult)
    assert w is not None and w.source == "steady" and w.steps == (1, 2)
    assert (w.start_ns, w.end_ns) == (0, ns(1900))  # step 2's CPU range ends after relu1
    assert sorted(w.events["kernels"]["name"].to_list()) == ["gemm0", "gemm1", "relu0", "relu1"]
    assert w.to_json()["n_events"]["kernels"] == 4


def test_step_window_holds_its_kernels_only_and_the_findings_track() -> None:
    report = _report(_trace(), window="step:2-3")
    doc = _doc(report)
    assert isinstance(doc["traceEvents"], list)
    assert _importer_problems(doc) == []
    assert _kernels(doc) == ["gemm1", "gemm2", "relu1", "relu2"]
    ev = doc["traceEvents"]
    steps = sorted(e["name"] for e in ev if e.get("cat") == "user_annotation")
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[FINDINGS_PID] == FINDINGS_PROCESS
    assert procs[0] == "GPU 0" and procs[100] == "host process 100"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(0, 7)] == "stream 7"
    # every pid/tid used has its names
    for e in ev:
        if e["ph"] in ("X", "i") and e["pid"] != FINDINGS_PID:
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads, e
    # the device gaps starting in the window (1000 → 2900 µs), coloured by cause: the 180 µs gap inside
    # each step and the 220 µs one from each step's ReLU to the next step's GEMM
    gaps = [e for e in ev if e.get("cat") == "traceanalyzer" and e["name"].startswith("idle: ")]
    assert [(g["ts"], g["dur"]) for g in gaps] == [(430.0, 180.0), (810.0, 220.0), (1430.0, 180.0), (1810.0, 220.0)]
    assert {(g["name"], g["cname"]) for g in gaps} == {("idle: host_bound", "terrible")}
    assert threads[(FINDINGS_PID, gaps[0]["tid"])] == "idle gaps · GPU 0"
    # one thread and one slice over the window per finding, named by its rule
    assert report.findings, "the planted host-bound gaps must give a finding"
    rules = [f.rule_id for f in report.findings]
    slices = [e for e in ev if e.get("cat") == "traceanalyzer" and e["ph"] == "X" and e["name"] in rules]
    assert [s["name"] for s in slices] == rules
    assert "host_bound_gaps" in rules
    # over the window (1000 → 2900 µs); host_bound_gaps's slice also holds its last gap whole (→ 3030 µs)
    assert {s["name"]: (s["ts"], s["dur"]) for s in slices} == {
        r: (0.0, 2030.0 if r == "host_bound_gaps" else 1900.0) for r in rules}
    hb_tid = next(s["tid"] for s in slices if s["name"] == "host_bound_gaps")
    under = [e for e in ev if e["ph"] == "X" and e["pid"] == FINDINGS_PID and e["tid"] == hb_tid
             and e["name"] != "host_bound_gaps"]
    assert [(e["name"], e["ts"], e["dur"]) for e in under] == [
        ("host_bound_gaps: idle host_bound", t, d) for t, d in ((430.0, 180.0), (810.0, 220.0), (1430.0, 180.0),
                                                                (1810.0, 220.0))]
    assert {threads[(FINDINGS_PID, s["tid"])] for s in slices} == set(rules)
    assert all(s["args"]["title"] and s["args"]["fix"] for s in slices)
    # counters: busy % of each step and the memory of the window
    busy = [e for e in ev if e["ph"] == "C" and e["name"] == "GPU 0 busy % of step"]
    # 600 µs busy of each 900 µs step window
    assert [(b["ts"], b["args"]["busy %"]) for b in busy] == [(0.0, 66.667), (1000.0, 66.667), (1900.0, 0.0)]
    mem = [e for e in ev if e["ph"] == "C" and e["name"] == "GPU 0 memory"]
    assert [m["args"]["allocated bytes"] for m in mem] == [2 << 20, 3 << 20]
    assert doc["baseTimeNanoseconds"] == ns(1000)


def test_time_window() -> None:
    doc = _doc(_report(_trace(), window="1:2"))  # ms from the trace start: step 2
    assert _kernels(doc) == ["gemm1", "relu1"]


def test_round_trip_through_our_loader(tmp_path: Path) -> None:
    report = _report(_trace(), window="step:2-3")
    written = write_outputs(report, tmp_path, ["perfetto"])
    assert written == [tmp_path / FILE_NAME]
    json.loads(gzip.decompress(written[0].read_bytes()))  # plain JSON for any reader
    model = load(written[0])
    assert isinstance(model, TraceModel)
    w = report.results.typed("trace_window", TraceWindowResult)
    assert w is not None
    cols = ["name", "ts_ns", "dur_ns", "device", "stream", "correlation"]
    assert model.kernels.select(cols).sort("ts_ns").equals(w.events["kernels"].select(cols).sort("ts_ns"))
    assert model.steps["step"].to_list() == [2, 3]
    assert model.runtime.height == w.events["runtime"].height
    assert model.memory_events.height == 2
    assert not [x for x in model.warnings if "unrecognised" in x]
    res = CliRunner().invoke(cli, ["analyze", str(written[0]), "-o", str(tmp_path / "again"), "-f", "json", "-q"])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["analyses"]["steps"]["n_steps"] == 2


def test_cli_window_writes_perfetto(tmp_path: Path) -> None:
    src = tmp_path / "t.json"
    src.write_text(json.dumps(_trace().doc()))
    res = CliRunner().invoke(cli, ["analyze", str(src), "-o", str(tmp_path / "o"), "-f", "json", "-q",
                                   "--window", "step:4"])
    assert res.exit_code == 0, res.output
    doc = json.loads(gzip.decompress((tmp_path / "o" / FILE_NAME).read_bytes()))
    assert _kernels(doc) == ["gemm3", "relu3"]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["analyses"]["trace_window"]["steps"] == [4]


@pytest.mark.parametrize(("window", "says"), [
    ("step:9", "--window: step:9: no such step in the trace (steps #1–#4)"),
    ("50:60", "--window: 50:60 ms starts after the trace ends"),
    ("x", "--window 'x': expected START_MS:END_MS"),
])
def test_cli_window_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], window: str,
                                        says: str) -> None:
    src = tmp_path / "t.json"
    src.write_text(json.dumps(_trace().doc()))
    code, err = run_main(["analyze", str(src), "-o", str(tmp_path / "o"), "-q", "--window", window], capsys)
    assert code == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], err


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The entry point as users run it: (exit code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0), capsys.readouterr().err


def test_perfetto_is_opt_in_and_written_before_the_page() -> None:
    assert "perfetto" not in resolve_formats(None)
    assert resolve_formats(["html,perfetto"]) == ["perfetto", "html"]


def test_no_window_no_file(tmp_path: Path) -> None:
    report = _report(_trace())
    from dataclasses import replace

    from traceanalyzer.analyses import Results

    bare = replace(report, results=Results(values={k: v for k, v in report.results.values.items()
                                                   if k != "trace_window"}))
    assert write_outputs(bare, tmp_path, ["perfetto"]) == []


def test_page_links_to_the_export_only_when_written(tmp_path: Path) -> None:
    report = _report(_trace())
    write_outputs(report, tmp_path / "both", ["html", "perfetto"])
    page = (tmp_path / "both" / "report.html").read_text()
    assert f'href="{FILE_NAME}"' in page
    write_outputs(report, tmp_path / "page", ["html"])
    assert FILE_NAME not in (tmp_path / "page" / "report.html").read_text()


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("rel", ["hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                 "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz"])
def test_real_trace_export_reloads_with_the_window(tmp_path: Path, rel: str) -> None:
    """A real AMD and MTIA trace: the export re-loads with the window's GPU work, and names the
    devices as the rest of the report does."""
    path = SHARED_TRACES / rel
    report = build_report(load(path), source=str(path))
    w = report.results.typed("trace_window", TraceWindowResult)
    assert w is not None
    [out] = write_outputs(report, tmp_path, ["perfetto"])
    again = load(out)
    assert isinstance(again, TraceModel)
    for table in ("kernels", "memcpy", "memset", "runtime", "cpu_ops"):
        assert getattr(again, table).height == w.events[table].height, table
    doc = json.loads(gzip.decompress(out.read_bytes()))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    # our tracks nest on every thread; the MTIA source itself has overlapping slices on some threads
    # (async stages written as X events), passed through as they are
    assert _importer_problems(doc, nested_pids={FINDINGS_PID}) == []
    if "amd" in rel:
        assert _importer_problems(doc) == []
    word = "MTIA" if "mtia" in rel else "GPU"
    assert any(n.startswith(f"{word} ") for n in names), names


def test_importer_rules_check_catches_what_perfetto_misdraws() -> None:
    """The check above on documents with a known answer: nested and back-to-back slices pass; a
    partial overlap, a negative duration and a text counter are reported."""
    def x(ts: float, dur: float, name: str = "s") -> dict[str, Any]:
        return {"ph": "X", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    ok = {"traceEvents": [x(0.0, 10.0), x(1.0, 2.0), x(3.0, 7.0), x(10.0, 1.5), x(2752.745, 19.337),
                          x(2740.081, 12.664)]}
    assert _importer_problems(ok) == []
    bad = {"traceEvents": [x(0.0, 10.0), x(5.0, 10.0), x(20.0, -1.0),
                           {"ph": "C", "name": "c", "pid": 1, "ts": 0.0, "args": {"v": "1"}}]}
    found = _importer_problems(bad)
    assert len(found) == 3 and found[0].startswith("bad dur") and "counter args" in found[1]
    assert "partial overlap" in found[2]
