"""report.md: golden file on a synthetic trace, escaping of hostile names, structure.

Regenerate the golden file after an intended change with
``UPDATE_GOLDEN=1 pytest tests/test_report_markdown.py`` and review the diff.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_support import synthetic_report
from test_report_json import compare_golden

from traceanalyzer import __version__
from traceanalyzer.pipeline import write_outputs
from traceanalyzer.report.markdown import to_markdown

GOLDEN = Path(__file__).resolve().parent / "golden" / "report.md"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return synthetic_report(tmp_path_factory.mktemp("md"))


def normalise(text: str) -> bytes:
    return text.replace(f"traceanalyzer {__version__}:", "traceanalyzer <version>:").encode()


def test_markdown_matches_golden(report: Any) -> None:
    compare_golden(normalise(to_markdown(report)), GOLDEN)


def test_markdown_structure(report: Any) -> None:
    md = to_markdown(report)
    lines = md.splitlines()
    assert lines[0] == "# traceanalyzer report: `synthetic.json`"
    heads = [ln for ln in lines if ln.startswith("## ")]
    assert heads[:3] == ["## Findings", "## Key numbers", "## Top offenders"]
    # concise: a ticket comment, not a dump of every table
    assert len(lines) < 200
    # every table row has as many cells as its header (renders in GitHub/GitLab/Jira)
    header_cells = None
    for ln in lines:
        if ln.startswith("|"):
            cells = ln.count("|") - ln.count("\\|")
            if header_cells is None:
                header_cells = cells
            assert cells == header_cells, ln
        else:
            header_cells = None
    # timestamps are relative to the trace start, never 19-digit epoch ns
    assert "1,767," not in md and "+" in md


def test_hostile_names_are_inert(tmp_path: Path) -> None:
    report = synthetic_report(tmp_path, hostile=True)
    md = to_markdown(report)
    assert "<script>" not in md and "<img" not in md
    assert "&lt;script&gt;" in md  # the name is shown, escaped
    assert "evil\\|kernel" in md  # a pipe in a name must not add a table cell
    assert "evil|kernel" not in md


def test_render_writes_report_md(report: Any, tmp_path: Path) -> None:
    written = write_outputs(report, tmp_path, ["md"])
    assert written == [tmp_path / "report.md"]
    assert written[0].read_text(encoding="utf-8") == to_markdown(report)


def test_findings_table(report: Any) -> None:
    from report_support import with_findings

    md = to_markdown(with_findings(report))
    rows = [ln for ln in md.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |") or ln.startswith("| 3 |")]
    assert rows[0].startswith("| 1 | critical | Input batch copied from pageable memory every step (`pageable_memcpy`)")
    assert "| 2.16 ms (25.4 % of median step) |" in rows[0]
    assert "| 400.00 MiB |" in rows[2]
    assert "<script>" not in md and "<img" not in md


# --- Terminal escape sequences in trace-provided names (issue 19) ----------------------------------------------------

_HOSTILE = ("evil\x1b]0;pwned\x07kernel\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\_x\x1b[31mred\x1b[0m\x1bP1$r\x1b\\"
            "\x9b2J\u202eRLO\x07\x08")


def test_clean_text_strips_every_escape_sequence() -> None:
    from traceanalyzer.report.text import clean_text, md_escape

    out = clean_text(_HOSTILE)
    assert out == "evilkernel_xredRLO", repr(out)
    assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in out)
    assert clean_text("a\tb\nc") == "a\tb\nc" and clean_text("a\nb", keep_newlines=False) == "a b"
    assert clean_text("unterminated \x1b]0;title") == "unterminated "
    assert "\x1b" not in md_escape(_HOSTILE) and "]52;" not in md_escape(_HOSTILE)
    assert clean_text("plain µs – name") == "plain µs – name"


def test_osc_in_kernel_name_never_reaches_terminal_or_report_md(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import kineto_doc, write_trace

    from traceanalyzer.cli import main

    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 5, "pid": 1, "tid": 1,
           "args": {"correlation": 7}}]
    for i in range(5):
        ev.append({"ph": "X", "cat": "kernel", "name": _HOSTILE, "ts": 10 + 100 * i, "dur": 60, "pid": 0,
                   "tid": 7, "args": {"correlation": 7 if i == 0 else 100 + i, "device": 0, "stream": 7}})
    p = write_trace(tmp_path / "t.json", kineto_doc(ev))
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(p), "--format", "md", "-o", str(tmp_path / "o")])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "evilkernel" in printed and "evilkernel" in md
    for text in (printed, md):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
