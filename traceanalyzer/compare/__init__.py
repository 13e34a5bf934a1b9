"""Run-vs-run and trace-vs-trace comparison.

* :mod:`~traceanalyzer.compare.diff` — load and analyse each side, then pure functions
  over the two: step time, busy %, per-kernel and per-op deltas ranked by impact,
  new/vanished kernels, memory peak.
* :mod:`~traceanalyzer.compare.stats` — the step-time difference with a bootstrap
  confidence interval and a Mann–Whitney U test ("did the change help?").
* :mod:`~traceanalyzer.compare.render` — Markdown, JSON and HTML outputs.
"""

from traceanalyzer.compare.diff import Comparison, Side, compare_paths, compare_sides, load_side
from traceanalyzer.compare.stats import StepTimeChange, step_time_change

__all__ = ["Comparison", "Side", "StepTimeChange", "compare_paths", "compare_sides", "load_side",
           "step_time_change"]
