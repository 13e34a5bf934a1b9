"""Validation of settings (``--set``, ``--config``) against the declared parameters.

Every setting is ``<owner>.<param>``: the owner is an analysis (its ``params=`` in
:func:`~traceanalyzer.analyses.analysis`), a rule (its ``params=`` in
:func:`~traceanalyzer.rules.rule`) or one of the engines (:data:`ENGINE_PARAMS`). A key whose
owner or parameter is not declared, or whose value does not convert to the type of the
declared default (:func:`traceanalyzer.config.convert`: non-finite and out-of-range numbers
included), is refused with one line naming where it came from: a typo must not silently
leave a default in effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceanalyzer.config import convert
from traceanalyzer.errors import ConfigError


def engine_params() -> dict[str, Mapping[str, Any]]:
    """The engines' own settings, owner → param → default (its type is what is checked):
    the analysis runner's (``analyses.workers``: see
    :func:`~traceanalyzer.analyses.run_analyses`) and the rule engine's (``rules.min_cost_pct``:
    see :func:`~traceanalyzer.rules.run_rules`)."""
    from traceanalyzer.analyses import RUNNER_PARAMS
    from traceanalyzer.rules import MIN_COST_PCT

    return {"analyses": RUNNER_PARAMS, "rules": {"min_cost_pct": MIN_COST_PCT}}


def analysis_params() -> dict[str, Mapping[str, Any]]:
    """Analysis name → its declared parameters with their defaults (the engines' too)."""
    from traceanalyzer.analyses import registry

    return {name: spec.params for name, spec in registry().items()} | engine_params()


def check_keys(overrides: Mapping[str, Any], origin: str) -> None:
    """Raise :class:`ConfigError` (one line naming ``origin``) for a key whose owner is neither
    a rule nor an analysis, a param the rule or analysis does not declare, or a value that does
    not convert to its default's type."""
    from traceanalyzer.rules import registry as rule_registry

    rules = rule_registry()
    analyses = analysis_params()
    for key, value in overrides.items():
        owner, _, param = key.partition(".")
        if owner in rules:
            kind, known = "rule", rules[owner].params
        elif owner in analyses:
            kind, known = "analysis", analyses[owner]
        else:
            raise ConfigError(f"{origin}: unknown rule or analysis {owner!r}; `traceanalyzer rules` lists the rules "
                              "and their parameters")
        if param not in known:
            have = ", ".join(sorted(known)) or "none"
            raise ConfigError(f"{origin}: {kind} {owner!r} has no parameter {param!r} (its parameters: {have})")
        try:
            convert(key, value, known[param])  # what the owner would refuse at run time
        except ConfigError as exc:
            raise ConfigError(f"{origin}: {exc}") from None


__all__ = ["analysis_params", "check_keys", "engine_params"]
