"""report.md: golden file on a synthetic trace, escaping of hostile names, structure.

Regenerate the golden file after an intended change with
``UPDATE_GOLDEN=1 pytest tests/test_report_markdown.py`` and review the diff.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_TRACES, needs_shared
from report_support import HOSTILE, synthetic_report, with_findings
from test_report_json import compare_golden

from traceanalyzer import __version__
from traceanalyzer.pipeline import analyze, write_outputs
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
    # the run line, then the verdict with its number, before anything else
    assert lines[2].startswith("**Device**: NVIDIA A100 80GB PCIe · **Steps**: 3 (#1–#3), median steady step ")
    assert lines[4].startswith("**Verdict**: input-bound (data loader): 36.3 % of the step")
    heads = [ln for ln in lines if ln.startswith("## ")]
    assert heads[0] == "## Findings" and heads[1].startswith("## Top kernels")
    assert "## Key numbers" not in heads  # everything else is in report.html / summary.json
    # each finding: title heading, severity/rule/cost line, fix, one evidence line
    titles = [ln for ln in lines if ln.startswith("### ")]
    assert len(titles) == len(report.findings) == 5
    assert titles[0].startswith("### 1. The step waits for input data: ")
    assert sum(ln.startswith("**Fix**: ") for ln in lines) == 5
    assert sum(ln.startswith("Evidence: ") for ln in lines) == 5
    assert "Evidence: dataloader per step: 3.081 ms" in lines
    # a ticket comment, not a dump of every table
    assert len(lines) < 120
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


#: What a ticket must never show: a cut text, an HTML entity, a backslash escape outside the ``\|``
#: of a table cell, an escaped newline or quote from a repr.
_CUT = "…"
_ENTITY = re.compile(r"&(?:gt|lt|amp|quot|#\d+|#x[0-9a-fA-F]+);")
_BACKSLASH = re.compile(r"\\[\\`*_{}\[\]()<>#+!.~$&\"'nt-]")


def assert_ticket_ready(md: str) -> None:
    """report.md as a ticket takes it: nothing cut, no entity, no stray escape."""
    assert _CUT not in md, [ln for ln in md.splitlines() if _CUT in ln][:3]
    assert not _ENTITY.search(md), _ENTITY.findall(md)[:5]
    bad = [ln for ln in md.splitlines() if _BACKSLASH.search(ln.replace("\\|", ""))]
    assert not bad, bad[:3]


def test_markdown_is_ticket_ready_on_samples(report: Any) -> None:
    assert_ticket_ready(to_markdown(report))
    samples = Path(__file__).resolve().parent.parent / "sample_traces"
    files = sorted(p for p in samples.rglob("*.json*") if ".truth." not in p.name)
    assert files
    for p in files:
        assert_ticket_ready(to_markdown(analyze(p)))


@pytest.mark.shared
@needs_shared
@pytest.mark.parametrize("rel", [
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/misc/torch_compile_triton.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
])
def test_markdown_is_ticket_ready_on_real_traces(rel: str) -> None:
    path = SHARED_TRACES / rel
    if not path.exists():
        pytest.skip(f"{rel} not in ../shared")
    md = to_markdown(analyze(path))
    assert_ticket_ready(md)
    assert "**Verdict**: " in md


def test_ticket_check_catches_what_it_should() -> None:
    for bad in ("a fix cut short…", "x &gt; y", "a &amp; b", "\\_name\\_", r'said \"x\"', "line\\nbreak"):
        with pytest.raises(AssertionError):
            assert_ticket_ready(bad)
    assert_ticket_ready("| `evil\\|kernel` | 1 |")  # the one escape a table cell needs


def test_hostile_names_are_inert(tmp_path: Path) -> None:
    report = synthetic_report(tmp_path, hostile=True)
    md = to_markdown(with_findings(report))
    # the hostile name is shown whole, inside code spans, where no renderer reads HTML or math
    for line in md.splitlines():
        for tag in ("<script>", "<img"):
            i = line.find(tag)
            while i >= 0:
                assert line[:i].count("`") % 2 == 1 or "``" in line[:i], line  # inside a code span
                i = line.find(tag, i + 1)
    assert "&lt;" not in md and "&gt;" not in md
    assert "Kernel `evil|kernel<script>" in md  # whole, in a code span
    assert_ticket_ready(md)
    from traceanalyzer.report.text import md_cell

    cell = md_cell(HOSTILE, code=True)  # a pipe in a table cell must not add a cell
    assert "evil\\|kernel" in cell and cell.count("|") == cell.count("\\|")


def test_md_text_and_code() -> None:
    from traceanalyzer.report.text import md_code, md_text

    assert md_text("Use DataLoader(pin_memory=True) and x.to(d).") == "Use `DataLoader(pin_memory=True)` and x.to(d)."
    assert md_text("(num_workers), then") == "(`num_workers`), then"
    assert md_text("allow set_precision('high');") == "allow `set_precision('high')`;"
    assert md_text("kernels (< 10 µs) a & b") == "kernels (< 10 µs) a & b"  # nothing to protect
    assert md_text("void f<float>(x)") == "void `f<float>(x)`"
    assert md_code("a`b") == "``a`b``" and md_code("`x`") == "`` `x` ``"


def test_render_writes_report_md(report: Any, tmp_path: Path) -> None:
    written = write_outputs(report, tmp_path, ["md"])
    assert written == [tmp_path / "report.md"]
    assert written[0].read_text(encoding="utf-8") == to_markdown(report)


def test_findings_are_whole(report: Any) -> None:
    md = to_markdown(with_findings(report))
    assert "### 1. Input batch copied from pageable memory every step" in md
    assert "**critical** · `pageable_memcpy` · cost 2.16 ms/step (25.4 % of median step)" in md
    assert "**Fix**: Use `DataLoader(pin_memory=True)` and .to(device, `non_blocking=True`)." in md
    assert "```python\nloader = DataLoader(ds, pin_memory=True)\nx = x.to('cuda', non_blocking=True)\n```" in md
    assert "Evidence: bytes per step: 18.38 MiB" in md
    assert "cost 400.00 MiB" in md
    long_fix = "word " * 200
    from dataclasses import replace

    r = with_findings(report)
    r = replace(r, findings=[replace(r.findings[0], fix=long_fix.strip())])
    assert long_fix.strip() in to_markdown(r)


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
    from conftest import write_trace
    from support.events import kineto_doc

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
