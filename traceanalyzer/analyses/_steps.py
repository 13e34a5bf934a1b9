"""Assigning events to step windows (private to the analyses package).

Every analysis that reports per step reads the ``steps`` result's windows
(:meth:`~traceanalyzer.analyses.steps.StepsResult.windows`: ``window, step, start_ns,
end_ns``, disjoint and sorted) and assigns its events to them with :func:`assign_steps`.
"""

from __future__ import annotations

from typing import Protocol

import polars as pl

from traceanalyzer.analyses._intervals import assign_window


class HasWindows(Protocol):
    """A result with step windows (the ``steps`` result)."""

    def windows(self) -> pl.DataFrame: ...


class StepWindows(HasWindows, Protocol):
    """The ``steps`` result as its readers see it: windows, and whether they are real steps."""

    @property
    def has_steps(self) -> bool: ...


def assign_steps(df: pl.DataFrame, steps: HasWindows | pl.DataFrame, ts_col: str = "ts_ns") -> pl.DataFrame:
    """Add ``window`` and ``step`` to ``df``: the step window containing ``ts_col`` (as-of join).

    ``steps`` is the ``steps`` result or its ``windows()`` frame. Rows outside every window
    get nulls; existing ``window``/``step`` columns are replaced.
    """
    w = steps if isinstance(steps, pl.DataFrame) else steps.windows()
    base = df.drop([c for c in ("window", "step") if c in df.columns])
    # The step comes from the same binary search as the window: no join (a join copies
    # every column of ``df``; these frames are the analyses' largest).
    return assign_window(base, w, ts_col, "window", carry=("step",))


__all__ = ["HasWindows", "StepWindows", "assign_steps"]
