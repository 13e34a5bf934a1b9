"""The atomic file writer, re-exported for the renderers: it lives in :mod:`traceanalyzer.fsutil`
(a base module, so that ``store`` writes through it too)."""

from __future__ import annotations

from traceanalyzer.fsutil import atomic_write, atomic_write_bytes, atomic_write_text, make_dir

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "make_dir"]
