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
  traceanalyzer analyze rank0.pt.trace.json.gz          # report: html, md, json (-f all: + png)
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
                   "default 16G). Same as TRACEANALYZER_MAX_INPUT_BYTES or [budget] max_input_size.")
@click.option("--max-gzip-ratio", metavar="RATIO", default=None,
              help="Input budget: refuse a .gz that expands more than this many times (default 200). "
                   "Same as TRACEANALYZER_MAX_GZIP_RATIO or [budget] max_gzip_ratio.")
@click.option("--snapshot-limit", "snapshot_limits", metavar="NAME=N", multiple=True,
              help="Snapshot budget: raise one limit of what a snapshot pickle may build (max_objects, "
                   "max_items, max_string_bytes, max_depth, max_gzip_ratio). Same as "
                   "TRACEANALYZER_SNAPSHOT_<NAME> or [budget] snapshot_<name>. Repeatable.")
@click.option("--limit", "limits", metavar="NAME=N", multiple=True,
              help="Input budget: set any limit by its name (max_events, max_string_bytes, max_depth, "
                   "max_input_bytes, max_gzip_ratio, snapshot_max_objects, …; docs/input_formats.md). Same as "
                   "its TRACEANALYZER_* variable or [budget] NAME = N in --config. Repeatable.")
@click.option("--max-memory", metavar="SIZE", default=None,
              help="Memory the run may use (e.g. 8G): analyze, memory and compare run in a child process "
                   "stopped with one line past it; batch uses it as --file-memory. Default: no limit "
                   "beyond the input budget. Same as TRACEANALYZER_MAX_MEMORY.")
@click.pass_context
def cli(ctx: click.Context, max_input_size: str | None, max_gzip_ratio: str | None,
        snapshot_limits: tuple[str, ...], limits: tuple[str, ...], max_memory: str | None) -> None:
    """Analyze PyTorch profiler traces and CUDA memory snapshots, offline.

    The input budget (docs/input_formats.md) refuses files that would cost more than real
    traces do; its options go before the sub-command and hold for the whole run."""
    set_budget(max_input_size, max_gzip_ratio, snapshot_limits, limits)
    limit = memory_limit(max_memory)
    if limit is not None and ctx.invoked_subcommand in _SUPERVISED:
        from traceanalyzer.supervise import run_supervised

        raise click.exceptions.Exit(run_supervised(_ARGV or sys.argv[1:], limit, ctx.invoked_subcommand))


#: Sub-commands that ``--max-memory`` runs in a supervised child process (``batch`` has its own
#: per-file workers and takes the limit as ``--file-memory``; ``rules`` reads no input).
_SUPERVISED = frozenset({"analyze", "memory", "compare"})
#: The arguments :func:`main` was called with (the child of ``--max-memory`` gets the same).
_ARGV: list[str] = []


def memory_limit(option: str | None) -> int | None:
    """Bytes of ``--max-memory`` (or ``TRACEANALYZER_MAX_MEMORY``), None without one; a bad value
    is a one-line usage error. Inside the supervised child the limit is already applied."""
    from traceanalyzer.errors import ConfigError
    from traceanalyzer.supervise import ENV_CHILD, ENV_MAX_MEMORY

    raw = option if option is not None else os.environ.get(ENV_MAX_MEMORY)
    if raw is None or not raw.strip():
        return None
    from traceanalyzer.params import _size

    try:
        limit = int(_size(raw.strip()))
    except ValueError as exc:
        where = "--max-memory" if option is not None else ENV_MAX_MEMORY
        raise ConfigError(f"{where} {raw!r}: expected {exc}") from None
    os.environ[ENV_MAX_MEMORY] = str(limit)  # batch reads it as its --file-memory default
    return None if os.environ.get(ENV_CHILD) else limit


def set_budget(max_input_size: str | None, max_gzip_ratio: str | None, snapshot_limits: tuple[str, ...],
               limits: tuple[str, ...] = ()) -> None:
    """Put the budget options into the environment the loaders read (so batch worker
    processes inherit them), after checking each: a bad value is a one-line usage error
    naming the option."""
    from traceanalyzer.errors import ConfigError
    from traceanalyzer.params import apply_budget

    for option, key, value in (("--max-input-size", "max_input_bytes", max_input_size),
                               ("--max-gzip-ratio", "max_gzip_ratio", max_gzip_ratio)):
        if value is None:
            continue
        try:
            apply_budget({key: value}, option, from_options=True)
        except ConfigError as exc:
            expected = str(exc).rpartition(": expected ")[2]
            raise ConfigError(f"{option} {value!r}: expected {expected}") from None
    for item in snapshot_limits:
        name, _, raw = item.partition("=")
        try:
            apply_budget({"snapshot_" + name.strip().lower(): raw}, "--snapshot-limit", from_options=True)
        except ConfigError as exc:
            from dataclasses import fields

            from traceanalyzer.load.pickle_budget import PickleBudget

            names = [f.name for f in fields(PickleBudget)]
            if name.strip().lower() not in names:
                raise ConfigError(f"--snapshot-limit {item!r}: expected NAME=N with NAME one of "
                                  f"{', '.join(names)}") from None
            expected = str(exc).rpartition(": expected ")[2]
            raise ConfigError(f"--snapshot-limit {item!r}: expected {expected}") from None
    for item in limits:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--limit {item!r}: expected NAME=N, e.g. --limit max_events=50000000")
        try:
            apply_budget({name.strip().lower(): raw}, f"--limit {item}", from_options=True)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(f"--limit {item}: ", f"--limit {item!r}: ", 1)) from None


def _register_commands() -> None:
    for module in import_submodules("traceanalyzer.commands"):
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            cli.add_command(command)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors, never a traceback (unless TRACEANALYZER_DEBUG=1).

    Called without ``argv`` (the console script, ``python -m traceanalyzer``), the process ends
    with :func:`_leave` once the command is done; with ``argv`` (the Python API, tests) it raises
    :class:`SystemExit` as any click program does."""
    if argv is not None:
        _main(argv)
        return
    try:
        _main(None)
    except SystemExit as exc:
        _leave(exc.code)


def _leave(code: object) -> None:
    """End the process now with ``code``'s exit status, without the interpreter's shutdown.

    Every output is written and closed by then, and nothing registers work for exit: the
    shutdown would only free, module by module and frame by frame, the memory of a run that
    is over (0.1-0.5 s after a 50 MB trace, more after larger ones), which the OS takes back at
    once. Under a profiler or a tracer (cProfile, coverage), or with TRACEANALYZER_DEBUG set,
    the usual exit runs, so that they write their results."""
    status = 0 if code is None else code if isinstance(code, int) else 1
    if not isinstance(code, (int, type(None))):
        print(code, file=sys.stderr)
    if sys.getprofile() is not None or sys.gettrace() is not None or os.environ.get("TRACEANALYZER_DEBUG"):
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status)


def _main(argv: list[str] | None) -> None:
    _ARGV[:] = list(argv) if argv is not None else sys.argv[1:]
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
    except MemoryError:
        # Under --max-memory the supervising parent names the limit; otherwise the machine ran out.
        from traceanalyzer.supervise import ENV_CHILD

        if os.environ.get(ENV_CHILD):
            sys.exit(128 + 6)  # what the parent reads as "ran out of memory" (SIGABRT's status)
        click.echo("error: ran out of memory; --max-memory <size> stops a run with one line before the "
                   "machine runs out, and the input budget options refuse oversized inputs", err=True)
        sys.exit(2)
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
