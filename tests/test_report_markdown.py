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
