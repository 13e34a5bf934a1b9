"""``traceanalyzer rules``: the recommendation rules, their thresholds and documentation."""

from __future__ import annotations

import click

from traceanalyzer.commands.options import config_options, make_config
from traceanalyzer.errors import ConfigError
from traceanalyzer.report.terminal import rule_docs, rules_listing
from traceanalyzer.rules import registry


@click.command("rules", epilog="""\b
Examples:
  traceanalyzer rules                         # every rule: id, severity, inputs, thresholds
  traceanalyzer rules pageable_memcpy         # one rule's full documentation
  traceanalyzer rules --set host_bound_gaps.min_pct_of_step=2   # show thresholds in effect
""")
@click.argument("rule_ids", nargs=-1, metavar="[RULE_ID]...")
@config_options
def command(rule_ids: tuple[str, ...], config_path: str | None, assignments: tuple[str, ...]) -> None:
    """List the recommendation rules, or print the full documentation of RULE_ID.

    Thresholds are overridden with --set RULE_ID.PARAM=VALUE or a TOML config file
    ([RULE_ID] table); the values shown are those in effect with the given options.
    """
    config = make_config(config_path, assignments)
    rules = registry()
    unknown = [r for r in rule_ids if r not in rules]
    if unknown:
        raise ConfigError(f"unknown rule {', '.join(map(repr, unknown))}; `traceanalyzer rules` lists them")
    click.echo(rule_docs(rule_ids, rules, config) if rule_ids else rules_listing(rules, config))
