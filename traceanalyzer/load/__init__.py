"""Loaders: the only code that touches raw JSON or pickle bytes.

:func:`load` sniffs a file by its content (never its extension) and dispatches to
the loader registered for that kind of input. Each loader returns a model object
(:data:`Model`) with a ``kind`` attribute (``"trace"``, ``"snapshot"``,
``"memory_timeline"``) that the analysis registry uses to pick the analyses that apply.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeAlias

from traceanalyzer.errors import InputError
from traceanalyzer.load.budget import check_regular, open_regular
from traceanalyzer.model import MemoryTimelineModel, Model, SnapshotModel, TraceModel  # Model: what load() returns

# The kinds :func:`sniff` tells apart (each model's ``kind``).
Kind: TypeAlias = Literal["trace", "snapshot", "memory_timeline"]
# A loader: a path (a regular file) → its model, or InputError.
Loader: TypeAlias = Callable[[Path], Model]


# Each returns its loader, importing the module on first use, so that loading a trace
# never pays for the snapshot machinery and vice versa.
def _trace_loader() -> Callable[[Path], TraceModel]:
    from traceanalyzer.load.chrome_trace import load_chrome_trace

    return load_chrome_trace


def _snapshot_loader() -> Callable[[Path], SnapshotModel]:
    from traceanalyzer.load.snapshot import load_snapshot

    return load_snapshot


def _memory_timeline_loader() -> Callable[[Path], MemoryTimelineModel]:
    from traceanalyzer.load.memory_timeline import load_memory_timeline

    return load_memory_timeline


# kind → the function that imports and returns its loader.
LOADERS: dict[str, Callable[[], Loader]] = {
    "trace": _trace_loader,
    "snapshot": _snapshot_loader,
    "memory_timeline": _memory_timeline_loader,
}

_PICKLE_PROTO = b"\x80"
# GLOBAL (``c``) of protocol 0/1: ``c<module>\n<name>\n``.
_GLOBAL_FIRST = re.compile(rb"c([A-Za-z_][\w.]{0,200})\n([A-Za-z_][\w.]{0,200})\n")


def _clean_name(raw: bytes) -> str:
    """A module or attribute name from a file, printable (at most 80 characters)."""
    return raw.decode("ascii", "replace")[:80]


def _head(path: Path, n: int = 4096) -> bytes:
    f, _ = open_regular(path)
    try:
        with f:
            raw = f.read(n)
            if raw.startswith(b"\x1f\x8b"):
                f.seek(0)
                compressed = f.read(1 << 20)
    except OSError as exc:
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    if raw.startswith(b"\x1f\x8b"):
        # zlib rather than the gzip module: it yields the first bytes of a truncated
        # stream too, and ``max_length`` bounds the output (a bomb never expands here).
        out = b""
        try:
            while compressed[:2] == b"\x1f\x8b" and len(out) < n:  # member after member
                d = zlib.decompressobj(wbits=31)
                out += d.decompress(compressed, n - len(out))
                compressed = d.unused_data
        except zlib.error as exc:
            raise InputError(path, f"corrupt gzip data: {exc}") from None
        return out
    return raw


def sniff(path: str | Path) -> Kind:
    """The kind of input in ``path``, decided from its first bytes.

    ``"snapshot"`` for a pickle (protocol 2+: byte 0x80 first; protocol 0/1: see
    :func:`~traceanalyzer.load.safe_pickle.legacy_protocol`), ``"memory_timeline"`` for an
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
    glob = _GLOBAL_FIRST.match(head)
    if glob:
        # A protocol 0/1 pickle opening with GLOBAL names code to import and call: what an
        # exploit looks like. torch writes snapshots with protocol 2+ (0x80 first).
        what = _clean_name(glob.group(1) + b"." + glob.group(2))
        raise InputError(p, f"a protocol 0/1 pickle that starts by naming code to run ({what}); memory "
                            "snapshots start with the protocol byte 0x80 and are never unpickled with code: refused")
    from traceanalyzer.load.safe_pickle import legacy_protocol  # stdlib only; reached for non-JSON input

    if legacy_protocol(head) is not None:
        # A protocol 0/1 pickle (``pickle.dumps(snapshot, protocol=0)``): read like the others;
        # the loader's opcode scan refuses any opcode in it that reaches code, by name.
        return "snapshot"
    if head[:3] == b"\xef\xbb\xbf" and text[3:4] in (b"{", b"["):
        return "trace"
    raise InputError(p, "unrecognised content: not a chrome trace (JSON), a memory snapshot (pickle) "
                        "or a memory timeline export")


def load(path: str | Path, kind: str | None = None) -> Model:
    """Load any supported input, choosing the loader by content unless ``kind`` is given."""
    p = Path(path)
    if kind is not None:
        check_regular(p)  # sniff checks it otherwise: never open a FIFO or a device
    kind = kind or sniff(p)
    get_loader = LOADERS.get(kind)
    if get_loader is None:
        raise InputError(p, f"no loader for inputs of kind {kind!r}")
    try:
        loader = get_loader()
    except ModuleNotFoundError:
        raise InputError(p, f"is a {kind.replace('_', ' ')}, which this build cannot read yet") from None
    return loader(p)


__all__ = ["LOADERS", "Kind", "Loader", "Model", "load", "sniff"]
