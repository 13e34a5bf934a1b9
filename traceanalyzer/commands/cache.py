"""``traceanalyzer cache info|clear``: the model cache (docs/performance.md, "Model cache");
and ``--no-cache``, the option of every sub-command that loads one input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from traceanalyzer.store.cache import ENV_NO_CACHE, ModelCache, cache_enabled
from traceanalyzer.units import fmt_bytes


def no_cache_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--no-cache`` (``no_cache``): parse the input and neither read nor write the model cache."""
    return click.option("--no-cache", "no_cache", is_flag=True,
                        help=f"Parse the input even when the model cache holds it, and store nothing there "
                             f"(everywhere: {ENV_NO_CACHE}=1).")(func)


@click.group("cache", epilog="""\b
Examples:
  traceanalyzer cache info
  traceanalyzer cache clear
""")
def command() -> None:
    """The model cache: each loaded input's tables, and its analyses' results, kept so that a
    re-run of an unchanged file (other thresholds, other formats) skips the parse and reruns
    only the analyses whose thresholds changed.

    Location: $TRACEANALYZER_CACHE_DIR, else $XDG_CACHE_HOME/traceanalyzer, else
    ~/.cache/traceanalyzer. Size cap: TRACEANALYZER_CACHE_MAX (default 5G; least recently
    used entries go first). Off: --no-cache, or TRACEANALYZER_NO_CACHE=1."""


@command.command("info")
def info() -> None:
    """Where the cache is, its size against the cap, and its entries (least recently used first)."""
    cache = ModelCache()
    entries = cache.entries()
    total = sum(e.bytes for e in entries)
    state = "on" if cache_enabled() else f"off ({ENV_NO_CACHE} is set)"
    click.echo(f"model cache: {cache.root}  [{state}]")
    n_results = sum(e.results for e in entries)
    click.echo(f"  {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({n_results} analysis "
               f"result{'' if n_results == 1 else 's'}), {fmt_bytes(total)} of a {fmt_bytes(cache.max_bytes)} cap")
    for e in entries:
        click.echo(f"  {e.key}  {fmt_bytes(e.bytes):>10}  {e.results:>4} results  {e.source or '?'}")


@command.command("clear")
def clear() -> None:
    """Remove every entry of the model cache (with the results kept in it)."""
    cache = ModelCache()
    n, size = cache.clear()
    click.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} ({fmt_bytes(size)}) from {cache.root}")
