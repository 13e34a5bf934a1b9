"""progress(): silent unless asked or on a terminal; a bar with a total, a spinner without."""

from __future__ import annotations

import io
import time

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
