"""Options shared by several sub-commands (config, thresholds, formats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from traceanalyzer.config import Config
from traceanalyzer.params import check_keys


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
