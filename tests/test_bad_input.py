"""Bad input: a one-line error naming the file (exit 2) or a warning saying what was skipped."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import fail_writes, kineto_doc, write_trace

from traceanalyzer.cli import main
from traceanalyzer.errors import InputError
from traceanalyzer.load import load


def _events(n: int = 20) -> list[dict]:
    ev = []
    for i in range(n):
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": 10.0 * i, "dur": 5.0, "pid": 1, "tid": 1,
                   "args": {"External id": i}})
    return ev


def _pretty(doc: object) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


@pytest.mark.parametrize("pretty", [True, False])
def test_truncated_json_recovers_complete_events(tmp_path: Path, pretty: bool) -> None:
    data = (_pretty if pretty else orjson.dumps)(kineto_doc(_events(20)))
    cut = data[: int(len(data) * 0.6)]  # a job killed while writing
    p = tmp_path / "killed.json"
    p.write_bytes(cut)
    m = load(p)
    assert 5 <= m.cpu_ops.height < 20
    assert any("truncated" in w for w in m.warnings)


def test_truncated_bare_array(tmp_path: Path) -> None:
    data = _pretty(_events(10))
    p = tmp_path / "arr.json"
    p.write_bytes(data[: len(data) // 2])
    m = load(p)
    assert 0 < m.cpu_ops.height < 10 and any("truncated" in w for w in m.warnings)


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(_pretty(kineto_doc(_events(400))))
    p = tmp_path / "killed.json.gz"
    p.write_bytes(data[: int(len(data) * 0.7)])
    m = load(p)
    assert 0 < m.cpu_ops.height < 400
    assert any("gzip stream is truncated" in w for w in m.warnings)


def test_invalid_tokens_are_replaced(tmp_path: Path) -> None:
    text = _pretty(kineto_doc([
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1, "dur": 0, "pid": 0,
         "tid": 7, "args": {"memory bandwidth (GB/s)": "@INF@", "x": "@NAN@", "y": "@NA@", "bytes": 8}},
    ])).replace(b'"@INF@"', b"inf").replace(b'"@NAN@"', b"NaN").replace(b'"@NA@"', b"N/A")
    p = tmp_path / "inf.json"
    p.write_bytes(text)
    m = load(p)
    assert m.memcpy.height == 1 and m.memcpy["bytes"][0] == 8
    assert any("invalid JSON tokens" in w and "3" in w for w in m.warnings)


def test_control_characters_in_names(tmp_path: Path) -> None:
    text = _pretty(kineto_doc(_events(3))).replace(b"aten::op1", b"aten::op\x01\x02")
    p = tmp_path / "ctrl.json"
    p.write_bytes(text)
    m = load(p)
    assert m.cpu_ops.height == 3 and any("control characters" in w for w in m.warnings)


def test_events_without_dur_negative_dur_and_unknown_categories(tmp_path: Path) -> None:
    ev = _events(4)
    ev[0].pop("dur")
    ev[1]["dur"] = -3
    ev.append({"ph": "X", "cat": "mystery_cat", "name": "?", "ts": 1, "dur": 1, "pid": 1, "tid": 1})
    m = load(write_trace(tmp_path / "t.json", kineto_doc(ev)))
    assert m.cpu_ops.height == 2
    text = " | ".join(m.warnings)
    assert "skipped 1 duration events without dur" in text
    assert "skipped 1 duration events with negative dur" in text
    assert "mystery_cat (1)" in text and m.other_events.height == 1


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "empty file"),
        (b'{"hello": "world"}', "not a chrome trace: JSON object without 'traceEvents'"),
        (b'{"traceEvents": {}}', "'traceEvents' is not an array"),
        (b'{"traceEvents": []}', "trace has no events"),
        (b"[1, 2, 3]", "not trace events"),
        (b'{"schema": "1.0.3", "nodes": [], "pid": 1}', "Execution Trace"),
        (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}', "no usable events"),
        (b"\x00\x01binary junk", "unrecognised content"),
        (b'{"traceEvents": [ {"ph": "X", "na', "not valid JSON"),
        (b"\x1f\x8bnot really gzip", "corrupt gzip"),
    ],
)
def test_unusable_files_raise_one_line_input_error(tmp_path: Path, content: bytes, problem: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(InputError) as info:
        load(p)
    msg = str(info.value)
    assert msg.startswith(str(p)) and problem in msg and "\n" not in msg


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a directory"):
        load(tmp_path)


@pytest.mark.parametrize("name, content", [
    ("empty.json", b""),
    ("junk.json", b"{]"),
    ("notrace.json", b'{"a": 1}'),
])
def test_cli_bad_input_exit_2_one_line_no_traceback(tmp_path: Path, name: str, content: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "traceanalyzer", "analyze", str(p), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and str(p) in err and "Traceback" not in err


def test_cli_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A directory is a run (analyze RUN_DIR): an empty one holds no input.
    for target, problem in ((tmp_path / "missing.json", "no such file"),
                            (tmp_path, "no trace or memory snapshot found")):
        with pytest.raises(SystemExit) as info:
            main(["analyze", str(target), "-o", str(tmp_path / "o")])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert problem in err and len(err.splitlines()) == 1


def test_cli_unknown_format_is_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "--format", "pdf", "-o", str(tmp_path / "o")])
    assert info.value.code == 2
    assert "unknown format 'pdf'" in capsys.readouterr().err


# --- Hostile parameters and output locations (issue 19) --------------------------------------------------------------


@pytest.mark.parametrize("assignment, problem", [
    ("idle_gaps.long_gap_us=abc", "expected a float, got 'abc'"),
    ("idle_gaps.long_gap_us=nan", "expected a finite float"),
    ("idle_gaps.long_gap_us=1e308", "out of range"),
    ("idle_gaps.long_gap_us=" + "9" * 40, "out of range"),
    ("kernels.top_n=abc", "expected an integer, got 'abc'"),
    ("memory_leaks.min_bytes=abc", "expected an integer"),
    ("kernels.top_n=2.5", "expected an integer"),
    ("memory_leaks.min_bytes=inf", "finite"),
    ("low_gpu_utilization.min_busy_pct=nan", "expected a finite float"),
    ("low_gpu_utilization.min_busy_pct=1e308", "out of range"),
    ("low_gpu_utilization.min_busy_pct=" + "9" * 40, "out of range"),
])
def test_cli_bad_parameter_values_exit_2_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  assignment: str, problem: str) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "-q", "--format", "json", "-o", str(tmp_path / "o"), "--set", assignment])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    key = assignment.split("=", 1)[0]
    assert len(err.splitlines()) == 1 and key in err and problem in err, err
    assert not (tmp_path / "o").exists()


def test_good_parameter_values_still_accepted(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "-q", "--format", "json", "-o", str(tmp_path / "o"),
              "--set", "idle_gaps.long_gap_us=50", "--set", "kernels.top_n=3", "--set", "rules.min_cost_pct=0.5"])
    assert info.value.code == 0
    assert (tmp_path / "o" / "summary.json").is_file()


@pytest.mark.parametrize("err_no", [__import__("errno").ENOSPC, __import__("errno").EACCES,
                                    __import__("errno").EROFS])
def test_cli_unwritable_output_exit_2_nothing_half_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, err_no: int) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    fail_writes(monkeypatch, err_no)  # half a file, then the disk is full
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "-q", "--format", "json,md", "-o", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write" in err and os.strerror(err_no) in err, err
    assert list(out.iterdir()) == []  # no half-written report, no temporary file


def test_cli_output_under_a_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "-q", "--format", "json", "-o", str(tmp_path / "afile" / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write" in err


def test_cli_read_only_output_dir_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(SystemExit) as info:
            main(["analyze", str(p), "-q", "--format", "json", "-o", str(ro)])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "cannot write" in err and str(ro) in err
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("args", [
    ["compare", "{t}", "{t}", "--fail-if-slower", "nan"],
    ["compare", "{t}", "{t}", "--fail-if-slower", "1e400"],
    ["batch", "{t}", "--file-timeout", "nan"],
    ["batch", "{t}", "--file-memory", "inf"],
    ["batch", "{t}", "-j", "9" * 25],
])
def test_cli_non_finite_or_huge_option_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     args: list[str]) -> None:
    p = write_trace(tmp_path / "t.json", kineto_doc(_events(2)))
    with pytest.raises(SystemExit) as info:
        main([a.format(t=p) for a in args] + ["-q", "-o", str(tmp_path / "o")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Invalid value" in err and "Traceback" not in err and not (tmp_path / "o").exists()
