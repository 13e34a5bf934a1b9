"""Loaders: the only code that touches raw JSON or pickle bytes.

:func:`load` sniffs a file by its content (never its extension) and dispatches to
the loader registered for that kind of input. Each loader returns a model object
with a ``kind`` attribute (``"trace"``, ``"snapshot"``, ``"memory_timeline"``) that
the analysis registry uses to pick the analyses that apply.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from pathlib import Path
from typing import Any

from traceanalyzer.errors import InputError

# kind → "module:function". Modules are imported on first use so that loading a
# trace never pays for the snapshot machinery and vice versa.
LOADERS: dict[str, str] = {
    "trace": "traceanalyzer.load.chrome_trace:load_chrome_trace",
    "snapshot": "traceanalyzer.load.snapshot:load_snapshot",
    "memory_timeline": "traceanalyzer.load.memory_timeline:load_memory_timeline",
}

_PICKLE_PROTO = b"\x80"


def _head(path: Path, n: int = 4096) -> bytes:
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a directory, not a trace file (use `traceanalyzer batch` for directories)")
    try:
        with path.open("rb") as f:
            raw = f.read(n)
    except OSError as exc:
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    if raw.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as g:
                return g.read(n)
        except (OSError, EOFError, zlib.error):
            # A truncated gzip still yields its first bytes through zlib.
            try:
                return zlib.decompressobj(wbits=31).decompress(path.read_bytes()[: 1 << 20])[:n]
            except zlib.error as exc:
                raise InputError(path, f"corrupt gzip data: {exc}") from None
    return raw


def sniff(path: str | Path) -> str:
    """The kind of input in ``path``, decided from its first bytes.

    ``"snapshot"`` for a pickle, ``"memory_timeline"`` for an
    ``export_memory_timeline`` JSON (an array of arrays), ``"trace"`` for any other
    JSON. Raises :class:`InputError` for an empty file or unknown content.
    """
    p = Path(path)
    head = _head(p)
    if not head:
        raise InputError(p, "empty file")
    if head[:1] == _PICKLE_PROTO:
        return "snapshot"
    text = head.lstrip()
    if text[:1] == b"[" and text[1:].lstrip()[:1] == b"[":
        return "memory_timeline"
    if text[:1] in (b"{", b"["):
        return "trace"
    if head.startswith(b"PK"):
        raise InputError(p, "is a zip archive; unpack it first")
    if head[:3] == b"\xef\xbb\xbf" and text[3:4] in (b"{", b"["):
        return "trace"
    raise InputError(p, "unrecognised content: not a chrome trace (JSON), a memory snapshot (pickle) "
                        "or a memory timeline export")


def load(path: str | Path, kind: str | None = None) -> Any:
    """Load any supported input, choosing the loader by content unless ``kind`` is given."""
    p = Path(path)
    kind = kind or sniff(p)
    target = LOADERS.get(kind)
    if target is None:
        raise InputError(p, f"no loader for inputs of kind {kind!r}")
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        raise InputError(p, f"is a {kind.replace('_', ' ')}, which this build cannot read yet") from None
    return getattr(module, func_name)(p)


__all__ = ["LOADERS", "load", "sniff"]
