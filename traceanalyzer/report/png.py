"""PNG output: one ``<chart>.png`` per chart (see :mod:`traceanalyzer.report.charts`).

The report's charts drawn by matplotlib, as standalone files for tickets and chats (the HTML
page shows the same charts as inline SVG, without matplotlib). Not a default format, being the
slow one: ``--format png`` (or ``all``) writes it. Charts whose analysis did not run are not
drawn; a chart that fails to draw is reported on stderr and skipped (the other formats are
unaffected).
"""

from __future__ import annotations

import sys
from pathlib import Path

from traceanalyzer.report import renderer
from traceanalyzer.report.document import Report
from traceanalyzer.report.fsutil import atomic_write_bytes


@renderer("png", description="<chart>.png: the report's charts as standalone images (matplotlib; not a "
          "default: ask for it, or 'all')", default=False, in_all=True)
def render(report: Report, outdir: Path) -> list[Path]:
    from traceanalyzer.report.charts import draw_all  # matplotlib only when PNGs are wanted

    written: list[Path] = []
    for drawn in draw_all(report.results):
        if drawn.png is None:
            print(f"warning: chart {drawn.spec.name} could not be drawn: {drawn.error}", file=sys.stderr)
            continue
        path = outdir / f"{drawn.spec.name}.png"
        atomic_write_bytes(path, drawn.png)
        written.append(path)
    return written
