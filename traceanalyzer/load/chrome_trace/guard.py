"""The trace budget at the byte level: long strings cut short, nesting depth measured.

Both decode paths (:mod:`.framing` and the simple path) run their text through these
before a decoder sees it, so a hostile string or nesting costs what the budget allows
(:mod:`traceanalyzer.load.budget`), never what the file asks:

* :func:`clip_strings` cuts every JSON string longer than ``max_string_bytes`` to that
  length (at a character boundary, never inside an escape), and says whether the text
  ends inside a string it cut, whose rest the caller drops as it streams in
  (:class:`StringSkipper`);
* :func:`max_depth` is the deepest nesting of a piece of text, and where it is reached.

Both find strings by their quotes (numpy, no Python loop per byte); a piece of text with
no gap between two quotes longer than the limit holds no long string, which one
``diff`` tells, so the common case costs one pass over the quotes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_BACKSLASH = 0x5C
_QUOTE = 0x22


def _structure(buf: bytes | memoryview, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The brackets of ``buf`` outside strings: (positions, byte, depth after each).

    ``buf`` must start outside a string, at nesting depth ``depth0``. Escaped quotes
    are told apart by the parity of the backslash run before them. For whole chunks
    (the exact path); the small framing jobs use :func:`.framing._brackets`, which stops
    early and needs no numpy (whose import a plain trace run then never pays).
    """
    import numpy as np

    a = np.frombuffer(buf, np.uint8)
    q = _quotes(a)
    kind = np.zeros(256, np.int8)
    kind[[ord("{"), ord("[")]] = 1
    kind[[ord("}"), ord("]")]] = -1
    kind = kind[a]
    br = np.flatnonzero(kind)
    if q.size:
        br = br[(np.searchsorted(q, br) & 1) == 0]
    step = kind[br]
    return br, a[br], depth0 + np.cumsum(step, dtype=np.int64)


def _quotes(a: np.ndarray) -> np.ndarray:
    """Positions of the unescaped quotes of ``a`` (uint8 text that starts outside a string)."""
    import numpy as np

    q = np.flatnonzero(a == _QUOTE)
    if q.size:
        prev = a[np.maximum(q - 1, 0)] == _BACKSLASH
        prev[q == 0] = False
        cand = np.flatnonzero(prev)
        if cand.size:
            escaped = np.zeros(q.size, bool)
            for i in cand.tolist():
                j = int(q[i]) - 1
                n = 0
                while j >= 0 and a[j] == _BACKSLASH:
                    n += 1
                    j -= 1
                escaped[i] = bool(n & 1)
            q = q[~escaped]
    return q


def max_depth(buf: bytes | memoryview, depth0: int) -> tuple[int, int]:
    """The deepest nesting in ``buf`` (which starts outside a string at ``depth0``) and
    the byte where it is first reached (``(depth0, -1)`` with no bracket)."""
    br, _, depth = _structure(buf, depth0)
    if not depth.size:
        return depth0, -1
    i = int(depth.argmax())
    return int(depth[i]), int(br[i])


def cut_point(buf: bytes | memoryview, start: int, limit: int) -> int:
    """Where to cut a string whose content starts at ``start`` to keep at most ``limit``
    bytes of it: never inside a UTF-8 character, an escape (``\\n``, ``\\u00e9``) or a
    surrogate pair, so the kept text stays a valid JSON string once closed."""
    c = start + limit
    while c > start and (buf[c] & 0xC0) == 0x80:  # a UTF-8 continuation byte
        c -= 1
    # The last backslash within reach of the cut: does its escape straddle the cut?
    k = c - 1
    lo = max(start, c - 12)
    while k >= lo and buf[k] != _BACKSLASH:
        k -= 1
    while k >= lo:
        run = 0
        j = k
        while j >= start and buf[j] == _BACKSLASH:
            run += 1
            j -= 1
        first = j + 1  # the run's first backslash
        # Escapes start at every other backslash of the run: the last one that starts one.
        esc = first + ((run - 1) // 2) * 2
        length = 6 if esc + 1 < len(buf) and buf[esc + 1] == 0x75 else 2  # \uXXXX or \x
        if esc + length > c:
            c = esc
        elif length == 6 and bytes(buf[esc + 2:esc + 4]).lower() in (b"d8", b"d9", b"da", b"db"):
            c = esc  # a high surrogate whose low half would be cut off
        else:
            break
        k = c - 1
        while k >= lo and buf[k] != _BACKSLASH:
            k -= 1
    return c


# A quote that no backslash precedes: one in each window of a piece of text rules out a
# string longer than two windows in it.
_PLAIN_QUOTE = re.compile(rb'[^\\]"')


def _may_hold_long_string(buf: bytes, limit: int) -> bool:
    """Whether ``buf`` may hold a string longer than ``limit`` bytes. Such a string is a
    run of more than ``limit`` bytes without an unescaped quote, which covers a whole
    aligned window of ``limit // 2`` bytes; a window with a quote after a byte other than
    a backslash (always unescaped) cannot lie inside it. One regex search per window,
    each stopping at the first quote, where real text has one every few bytes: a few
    calls per buffer. A window of escaped quotes only is a "maybe" (the exact scan
    decides)."""
    if len(buf) <= limit:
        return False
    half = max(2, limit // 2)
    search = _PLAIN_QUOTE.search
    return any(search(buf, k, k + half) is None for k in range(0, len(buf) - half + 1, half))


def clip_strings(buf: bytes, limit: int) -> tuple[bytes, int, int, int]:
    """``buf`` (text that starts outside a string) with every string longer than
    ``limit`` bytes cut to ``limit`` (see :func:`cut_point`).

    Returns ``(text, count, longest, open_len)``: the strings cut, the longest one's
    length, and, when ``buf`` ends inside a string that was cut, that string's length so
    far (else 0): it is left unterminated, and the caller drops what follows up to its
    closing quote (see :class:`StringSkipper`). A string still open at the end and no
    longer than the limit is left alone."""
    if not _may_hold_long_string(buf, limit):
        return buf, 0, 0, 0
    import numpy as np

    a = np.frombuffer(buf, np.uint8)
    q = _quotes(a)
    opens = q[0::2]
    closes = q[1::2]
    lengths = np.empty(opens.size, np.int64)
    lengths[:closes.size] = closes - opens[:closes.size] - 1
    if opens.size > closes.size:  # the text ends inside a string
        lengths[-1] = len(buf) - int(opens[-1]) - 1
    long = np.flatnonzero(lengths > limit)
    if not long.size:
        return buf, 0, 0, 0
    parts: list[bytes] = []
    prev = 0
    open_len = 0
    for i in long.tolist():
        start = int(opens[i]) + 1
        cut = cut_point(buf, start, limit)
        parts.append(buf[prev:cut])
        if i < closes.size:
            prev = int(closes[i])  # resume at the closing quote
        else:
            prev = len(buf)
            open_len = int(lengths[i])
    parts.append(buf[prev:])
    return b"".join(parts), int(long.size), int(lengths[long].max()), open_len


class StringSkipper:
    """Drops the rest of a string that :func:`clip_strings` cut at the end of a buffer,
    block by block, up to its closing quote (escaped quotes and backslash runs split
    across blocks included). ``dropped`` counts the bytes dropped."""

    def __init__(self) -> None:
        self.active = False
        self.escaped = False  # the bytes dropped so far end in an odd run of backslashes
        self.dropped = 0

    def start(self, text: bytes) -> None:
        """Skip from the end of ``text`` (the buffer the string was cut in: its trailing
        backslashes may escape the first byte of the next block)."""
        run = len(text) - len(text.rstrip(b"\\"))
        self.active, self.escaped, self.dropped = True, bool(run & 1), 0

    def feed(self, block: bytes) -> bytes | None:
        """The part of ``block`` from the closing quote on (the skip is then over), or
        None when the whole block lies inside the string (dropped)."""
        i = 0
        while True:
            k = block.find(b'"', i)
            if k < 0:
                break
            run = 0
            j = k - 1
            while j >= 0 and block[j] == _BACKSLASH:
                run += 1
                j -= 1
            odd = bool(run & 1)
            if j < 0 and self.escaped:  # the run goes on from the previous block
                odd = not odd
            if not odd:
                self.active = False
                self.dropped += k
                return block[k:]
            i = k + 1
        stripped = block.rstrip(b"\\")
        run = len(block) - len(stripped)
        self.escaped = (not (run & 1)) == self.escaped if not stripped else bool(run & 1)
        self.dropped += len(block)
        return None
