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
def cli() -> None:
    """Analyze PyTorch profiler traces and CUDA memory snapshots, offline."""


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
