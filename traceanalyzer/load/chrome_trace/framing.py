"""The chunked path

The ``traceEvents`` array is cut into chunks of about ``CHUNK_BYTES`` at event
boundaries, as the bytes stream in (gzip included). Each chunk becomes
newline-delimited JSON (one event a line) and polars' own JSON reader (Rust,
multi-threaded) decodes it straight into typed columns of only the fields the
model needs; polars expressions then sort the rows into tables. No Python object
per event is created.

Exactness: the reader is strict about types (an int column refuses a float or a
string), so any chunk it cannot take exactly (odd types, bad tokens, control
characters, a non-object item …) is decoded again by the simple path's per-event
loop, with the same repairs. A cut is only a *candidate* boundary (a separator
found by ``rfind``): a chunk that decodes is proof that it was right; one that does
not is re-framed exactly by a string-aware bracket scan (numpy) before the slow
path takes it. The end of the file (array end, keys after the array, truncation)
always goes through the exact scan, on a small piece.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.budget import DEPTH_CEILING, Budget
from traceanalyzer.load.chrome_trace.assembly import _assemble
from traceanalyzer.load.chrome_trace.exact import _collect_events
from traceanalyzer.load.chrome_trace.guard import StringSkipper, _structure, clip_strings, max_depth
from traceanalyzer.load.chrome_trace.ndjson import _NL_TO_TAB, ArgKeys, _decode_region, _fast_chunk, _NotFast
from traceanalyzer.load.chrome_trace.raw import _RAW_COLS, _Stats
from traceanalyzer.load.jsonio import (
    GZIP_MAGIC,
    ByteStream,
    Repaired,
    damage_inside_events,
    decode_repairing,
    describe_error,
    fix_tokens,
    recover_members,
    repair_warnings,
    truncation_warning,
)
from traceanalyzer.model.trace import TraceModel

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CHUNK_BYTES", "MAX_REGION_SCALE", "PARALLEL_CHUNK_BYTES", "REGION_SCALE_BYTES", "_ChunkedLoader",
           "_Unframed", "_brackets", "_structure", "region_scale", "size_hint"]

CHUNK_BYTES = 4 << 20
# Regions when two are decoded at once (see _ChunkedLoader): the same peak as one region
# of CHUNK_BYTES at a time.
PARALLEL_CHUNK_BYTES = 2 << 20
# Larger files get larger regions, up to this many times the sizes above: each region
# costs a fixed ~20 ms of CPU (the reads and the polars queries that split it), 400 regions
# on an 800 MB file. A region's working set (~15x it) grows with it, but from a file of
# REGION_SCALE_BYTES on the analyses' working set, which grows with the model, is larger.
MAX_REGION_SCALE = 4
REGION_SCALE_BYTES = 64 << 20


def size_hint(path: Path) -> int | None:
    """The file's size on disk, or for a gzip file the larger of that and its trailer's
    ISIZE (the last member's decompressed size modulo 2**32: a multi-member or > 4 GiB file
    reads smaller than it is, which only keeps its regions smaller). None when unreadable
    (the stream's own open reports why)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 18 or f.read(2) != GZIP_MAGIC:
                return size
            f.seek(size - 4)
            return max(size, int.from_bytes(f.read(4), "little"))
    except OSError:
        return None


def region_scale(size: int | None) -> int:
    """How many times the base region size a file of ``size`` bytes on disk is read in:
    1 below :data:`REGION_SCALE_BYTES` and for an unknown size, then one more per
    REGION_SCALE_BYTES, at most :data:`MAX_REGION_SCALE` (``size`` from :func:`size_hint`)."""
    if not size or size < REGION_SCALE_BYTES:
        return 1
    return int(min(MAX_REGION_SCALE, size // REGION_SCALE_BYTES))


_WS = b" \t\r\n"

# JSON strings (skipped whole), brackets, and a string the buffer cuts off (a lone
# ``"``: everything after it is inside that string).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]|"', re.S)
_OPEN = frozenset(b"[{")


_COLON = re.compile(rb"\s*:\s*")
_COMMA = re.compile(rb"\s*,?")
_SEP = re.compile(rb"\}\s*,\s*\{")


class _Unframed(Exception):
    """The chunked reader cannot frame this file: the simple path takes it."""


# Damage in the middle of a file (an event that does not decode, garbage between events, an
# unterminated string followed by more events …): files up to this size (decompressed) are
# handed to the simple path, which defines the outcome (refused with the first error's
# position, or kept up to a damaged end: ``jsonio.damage_inside_events``), so both paths give
# the same line. Larger ones are refused here (the simple path's memory is several times the
# file): the same outcome, the position worded from the region that failed.
SIMPLE_FALLBACK_BYTES = 64 << 20


def _brackets(buf: bytes | memoryview, depth0: int) -> Iterator[tuple[int, int, int]]:
    """:func:`_structure` as a lazy scan: (position, byte, depth after it) for each
    bracket outside strings, in order, so a caller that needs the first few stops
    there. Same answer for any ``buf`` that starts outside a string; on invalid JSON
    (a backslash outside a string) the two may differ, and every caller then fails to
    decode and re-frames with :func:`_structure`."""
    depth = depth0
    for m in _TOKENS.finditer(buf):
        start = m.start()
        ch = buf[start]
        if ch == 0x22:
            if m.end() - start == 1:
                return  # a string the buffer cuts off
            continue
        depth += 1 if ch in _OPEN else -1
        yield start, ch, depth


@dataclass
class _Pending:
    """A region being decoded on the pool, and what undoes the assumption that it decodes:
    where it started (``carry[:nxt]`` is its text up to the next region) and the loader's
    position before it."""

    future: Future[tuple[dict[str, pl.DataFrame], _Stats] | None]
    carry: bytes
    nxt: int
    offset: int
    last_end: int | None


class _Rollback(Exception):
    """A region decoded ahead did not decode: ``carry`` is the text from its start on."""

    def __init__(self, carry: bytes) -> None:
        super().__init__()
        self.carry = carry


class _ChunkedLoader:
    """Streams one file through the chunked path (see the module docstring).

    With ``workers`` ≥ 2 (the default where polars has two threads or more), two regions
    are decoded at once on a thread pool: the reader keeps two cores busy, but the rest of
    a region's work (the screen, the separator rewrite, the split into tables) runs on
    one, so on 2 cores one region's tables are built while the next one is read. Two
    regions in flight hold two working sets, hence regions of
    :data:`PARALLEL_CHUNK_BYTES` then, half of :data:`CHUNK_BYTES`: the same peak as one
    region at a time; both grow with the file (:func:`region_scale`). Regions are cut
    assuming the one
    before decodes; where one does not (a value the reader would blur, a separator inside
    a string), the regions cut after it are dropped, the loader goes back to its start
    and carries on one region at a time, exactly as with ``workers=1``. Frames are added
    in file order either way.
    """

    def __init__(self, path: Path, chunk_bytes: int | None = None, workers: int | None = None) -> None:
        self.path = path
        if workers is None:
            workers = 2 if pl.thread_pool_size() >= 2 else 1
        self.workers = workers
        if chunk_bytes is None:
            base = PARALLEL_CHUNK_BYTES if workers > 1 else CHUNK_BYTES
            chunk_bytes = base * region_scale(size_hint(path))
        self.chunk = max(1, chunk_bytes)
        self.pool: ThreadPoolExecutor | None = None
        self.pending: deque[_Pending] = deque()
        self.budget = Budget.from_env()
        self.stream = ByteStream(path, self.budget)
        self.skipper = StringSkipper()
        self.n_clipped = 0  # strings cut to the string limit
        self.longest_clipped = 0
        self.open_clipped = 0  # length so far of the string being skipped
        self.events_seen = 0  # events counted in the regions handed to a decoder
        self.frames: dict[str, list[pl.DataFrame]] = {t: [] for t in _RAW_COLS}
        self.stats = _Stats()
        self.n_tokens = 0
        self.n_ctrl = 0
        self.not_strict = False
        self.autograd = False
        self.arg_keys = ArgKeys()  # the args fields the regions read so far hold
        self.top: dict[str, Any] = {}
        self.sep: bytes | None = None  # raw bytes between two events, learned from the file
        self.sep_nd: bytes = b""
        self.sep_nl: bytes = b""  # sep_nd with its ``,`` made a newline: same length, so
        # ``bytes.replace`` substitutes in place (cheaper than inserting ``}\n{``)
        self.offset = 0  # position in the (decompressed) file of the current buffer's first byte
        self.truncated_at: int | None = None
        self.last_end: int | None = None  # file position just after the last complete event
        self.expect_comma = False  # the buffer starts before the ``,`` that follows an event

    # -- driver -----------------------------------------------------------------

    def load(self) -> TraceModel:
        try:
            return self._load()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = None

    def _load(self) -> TraceModel:
        blocks = self._blocks = self.stream.blocks(self.chunk)
        carry = self._header(blocks)
        tail_parts: list[bytes] | None = None
        parts, n = [carry], len(carry)
        wait = self.chunk
        # The empty block first: what the header left may already fill a chunk (appending
        # the next block before cutting made the first chunk twice the others).
        limit = self.budget.max_string_bytes
        for block in chain((b"",), blocks):
            if self.skipper.active:
                rest = self.skipper.feed(block)
                if rest is None:
                    continue
                self.longest_clipped = max(self.longest_clipped, self.open_clipped + self.skipper.dropped)
                block = rest
            if tail_parts is not None:
                tail_parts.append(block)
                if sum(map(len, tail_parts)) > limit:
                    tail_parts = [self._clip(b"".join(tail_parts))]
                continue
            if block:
                parts.append(block)
                n += len(block)
            if n < wait:
                continue
            carry = b"".join(parts) if len(parts) > 1 else parts[0]
            if len(carry) > limit:
                carry = self._clip(carry)
            before = len(carry)
            try:
                carry, tail = self._step(carry)
            except _Rollback as rb:  # from here on one region at a time
                carry, tail = self._step(rb.carry)
            if tail is not None:
                tail_parts = [tail]
                parts, n = [], 0
                continue
            parts, n = [carry], len(carry)
            # A step that consumed nothing (one event, or the whitespace between two,
            # longer than the buffer) is retried once the buffer has doubled: O(n) copies
            # and scans for n such bytes, not O(n²) (whitespace bombs inside the events
            # array, one endless string).
            wait = 2 * n if n >= before else self.chunk
        carry = b"".join(parts)
        del parts
        if len(carry) > limit:
            carry = self._clip(carry)
        if tail_parts is None:
            try:
                self._drain(carry)
            except _Rollback as rb:
                carry = rb.carry
            tail = self._final(carry)
        else:
            tail = b"".join(tail_parts)
        del carry
        if tail is not None:
            self._tail(tail)
        total = self.stream.nbytes
        if self.truncated_at is not None and not self.stats.n_events and tail is None:
            # Not one complete event before the cut: the file is a fragment, small by
            # construction; the simple path's decoder words the error.
            raise _Unframed
        warnings = list(self.stream.warnings)
        if self.n_clipped:
            if self.skipper.active:  # the file ended inside the string
                self.longest_clipped = max(self.longest_clipped, self.open_clipped + self.skipper.dropped)
            warnings.append(self.budget.string_warning(self.n_clipped, self.longest_clipped))
        warnings += repair_warnings(self.n_tokens, self.n_ctrl, self.not_strict)
        if self.truncated_at is not None:
            warnings.append(truncation_warning(self.truncated_at, total))
        if self.autograd and self.stats.n_events and self._first_ph_missing:
            raise InputError(self.path, "a JSON array whose items are not trace events (no 'ph' fields)")
        return _assemble(self.path, self.top, self.autograd, self.frames, self.stats, warnings)

    _first_ph_missing = False

    def _clip(self, buf: bytes) -> bytes:
        """``buf`` with its strings cut to the string limit (:func:`.guard.clip_strings`); a
        string still open at its end is closed by dropping the rest of it as it streams in."""
        out, count, longest, open_len = clip_strings(buf, self.budget.max_string_bytes)
        if count:
            self.n_clipped += count
            self.longest_clipped = max(self.longest_clipped, longest)
            if open_len:
                self.open_clipped = open_len
                self.skipper.start(buf)
        return out

    def _count(self, buf: bytes, end: int, n: int | None = None) -> None:
        """Count the events of a region (``buf[:end]``) about to be decoded and refuse the file
        once the total passes the event limit. ``n``: the exact count (exact framing); otherwise
        the separators are counted, and only a total past the limit pays for an exact
        count (a separator inside a string must not refuse a genuine file)."""
        max_events = self.budget.max_events
        if n is None:
            n = buf.count(self.sep, 0, end) + 1 if self.sep else 1
            if self.events_seen + n > max_events:
                _, ch, depth = _structure(memoryview(buf)[:end], 1)
                n = int(((depth == 2) & ((ch == 0x7B) | (ch == 0x5B))).sum())
        self.events_seen += n
        if self.events_seen > max_events:
            raise self.budget.events_exceeded(self.path, self.events_seen, self.offset + end)

    def _check_depth(self, region: bytes | memoryview) -> None:
        """Refuse a region nested past the depth limit. Needed only where the limit is below
        :data:`~traceanalyzer.load.budget.DEPTH_CEILING`: at the ceiling, the columnar
        reader refuses a deeper region itself, which then takes the exact path, where
        the depth comes with the framing."""
        if self.budget.max_depth < DEPTH_CEILING:
            depth, at = max_depth(region, 1)
            self._depth_refusal(depth, at)

    def _depth_refusal(self, depth: int, at: int) -> None:
        depth += 0 if self.autograd else 1  # levels in the document: the top-level object too
        if depth > self.budget.max_depth:
            raise self.budget.depth_exceeded(self.path, depth, self.offset + at)

    def _header(self, blocks: Iterator[bytes]) -> bytes:
        """Consume blocks up to the ``[`` that opens the events; return what follows."""
        buf = b""
        for block in blocks:
            buf += block
            start = self._events_start(buf, final=False)
            if start is not None:
                self.offset = start
                return buf[start:]
        start = self._events_start(buf, final=True)
        assert start is not None
        self.offset = start
        return buf[start:]

    def _events_start(self, buf: bytes, final: bool) -> int | None:
        body = buf.lstrip(_WS)
        if not body:
            if final:
                raise _Unframed
            return None
        i = len(buf) - len(body)
        if body[:1] == b"[":
            self.autograd = True
            return i + 1
        if body[:1] != b"{":
            raise _Unframed
        limit = 1 << 16
        while True:
            window = buf[:limit]
            k = window.find(b'"traceEvents"')
            while k >= 0:
                depth = 0
                for _, _, d in _brackets(memoryview(window)[:k], 0):
                    depth = d
                if depth == 1 and _outside_string(window[:k]):
                    m = _COLON.match(buf, k + 13)
                    if m is None or m.end() >= len(buf):
                        if final:
                            raise _Unframed
                        return None
                    if buf[m.end():m.end() + 1] != b"[":
                        raise _Unframed
                    head = buf[:k].rstrip(_WS)
                    if head.endswith(b","):
                        head = head[:-1]
                    try:
                        top = orjson.loads(head + b"}")
                    except orjson.JSONDecodeError:
                        raise _Unframed from None
                    if not isinstance(top, dict):
                        raise _Unframed
                    self.top = top
                    return m.end() + 1
                k = window.find(b'"traceEvents"', k + 1)
            if limit >= len(buf):
                if final or len(buf) >= (64 << 20):
                    raise _Unframed
                return None
            if limit >= (64 << 20):
                raise _Unframed
            limit *= 16

    # -- chunks -----------------------------------------------------------------

    def _learn_sep(self, buf: bytes) -> None:
        """The bytes between the first two events (``},\\n  {`` for Kineto's own writer)."""
        end = -1
        starts: list[int] = []
        for pos, ch, depth in _brackets(memoryview(buf)[: 16 << 20], 1):
            if depth == 1 and ch == 0x7D and end < 0:
                end = pos
            elif depth == 2 and ch == 0x7B:
                starts.append(pos)
            if end >= 0 and len(starts) > 1:
                break
        if end >= 0 and len(starts) > 1 and starts[1] > end:
            sep = buf[end:starts[1] + 1]
            if _SEP.fullmatch(sep):
                self.sep = sep
                self.sep_nd = sep.translate(_NL_TO_TAB)
                self.sep_nl = self.sep_nd.replace(b",", b"\n")

    def _total(self) -> int:
        """The file's (decompressed) size, for error messages: reads the rest of the stream."""
        for _ in self._blocks:
            pass
        return self.stream.nbytes

    def _skip_comma(self, carry: bytes, final: bool) -> bytes | None:
        """Drop the ``,`` that separates the last processed event from the next one
        when the previous buffer ended before it; None when more bytes are needed."""
        rest = carry.lstrip(_WS)
        if not rest and not final:
            return None
        self.expect_comma = False
        if rest[:1] not in (b",", b"]", b""):
            at = self.offset + len(carry) - len(rest)
            raise self._damaged("unexpected character, expected ',' or ']' "
                                f"at byte {at:,} of {self._total():,}")
        if rest[:1] != b",":
            return carry  # the array's ``]``, or the end of a cut-off file
        n = len(carry) - len(rest) + 1
        self.offset += n
        return carry[n:]

    def _step(self, carry: bytes) -> tuple[bytes, bytes | None]:
        """Process the complete events of a full buffer; return (rest, tail-or-None)."""
        if self.expect_comma:
            skipped = self._skip_comma(carry, final=False)
            if skipped is None:
                return carry, None
            carry = skipped
        if self.sep is None:
            self._learn_sep(carry)
        p = -1
        if self.sep:
            # The last boundary within one chunk, so that a region (whose decode working
            # set is many times its size) is never much more than CHUNK_BYTES; the whole
            # buffer only when one event is longer than that.
            p = carry.rfind(self.sep, 0, self.chunk + len(self.sep))
            if p <= 0:
                p = carry.rfind(self.sep)
        if p > 0:
            nxt = p + len(self.sep) - 1  # type: ignore[arg-type]
            if self.workers > 1:
                return self._ahead(carry, p, nxt), None
            if self._fast(carry[: p + 1]):
                self.last_end = self.offset + p + 1
                self.offset += nxt
                return carry[nxt:], None
            resume, end = self._exact(carry, p + 1, final=False)
        elif len(carry) < 4 * self.chunk:
            return carry, None  # no boundary yet: read on
        else:
            self._drain(carry)
            resume, end = self._exact(carry, len(carry), final=False)
        if end >= 0:
            return b"", carry[end + 1:]
        self.offset += resume
        return carry[resume:], None

    def _final(self, carry: bytes) -> bytes | None:
        """The last buffer: events, the array's end and what follows (or a truncation).

        The bulk goes through the columnar reader; only the last event and what follows
        it are framed exactly (a bracket scan of the whole buffer would cost more than
        decoding it).
        """
        if self.expect_comma:
            carry = self._skip_comma(carry, final=True)  # type: ignore[assignment]
        if self.sep is None:
            self._learn_sep(carry)
        p = carry.rfind(self.sep) if self.sep else -1
        if p > 0:
            q = p + len(self.sep) - 1  # type: ignore[arg-type]
            closed = next((pos for pos, _, depth in _brackets(memoryview(carry)[q:], 1) if depth <= 0), -1)
            if closed >= 0:
                end = q + closed
                events = carry[:end].rstrip(_WS)
                if self._fast(events):
                    self.last_end = self.offset + len(events)
                    self.offset += end + 1
                    return carry[end + 1:]
            elif self._fast(carry[: p + 1]):
                self.last_end = self.offset + p + 1
                self.offset += q
                carry = carry[q:]
        resume, end = self._exact(carry, len(carry), final=True)
        return carry[end + 1:] if end >= 0 else None

    def _fast(self, region: bytes) -> bool:
        self._check_depth(region)
        seen = self.events_seen
        self._count(region, len(region))
        got = _decode_region(region, self.sep_nd, self.sep_nl, self.autograd, self.arg_keys)
        if got is None:
            self.events_seen = seen  # the exact path counts them
            return False
        self._add(*got)
        return True

    def _ahead(self, carry: bytes, p: int, nxt: int) -> bytes:
        """Send ``carry[:p + 1]`` to the pool and move on as if it decodes (see the class);
        with two regions in flight, first settle the older one. Returns the rest."""
        self._check_depth(memoryview(carry)[: p + 1])
        self._count(carry, p + 1)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="traceanalyzer-load")
        future = self.pool.submit(_decode_region, carry[: p + 1], self.sep_nd, self.sep_nl, self.autograd,
                                  self.arg_keys)
        self.pending.append(_Pending(future, carry, nxt, self.offset, self.last_end))
        self.last_end = self.offset + p + 1
        self.offset += nxt
        rest = carry[nxt:]
        while len(self.pending) >= self.workers:
            self._settle_oldest(rest)
        return rest

    def _drain(self, carry: bytes) -> None:
        """Settle every region in flight (``carry``: the text after the last one)."""
        while self.pending:
            self._settle_oldest(carry)

    def _settle_oldest(self, carry: bytes) -> None:
        """Add the oldest region's frames, or, where it did not decode, drop every region
        in flight, go back to its start and raise :class:`_Rollback` with the text from
        there on (``carry``: the text after the newest region)."""
        first = self.pending.popleft()
        got = first.future.result()
        if got is not None:
            self._add(*got)
            return
        later = list(self.pending)
        self.pending.clear()
        for q in later:
            if not q.future.cancel():
                q.future.result()  # let it finish: its working set goes with it
        self.offset, self.last_end = first.offset, first.last_end
        self.events_seen = self.stats.n_events  # the regions dropped are counted again
        self.workers = 1
        parts = [first.carry[: first.nxt], *(q.carry[: q.nxt] for q in later), carry]
        del first, later
        raise _Rollback(b"".join(parts))

    def _exact(self, buf: bytes, upto: int, final: bool) -> tuple[int, int]:
        """Frame ``buf[:upto]`` exactly and process its complete events.

        Returns (where the unprocessed text resumes, array end or -1).
        """
        view = memoryview(buf)[:upto]
        import numpy as np

        br, ch, depth = _structure(view, 1)
        if depth.size:
            i = int(depth.argmax())
            self._depth_refusal(int(depth[i]), int(br[i]))
        closed = np.flatnonzero(depth <= 0)
        array_end = int(br[closed[0]]) if closed.size else -1
        if closed.size:
            br, ch, depth = br[: closed[0]], ch[: closed[0]], depth[: closed[0]]
        opens = (depth == 2) & ((ch == ord("{")) | (ch == ord("[")))
        ends = br[(depth == 1) & ((ch == ord("}")) | (ch == ord("]")))]
        starts = br[opens]
        starts_ch = ch[opens]
        n = int(ends.size)
        if array_end >= 0:
            content_end = array_end
            resume = array_end + 1
        else:
            content_end = int(ends[-1]) + 1 if n else 0
            if final:
                # A cut-off file: the simple path counts the repairs in the lost text too.
                _, n_tokens, n_ctrl = fix_tokens(bytes(view[content_end:]))
                self.n_tokens += n_tokens
                self.n_ctrl += n_ctrl
                resume = upto
            elif n:
                m = _COMMA.match(buf, content_end)
                resume = m.end() if m else content_end
                self.expect_comma = not buf[content_end:resume].count(b",")
            else:
                resume = 0
        content = bytes(view[:content_end])
        del view
        if n:
            self._count(content, len(content), n)
        if content.strip(_WS):
            self._exact_content(content, starts[:n], ends, starts_ch[:n])
        if n:
            self.last_end = self.offset + int(ends[-1]) + 1
        if final and array_end < 0:
            self.truncated_at = self.last_end if self.last_end is not None else self.offset + content_end
            lost = bytes(memoryview(buf)[content_end:upto])
            if _SEP.search(lost) or _damage_inside(lost):
                # Not a file cut off but damage before its end (an unterminated string flips
                # every quote after it, so the events after it look like one cut-off item).
                raise self._damaged(f"damaged event at byte {self.truncated_at:,} of {self._total():,}, "
                                    "followed by more of the file")
        return resume, array_end

    def _damaged(self, problem: str) -> Exception:
        """Damage in the middle of the file: see :data:`SIMPLE_FALLBACK_BYTES`."""
        if self._total() <= SIMPLE_FALLBACK_BYTES:
            return _Unframed()
        return InputError(self.path, f"not valid JSON ({problem})")

    def _exact_content(self, content: bytes, starts: np.ndarray, ends: np.ndarray, starts_ch: np.ndarray) -> None:
        """Complete events, exactly framed: columnar when every item is a plain object, else slow."""
        if starts.size and (starts_ch == ord("{")).all():
            t = content.translate(_NL_TO_TAB)
            s_list, e_list = starts.tolist(), ends.tolist()
            gaps = b"".join(t[e + 1:s] for e, s in zip(e_list[:-1], s_list[1:]))
            outer = t[: s_list[0]] + t[e_list[-1] + 1:]
            if (gaps.count(b",") == len(s_list) - 1 and not gaps.translate(None, b" \t,")
                    and not outer.translate(None, b" \t")):
                nd = b"\n".join(t[s:e + 1] for s, e in zip(s_list, e_list))
                try:
                    frames, stats = _fast_chunk(nd, self.autograd, self.arg_keys)
                except _NotFast:
                    pass
                else:
                    self._add(frames, stats)
                    return
        self._slow(content)

    def _slow(self, content: bytes) -> None:
        """The simple path's decoding (with its repairs) and event loop, on one chunk."""
        repaired = decode_repairing(b"[" + content + b"]")
        if not isinstance(repaired, Repaired):
            raise self._damaged(describe_error(repaired.error, self.offset - 1, self._total()))
        self.n_tokens += repaired.n_tokens
        self.n_ctrl += repaired.n_ctrl
        self.not_strict |= repaired.not_strict
        events = repaired.doc
        frames, stats = _collect_events(events, self.autograd)
        del events
        self._add(frames, stats)

    def _add(self, frames: dict[str, pl.DataFrame], stats: _Stats) -> None:
        if not self.stats.n_events and stats.n_events:
            self._first_ph_missing = stats.no_ph_head
        for t, f in frames.items():
            if f.height:
                self.frames[t].append(f)
        self.stats.merge(stats)

    def _tail(self, tail: bytes) -> None:
        """Top-level keys after the events array (Kineto writes ``traceName``,
        ``displayTimeUnit`` and ``baseTimeNanoseconds`` there), or a damaged end: the
        keys before the damage are kept, as the simple path's recovery does."""
        start = self.stream.nbytes - len(tail)  # file position just after the array's ``]``
        if self.autograd:
            if tail.strip(_WS) and self.truncated_at is None:
                self.truncated_at = start
            return
        fixed, n_tokens, n_ctrl = fix_tokens(tail)
        members, kept, complete, not_strict = recover_members(fixed)
        self.n_tokens += n_tokens
        self.n_ctrl += n_ctrl
        self.not_strict |= not_strict
        self.top.update(members)
        if not complete and self.truncated_at is None:
            self.truncated_at = start + kept


def _damage_inside(lost: bytes) -> bool:
    """The simple path's rule (:func:`~traceanalyzer.load.jsonio.damage_inside_events`) on
    the text after the last complete event of a file that looks cut off."""
    probe = b"[" + lost.lstrip(b" \t\r\n,")
    got = decode_repairing(probe)
    return not isinstance(got, Repaired) and damage_inside_events(got.fixed, got.first_error_at())


def _outside_string(before: bytes) -> bool:
    """Whether the position after ``before`` (which starts outside strings) is outside a string."""
    n = 0
    i = before.find(b'"')
    while i >= 0:
        j = i - 1
        k = 0
        while j >= 0 and before[j] == 0x5C:
            k += 1
            j -= 1
        if not k & 1:
            n += 1
        i = before.find(b'"', i + 1)
    return not n & 1
