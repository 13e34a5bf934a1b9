"""A pickle reader that can only build plain data: no code runs, ever.

A memory snapshot copied off a cluster is untrusted input, and ``pickle.load`` on it
runs whatever the file asks (``os.system`` through ``REDUCE`` …). Real snapshots hold
only dict/list/tuple/str/int/float/bool/None, so nothing legitimate needs a class.

Two independent guards:

1. :class:`RestrictedUnpickler` (the C unpickler) with ``find_class`` and
   ``persistent_load`` that always raise. Every way a pickle can reach code goes
   through one of them: ``GLOBAL``/``STACK_GLOBAL``/``INST``/``EXT*`` call
   ``find_class``; ``REDUCE``/``NEWOBJ``/``OBJ``/``BUILD`` need a callable or class on
   the stack, which only ``find_class`` can put there; ``PERSID`` calls
   ``persistent_load``. This is the guarantee, and it costs nothing.
2. :func:`scan_opcodes`: a pure opcode walk (``pickletools.genops``, nothing is
   built) that refuses any opcode outside :data:`ALLOWED_OPCODES` and names the
   culprit. It runs in Python (~1 µs per opcode), so :func:`safe_loads` applies it
   to inputs up to ``scan_limit`` bytes, where it turns a hostile file into a precise
   message before anything is unpickled; larger files rely on guard 1 alone.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any

# Opcodes that only push builtin scalars/containers or manage the stack/memo.
ALLOWED_OPCODES: frozenset[str] = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
    "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING",
    "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS",
    "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
})

# Files up to this size get the opcode scan as well (about a second per 20 MB).
DEFAULT_SCAN_LIMIT = 16 << 20


class UnsafePickleError(Exception):
    """The pickle asks for a class, a global or a persistent object: refused."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global/class and every persistent id."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class docstring
        raise UnsafePickleError(
            f"refused: the pickle imports {module}.{name} — a memory snapshot holds only plain "
            "dicts/lists/numbers, so this file would run code if opened with pickle.load"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError("refused: the pickle references a persistent object (PERSID)")


def scan_opcodes(data: bytes) -> int | None:
    """Walk the opcodes without building anything; return the protocol (or None).

    Raises :class:`UnsafePickleError` naming the first opcode outside
    :data:`ALLOWED_OPCODES` (with its argument, e.g. ``GLOBAL 'posix system'``), and
    ``ValueError`` when the opcode stream itself is corrupt.
    """
    proto: int | None = None
    for op, arg, pos in pickletools.genops(data):
        if op.name not in ALLOWED_OPCODES:
            shown = f" {arg!r}" if arg is not None else ""
            raise UnsafePickleError(
                f"refused: opcode {op.name}{shown} at byte {pos} can import or call code; "
                "a memory snapshot never contains it"
            )
        if op.name == "PROTO":
            proto = int(arg)  # type: ignore[arg-type]
        elif op.name == "STOP":
            break
    return proto


def pickle_protocol(data: bytes) -> int | None:
    """The protocol from the leading PROTO opcode (``None`` for protocol 0/1 files)."""
    if len(data) >= 2 and data[0] == 0x80:
        return data[1]
    return None


def safe_loads(data: bytes, scan_limit: int = DEFAULT_SCAN_LIMIT) -> Any:
    """Unpickle ``data`` into builtin objects only.

    Raises :class:`UnsafePickleError` for a pickle that asks for any class or global
    (nothing is imported or called), and ``pickle.UnpicklingError``/``ValueError``/
    ``EOFError`` … for a corrupt one; callers turn both into an ``InputError``.
    """
    if len(data) <= scan_limit:
        scan_opcodes(data)
    return RestrictedUnpickler(io.BytesIO(data)).load()


__all__ = [
    "ALLOWED_OPCODES",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "pickle_protocol",
    "safe_loads",
    "scan_opcodes",
]
