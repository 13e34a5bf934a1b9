"""Atomic file writes, so an interrupted run never leaves half a report.

Every output of the tool (reports, compare outputs, the batch index, cache entries) is
written here: a temporary file in the target directory, then a rename. A write that
fails (read-only location, no permission, disk full) removes its temporary file and
raises :class:`~traceanalyzer.errors.OutputError`, a one-line usage error (exit 2).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from traceanalyzer.errors import OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory + rename.

    The file gets the usual permissions (0666 minus the umask), not mkstemp's private
    0600: reports are meant to be shared.
    """
    make_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError.from_os(path.parent, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def make_dir(path: Path) -> None:
    """``mkdir -p``; a failure is an :class:`~traceanalyzer.errors.OutputError`."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError.from_os(path, exc) from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
