"""``analyze RUN_DIR`` on the ranks of one run (the multi-rank summary, written by batch):
``--open`` opens that summary and ``--fail-on`` gates on the findings of every rank and the
cross-rank one, as they do for one trace."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
import pytest
from click.testing import CliRunner
from support.synthetic import dumps_trace, scenario_multi_rank, write_bytes

from traceanalyzer.cli import cli
from traceanalyzer.rules import Severity


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks of one DDP run, rank 1 a straggler (slow DataLoader)."""
    run = tmp_path_factory.mktemp("ranks") / "run"
    for rank in range(2):
        trace, _ = scenario_multi_rank(rank=rank, world_size=2, straggler_rank=1, steps=3)
        write_bytes(run / f"rank{rank}.json", dumps_trace(trace))
    return run


def _at_or_above(out: Path, severity: str) -> tuple[int, int]:
    """(per-rank findings, cross-rank findings) of ``severity`` or worse, read from the outputs."""
    threshold = Severity.parse(severity)
    per_rank = sum(Severity.parse(f["severity"]) >= threshold
                   for p in sorted((out / "reports").glob("*/summary.json"))
                   for f in orjson.loads(p.read_bytes())["findings"])
    runs = orjson.loads((out / "index.json").read_bytes())["runs"]
    cross = sum(Severity.parse(r["multirank"]["finding"]["severity"]) >= threshold
                for r in runs if (r.get("multirank") or {}).get("finding"))
    return per_rank, cross


def test_open_and_fail_on_in_ranks_mode(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []

    def launch(url: str, *args: object, **kwargs: object) -> int:
        opened.append(url)
        return 0

    monkeypatch.setattr(click, "launch", launch)
    out = tmp_path / "out"
    base = ["analyze", str(run_dir), "-o", str(out), "-q"]

    # --open: the multi-rank summary (and the per-rank html: --open implies it); --fail-on
    # critical: exit 1, counting every rank's findings (read from their summary.json) and the
    # cross-rank one.
    res = CliRunner().invoke(cli, [*base, "-f", "json", "--open", "--fail-on", "critical"])
    assert res.exit_code == 1, res.output
    assert opened == [str((out / "index.html").resolve())]
    assert sorted(p.name for p in (out / "reports").iterdir()) == ["rank0.json", "rank1.json"]
    assert all((d / "report.html").is_file() for d in (out / "reports").iterdir())
    per_rank, cross = _at_or_above(out, "critical")
    assert per_rank >= 2 and cross == 1  # both ranks have a critical finding; the straggler is one too
    assert f"fail-on critical: {per_rank + cross} finding(s) of severity critical or worse" in res.output
    assert "[critical] " in res.output and any(f"{who}: " in res.output
                                               for who in ("rank 0", "rank 1", "across ranks"))

    # Without json in --format, --fail-on adds it (a run without it would count the cross-rank
    # finding alone). The formats then equal the first run's: the ranks come from batch's cache.
    res = CliRunner().invoke(cli, [*base, "-f", "html", "--fail-on", "critical"])
    assert res.exit_code == 1, res.output
    assert f"fail-on critical: {per_rank + cross} finding(s)" in res.output

    # No --fail-on: exit 0 whatever the findings.
    res = CliRunner().invoke(cli, [*base, "-f", "json,html"])
    assert res.exit_code == 0, res.output
