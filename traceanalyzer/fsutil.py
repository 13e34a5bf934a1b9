"""Atomic file writes, so an interrupted run never leaves half a file.

Every output of the tool (reports, compare outputs, the batch index and cache, the Parquet
export) is written here: a temporary file in the target directory, then a rename. A write
that fails (read-only location, no permission, disk full) removes its temporary file and
raises :class:`~traceanalyzer.errors.OutputError`, a one-line usage error (exit 2).

A base module (below ``store`` and ``report`` in tests/test_architecture.py's ranks), so that
both write through the same code.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from traceanalyzer.errors import OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _replace_into(path: Path, fill: Callable[[int, Path], object]) -> None:
    """``fill(fd, tmp)`` writes a temporary file beside ``path`` (``fd`` is open on it and
    ``fill`` owns it), which is then renamed onto ``path``.

    The file gets the usual permissions (0666 minus the umask), not mkstemp's private 0600:
    outputs are meant to be shared.
    """
    make_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError.from_os(path.parent, exc) from None
    try:
        fill(fd, Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError.from_os(path, exc) from None
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory + rename."""

    def fill(fd: int, _tmp: Path) -> None:
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    _replace_into(path, fill)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` writes the file at the path it is given (a library's own writer, e.g.
    polars' ``write_parquet``); it lands at ``path`` by a rename, as :func:`atomic_write_bytes`."""

    def fill(fd: int, tmp: Path) -> None:
        os.close(fd)
        write(tmp)

    _replace_into(path, fill)


def make_dir(path: Path) -> None:
    """``mkdir -p``; a failure is an :class:`~traceanalyzer.errors.OutputError`."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError.from_os(path, exc) from None


__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "make_dir"]
