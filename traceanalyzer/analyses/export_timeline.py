"""Categorised memory timeline from ``export_memory_timeline``: peak and its make-up.

``peak_total_bytes``: the highest sum over categories of bytes held (the top of the
stacked plot) and when (``peak_ts_ns``); ``at_peak``: bytes per category at that
sample with its share; ``max_per_category``: each category's own maximum;
``final_total_bytes``: the last sample; ``growth_bytes``: last − first sample total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model.memory import TIMELINE_CATEGORIES, MemoryTimelineModel


@dataclass(frozen=True)
class ExportTimelineResult:
    """See the module docstring."""

    layout: str
    n_samples: int
    span_ns: int
    peak_total_bytes: int
    peak_ts_ns: int
    final_total_bytes: int
    growth_bytes: int
    at_peak: pl.DataFrame
    max_per_category: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, pl.DataFrame)}
        out["at_peak"] = self.at_peak.to_dicts()
        return out

    def summary(self) -> list[tuple[str, str]]:
        from traceanalyzer.units import fmt_bytes

        out = [("Peak (all categories)", fmt_bytes(self.peak_total_bytes)),
               ("At end / growth", f"{fmt_bytes(self.final_total_bytes)} / {fmt_bytes(self.growth_bytes)}")]
        for row in self.at_peak.head(3).iter_rows(named=True):
            out.append((f"  {row['category']}", f"{fmt_bytes(row['bytes'])} ({row['pct_of_peak']:.1f} %)"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Categories at the peak": self.at_peak}


@analysis("export_timeline", input="memory_timeline", title="Memory timeline (export)", order=10)
def export_timeline(ctx: AnalysisContext[MemoryTimelineModel]) -> ExportTimelineResult:
    """Peak of the categorised timeline and what each category held then."""
    model = ctx.model
    s = model.samples
    if s.is_empty():
        raise NotApplicable("the memory timeline has no samples")
    i = int(s["total_bytes"].arg_max())  # type: ignore[arg-type]
    row = s.row(i, named=True)
    peak = int(row["total_bytes"])
    at_peak = pl.DataFrame({
        "category": list(TIMELINE_CATEGORIES),
        "bytes": [int(row[f"{c}_bytes"]) for c in TIMELINE_CATEGORIES],
    }).with_columns(pct_of_peak=(pl.col("bytes") * 100.0 / max(peak, 1)).round(2)).filter(
        pl.col("bytes") != 0).sort(["bytes", "category"], descending=[True, False])
    return ExportTimelineResult(
        layout=model.meta.layout, n_samples=s.height,
        span_ns=int(s["ts_ns"].max() - s["ts_ns"].min()),  # type: ignore[operator, arg-type]  # polars scalars
        peak_total_bytes=peak, peak_ts_ns=int(row["ts_ns"]),
        final_total_bytes=int(s["total_bytes"][-1]), growth_bytes=int(s["total_bytes"][-1] - s["total_bytes"][0]),
        at_peak=at_peak,
        max_per_category={c: int(s[f"{c}_bytes"].max()) for c in TIMELINE_CATEGORIES},  # type: ignore[arg-type]
    )
