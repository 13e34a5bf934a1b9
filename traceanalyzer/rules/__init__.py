"""Rules: read analysis results, yield findings with evidence, cost and a fix.

Contract
--------
A rule is one module in this package with one decorated function::

    @rule("pageable_memcpy", needs=("copies",), severity=Severity.WARNING,
          params={"min_ms_per_step": 0.5})
    def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
        '''Docstring: what the rule detects, its signal, thresholds and fix.'''

* It reads results typed: ``results.need("copies", CopiesResult)`` for an analysis named in
  ``needs`` (the engine guarantees it is present), ``results.typed("context", ContextResult)``
  for one named in ``uses`` or ``needs_any`` (None when absent); the result classes come from
  the analysis modules (``traceanalyzer.analyses.copies``). A rule reads only what it
  declares: the engine hands it ``results.declared(...)``, where any other name raises
  (helpers in ``rules/_*.py`` count: a rule calling ``for_engine`` reads ``context``).
* ``uses`` names optional inputs: read when present, the rule runs without them.
* ``needs`` names the analyses it requires. When one is missing (skipped or failed)
  the rule does not run and the report lists it under "checks that could not run"
  with the analysis' reason. ``needs_any`` names alternatives (e.g. a snapshot's
  ``memory_fragmentation`` or a trace's ``trace_memory``): the rule runs when at least
  one of them is present. A rule may also raise
  :class:`~traceanalyzer.errors.NotApplicable` itself.
* A rule that raises anything else is a bug: the run goes on, and the report lists it
  under "checks that could not run" as failed (``RuleOutcome.failed``); its findings
  are dropped (none of a half-run rule is kept).
* ``params`` are its thresholds with their defaults; ``params.x`` reads the value in
  effect (``--set pageable_memcpy.min_ms_per_step=1`` or a config file overrides). A rule
  reads no other setting from ``config``: the engine's own (``rules.min_cost_pct``) is read
  by :func:`run_rules`.
* The docstring is its documentation (``traceanalyzer rules`` prints it).
* A helper several rules call on the same results (``rules/_util.py``, ``rules/_hostsync.py``)
  wraps its work in :func:`shared`, which computes it once per :func:`run_rules` call.

Findings are ranked by estimated cost: ms per step first, then bytes, then severity.

The reporting floor: a warning or critical finding whose cost is known and under
``rules.min_cost_pct`` (:data:`MIN_COST_PCT`, 1 % of the median steady step) is not worth a
reader's time next to the others. It is kept out of the ranked findings and listed in
:attr:`RuleOutcome.below_floor` (``findings_below_floor`` in summary.json, one line in the
other formats), so nothing is lost. Info findings and findings priced in bytes or without a
time cost are never held back.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from traceanalyzer.analyses import Results
from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.config import Config, Params
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import KIND_WORDS
from traceanalyzer.plugins import import_submodules


class Severity(enum.IntEnum):
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.strip().upper()]

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    """One recommendation.

    ``cost_ms_per_step`` / ``cost_pct_of_step`` estimate what fixing it could buy
    (time per step); ``cost_bytes`` is used for memory findings. ``confidence``
    (0–1) is below 1 when the signal is indirect. ``evidence`` holds the numbers,
    steps and top offenders that support the finding.
    """

    rule_id: str
    severity: Severity
    title: str
    evidence: Mapping[str, Any]
    fix: str
    code_hint: str = ""
    cost_ms_per_step: float | None = None
    cost_pct_of_step: float | None = None
    cost_bytes: int | None = None
    confidence: float = 1.0

    def sort_key(self) -> tuple[float, float, int]:
        return (-(self.cost_ms_per_step or 0.0), -float(self.cost_bytes or 0), -int(self.severity))

    def to_json(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "severity": str(self.severity),
            "title": self.title,
            "evidence": dict(self.evidence),
            "fix": self.fix,
            "code_hint": self.code_hint,
            "cost_ms_per_step": self.cost_ms_per_step,
            "cost_pct_of_step": self.cost_pct_of_step,
            "cost_bytes": self.cost_bytes,
            "confidence": self.confidence,
        }


#: A rule's check: typed results in (``results.need(name, ResultClass)`` for a name in ``needs``,
#: ``results.typed(...)`` for an optional one), findings out; thresholds come from ``params``.
CheckFunc = Callable[[Results, Config, Params], Iterable[Finding]]


@dataclass(frozen=True)
class RuleSpec:
    rule_id: str
    func: CheckFunc
    needs: tuple[str, ...]
    severity: Severity
    params: Mapping[str, Any]
    doc: str
    needs_any: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()  # optional inputs: read when present, never required

    @property
    def reads(self) -> tuple[str, ...]:
        """Every analysis the rule may read: ``needs``, ``needs_any`` and ``uses``."""
        return (*self.needs, *self.needs_any, *self.uses)

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else ""

    @property
    def needs_text(self) -> str:
        """``needs`` and ``needs_any`` in words (``traceanalyzer rules``, docs/rules.md)."""
        parts = list(self.needs)
        if self.needs_any:
            parts.append(self.needs_any[0] if len(self.needs_any) == 1 else "one of " + " / ".join(self.needs_any))
        return ", ".join(parts) or "-"


_REGISTRY: dict[str, RuleSpec] = {}


def rule(
    rule_id: str,
    *,
    needs: tuple[str, ...] = (),
    severity: Severity = Severity.WARNING,
    params: Mapping[str, Any] | None = None,
    needs_any: tuple[str, ...] = (),
    uses: tuple[str, ...] = (),
) -> Callable[[CheckFunc], CheckFunc]:
    """Register a rule; see the module docstring."""

    def deco(func: CheckFunc) -> CheckFunc:
        if rule_id in _REGISTRY and _REGISTRY[rule_id].func is not func:
            raise ValueError(f"rule {rule_id!r} registered twice")
        _REGISTRY[rule_id] = RuleSpec(
            rule_id=rule_id,
            func=func,
            needs=needs,
            severity=severity,
            params=dict(params or {}),
            doc=inspect.cleandoc(func.__doc__ or ""),
            needs_any=tuple(needs_any),
            uses=tuple(uses),
        )
        return func

    return deco


def discover() -> None:
    """Import every module of this package so their decorators register."""
    import_submodules(__name__)


def registry() -> dict[str, RuleSpec]:
    discover()
    return dict(_REGISTRY)


@dataclass
class RuleOutcome:
    """Findings ranked by cost, those under the reporting floor, and the rules that could not
    run and why."""

    findings: list[Finding] = field(default_factory=list)
    below_floor: list[Finding] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


#: The reporting floor (% of the median steady step): see the module docstring.
MIN_COST_PCT = 1.0


def below_floor(f: Finding, floor_pct: float) -> bool:
    """True for a warning/critical finding whose time cost is known and under ``floor_pct`` % of
    the step (and which is not priced in bytes)."""
    return (f.severity >= Severity.WARNING and f.cost_bytes is None and f.cost_pct_of_step is not None
            and f.cost_pct_of_step < floor_pct)


def _why_missing(names: Iterable[str], results: Results, alternatives: bool = False) -> str:
    """Why analyses ``names`` are absent: their own skip/failure reasons when they ran on this
    input, else which kind of input produces them (they do not apply to this one)."""
    names = list(names)
    reasons = [results.skipped.get(n) or results.failed.get(n) for n in names]
    known = [r for r in dict.fromkeys(reasons) if r]
    # An analysis skipped because its own input was skipped repeats that reason inside its own
    # ("needs gpu_time: no GPU activity …"): keep only the most informative one.
    known = [r for r in known if not any(r != o and r in o for o in known)]
    if known:
        return "; ".join(known)
    specs = analysis_registry()
    by_kind: dict[str, list[str]] = {}
    for n in names:
        kind = specs[n].input if n in specs else ""
        by_kind.setdefault(KIND_WORDS[kind][0] if kind in KIND_WORDS else kind, []).append(n)
    if alternatives:
        return "needs " + " or ".join(
            f"{' or '.join(ns)} (from {kind})" if kind else " or ".join(ns) for kind, ns in by_kind.items())
    kinds = [k for k in by_kind if k]
    return f"needs {', '.join(names)}" + (f" (from {' or '.join(kinds)})" if kinds else "")


T = TypeVar("T")

#: What the helpers of several rules derive from the same results, kept for one :func:`run_rules` call.
_RUN_MEMO: ContextVar[dict[Hashable, Any] | None] = ContextVar("traceanalyzer_rules_memo", default=None)


def shared(key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, computed once per :func:`run_rules` call and ``key``: a helper several rules
    call on the same results (the steady windows, the host-blocking events) runs once. ``key``
    names the helper and the ``id`` of each result it reads (read through the rule's
    ``results`` first, so that an undeclared input still raises; results live as long as the
    run). Outside a run, ``build()`` runs each time. The value is shared: never change it."""
    memo = _RUN_MEMO.get()
    if memo is None:
        return build()
    if key not in memo:
        memo[key] = build()
    return memo[key]  # type: ignore[no-any-return]


def run_rules(results: Results, config: Config | None = None, strict: bool = False) -> RuleOutcome:
    """Run every registered rule whose ``needs`` (and one of ``needs_any``) are present.

    ``results`` holds the analyses' results; its ``skipped`` and ``failed`` reasons explain
    rules that cannot run. Every registered rule ends up in
    exactly one place: it produced findings (ranked, or under the reporting floor) or stayed
    silent (it ran and found nothing),
    ``not_run`` (its input is absent, with the reason) or ``failed`` (it raised: a bug).
    With ``strict`` a failing rule's exception propagates (tests use it).
    """
    token = _RUN_MEMO.set({})
    try:
        return _run_rules(results, config, strict)
    finally:
        _RUN_MEMO.reset(token)


def _run_rules(results: Results, config: Config | None, strict: bool) -> RuleOutcome:
    config = config or Config()
    floor_pct = float(config.get("rules.min_cost_pct", MIN_COST_PCT))
    out = RuleOutcome()
    for rid, spec in sorted(registry().items()):
        missing = [n for n in spec.needs if n not in results]
        if missing:
            out.not_run[rid] = _why_missing(missing, results)
            continue
        if spec.needs_any and not any(n in results for n in spec.needs_any):
            out.not_run[rid] = _why_missing(spec.needs_any, results, alternatives=True)
            continue
        try:
            # Materialise before keeping anything: a rule that yields then raises keeps nothing.
            view = results.declared(spec.reads, f"rule {rid}")
            found = list(spec.func(view, config, Params(rid, spec.params, config)))
        except NotApplicable as na:
            out.not_run[rid] = na.reason
            continue
        except Exception as exc:  # noqa: BLE001 - a broken rule must not sink the report
            if strict:
                raise
            out.failed[rid] = f"{type(exc).__name__}: {exc}"
            continue
        out.findings.extend(f for f in found if not below_floor(f, floor_pct))
        out.below_floor.extend(f for f in found if below_floor(f, floor_pct))
    out.findings.sort(key=Finding.sort_key)
    out.below_floor.sort(key=Finding.sort_key)
    return out


__all__ = ["Finding", "Params", "RuleOutcome", "RuleSpec", "Severity", "registry", "rule", "run_rules", "shared"]
