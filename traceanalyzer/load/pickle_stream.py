"""A streaming, restricted pickle machine for large memory snapshots.

``pickle``'s C unpickler must build the whole object tree, and its memo pins every
dict it ever built, so a snapshot costs several times its size in Python objects.
This module walks the opcodes itself (protocols 0–5,
plain data only) and hands every batch of trace entries (the ``APPENDS`` of a
list whose items are dicts with an ``"action"`` key) to a callback *instead of*
appending them, so the entries can be turned into columns and dropped while the
rest of the file is still being read. What stays is bounded by the distinct
values: short strings are interned, tuples of scalars deduplicated, and the memo
slots of absorbed entry dicts are emptied.

Safety: there is no ``find_class`` here at all. Only the opcodes of
:data:`~traceanalyzer.load.safe_pickle.ALLOWED_OPCODES` are implemented; any other
(``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``,
``EXT*``, ``PERSID`` …) raises :class:`~traceanalyzer.load.safe_pickle.UnsafePickleError`
naming the opcode and its byte offset before anything else happens.

A memo reference to an absorbed entry (something no real snapshot does) raises
:class:`StreamFallback`; the loader then reads the file the ordinary way.

Speed: one Python loop iteration per opcode, slower than the C unpickler; hence only
files over :data:`~traceanalyzer.load.snapshot.STREAM_MIN_BYTES` are read here.
"""

from __future__ import annotations

import codecs
import pickletools
from collections.abc import Callable
from struct import error as struct_error
from struct import unpack_from
from typing import Any, BinaryIO

from traceanalyzer.load.pickle_budget import PickleBudget
from traceanalyzer.load.safe_pickle import UnsafePickleError

_BLOCK = 8 << 20          # bytes read per refill
_MARGIN = 1 << 16         # an opcode with a fixed-size argument never needs more than this
_MAX_MEMO_GAP = 1 << 20   # a PUT far beyond the memo's end is corrupt, not a reason to allocate
_MAX_INTERNED = 1 << 20   # distinct short strings kept in the intern table
_INTERN_MAX_LEN = 256

# A batch consumer: (the list being appended to, its items) → None.
BatchSink = Callable[[list[Any], list[Any]], None]


class StreamTruncated(EOFError):
    """The data ends before ``STOP`` (a file cut short), raised with ``salvage=True``.

    ``partial`` is the root object with every open container closed as it stood at the
    cut (``None`` when nothing was built); ``at`` is the unpacked byte offset of the cut."""

    def __init__(self, partial: Any, at: int) -> None:
        super().__init__(f"pickle data was truncated at byte {at:,}")
        self.partial, self.at = partial, at


class StreamFallback(Exception):
    """The file uses a pickle feature the streaming reader does not reproduce."""


class _Absorbed:
    """Placeholder left in the memo where an absorbed trace entry was."""

    __slots__ = ()


ABSORBED = _Absorbed()


def _is_entry_batch(items: list[Any]) -> bool:
    return bool(items) and type(items[0]) is dict and "action" in items[0]


# opcode character → its description (``pickletools.code2op``, which typeshed does not declare).
_CODE2OP: dict[str, pickletools.OpcodeInfo] = {op.code: op for op in pickletools.opcodes}


def _refuse(buf: bytes, pos: int, file_pos: int) -> Exception:
    """The same message as :func:`safe_pickle.scan_opcodes` for the opcode at ``pos``
    (a byte that is no opcode at all is corruption, not hostility)."""
    op = _CODE2OP.get(chr(buf[pos]))
    if op is None:
        return ValueError(f"invalid opcode 0x{buf[pos]:02x} at byte {file_pos}")
    name = op.name
    arg = None
    if op is not None:
        try:
            arg = next(iter(pickletools.genops(buf[pos:pos + 4096])))[1]
        except Exception:  # noqa: BLE001 - the argument is only decoration of the message
            arg = None
    shown = f" {arg!r}" if arg is not None else ""
    return UnsafePickleError(
        f"refused: opcode {name}{shown} at byte {file_pos} can import or call code; "
        "a memory snapshot never contains it"
    )


def stream_load(f: BinaryIO, on_batch: BatchSink, budget: PickleBudget | None = None,
                salvage: bool = False) -> Any:
    """Unpickle ``f`` (positioned at the ``PROTO`` byte) into builtin objects.

    Every ``APPENDS``/``APPEND`` whose items are dicts with an ``"action"`` key is
    passed to ``on_batch(target_list, items)`` and *not* appended: the lists of
    trace entries come back empty and the caller keeps what it took from them.

    ``budget`` (default :meth:`PickleBudget.from_env`), the same budget as the opcode
    scan of small files: ``max_string_bytes`` is checked before a string is read,
    ``max_items`` on every batch and container, ``max_objects`` on every batch and every
    memo reference to a container (which counts all that container holds again, see
    :func:`measure`), ``max_depth`` on every ``MARK`` (each open one is a container being
    filled), every memo reference to a container, and on the tree as built before it is
    returned (the nesting that ``APPEND``/``SETITEM`` alone can build).

    ``salvage``: on data cut short, raise :class:`StreamTruncated` carrying what was
    read before the cut (trace entries read so far are handed to ``on_batch``) instead
    of a bare ``EOFError``.

    Raises :class:`UnsafePickleError` for any opcode that could reach code,
    :class:`~traceanalyzer.load.pickle_budget.BudgetExceeded` past a limit,
    :class:`StreamFallback` where the result would differ from ``pickle.loads``,
    and ``ValueError``/``EOFError`` for a corrupt or truncated stream.
    """
    b = budget or PickleBudget.from_env()
    max_items, max_str = b.max_items, b.max_string_bytes
    max_objects, max_depth = b.max_objects, b.max_depth
    # Objects built, counted as the opcode scan counts them: each element added to a
    # container (per batch, not per opcode), and for a memo reference to a container,
    # everything it holds again (its weight, see :func:`measure`).
    total = 0
    weights: _Cache = {}

    def too_many_objects() -> Exception:
        return b.exceeded("max_objects", f"more than {max_objects:,} objects, memo references counted as the "
                                         f"objects they repeat (byte {base + pos})")

    def too_deep(d: int) -> Exception:
        return b.exceeded("max_depth", f"nesting {d:,} deep, deeper than {max_depth:,} (byte {base + pos})")

    def check_tree(root: Any) -> None:
        """The whole tree as built (trace entries excepted: handed over), measured afresh."""
        w, d = measure(root, {}, max_objects)
        if d > max_depth:
            raise too_deep(d)
        if w > max_objects:
            raise too_many_objects()

    def too_long(n: int) -> Exception:
        return b.exceeded("max_string_bytes", f"a string of {n:,} bytes (byte {base + pos})")

    def too_many(n: int) -> Exception:
        return b.exceeded("max_items", f"a container of {n:,} elements (byte {base + pos})")

    buf = f.read(_BLOCK)
    base = 0                    # file offset of buf[0]
    pos = 0
    eof = not buf
    lim = len(buf) - _MARGIN

    stack: list[Any] = []
    metastack: list[list[Any]] = []
    markmemo: list[int] = []    # len(memo) at each MARK: absorbed entries were memoized after it
    memo: list[Any] = []
    memo_append = memo.append
    interned: dict[bytes, str] = {}
    tuples: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    utf8 = codecs.utf_8_decode

    fed: set[int] = set()  # ids of the lists whose entries went to on_batch

    def absorb(target: list[Any], items: list[Any], m0: int) -> None:
        on_batch(target, items)
        fed.add(id(target))
        # Free the memo slots of the entry dicts (they would otherwise pin every entry).
        for i in range(m0, len(memo)):
            o = memo[i]
            if type(o) is dict and "action" in o:
                memo[i] = ABSORBED

    def intern(raw: bytes) -> str:
        s = interned.get(raw)
        if s is None:
            s = utf8(raw, "surrogatepass", True)[0]
            if len(raw) <= _INTERN_MAX_LEN and len(interned) < _MAX_INTERNED:
                interned[raw] = s
        return s

    def dedup(t: tuple[Any, ...]) -> tuple[Any, ...]:
        # Tuples of scalars only: hashing a nested tuple walks it (recursively, in C), so
        # a chain of nested tuples would cost its depth squared, and its depth in C stack.
        for x in t:
            if type(x) not in _FLAT:
                return t
        return tuples.setdefault(t, t) if len(tuples) < _MAX_INTERNED else t

    def get(i: int) -> Any:
        try:
            o = memo[i]
        except IndexError:
            raise ValueError(f"memo index {i} not defined") from None
        if o is ABSORBED or o is None:
            if o is ABSORBED:
                raise StreamFallback("a memo reference to an absorbed trace entry")
            raise ValueError(f"memo index {i} not defined")
        return o

    def ref(o: Any) -> int:
        """A memo reference to container ``o``: the objects it repeats beyond the one element
        the reference counts where it is added (refused past the depth limit)."""
        h = weights.get(id(o))
        if h is not None and h[0] is o and h[1] == len(o):
            w, d = h[2], h[3]
        else:
            w, d = measure(o, weights, max_objects)
        if d > max_depth:
            raise too_deep(d)
        return w - 1

    def put(i: int) -> None:
        n = len(memo)
        if i == n:
            memo_append(stack[-1])
        elif i < n:
            memo[i] = stack[-1]
        elif i - n > _MAX_MEMO_GAP:
            raise ValueError(f"memo index {i} far beyond the memo ({n} entries)")
        else:
            memo.extend([None] * (i - n))
            memo_append(stack[-1])

    try:
        while True:
            if pos > lim:
                if not eof:
                    try:
                        chunk = f.read(_BLOCK)
                    except EOFError:  # compressed data cut short: parse what came before it
                        chunk = b""
                    eof = not chunk
                    buf = buf[pos:] + chunk
                    base += pos
                    pos = 0
                lim = len(buf) if eof else len(buf) - _MARGIN
                if pos >= len(buf):
                    raise EOFError("pickle data was truncated")
            op = buf[pos]
            pos += 1
            # Ordered by frequency in real snapshots (BINGET first: the most common).
            if op == 0x68:    # BINGET
                o = get(buf[pos])
                pos += 1
                ot = type(o)
                if ot is not str and ot in _CONTAINERS:
                    total += ref(o)
                    if total > max_objects:
                        raise too_many_objects()
                stack.append(o)
            elif op == 0x8a:  # LONG1
                n = buf[pos]
                stack.append(int.from_bytes(buf[pos + 1:pos + 1 + n], "little", signed=True))
                pos += 1 + n
            elif op == 0x28:  # MARK
                metastack.append(stack)
                stack = []
                markmemo.append(len(memo))
                if len(metastack) > max_depth:  # each open MARK is a container being filled
                    raise too_deep(len(metastack))
            elif op == 0x94:  # MEMOIZE
                if not stack:
                    raise ValueError("MEMOIZE on an empty stack")
                memo_append(stack[-1])
            elif op == 0x4b:  # BININT1
                stack.append(buf[pos])
                pos += 1
            elif op == 0x7d:  # EMPTY_DICT
                stack.append({})
            elif op == 0x75:  # SETITEMS
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                d = stack[-1]
                if type(d) is not dict:
                    raise ValueError("SETITEMS on a non-dict")
                if len(items) & 1:
                    raise ValueError("SETITEMS with an odd number of items")
                if len(items) + 2 * len(d) > 2 * max_items:
                    raise too_many(len(items) // 2 + len(d))
                total += len(items)
                if total > max_objects:
                    raise too_many_objects()
                for i in range(0, len(items), 2):
                    d[items[i]] = items[i + 1]
            elif op == 0x4a:  # BININT
                stack.append(unpack_from("<i", buf, pos)[0])
                pos += 4
            elif op == 0x4d:  # BININT2
                stack.append(buf[pos] | (buf[pos + 1] << 8))
                pos += 2
            elif op == 0x8c:  # SHORT_BINUNICODE
                n = buf[pos]
                stack.append(intern(buf[pos + 1:pos + 1 + n]))
                pos += 1 + n
            elif op == 0x65:  # APPENDS
                items = stack
                stack = metastack.pop()
                m0 = markmemo.pop()
                lst = stack[-1]
                if type(lst) is not list:
                    raise ValueError("APPENDS on a non-list")
                if len(items) + len(lst) > max_items:
                    raise too_many(len(items) + len(lst))
                total += len(items)
                if total > max_objects:
                    raise too_many_objects()
                if _is_entry_batch(items):
                    absorb(lst, items, m0)
                else:
                    lst.extend(items)
            elif op == 0x6a:  # LONG_BINGET
                o = get(unpack_from("<I", buf, pos)[0])
                pos += 4
                ot = type(o)
                if ot is not str and ot in _CONTAINERS:
                    total += ref(o)
                    if total > max_objects:
                        raise too_many_objects()
                stack.append(o)
            elif op == 0x95:  # FRAME: framing is only a read-ahead hint
                pos += 8
            elif op == 0x5d:  # EMPTY_LIST
                stack.append([])
            elif op == 0x86:  # TUPLE2
                t: tuple[Any, ...] = (stack[-2], stack[-1])
                del stack[-2:]
                stack.append(dedup(t))
            elif op == 0x71:  # BINPUT
                put(buf[pos])
                pos += 1
            elif op == 0x72:  # LONG_BINPUT
                put(unpack_from("<I", buf, pos)[0])
                pos += 4
            elif op == 0x4e:  # NONE
                stack.append(None)
            elif op == 0x88:  # NEWTRUE
                stack.append(True)
            elif op == 0x89:  # NEWFALSE
                stack.append(False)
            elif op == 0x47:  # BINFLOAT
                stack.append(unpack_from(">d", buf, pos)[0])
                pos += 8
            elif op == 0x73:  # SETITEM
                v = stack.pop()
                k = stack.pop()
                d = stack[-1]
                if type(d) is not dict:
                    raise ValueError("SETITEM on a non-dict")
                d[k] = v
                total += 2
            elif op == 0x61:  # APPEND
                v = stack.pop()
                lst = stack[-1]
                if type(lst) is not list:
                    raise ValueError("APPEND on a non-list")
                total += 1
                if len(lst) >= max_items:
                    raise too_many(len(lst) + 1)
                if type(v) is dict and "action" in v:
                    absorb(lst, [v], len(memo))
                    # its own memo slot (memoized before the APPEND) is freed too
                    for i in range(len(memo) - 1, max(-1, len(memo) - 64), -1):
                        if memo[i] is v:
                            memo[i] = ABSORBED
                            break
                else:
                    lst.append(v)
            elif op == 0x58:  # BINUNICODE
                n = unpack_from("<I", buf, pos)[0]
                pos += 4
                if n > max_str:
                    raise too_long(n)
                if pos + n > len(buf):
                    buf, base, pos, lim, eof = _ensure(f, buf, base, pos, n)
                stack.append(intern(buf[pos:pos + n]) if n <= _INTERN_MAX_LEN
                             else utf8(buf[pos:pos + n], "surrogatepass", True)[0])
                pos += n
            elif op == 0x85:  # TUPLE1
                stack[-1] = dedup((stack[-1],))
            elif op == 0x87:  # TUPLE3
                t = (stack[-3], stack[-2], stack[-1])
                del stack[-3:]
                stack.append(dedup(t))
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x74:  # TUPLE
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                total += len(items)
                stack.append(dedup(tuple(items)))
            elif op == 0x6c:  # LIST
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                if len(items) > max_items:
                    raise too_many(len(items))
                total += len(items)
                stack.append(items)
            elif op == 0x64:  # DICT
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                if len(items) & 1:
                    raise ValueError("DICT with an odd number of items")
                if len(items) > 2 * max_items:
                    raise too_many(len(items) // 2)
                total += len(items)
                stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})
            elif op == 0x8b:  # LONG4
                n = unpack_from("<i", buf, pos)[0]
                pos += 4
                if n < 0:
                    raise ValueError("LONG4 with a negative length")
                if pos + n > len(buf):
                    buf, base, pos, lim, eof = _ensure(f, buf, base, pos, n)
                stack.append(int.from_bytes(buf[pos:pos + n], "little", signed=True))
                pos += n
            elif op in (0x8d, 0x42, 0x43, 0x8e, 0x96, 0x54, 0x55):
                # BINUNICODE8, BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8, BINSTRING, SHORT_BINSTRING
                if op == 0x43 or op == 0x55:
                    n, w = buf[pos], 1
                elif op in (0x42, 0x54):
                    n, w = unpack_from("<I" if op == 0x42 else "<i", buf, pos)[0], 4
                else:
                    n, w = unpack_from("<Q", buf, pos)[0], 8
                if n < 0:
                    raise ValueError("negative string length")
                if n > max_str:
                    raise too_long(n)
                pos += w
                if pos + n > len(buf):
                    buf, base, pos, lim, eof = _ensure(f, buf, base, pos, n)
                raw = buf[pos:pos + n]
                pos += n
                if op == 0x8d:
                    stack.append(utf8(raw, "surrogatepass", True)[0])
                elif op == 0x96:
                    stack.append(bytearray(raw))
                elif op in (0x54, 0x55):  # py2 str: the default ASCII decoding of pickle.loads
                    stack.append(raw.decode("ascii"))
                else:
                    stack.append(bytes(raw))
            elif op == 0x8f:  # EMPTY_SET
                stack.append(set())
            elif op == 0x90:  # ADDITEMS
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                s = stack[-1]
                if type(s) is not set:
                    raise ValueError("ADDITEMS on a non-set")
                total += len(items)
                s.update(items)
            elif op == 0x91:  # FROZENSET
                items = stack
                stack = metastack.pop()
                markmemo.pop()
                stack.append(frozenset(items))
            elif op == 0x30:  # POP
                if stack:
                    stack.pop()
                else:
                    stack = metastack.pop()
                    markmemo.pop()
            elif op == 0x31:  # POP_MARK
                stack = metastack.pop()
                markmemo.pop()
            elif op == 0x32:  # DUP
                stack.append(stack[-1])
            elif op == 0x80:  # PROTO
                if buf[pos] > 5:
                    raise ValueError(f"unsupported pickle protocol: {buf[pos]}")
                pos += 1
            elif op == 0x2e:  # STOP
                if len(stack) != 1 or metastack:
                    raise ValueError("STOP with an unbalanced stack")
                if total > max_objects:
                    raise too_many_objects()
                check_tree(stack[0])
                return stack[0]
            elif op in (0x49, 0x4c, 0x46, 0x53, 0x56, 0x70, 0x67):
                # Text opcodes (INT, LONG, FLOAT, STRING, UNICODE, PUT, GET): newline-terminated.
                end = buf.find(b"\n", pos)
                while end < 0 and not eof:
                    buf, base, pos, lim, eof = _ensure(f, buf, base, pos, len(buf) - pos + _BLOCK)
                    end = buf.find(b"\n", pos)
                if end < 0:
                    raise EOFError("pickle data was truncated")
                line = buf[pos:end]
                pos = end + 1
                if op == 0x49:
                    stack.append(True if line == b"01" else False if line == b"00" else int(line))
                elif op == 0x4c:
                    stack.append(int(line[:-1] if line.endswith(b"L") else line))
                elif op == 0x46:
                    stack.append(float(line))
                elif op == 0x53:
                    stack.append(_text_string(line))
                elif op == 0x56:
                    stack.append(codecs.raw_unicode_escape_decode(line)[0])
                elif op == 0x70:
                    put(int(line))
                else:
                    o = get(int(line))
                    if type(o) in _CONTAINERS:
                        total += ref(o)
                        if total > max_objects:
                            raise too_many_objects()
                    stack.append(o)
            else:
                raise _refuse(buf, pos - 1, base + pos - 1)
    except (EOFError, IndexError, struct_error) as exc:
        # Past the end of the data: a file cut short (an IndexError or struct.error read
        # past the last byte). Anywhere else they are corruption.
        if not (eof or isinstance(exc, EOFError)):
            raise
        if not salvage:
            raise EOFError(f"pickle data was truncated at byte {base + pos:,}") from None
        at = base + pos
        # Close every open MARK as the pending APPENDS/SETITEMS would have: what was read
        # before the cut stays in its container; an incomplete key/value pair is dropped.
        while metastack:
            items = stack
            stack = metastack.pop()
            m0 = markmemo.pop()
            top = stack[-1] if stack else None
            if type(top) is list:
                if _is_entry_batch(items):
                    absorb(top, items, m0)
                else:
                    top.extend(items)
            elif type(top) is dict:
                if len(items) & 1 and len(items) >= 3 and type(items[-2]) is list:
                    # a value still waiting for its single APPEND (a one-element list, e.g.
                    # the one device of device_traces): append it, the pairs stay aligned
                    v = items.pop()
                    if type(v) is dict and "action" in v:
                        absorb(items[-1], [v], m0)
                    else:
                        items[-1].append(v)
                for i in range(0, len(items) - 1, 2):
                    try:
                        top[items[i]] = items[i + 1]
                    except TypeError:  # an unhashable key: the pair is lost
                        pass
        # Protocol 0 adds each item as soon as it is complete (APPEND, SETITEM: no MARK), so
        # at the cut the containers being filled are still stacked one on the other (a dict,
        # a key, a list, its next item …): add each to the one below it, as the pending
        # APPEND/SETITEM would have; a key still waiting for its value is dropped.
        while len(stack) > 1:
            v = stack.pop()
            below = stack[-1]
            if type(below) is list:
                if type(v) is dict and ("action" in v or id(below) in fed):  # an entry, maybe cut short
                    absorb(below, [v], len(memo))
                else:
                    below.append(v)
            elif type(below) is not dict and len(stack) >= 2 and type(stack[-2]) is dict:
                stack.pop()
                try:
                    stack[-1][below] = v
                except TypeError:  # an unhashable key: the pair is lost
                    pass
        if stack:
            check_tree(stack[0])
        raise StreamTruncated(stack[0] if stack else None, at) from None



_CONTAINERS = frozenset({list, dict, tuple, set, frozenset})
_FLAT = frozenset({str, int, float, bool, type(None), bytes})

# id(container) → (the container, its length then, weight, depth): the container is held so
# that its id cannot be reused while the entry stands.
_Cache = dict[int, tuple[Any, int, int, int]]


def measure(obj: Any, cache: _Cache, cap: int) -> tuple[int, int]:
    """(weight, depth) of ``obj``, counted as :func:`~traceanalyzer.load.safe_pickle.scan_opcodes`
    counts them: weight = objects, every reference to a shared container counting all it
    holds again (a dict's keys included); depth = nesting levels of containers (a flat
    list: 1). Iterative (no recursion however deep); a container met again inside itself
    (a cycle) counts 1. Results are cached per container while its length stays the same,
    so repeated references cost one lookup. Stops early, returning a weight over ``cap``,
    once the weight passes ``cap``."""
    if type(obj) not in _CONTAINERS:
        return 1, 0

    def hit(x: Any) -> tuple[int, int] | None:
        h = cache.get(id(x))
        if h is not None and h[0] is x and h[1] == len(x):
            return h[2], h[3]
        return None

    def children(x: Any) -> Any:
        return iter(x.values()) if type(x) is dict else iter(x)

    found = hit(obj)
    if found is not None:
        return found
    path = [(obj, children(obj))]
    acc = [[1 + (len(obj) if type(obj) is dict else 0), 1]]
    onpath = {id(obj)}
    while True:
        o, it = path[-1]
        top = acc[-1]
        for x in it:
            if type(x) not in _CONTAINERS:
                top[0] += 1
                continue
            h = hit(x)
            if h is not None:
                top[0] += h[0]
                if h[1] + 1 > top[1]:
                    top[1] = h[1] + 1
                continue
            if id(x) in onpath:
                top[0] += 1
                continue
            onpath.add(id(x))
            path.append((x, children(x)))
            acc.append([1 + (len(x) if type(x) is dict else 0), 1])
            break
        else:
            path.pop()
            w, d = acc.pop()
            onpath.discard(id(o))
            cache[id(o)] = (o, len(o), w, d)
            if not acc:
                return w, d
            acc[-1][0] += w
            if d + 1 > acc[-1][1]:
                acc[-1][1] = d + 1
            if acc[-1][0] > cap:
                return acc[-1][0], acc[-1][1]  # past the budget: no need to finish


def _text_string(line: bytes) -> str:
    """STRING's argument: a quoted Python 2 str literal, decoded like ``pickle.loads``."""
    if len(line) >= 2 and line[0] == line[-1] and line[:1] in (b"'", b'"'):
        return codecs.escape_decode(line[1:-1])[0].decode("ascii")
    raise ValueError("the STRING opcode argument must be quoted")


def _ensure(f: BinaryIO, buf: bytes, base: int, pos: int, n: int) -> tuple[bytes, int, int, int, bool]:
    """Refill so that ``buf[pos:pos+n]`` is available (reads whole-string arguments)."""
    rest = buf[pos:]
    need = n - len(rest)
    parts = [rest]
    while need > 0:
        # capped: a forged length of 2**60 must end in EOFError, not one huge read
        chunk = f.read(min(max(need, _BLOCK), 64 << 20))
        if not chunk:
            raise EOFError("pickle data was truncated")
        parts.append(chunk)
        need -= len(chunk)
    buf = b"".join(parts)
    base += pos
    eof = False
    return buf, base, 0, len(buf) - _MARGIN, eof


__all__ = ["ABSORBED", "BatchSink", "StreamFallback", "StreamTruncated", "stream_load"]
