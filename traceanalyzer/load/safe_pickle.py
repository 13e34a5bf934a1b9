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
   culprit. It runs in Python (~1.5-3 µs per opcode with the budget accounting), so
   :func:`safe_loads` applies it to inputs up to ``scan_limit`` bytes, where it turns a
   hostile file into a precise message before anything is unpickled; larger files rely
   on guard 1 alone. The same walk checks the input budget
   (:mod:`~traceanalyzer.load.pickle_budget`): objects built with memo references
   counted again, elements per container, string length, nesting depth.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any

from traceanalyzer.load.pickle_budget import BudgetExceeded, PickleBudget

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

# Files up to this size get the opcode scan as well (a Python loop over every opcode,
# so its cost bounds this size).
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


_PUSH_CONTAINER = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "EMPTY_TUPLE"})
_ADD_MARKED = frozenset({"APPENDS", "SETITEMS", "ADDITEMS"})
_BUILD_MARKED = frozenset({"LIST", "TUPLE", "DICT", "FROZENSET"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_NO_STACK = frozenset({"PROTO", "FRAME", "STOP"})
_SCALAR = (1, 0, 0)  # (counted objects, depth, items) of anything that is not a container


def scan_opcodes(data: bytes, budget: PickleBudget | None = None) -> int | None:
    """Walk the opcodes without building anything; return the protocol (or None).

    Raises :class:`UnsafePickleError` naming the first opcode outside
    :data:`ALLOWED_OPCODES` (with its argument, e.g. ``GLOBAL 'posix system'``),
    :class:`~traceanalyzer.load.pickle_budget.BudgetExceeded` when what the pickle
    would build passes ``budget`` (default: :meth:`PickleBudget.from_env`), and
    ``ValueError`` when the opcode stream itself is corrupt.

    Budget accounting mirrors the pickle machine on cells ``[objects, depth, items]``
    instead of objects: a container's cell grows as items are added, the memo holds
    cells, and a memo reference adds its cell's objects to the total again.
    """
    b = budget or PickleBudget.from_env()
    max_objects, max_items, max_str, max_depth = b.max_objects, b.max_items, b.max_string_bytes, b.max_depth
    proto: int | None = None
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}
    total = 0

    def add(c: Any, items: list[Any], pos: int | None) -> None:
        nonlocal total
        if type(c) is not list:
            raise ValueError(f"items added to a non-container at byte {pos}")
        n = len(items)
        c[2] += n
        if n > max_items or c[2] > max_items:
            raise b.exceeded("max_items", f"a container of more than {max_items:,} elements (byte {pos})")
        if n:
            c[0] += sum(x[0] for x in items)
            d = 1 + max(x[1] for x in items)
            if d > c[1]:
                c[1] = d
                if d > max_depth:
                    raise b.exceeded("max_depth", f"nesting deeper than {max_depth:,} (byte {pos})")

    for op, arg, pos in pickletools.genops(data):
        name = op.name
        if name not in ALLOWED_OPCODES:
            shown = f" {arg!r}" if arg is not None else ""
            raise UnsafePickleError(
                f"refused: opcode {name}{shown} at byte {pos} can import or call code; "
                "a memory snapshot never contains it"
            )
        if name in _GET:
            try:
                c = memo[arg]  # type: ignore[index]
            except KeyError:
                raise ValueError(f"memo index {arg} not defined (byte {pos})") from None
            stack.append(c)
            total += c[0]  # the whole object again: shared references cannot multiply
        elif name in _PUT or name == "MEMOIZE":
            if not stack:
                raise ValueError(f"{name} on an empty stack (byte {pos})")
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]  # type: ignore[index]
        elif name == "MARK":
            metastack.append(stack)
            stack = []
        elif name in _PUSH_CONTAINER:
            stack.append([1, 1, 0])
            total += 1
        elif name in _ADD_MARKED:
            items = stack
            if not metastack:
                raise ValueError(f"{name} without MARK (byte {pos})")
            stack = metastack.pop()
            if not stack:
                raise ValueError(f"{name} on an empty stack (byte {pos})")
            add(stack[-1], items, pos)
        elif name in _BUILD_MARKED:
            items = stack
            if not metastack:
                raise ValueError(f"{name} without MARK (byte {pos})")
            stack = metastack.pop()
            c = [1, 1, 0]
            add(c, items, pos)
            stack.append(c)
            total += 1
        elif name in _TUPLE_N:
            n = _TUPLE_N[name]
            if len(stack) < n:
                raise ValueError(f"{name} on a short stack (byte {pos})")
            items = stack[-n:]
            del stack[-n:]
            c = [1, 1, 0]
            add(c, items, pos)
            stack.append(c)
            total += 1
        elif name in ("APPEND", "SETITEM"):
            n = 1 if name == "APPEND" else 2
            if len(stack) < n + 1:
                raise ValueError(f"{name} on a short stack (byte {pos})")
            items = stack[-n:]
            del stack[-n:]
            add(stack[-1], items, pos)
        elif name == "POP":
            if stack:
                stack.pop()
            elif metastack:
                stack = metastack.pop()
        elif name == "POP_MARK":
            if not metastack:
                raise ValueError(f"POP_MARK without MARK (byte {pos})")
            stack = metastack.pop()
        elif name == "DUP":
            if not stack:
                raise ValueError(f"DUP on an empty stack (byte {pos})")
            stack.append(stack[-1])
        elif name in _NO_STACK:
            if name == "PROTO":
                proto = int(arg)  # type: ignore[arg-type]
            elif name == "STOP":
                break
        else:  # a scalar: number, string, bytes, None, bool
            if isinstance(arg, (str, bytes, bytearray)) and len(arg) > max_str:
                raise b.exceeded("max_string_bytes", f"a string of {len(arg):,} bytes (byte {pos})")
            stack.append(_SCALAR)
            total += 1
        if total > max_objects:
            raise b.exceeded("max_objects", f"more than {max_objects:,} objects, memo references counted "
                                            f"as the objects they repeat (byte {pos})")
    return proto


def pickle_protocol(data: bytes) -> int | None:
    """The protocol from the leading PROTO opcode, or 0/1 for a file that starts like a
    protocol 0/1 pickle (:func:`legacy_protocol`); ``None`` otherwise."""
    if len(data) >= 2 and data[0] == 0x80:
        return data[1]
    return legacy_protocol(data)


# How a protocol 0/1 pickle starts: MARK (``(dp0``/``(lp0``: DICT/LIST built from it;
# ``(S'..'\nios\n``: INST), EMPTY_DICT/EMPTY_LIST (protocol 1), or GLOBAL (``cos\nsystem\n``,
# what ``pickle.dumps(obj, 0)`` writes for an object with ``__reduce__``). The ones that reach
# code are refused by name: by :func:`traceanalyzer.load.sniff` or the loader's opcode scan.
_LEGACY_FIRST = frozenset(b"(}]c")
# What may follow each first opcode in a pickle written by ``pickle.dumps``: MARK → the dict
# or list it builds (protocol 0), or a payload's string/global (INST/OBJ); an empty container
# of protocol 1 → its memo PUT, the MARK of its items, or STOP. A text file that happens to
# begin with ``(`` or ``]`` fails here.
_LEGACY_SECOND: dict[str, frozenset[str]] = {
    "MARK": frozenset({"DICT", "LIST", "STRING", "UNICODE", "GLOBAL", "MARK"}),
    "EMPTY_DICT": frozenset({"BINPUT", "LONG_BINPUT", "PUT", "MARK", "STOP"}),
    "EMPTY_LIST": frozenset({"BINPUT", "LONG_BINPUT", "PUT", "MARK", "STOP"}),
    "GLOBAL": frozenset({"PUT", "BINPUT", "MARK", "STRING", "UNICODE", "BINUNICODE", "SHORT_BINSTRING",
                         "BINSTRING", "EMPTY_TUPLE"}),
}
# Opcodes a head must parse cleanly (or reach STOP) before it counts as a pickle.
_LEGACY_MIN_OPS = 3


def legacy_protocol(head: bytes) -> int | None:
    """0 or 1 when ``head`` (a file's first bytes, possibly cut anywhere) reads as the start
    of a protocol 0/1 pickle (no leading PROTO opcode); ``None`` when it does not.

    The protocol is 1 when any opcode of the head belongs to protocol 1 (``EMPTY_DICT``,
    ``BINPUT``, ``BINUNICODE`` …), else 0. Nothing is built; opcodes that reach code are
    accepted here (they start a pickle all the same) and refused by :func:`scan_opcodes`
    and the readers, which name them."""
    if not head or head[0] not in _LEGACY_FIRST:
        return None
    proto = 0
    n = 0
    first = ""
    try:
        for op, _arg, _pos in pickletools.genops(head):
            if op.name == "PROTO":
                return None  # PROTO is only ever the first opcode, checked by the caller
            if n == 0:
                first = op.name
            elif n == 1 and op.name not in _LEGACY_SECOND.get(first, ()):
                return None
            n += 1
            proto = max(proto, op.proto)
            if op.name == "STOP":
                break
    except Exception:  # noqa: BLE001 - a head cut mid-opcode, or not a pickle at all
        if n < _LEGACY_MIN_OPS:
            return None
    return 1 if proto >= 1 else 0


def safe_loads(data: bytes, scan_limit: int = DEFAULT_SCAN_LIMIT) -> Any:
    """Unpickle ``data`` into builtin objects only.

    Raises :class:`UnsafePickleError` for a pickle that asks for any class or global
    (nothing is imported or called), :class:`BudgetExceeded` for one past the input
    budget (scanned inputs only), and ``pickle.UnpicklingError``/``ValueError``/
    ``EOFError`` … for a corrupt one; callers turn both into an ``InputError``.
    """
    if len(data) <= scan_limit:
        scan_opcodes(data)
    return RestrictedUnpickler(io.BytesIO(data)).load()


__all__ = [
    "ALLOWED_OPCODES",
    "BudgetExceeded",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "legacy_protocol",
    "pickle_protocol",
    "safe_loads",
    "scan_opcodes",
]
