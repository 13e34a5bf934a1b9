"""The one error hierarchy. Exit codes are decided by the CLI alone.

* :class:`InputError` — the input file itself is unusable (missing, truncated beyond
  recovery, not a trace, hostile pickle). Its ``str()`` is the one line users see:
  ``<path>: <problem>``.
* :class:`ConfigError` — a bad option, threshold or config file.
* :class:`OutputError` — an output location that cannot be written (read-only, full disk).
* :class:`NotApplicable` — raised *inside an analysis* when the signal it needs is
  absent (no GPU events, no stacks …). It is not an error: the pipeline records the
  reason and the report lists the check as "could not run".
"""

from __future__ import annotations

from pathlib import Path


class TraceAnalyzerError(Exception):
    """Base of every error the CLI turns into a one-line message and exit code 2."""


class InputError(TraceAnalyzerError):
    """An input file that cannot be analysed; ``str()`` names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(TraceAnalyzerError):
    """A bad command-line option, threshold name/value or config file."""


class OutputError(TraceAnalyzerError):
    """An output location that cannot be written (read-only, no permission, disk full).
    A usage error, not a bug: ``str()`` is ``<path>: cannot write (<reason>)``."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: cannot write ({reason})")

    @classmethod
    def from_os(cls, path: str | Path, exc: OSError) -> OutputError:
        return cls(path, exc.strerror or str(exc) or type(exc).__name__)


class NotApplicable(Exception):
    """An analysis or rule cannot decide because its input signal is absent.

    ``reason`` is shown to users verbatim in the "checks that could not run" list,
    so it should say what is missing and, where possible, how to get it
    (e.g. "no Python stacks: profile with with_stack=True").
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
