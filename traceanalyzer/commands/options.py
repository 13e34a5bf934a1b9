"""Options shared by several sub-commands (config, thresholds, formats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from traceanalyzer.config import Config
from traceanalyzer.params import apply_budget, check_keys, split_budget


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
    checked (:func:`check_keys`): a typo must not silently leave a default in effect. The
    ``budget.*`` keys (a ``[budget]`` table) are not thresholds: they set the input budget for
    this run (:func:`~traceanalyzer.params.apply_budget`) and are not kept in the config."""
    cfg = Config.from_file(config_path) if config_path else Config()
    file_budget, thresholds = split_budget(cfg.overrides)
    check_keys(thresholds, str(config_path))
    apply_budget(file_budget, str(config_path))
    for a in assignments:
        key, value = Config.parse_assignment(a)
        budget, rest = split_budget({key: value})
        check_keys(rest, f"--set {a}")
        apply_budget(budget, f"--set {a}")
        thresholds.update(rest)
    return Config(thresholds)
