"""One batch per output directory at a time: ``OUTDIR/.lock``.

A second batch on the same output directory (while the first runs) would interleave
report folders and leave an index of only one of them, so it refuses with one line
naming the holder (exit 2) rather than waiting: a batch can run for hours, and a
refusal tells the user at once. The lock is an OS advisory lock (``flock``) on the
file, released by the kernel when its process ends however it ends, so a lock left by
a dead process is taken over silently; the pid, host and start time written into the
file are only there for the message. Platforms without ``fcntl`` run unlocked.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from traceanalyzer.errors import ConfigError, OutputError

LOCK_NAME = ".lock"


class BatchLock:
    """``with BatchLock(outdir): ...`` holds the output directory's lock or raises
    :class:`~traceanalyzer.errors.ConfigError` (another batch holds it)."""

    def __init__(self, outdir: Path) -> None:
        self.path = Path(outdir) / LOCK_NAME
        self._f: IO[str] | None = None

    def __enter__(self) -> BatchLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        try:
            f = open(self.path, "a+")
        except OSError as exc:
            raise OutputError.from_os(self.path, exc) from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise ConfigError(f"{self.path.parent}: another batch is writing into this output directory "
                              f"({holder}); wait for it to finish or choose another -o") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n")
        f.flush()
        self._f = f
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._f is not None:
            self._f.close()  # closing releases the flock
            self._f = None
