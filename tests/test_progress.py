"""progress(): silent unless asked or on a terminal; a bar with a total, a spinner without."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.progress import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_when_not_a_terminal() -> None:
    out = io.StringIO()
    with progress("Loading", stream=out) as bar:
        bar.update(3)
    assert out.getvalue() == "" and not bar.enabled and bar.done == 3


def test_silent_when_disabled_even_on_a_terminal() -> None:
    out = _Tty()
    with progress("Loading", total=2, enabled=False, stream=out) as bar:
        bar.update(1)
    assert out.getvalue() == ""


def test_bar_with_total_on_a_terminal() -> None:
    out = _Tty()
    with progress("Writing", total=4, stream=out) as bar:
        bar.update(1)
        bar.update(3)
    text = out.getvalue()
    assert "Writing [" in text and "4/4" in text
    assert text.endswith("\r\x1b[2K")  # the line is cleared for the command's own output


def test_spinner_without_total_redraws_while_work_runs() -> None:
    out = _Tty()
    with progress("Analysing", enabled=True, stream=out):
        time.sleep(0.35)
    text = out.getvalue()
    assert text.count("Analysing…") >= 2 and text.endswith("\r\x1b[2K")


def test_note_follows_the_count() -> None:
    out = _Tty()
    with progress("Writing", total=3, stream=out) as bar:
        bar.update(1, note="chart timeline")
        bar.update(1)  # no note given: the last one stays
    text = out.getvalue()
    assert "1/3 " in text and "chart timeline" in text
    last = text.rstrip("\r\x1b[2K").split("\r\x1b[2K")[-1]
    assert "2/3" in last and last.endswith("chart timeline")


def test_analyze_ticks_per_chart_and_per_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar of ``analyze``'s writing step counts the charts, then the formats: it moves while
    the charts are drawn instead of sitting at 0 until the first format is written."""
    import traceanalyzer.progress as prog
    from traceanalyzer.cli import cli

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "pt113_sync_bound.json.gz"
    monkeypatch.setattr(prog, "_is_tty", lambda stream: True)
    result = CliRunner().invoke(cli, ["analyze", str(sample), "-o", str(tmp_path), "--format", "png,json"])
    assert result.exit_code == 0, result.output
    n_charts = len(list(tmp_path.glob("*.png")))
    total = n_charts + 2
    err = result.stderr
    assert n_charts >= 3
    assert f"1/{total}" in err and "chart steps" in err  # the first chart done, named
    assert f"{n_charts}/{total}" in err and f"{total}/{total}" in err
