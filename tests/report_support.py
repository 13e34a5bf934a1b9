"""Helpers for the report tests: a deterministic synthetic report and a planted hostile name.

``synthetic_report(tmp_path)`` writes a small ``scenario_resnet_like`` trace (3 steps,
seed 0) as ``synthetic.json`` and analyses it from inside ``tmp_path`` under that
relative name, so nothing machine-specific (paths, clocks) reaches the outputs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from traceanalyzer.pipeline import analyze
from traceanalyzer.report.document import Report

#: A kernel name that would run script, break out of attributes or tables if unescaped.
HOSTILE = (
    "evil|kernel<script>document.documentElement.setAttribute('data-pwned','1')</script>"
    "\"'><img src=x onerror=\"document.documentElement.setAttribute('data-pwned','2')\">|`$x$`"
)


def synthetic_trace(hostile: bool = False) -> dict[str, Any]:
    from support.synthetic import scenario_resnet_like

    trace, _truth = scenario_resnet_like(seed=0, steps=3)
    if hostile:
        renamed = 0
        for ev in trace["traceEvents"]:
            if ev.get("cat") == "kernel" and renamed < 3:
                ev["name"] = HOSTILE
                renamed += 1
        assert renamed, "no kernel to plant the hostile name in"
    return trace


def synthetic_report(tmp_path: Path, hostile: bool = False, name: str = "synthetic.json") -> Report:
    from support.synthetic import dumps_trace

    (tmp_path / name).write_bytes(dumps_trace(synthetic_trace(hostile)))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return analyze(name)
    finally:
        os.chdir(cwd)


_CACHE: dict[bool, Report] = {}
_TMP: list[Any] = []


def shared_report(hostile: bool = False) -> Report:
    """One synthetic report per session (HTML and PNG tests share it, and with it the drawn
    charts, which :func:`traceanalyzer.report.charts.draw_all` caches per report)."""
    if hostile not in _CACHE:
        import tempfile

        tmp = tempfile.TemporaryDirectory(prefix="ta-report-")
        _TMP.append(tmp)  # removed at interpreter exit
        _CACHE[hostile] = synthetic_report(Path(tmp.name), hostile=hostile)
    return _CACHE[hostile]


def with_findings(report: Report) -> Report:
    """``report`` with three hand-made findings (rules are tested elsewhere; this is about
    how renderers show them), one carrying hostile text and an evidence table."""
    from dataclasses import replace

    from traceanalyzer.rules import Finding, Severity

    findings = [
        Finding(
            rule_id="pageable_memcpy", severity=Severity.CRITICAL,
            title="Input batch copied from pageable memory every step",
            evidence={"bytes_per_step": 19_267_584, "steps": [1, 2, 3],
                      "top_sites": [{"site": "train.py:36 (to_device)", "count": 3, "cpu_ns": 6_481_000}]},
            fix="Use DataLoader(pin_memory=True) and .to(device, non_blocking=True).",
            code_hint="loader = DataLoader(ds, pin_memory=True)\nx = x.to('cuda', non_blocking=True)",
            cost_ms_per_step=2.16, cost_pct_of_step=25.4,
        ),
        Finding(
            rule_id="hostile_rule", severity=Severity.WARNING, title=f"Kernel {HOSTILE} is slow",
            evidence={"kernel": HOSTILE, "rows": [{"name": HOSTILE, "total_ns": 1000}]},
            fix=f"Rename {HOSTILE}", cost_ms_per_step=0.5, confidence=0.6,
        ),
        Finding(
            rule_id="fragmentation", severity=Severity.INFO, title="Reserved memory is 40 % unused",
            evidence={"reserved_bytes": 1 << 30}, fix="Set expandable_segments:True.", cost_bytes=400 << 20,
        ),
    ]
    return replace(report, findings=findings)
