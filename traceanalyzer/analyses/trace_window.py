"""Trace window: the raw events of a stretch of the timeline, kept for the Perfetto export.

What is selected
----------------
* **The window.** By default the steady steps (neither warm-up nor truncated, see ``steps``),
  at most ``trace_window.max_steps`` (5) of them, the first ones; a trace without steps gives
  the whole trace. ``trace_window.window`` (the ``--window`` option of ``analyze``) chooses
  another one: ``START_MS:END_MS`` (milliseconds from the trace start, the first event of the
  trace) or ``step:N`` / ``step:N-M`` (the step windows of ``ProfilerStep#N`` … ``#M``).
  A window of steps runs from the first step window's start to the last one's end
  (``steps``' windows: the CPU range extended to the GPU work it launched).
* **The events.** Every event of the model's tables whose start lies in ``[start_ns,
  end_ns)``: CPU ops, user annotations, Python frames, runtime calls, kernels, copies,
  memsets, GPU annotations, flow endpoints (a flow only when both of its ends are kept),
  ``[memory]`` events; events are never clipped. The ``ProfilerStep#N`` ranges of steps
  outside the window are left out, so the exported file re-loads with the window's steps
  only. ``threads`` (thread names) are kept whole.

This analysis computes nothing: it selects rows, so that the Perfetto renderer
(``report/perfetto.py``) formats a frozen result instead of reading the model. ``to_json()``
holds the window and the event counts, not the events.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.units import fmt_ns

#: The model tables a window keeps (events selected by start time), in export order.
EVENT_TABLES = ("cpu_ops", "annotations", "python_frames", "runtime", "kernels", "memcpy", "memset",
                "gpu_annotations", "flows", "memory_events")

_STEP_NAME_RE = r"^ProfilerStep#\d+$"
_TIME_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*:\s*([0-9]+(?:\.[0-9]*)?)\s*$")
_STEP_RE = re.compile(r"^\s*step\s*:\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$", re.IGNORECASE)
#: A window longer than this (ms) cannot be meant: ~115 days.
_MAX_MS = 1e10

WINDOW_HELP = "START_MS:END_MS (ms from the trace start) or step:N or step:N-M"


@dataclass(frozen=True)
class WindowSpec:
    """A parsed window: ``kind`` is ``"steady"`` (the default), ``"time"`` (``start_ms``,
    ``end_ms`` from the trace start) or ``"steps"`` (``first_step`` … ``last_step``)."""

    kind: str
    start_ms: float = 0.0
    end_ms: float = 0.0
    first_step: int = 0
    last_step: int = 0

    def text(self) -> str:
        if self.kind == "time":
            return f"{self.start_ms:g}:{self.end_ms:g} ms"
        if self.kind == "steps":
            return f"step:{self.first_step}" + (f"-{self.last_step}" if self.last_step != self.first_step else "")
        return "steady steps"


def parse_window(text: str) -> WindowSpec:
    """``text`` (the ``--window`` value) as a :class:`WindowSpec`; ``""`` is the default
    (the steady steps). Raises ``ValueError`` with one line saying what is expected."""
    if not text.strip():
        return WindowSpec("steady")
    m = _TIME_RE.match(text)
    if m:
        start, end = float(m.group(1)), float(m.group(2))
        if not (math.isfinite(start) and math.isfinite(end)) or end > _MAX_MS:
            raise ValueError(f"--window {text!r}: times beyond {_MAX_MS:.0e} ms")
        if end <= start:
            raise ValueError(f"--window {text!r}: END_MS must be after START_MS")
        return WindowSpec("time", start_ms=start, end_ms=end)
    m = _STEP_RE.match(text)
    if m:
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"--window {text!r}: step:N-M needs N <= M")
        return WindowSpec("steps", first_step=first, last_step=last)
    raise ValueError(f"--window {text!r}: expected {WINDOW_HELP}, e.g. 120:180 or step:5-7")


@dataclass(frozen=True)
class TraceWindowResult:
    """See the module docstring. ``events`` maps each of :data:`EVENT_TABLES` to its rows in
    the window (the model's schema); ``step_windows`` are the ``steps`` windows that start in
    it; ``trace_start_ns`` is the origin of ``START_MS`` (the trace's first event)."""

    spec: str
    source: str  # "steady", "time", "steps", "whole trace"
    start_ns: int
    end_ns: int
    trace_start_ns: int
    base_time_ns: int
    steps: tuple[int, ...]
    step_windows: pl.DataFrame
    events: dict[str, pl.DataFrame] = field(repr=False)
    threads: pl.DataFrame = field(repr=False)
    device_properties: tuple[dict[str, Any], ...] = ()
    distributed_info: dict[str, Any] | None = None

    @property
    def n_events(self) -> int:
        return sum(df.height for df in self.events.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.spec,
            "source": self.source,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "dur_ns": self.end_ns - self.start_ns,
            "start_ms_from_trace_start": round((self.start_ns - self.trace_start_ns) / 1e6, 6),
            "steps": list(self.steps),
            "n_events": {name: df.height for name, df in self.events.items()},
        }

    def summary(self) -> list[tuple[str, str]]:
        where = (f"steps #{self.steps[0]}–#{self.steps[-1]}" if len(self.steps) > 1
                 else f"step #{self.steps[0]}" if self.steps else self.source)
        return [("Perfetto export window", f"{where}, {fmt_ns(self.end_ns - self.start_ns)} "
                 f"from +{fmt_ns(self.start_ns - self.trace_start_ns)}, {self.n_events:,} events")]


def _bounds(spec: WindowSpec, sr: StepsResult, trace_start: int, trace_end: int,
            max_steps: int) -> tuple[int, int, str]:
    """(start_ns, end_ns, source) of ``spec`` on this trace; NotApplicable when it misses it."""
    table = sr.table
    if spec.kind == "time":
        start = trace_start + round(spec.start_ms * 1e6)
        end = trace_start + round(spec.end_ms * 1e6)
        if start >= trace_end:
            raise NotApplicable(f"{spec.text()} starts after the trace ends "
                                f"({(trace_end - trace_start) / 1e6:,.3f} ms from its start)")
        return start, min(end, trace_end), "time"
    if spec.kind == "steps":
        if not sr.has_steps:
            raise NotApplicable(f"{spec.text()}: the trace has no ProfilerStep# ranges")
        rows = table.filter(pl.col("step").is_between(spec.first_step, spec.last_step))
        if rows.is_empty():
            have = table["step"].drop_nulls().to_list()
            raise NotApplicable(f"{spec.text()}: no such step in the trace (steps #{min(have)}–#{max(have)})")
        return int(rows["start_ns"].min()), int(rows["end_ns"].max()), "steps"  # type: ignore[arg-type]
    if not sr.has_steps:
        return trace_start, trace_end, "whole trace"
    steady = sr.steady_windows()[: max(1, max_steps)]
    rows = table.filter(pl.col("window").is_in(steady))
    return int(rows["start_ns"].min()), int(rows["end_ns"].max()), "steady"  # type: ignore[arg-type]


@analysis("trace_window", depends_on=("steps",), title="Trace window (Perfetto export)", order=95,
          params={"window": "", "max_steps": 5})
def trace_window(ctx: AnalysisContext[TraceModel]) -> TraceWindowResult:
    """The events of the exported window (the steady steps, or ``--window``) for the Perfetto export."""
    model = ctx.model
    try:
        spec = parse_window(str(ctx.params.window))
    except ValueError as exc:
        raise NotApplicable(str(exc)) from None
    sr = ctx.need("steps", StepsResult)
    t0, t1 = model.meta.span_start_ns, model.meta.span_end_ns
    start, end, source = _bounds(spec, sr, t0, t1, int(ctx.params.max_steps))
    windows = sr.table.filter((pl.col("start_ns") >= start) & (pl.col("start_ns") < end)) if sr.has_steps \
        else sr.table.head(0)
    steps = tuple(int(s) for s in windows["step"].to_list() if s is not None)
    inside = (pl.col("ts_ns") >= start) & (pl.col("ts_ns") < end)
    events: dict[str, pl.DataFrame] = {}
    for name in EVENT_TABLES:
        df: pl.DataFrame = getattr(model, name).filter(inside)
        if name in ("annotations", "cpu_ops") and sr.has_steps:
            # ProfilerStep ranges of other steps (the next step's CPU range can start inside the
            # last window's GPU tail) would re-load as steps of their own.
            label = pl.col("name").str.extract(r"#(\d+)$").cast(pl.Int64, strict=False)
            df = df.filter(~pl.col("name").str.contains(_STEP_NAME_RE) | label.is_in(list(steps)))
        if name == "flows":
            # Flows with both ends in the window: a window count per (kind, id), no group table
            # joined back (null keys match nothing, as in a join).
            df = df.filter(pl.col("kind").is_not_null() & pl.col("id").is_not_null()
                           & (pl.col("ph").n_unique().over("kind", "id") >= 2))
        events[name] = df
    return TraceWindowResult(
        spec=spec.text(), source=source, start_ns=start, end_ns=end, trace_start_ns=t0,
        base_time_ns=model.meta.base_time_ns, steps=steps, step_windows=windows, events=events,
        threads=model.threads, device_properties=model.meta.device_properties,
        distributed_info=model.meta.distributed_info,
    )
