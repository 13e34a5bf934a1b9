"""``traceanalyzer rules``: the recommendation rules, their thresholds and documentation."""

from __future__ import annotations

import click

from traceanalyzer.commands.options import config_options, make_config
from traceanalyzer.errors import ConfigError
from traceanalyzer.rules import Params, registry


def _fmt(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    if isinstance(v, int) and v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v} ({v >> 20} MiB)"
    return str(v)


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
    if rule_ids:
        unknown = [r for r in rule_ids if r not in rules]
        if unknown:
            raise ConfigError(f"unknown rule {', '.join(map(repr, unknown))}; `traceanalyzer rules` lists them")
        for i, rid in enumerate(rule_ids):
            spec = rules[rid]
            if i:
                click.echo("")
            click.echo(click.style(rid, bold=True) + f"  [{spec.severity}]  needs: {spec.needs_text}")
            click.echo("")
            click.echo(spec.doc)
            values = Params(rid, spec.params, config).as_dict()
            if values:
                click.echo("")
                click.echo("Parameters (default → in effect):")
                for k, v in spec.params.items():
                    now = values[k]
                    mark = "" if now == v else f" → {_fmt(now)}"
                    click.echo(f"  {rid}.{k} = {_fmt(v)}{mark}")
        return
    width = max(len(r) for r in rules)
    for rid, spec in sorted(rules.items()):
        click.echo(f"{click.style(rid.ljust(width), bold=True)}  {str(spec.severity):8}  {spec.summary}")
        values = Params(rid, spec.params, config).as_dict()
        extra = [f"needs: {spec.needs_text}" if spec.needs or spec.needs_any else "needs: (decides itself)"]
        if values:
            extra.append("params: " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
        for line in extra:
            click.echo(" " * (width + 2) + line)
    click.echo(f"\n{len(rules)} rules. `traceanalyzer rules RULE_ID` prints one rule's documentation; "
               "override a threshold with --set RULE_ID.PARAM=VALUE.")
