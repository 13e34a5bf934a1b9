"""How the console command ends: its exit status and its output, through the fast exit
(``cli._leave``) that skips the interpreter's shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceanalyzer import cli

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "pt113_sync_bound.json.gz"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceanalyzer", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_success_writes_everything_and_flushes_the_summary(tmp_path: Path) -> None:
    proc = _run("analyze", str(SAMPLE), "-o", str(tmp_path), "--format", "json,md")
    assert proc.returncode == 0, proc.stderr
    # stdout is a pipe here (block-buffered): the whole summary reaches it before the exit.
    assert proc.stdout.rstrip().splitlines()[-1].startswith("  wrote:")
    assert "Findings" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["analyses"]["steps"]
    assert (tmp_path / "report.md").read_text().strip()


def test_gate_and_bad_input_statuses(tmp_path: Path) -> None:
    gate = _run("analyze", str(SAMPLE), "-o", str(tmp_path / "g"), "--format", "json", "-q", "--fail-on", "info")
    assert gate.returncode == 1
    assert "fail-on info" in gate.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    proc = _run("analyze", str(bad), "-o", str(tmp_path / "b"), "-q")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_api_call_raises_system_exit() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0


def test_leave_under_a_profiler_exits_normally(capsys: pytest.CaptureFixture[str]) -> None:
    # A profiler or tracer must get the normal exit (it writes its results at shutdown).
    previous = sys.getprofile()
    sys.setprofile(lambda *a: None)
    try:
        with pytest.raises(SystemExit) as exc:
            cli._leave(3)
        assert exc.value.code == 3
        with pytest.raises(SystemExit) as exc:
            cli._leave("stopped: a message")
        assert exc.value.code == 1
        with pytest.raises(SystemExit) as exc:
            cli._leave(None)
        assert exc.value.code == 0
    finally:
        sys.setprofile(previous)
    assert "stopped: a message" in capsys.readouterr().err
