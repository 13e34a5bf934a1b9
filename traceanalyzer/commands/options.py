"""Options shared by several sub-commands (config, thresholds, formats)."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import click

from traceanalyzer.config import Config, check_value, convert
from traceanalyzer.errors import ConfigError


class FiniteFloat(click.FloatRange):
    """A float option that refuses ``nan``, ``inf`` and magnitudes beyond
    :data:`~traceanalyzer.config.MAX_ABS_VALUE` (a usage error, exit 2): ``nan`` would
    make every comparison false and silently disable a gate or a limit."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        from traceanalyzer.config import MAX_ABS_VALUE

        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and (not math.isfinite(rv) or abs(rv) > MAX_ABS_VALUE):
            self.fail(f"{value!r} is not a finite number of at most {MAX_ABS_VALUE:.0e}", param, ctx)
        return rv


# ---------------------------------------------------------------------------------------------
# Click options shared by several sub-commands: flags, types and metavars defined once; each
# sub-command words its own help (what its output directory holds, its default formats …).
# ---------------------------------------------------------------------------------------------

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def outdir_option(help: str, required: bool = False) -> Decorator:
    """``-o/--outdir DIR``: where the sub-command writes its files (``outdir``)."""
    return click.option("-o", "--outdir", required=required, type=click.Path(file_okay=False),
                        default=None, help=help)


def formats_option(help: str) -> Decorator:
    """``-f/--format FMT[,FMT…]``, comma-separated or repeated (``formats``)."""
    return click.option("-f", "--format", "formats", multiple=True, metavar="FMT[,FMT…]", help=help)


def quiet_option(help: str = "Print nothing but errors.") -> Decorator:
    """``-q/--quiet`` (``quiet``)."""
    return click.option("-q", "--quiet", is_flag=True, help=help)


def fail_on_option() -> Decorator:
    """``--fail-on SEVERITY`` (``fail_on``): exit 1 when a finding of that severity or worse exists."""
    return click.option("--fail-on", "fail_on", type=click.Choice(["info", "warning", "critical"]), default=None,
                        help="Exit 1 (after writing the reports) when a finding of this severity or worse exists: "
                             "a CI gate on performance.")


def top_option(default: int, help: str) -> Decorator:
    """``--top N`` (``top``), clamped to 1 … 10^6."""
    return click.option("--top", type=click.IntRange(min=1, max=1_000_000, clamp=True), default=default,
                        show_default=True, help=help)


def config_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE`` and repeatable ``--set OWNER.PARAM=VALUE``."""
    func = click.option(
        "--set", "assignments", multiple=True, metavar="OWNER.PARAM=VALUE",
        help="Override a threshold, e.g. --set idle_gaps.long_gap_us=100 (repeatable).",
    )(func)
    func = click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        help="TOML file of thresholds ([owner] tables of param = value).",
    )(func)
    return func


def make_config(config_path: str | None, assignments: tuple[str, ...]) -> Config:
    """The config in effect: the TOML file's values, then ``--set`` (later wins). Every key is
    checked (:func:`check_keys`): a typo must not silently leave a default in effect."""
    cfg = Config.from_file(config_path) if config_path else Config()
    check_keys(cfg.overrides, str(config_path))
    sets = [Config.parse_assignment(a) for a in assignments]
    for a, (key, value) in zip(assignments, sets):
        check_keys({key: value}, f"--set {a}")
    return cfg.with_overrides(dict(sets))


#: ``config.get("owner.param"``: every key an analysis reads.
_KEY_RE = re.compile(r"""config\.get\(\s*["']([a-z0-9_]+)\.([a-z0-9_]+)["']""")
#: ``config.get("owner.param", DEFAULT)`` with a simple default: the key and the default's text.
_GET_RE = re.compile(r"""config\.get\(\s*["']([a-z0-9_]+)\.([a-z0-9_]+)["']\s*(?:,\s*([^()\n]*?)\s*)?\)""")
_NO_DEFAULT = object()


def _default_of(text: str | None, module: Any) -> Any:
    """The value of a default as written in the source: a literal, a module constant, or
    :data:`_NO_DEFAULT` when it is an expression (then only the generic checks apply)."""
    if not text:
        return _NO_DEFAULT
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and hasattr(module, text):
        return getattr(module, text)
    try:  # constant arithmetic such as ``1 << 20`` or ``16 * MiB``
        return _const_eval(ast.parse(text, mode="eval").body, module)
    except (ValueError, SyntaxError, TypeError, ArithmeticError):
        return _NO_DEFAULT


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.LShift: lambda a, b: a << b,
}


def _const_eval(node: ast.AST, module: Any) -> Any:
    """The value of a small constant expression (numbers, module constants, + - * / <<)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), (int, float)):
        return getattr(module, node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_const_eval(node.left, module), _const_eval(node.right, module))
    raise ValueError("not a constant expression")


@functools.lru_cache(maxsize=1)
def _analysis_params() -> dict[str, dict[str, Any]]:
    """Owner → {param: default} that analyses read. Analyses read thresholds with literal
    ``config.get("owner.param", default)`` calls (the contract in analyses/__init__.py), so
    their sources name every key and, mostly, its default (:data:`_NO_DEFAULT` where the
    default is an expression); an analysis whose source is unavailable accepts any param."""
    from traceanalyzer.analyses import registry as analysis_registry

    keys: dict[str, dict[str, Any]] = {name: {} for name in analysis_registry()}
    unreadable: set[str] = set()
    for spec in analysis_registry().values():
        module = inspect.getmodule(spec.func)
        try:
            src = inspect.getsource(module)  # type: ignore[arg-type]
        except (OSError, TypeError):
            unreadable.add(spec.name)
            continue
        for owner, param in _KEY_RE.findall(src):
            keys.setdefault(owner, {}).setdefault(param, _NO_DEFAULT)
        for owner, param, default in _GET_RE.findall(src):
            value = _default_of(default, module)
            if keys[owner].get(param, _NO_DEFAULT) is _NO_DEFAULT:
                keys[owner][param] = value
    # The runner's own setting (traceanalyzer.analyses.run_analyses): how many at once.
    keys.setdefault("analyses", {})["workers"] = 1
    # The rule engine's own setting (traceanalyzer.rules.run_rules): the reporting floor.
    keys.setdefault("rules", {})["min_cost_pct"] = 1.0
    return {k: v for k, v in keys.items() if k not in unreadable}


def _analysis_keys() -> dict[str, frozenset[str]]:
    """Owner → params that analyses read (see :func:`_analysis_params`)."""
    return {k: frozenset(v) for k, v in _analysis_params().items()}


def check_keys(overrides: dict[str, Any], origin: str) -> None:
    """Raise :class:`ConfigError` (one line naming ``origin``) for a key whose owner is neither
    a rule nor an analysis, a param the rule or analysis does not have, or a value that does
    not convert to its default's type (non-finite and out-of-range numbers included: see
    :func:`traceanalyzer.config.convert`)."""
    from traceanalyzer.analyses import registry as analysis_registry
    from traceanalyzer.rules import Params
    from traceanalyzer.rules import registry as rule_registry

    rules = rule_registry()
    analyses = _analysis_params()
    for key, value in overrides.items():
        owner, _, param = key.partition(".")
        if owner in rules:
            known = rules[owner].params
            if param not in known:
                have = ", ".join(sorted(known)) or "none"
                raise ConfigError(f"{origin}: rule {owner!r} has no parameter {param!r} (its parameters: {have})")
            try:
                Params(owner, {param: known[param]}, Config({key: value}))  # converts to the default's type
            except ConfigError as exc:
                raise ConfigError(f"{origin}: {exc}") from None
        elif owner in analyses:
            if param not in analyses[owner]:
                have = ", ".join(sorted(analyses[owner])) or "none"
                raise ConfigError(f"{origin}: analysis {owner!r} has no parameter {param!r} (its parameters: {have})")
            default = analyses[owner][param]
            try:
                if isinstance(default, (bool, int, float, str)):
                    convert(key, value, default)  # the analysis would refuse it at run time
                else:
                    check_value(key, value)
            except ConfigError as exc:
                raise ConfigError(f"{origin}: {exc}") from None
        elif owner not in analysis_registry():
            raise ConfigError(f"{origin}: unknown rule or analysis {owner!r}; `traceanalyzer rules` lists the rules "
                              "and their parameters")
