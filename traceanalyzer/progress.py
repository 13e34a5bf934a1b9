"""Progress feedback for long work: a bar (known total) or a spinner (unknown), on stderr.

Usage::

    with progress("Loading trace", enabled=not quiet) as bar:
        model = load(path)
    with progress("Analysing", total=len(paths)) as bar:
        for p in paths:
            ...
            bar.update(1, note=p.name)   # the note: what was just done, after the count

``analyze`` (loading, analysing, writing each chart and format) and ``batch`` (one unit per
file) both draw through this one component.

It draws only when ``enabled`` (default: stderr is a terminal) so logs, pipes and CI
stay clean; a disabled progress costs nothing and ``update`` is then a no-op. The
spinner redraws from a daemon thread (the work itself may be one long C call, e.g.
JSON parsing, that gives no chance to redraw), and the line is cleared on exit so the
command's own output starts on a clean line.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ASCII_FRAMES = "|/-\\"


class Progress:
    """What ``with progress(...) as bar`` yields: ``bar.update(n)`` advances the count."""

    def __init__(self, label: str, total: int | None, stream: IO[str] | None, interval: float = 0.1) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.note = ""
        self._stream = stream
        self._interval = interval
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._frames = _FRAMES
        if stream is not None:
            enc = (getattr(stream, "encoding", None) or "ascii").lower()
            if "utf" not in enc:
                self._frames = _ASCII_FRAMES

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def update(self, n: int = 1, note: str | None = None) -> None:
        """Advance by ``n`` units of ``total`` (ignored when there is no total); ``note``, when
        given, replaces the short text shown after the count (e.g. the file or chart just done)."""
        self.done += n
        if note is not None:
            self.note = note
        if self._stream is not None and self.total:
            self._draw()

    def _line(self, tick: int) -> str:
        elapsed = time.monotonic() - self._start
        if self.total:
            frac = min(1.0, self.done / self.total)
            width = 24
            full = int(frac * width)
            bar = "#" * full + "-" * (width - full)
            note = f" {self.note[:40]}" if self.note else ""
            return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s{note}"
        frame = self._frames[tick % len(self._frames)]
        return f"{frame} {self.label}… {elapsed:5.1f}s"

    def _draw(self, tick: int = 0) -> None:
        stream = self._stream
        if stream is None:
            return
        with self._lock:
            try:
                stream.write("\r\x1b[2K" + self._line(tick))
                stream.flush()
            except (OSError, ValueError):  # closed terminal: progress is best-effort
                self._stream = None

    def _spin(self) -> None:
        tick = 0
        while not self._stop.wait(self._interval):
            tick += 1
            self._draw(tick)

    def _begin(self) -> None:
        if self._stream is None:
            return
        self._draw()
        self._thread = threading.Thread(target=self._spin, name="traceanalyzer-progress", daemon=True)
        self._thread.start()

    def _end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        stream = self._stream
        if stream is not None:
            with self._lock:
                try:
                    stream.write("\r\x1b[2K")
                    stream.flush()
                except (OSError, ValueError):
                    pass


def _is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def progress(
    label: str,
    total: int | None = None,
    enabled: bool | None = None,
    stream: IO[str] | None = None,
) -> Iterator[Progress]:
    """Show progress for the work inside the ``with`` block.

    ``total``: number of units (``bar.update(n)`` advances); ``None`` shows a spinner
    with the elapsed time. ``enabled``: ``None`` → only when ``stream`` (default stderr)
    is a terminal; ``False`` (e.g. ``--quiet``) → silent; ``True`` → draw anyway.
    """
    out = stream if stream is not None else sys.stderr
    on = _is_tty(out) if enabled is None else enabled
    bar = Progress(label, total, out if on else None)
    bar._begin()
    try:
        yield bar
    finally:
        bar._end()


__all__ = ["Progress", "progress"]
