"""The ``traceanalyzer`` command: a thin click layer over :mod:`traceanalyzer.pipeline`.

Sub-commands live one per module in :mod:`traceanalyzer.commands` and are
discovered automatically. Exit codes: 0 ok, 1 a ``--fail-on``/regression gate
tripped, 2 bad input or usage (also a ``compare`` gate refusing to judge across
different hardware), 3 internal error (a bug; set
``TRACEANALYZER_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import errno
import os
import sys

import click

from traceanalyzer import __version__
from traceanalyzer.errors import TraceAnalyzerError
from traceanalyzer.plugins import import_submodules
from traceanalyzer.report.text import clean_text

EPILOG = """\b
Examples:
  traceanalyzer analyze rank0.pt.trace.json.gz          # report: html, png, md, json
  traceanalyzer analyze trace.json -o out/ --format json,md --fail-on warning
  traceanalyzer memory snapshot.pickle                  # why did I OOM?
  traceanalyzer batch runs/ -o reports/ --jobs 8        # many files, ranks grouped into runs
  traceanalyzer compare baseline/ candidate/ --fail-if-slower 5
  traceanalyzer rules                                   # the checks and their thresholds
"""


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(super().list_commands(ctx))


@click.group(cls=_Group, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceanalyzer")
@click.option("--max-input-size", metavar="SIZE", default=None,
              help="Input budget: refuse JSON inputs larger than this once decompressed (e.g. 40G; "
                   "default 16G). Same as TRACEANALYZER_MAX_INPUT_BYTES.")
@click.option("--max-gzip-ratio", metavar="RATIO", default=None,
              help="Input budget: refuse a .gz that expands more than this many times (default 200). "
                   "Same as TRACEANALYZER_MAX_GZIP_RATIO.")
@click.option("--snapshot-limit", "snapshot_limits", metavar="NAME=N", multiple=True,
              help="Snapshot budget: raise one limit of what a snapshot pickle may build (max_objects, "
                   "max_items, max_string_bytes, max_depth, max_gzip_ratio). Same as "
                   "TRACEANALYZER_SNAPSHOT_<NAME>. Repeatable.")
def cli(max_input_size: str | None, max_gzip_ratio: str | None, snapshot_limits: tuple[str, ...]) -> None:
    """Analyze PyTorch profiler traces and CUDA memory snapshots, offline.

    The input budget (docs/input_formats.md) refuses files that would cost more than real
    traces do; its options go before the sub-command and hold for the whole run."""
    set_budget(max_input_size, max_gzip_ratio, snapshot_limits)


def set_budget(max_input_size: str | None, max_gzip_ratio: str | None, snapshot_limits: tuple[str, ...]) -> None:
    """Put the budget options into the environment the loaders read (so batch worker
    processes inherit them), after checking each: a bad value is a one-line usage error."""
    from dataclasses import fields

    from traceanalyzer.errors import ConfigError
    from traceanalyzer.load.budget import ENV_MAX_GZIP_RATIO, ENV_MAX_INPUT_BYTES, Budget
    from traceanalyzer.load.pickle_budget import ENV_PREFIX, PickleBudget

    for option, env, value in (("--max-input-size", ENV_MAX_INPUT_BYTES, max_input_size),
                               ("--max-gzip-ratio", ENV_MAX_GZIP_RATIO, max_gzip_ratio)):
        if value is None:
            continue
        before = os.environ.get(env)
        os.environ[env] = value
        try:
            Budget.from_env()
        except ConfigError:
            if before is None:
                del os.environ[env]
            else:
                os.environ[env] = before
            example = "a size such as 40G, 512M or 1000000" if env == ENV_MAX_INPUT_BYTES else "a number such as 500"
            raise ConfigError(f"{option} {value!r}: expected {example}, above zero") from None
    names = [f.name for f in fields(PickleBudget)]
    for item in snapshot_limits:
        name, _, raw = item.partition("=")
        name = name.strip().lower()
        if name not in names:
            raise ConfigError(f"--snapshot-limit {item!r}: expected NAME=N with NAME one of {', '.join(names)}")
        try:
            number = int(float(raw))
        except (ValueError, OverflowError):
            number = 0
        if number <= 0:
            raise ConfigError(f"--snapshot-limit {item!r}: expected a positive whole number")
        os.environ[ENV_PREFIX + name.upper()] = str(number)


def _register_commands() -> None:
    for module in import_submodules("traceanalyzer.commands"):
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            cli.add_command(command)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors, never a traceback (unless TRACEANALYZER_DEBUG=1)."""
    try:
        rv = cli.main(args=argv, prog_name="traceanalyzer", standalone_mode=False)
        if isinstance(rv, int) and rv:  # click returns (not raises) Exit codes without standalone mode
            sys.exit(rv)
    except TraceAnalyzerError as exc:
        click.echo(clean_text(f"error: {exc}", keep_newlines=False), err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:
        # A location the user named refusing access outside the paths that already say so
        # (atomic writers raise OutputError, loaders InputError): a usage problem, not a bug.
        if exc.errno not in _USAGE_ERRNOS or os.environ.get("TRACEANALYZER_DEBUG"):
            _internal(exc)
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(clean_text(f"error: {where}{exc.strerror}", keep_newlines=False), err=True)
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        _internal(exc)
    sys.exit(0)


#: errno values that mean "this location cannot be used as given" (exit 2, not 3).
_USAGE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                            errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENAMETOOLONG})


def _internal(exc: BaseException) -> None:
    """Exit 3: a bug. One line (the traceback with TRACEANALYZER_DEBUG=1)."""
    if os.environ.get("TRACEANALYZER_DEBUG"):
        raise exc
    click.echo(f"internal error (please report; TRACEANALYZER_DEBUG=1 shows details): "
               f"{type(exc).__name__}: {exc}", err=True)
    sys.exit(3)
