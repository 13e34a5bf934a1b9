"""One run's trace and memory snapshot together: where the snapshot's peak lies on the trace's steps.

``traceanalyzer analyze RUN_DIR`` (or a trace with a snapshot / memory-timeline export given
together) builds one report of the run: the trace's analyses and the memory file's analyses
side by side, plus this result, which places each memory file's peak on the trace's timeline.

When the clocks are comparable
------------------------------
A snapshot records ``time_us`` per allocator event on the Unix-epoch clock (the model's
``ts_ns``); a Kineto trace of PyTorch ≥ 2.0 records epoch times too (``baseTimeNanoseconds``
plus relative µs). The peak is **placed** when both are epoch times (after 2001-09-09, i.e.
≥ 10^18 ns: older exporters write times relative to the profiler start) and the peak lies in
the trace's span, widened by ``PLACE_TOLERANCE_NS`` (1 ms) on each side. It is then given the
step window that holds it (``step``, its offset into the window ``offset_ns``) or, between
windows, no step. Otherwise the peak is **shown apart** with the reason in ``note``: no time
recorded with the peak (a snapshot without history, or the peak before the history starts),
a trace on a relative clock, or a peak outside the trace (the snapshot was taken at another
time than the profile; the distance is said).

It is computed by :func:`place_memory_peaks` from the results of both inputs (the pipeline's
``build_run_report`` calls it), not from a model: the registered function below only gives the
report its title, order and documentation and never runs on a single input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import Model
from traceanalyzer.units import device_name, fmt_bytes, fmt_ns

#: Times at or above this many ns are Unix-epoch times (2001-09-09 onwards).
EPOCH_MIN_NS = 10**18
#: A peak this close outside the trace's span is still placed (clock granularity).
PLACE_TOLERANCE_NS = 1_000_000


@dataclass(frozen=True)
class MemoryPeak:
    """One memory file's peak as its analysis reports it: ``kind`` is the input kind
    (``snapshot``, ``memory_timeline``), ``ts_ns`` None when no time was recorded."""

    source: str
    kind: str
    device: int | None
    peak_bytes: int
    ts_ns: int | None


PLACEMENT_SCHEMA = {
    "source": pl.String, "kind": pl.String, "device": pl.String, "peak_bytes": pl.Int64, "ts_ns": pl.Int64,
    "placed": pl.Boolean, "step": pl.Int64, "offset_ns": pl.Int64, "note": pl.String,
}


@dataclass(frozen=True)
class RunMemoryResult:
    """See the module docstring: one row per memory input in ``placements``."""

    trace_source: str
    clocks_comparable: bool
    trace_start_ns: int
    trace_end_ns: int
    placements: pl.DataFrame  # PLACEMENT_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_source": self.trace_source,
            "clocks_comparable": self.clocks_comparable,
            "trace_start_ns": self.trace_start_ns,
            "trace_end_ns": self.trace_end_ns,
            "placements": self.placements.to_dicts(),
        }

    def summary(self) -> list[tuple[str, str]]:
        out = []
        for r in self.placements.iter_rows(named=True):
            what = f"{fmt_bytes(r['peak_bytes'])} on {r['device']}"
            if r["placed"] and r["step"] is not None:
                where = f"in step #{r['step']}, {fmt_ns(r['offset_ns'])} into its window"
            elif r["placed"]:
                where = f"at +{fmt_ns(r['ts_ns'] - self.trace_start_ns)} from the trace start, outside any step"
            else:
                where = f"not placed on the trace: {r['note']}"
            out.append((f"Peak of the {r['kind'].replace('_', ' ')}", f"{what}, {where}"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"Memory peaks on the trace": self.placements.select(
            "source", "device", "peak_bytes", "placed", "step", "offset_ns", "note")}


def place_memory_peaks(trace_source: str, trace_start_ns: int, trace_end_ns: int, steps: StepsResult | None,
                       peaks: Sequence[MemoryPeak], vendor: str | None = None) -> RunMemoryResult:
    """Place each of ``peaks`` on the trace's step windows (see the module docstring)."""
    comparable = trace_start_ns >= EPOCH_MIN_NS
    windows = steps.table if steps is not None and steps.has_steps else None
    rows: list[dict[str, Any]] = []
    for p in peaks:
        row: dict[str, Any] = {"source": p.source, "kind": p.kind, "device": device_name(p.device, vendor),
                               "peak_bytes": p.peak_bytes, "ts_ns": p.ts_ns, "placed": False, "step": None,
                               "offset_ns": None, "note": ""}
        if p.ts_ns is None:
            row["note"] = "no time is recorded with the peak (no allocator history, or the peak precedes it)"
        elif not comparable:
            row["note"] = "the trace's clock is relative to the profiler start, not the epoch clock of the snapshot"
        elif p.ts_ns < EPOCH_MIN_NS:
            row["note"] = "the memory file's clock is relative, not the epoch clock of the trace"
        elif p.ts_ns < trace_start_ns - PLACE_TOLERANCE_NS or p.ts_ns > trace_end_ns + PLACE_TOLERANCE_NS:
            side, dist = (("before", trace_start_ns - p.ts_ns) if p.ts_ns < trace_start_ns
                          else ("after", p.ts_ns - trace_end_ns))
            row["note"] = f"the peak lies {fmt_ns(dist)} {side} the trace: recorded at another time"
        else:
            row["placed"] = True
            if windows is not None:
                hit = windows.filter((pl.col("start_ns") <= p.ts_ns) & (pl.col("end_ns") > p.ts_ns))
                if hit.height:
                    row["step"] = hit["step"][0]
                    row["offset_ns"] = p.ts_ns - int(hit["start_ns"][0])
            if row["step"] is None:
                row["note"] = "inside the trace, between step windows"
        rows.append(row)
    return RunMemoryResult(trace_source, comparable, trace_start_ns, trace_end_ns,
                           pl.DataFrame(rows, schema=PLACEMENT_SCHEMA))


# ``after``: what place_memory_peaks reads of the trace (the runner never runs an input "run").
@analysis("run_memory", input="run", title="Memory peak on the trace's steps", order=75, after=("steps",))
def run_memory(ctx: AnalysisContext[Model]) -> RunMemoryResult:
    """Where a snapshot's memory peak lies on the trace's steps, for a run analysed together."""
    raise NotApplicable("needs a run's trace and memory snapshot analysed together (analyze RUN_DIR)")
