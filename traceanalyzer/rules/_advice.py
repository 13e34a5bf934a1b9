"""Vendor- and context-aware wording shared by the timeline rules (private: kept out of rule discovery).

The wording lives in :mod:`traceanalyzer.analyses._advice` (the diagnosis uses it too) and is
re-exported here with the helpers that read results: a rule never advises what the run already
does (``docs/context.md``), and withholds steady-state judgements on a capture-only trace.
"""

from __future__ import annotations

import dataclasses

from traceanalyzer.analyses import Results
from traceanalyzer.analyses._advice import (  # noqa: F401 - re-exported for the rules
    capture_only_note,
    compiled_lacks,
    engine_of,
    engine_sync_hint,
    engine_sync_move,
    fewer_launches,
    fewer_launches_hint,
    graphs_name,
    has_graphs,
    is_compiled,
    uses_graphs,
)
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.rules import Finding

__all__ = [
    "capture_only_note",
    "compiled_lacks",
    "context_of",
    "engine_of",
    "engine_sync_hint",
    "engine_sync_move",
    "fewer_launches",
    "fewer_launches_hint",
    "for_engine",
    "graphs_name",
    "has_graphs",
    "is_compiled",
    "uses_graphs",
    "vendor_of",
    "withhold_on_capture",
]


def vendor_of(results: Results) -> str:
    """The trace's GPU vendor from the ``ops`` analysis (``"unknown"`` without it)."""
    o = results.typed("ops", OpsResult)
    return str((o.vendor if o is not None else None) or "unknown")


def context_of(results: Results) -> ContextResult | None:
    """The ``context`` result, or None when it did not run (advice then stays generic)."""
    return results.typed("context", ContextResult)


def withhold_on_capture(results: Results, what: str) -> None:
    """Raise NotApplicable on a capture-only trace: a rule that judges ``what`` of the steady
    state has nothing to judge there (the report lists it as not run, with the reason)."""
    note = capture_only_note(context_of(results))
    if note:
        from traceanalyzer.errors import NotApplicable

        raise NotApplicable(f"{what} is a steady-state judgement, withheld: {note}")


def for_engine(results: Results, finding: Finding) -> Finding:
    """A host-blocking finding as it reads inside an inference engine: the syncs are the engine's
    own step (its settings move them), and the generic fix applies only to code of the user's own
    in that step. Unchanged outside an engine."""
    engine = engine_of(context_of(results))
    if not engine:
        return finding
    return dataclasses.replace(
        finding, fix=f"{engine_sync_move(engine)} For code of your own inside the step: {finding.fix}",
        code_hint=engine_sync_hint(engine) or finding.code_hint)
