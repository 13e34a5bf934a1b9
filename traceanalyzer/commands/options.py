"""Options shared by several sub-commands (config, thresholds, formats)."""

from __future__ import annotations

from typing import Any, Callable

import click

from traceanalyzer.config import Config


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
    cfg = Config.from_file(config_path) if config_path else Config()
    return cfg.with_overrides(dict(Config.parse_assignment(a) for a in assignments))
