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

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    if not overrides:
        # Nothing to check: the registries' imports (every analysis and rule module) are then
        # left to the pipeline's warm-up, which overlaps them with the parse.
        return
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


# ---------------------------------------------------------------------------------------------
# The input budget as settings: ``[budget]`` in --config, ``--set budget.<key>=…``, global options
# ---------------------------------------------------------------------------------------------

#: The owner name of the input budget's settings (``[budget]`` table, ``--set budget.KEY=VALUE``).
BUDGET_OWNER = "budget"
#: Set in the environment by :func:`apply_budget` for each variable a global option set, so a
#: ``[budget]`` table read later by the sub-command does not override what the command line said.
_FROM_OPTIONS: set[str] = set()


@dataclass(frozen=True)
class BudgetSetting:
    """One limit of the input budget (docs/input_formats.md, "Input budget").

    ``key`` is its name under ``[budget]``; ``env`` the environment variable the loaders read
    (every way of setting it ends there, so ``batch`` workers inherit it); ``option`` the global
    option that sets it; ``check`` turns a user's value into the text put in ``env``, or raises
    :class:`ValueError` with what was expected."""

    key: str
    env: str
    option: str
    check: Callable[[str], str]
    help: str


def _size(text: str) -> str:
    from traceanalyzer.load.budget import _parse_size

    try:
        n = _parse_size(text)
    except ConfigError:
        raise ValueError("a size such as 40G, 512M or 1000000") from None
    if n <= 0:
        raise ValueError("a size such as 40G, 512M or 1000000, above zero")
    return str(n)


def _ratio(text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 < x < 1e15:
        raise ValueError("a number such as 500, above zero")
    return repr(x)


def _count(text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (1 <= x < 1e18) or x != int(x):
        raise ValueError("a positive whole number")
    return str(int(x))


def budget_settings() -> dict[str, BudgetSetting]:
    """Every limit of the input budget (:data:`traceanalyzer.load.budget.LIMITS`), by its
    ``[budget]`` key: the trace limits by their name (``max_events``), the snapshot limits with
    ``snapshot_`` in front (``snapshot_max_objects``)."""
    from traceanalyzer.load.budget import LIMITS

    checks = {"size": _size, "count": _count, "ratio": _ratio}
    options = {"max_input_bytes": "--max-input-size", "max_gzip_ratio": "--max-gzip-ratio"}
    out = []
    for limit in LIMITS:
        key = limit.name if limit.applies_to == "trace" else f"snapshot_{limit.name}"
        if limit.applies_to == "snapshot":
            option = f"--snapshot-limit {limit.name}=N"
        else:
            option = options.get(limit.name, f"--limit {key}=N")
        out.append(BudgetSetting(key, limit.env, option, checks[limit.kind], limit.description))
    return {s.key: s for s in out}


def apply_budget(values: Mapping[str, Any], origin: str, *, from_options: bool = False) -> None:
    """Check each ``key → value`` of the budget and put it into the environment the loaders read.

    A bad key or value raises :class:`ConfigError` (one line naming ``origin``) before anything is
    set. Values from a config file (``from_options`` False) leave alone what a global option set."""
    settings = budget_settings()
    staged: dict[str, str] = {}
    for key, value in values.items():
        setting = settings.get(key)
        if setting is None:
            raise ConfigError(f"{origin}: the input budget has no limit {key!r} (its limits: "
                              f"{', '.join(settings)})")
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{origin}: budget.{key} = {value!r}: expected a number or a size")
        try:
            staged[setting.env] = setting.check(str(value).strip())
        except ValueError as exc:
            raise ConfigError(f"{origin}: budget.{key} = {value!r}: expected {exc}") from None
    staged = {env: text for env, text in staged.items() if from_options or env not in _FROM_OPTIONS}
    before = {env: os.environ.get(env) for env in staged}
    os.environ.update(staged)
    try:
        _check_as_loaders_read()
    except ConfigError as exc:
        for env, old in before.items():
            if old is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = old
        raise ConfigError(f"{origin}: {exc}") from None
    if from_options:
        _FROM_OPTIONS.update(staged)


def _check_as_loaders_read() -> None:
    """Read the budget the way the loaders will (limits checked against each other and their
    ceilings, e.g. ``max_depth`` ≤ 1,000), so a bad setting fails here, before any input."""
    from traceanalyzer.load.budget import Budget

    Budget.from_env()


def split_budget(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ``budget.*`` keys without their owner, every other key) of ``overrides``."""
    budget = {k.partition(".")[2]: v for k, v in overrides.items() if k.partition(".")[0] == BUDGET_OWNER}
    rest = {k: v for k, v in overrides.items() if k.partition(".")[0] != BUDGET_OWNER}
    return budget, rest


def budget_environment() -> dict[str, str]:
    """The budget's variables set in this process: what a worker on another machine (Dask)
    must be given to apply the same limits."""
    return {s.env: os.environ[s.env] for s in budget_settings().values() if s.env in os.environ}


__all__ = ["BUDGET_OWNER", "BudgetSetting", "analysis_params", "apply_budget", "budget_environment",
           "budget_settings", "check_keys", "engine_params", "split_budget"]
