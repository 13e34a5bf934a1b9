"""Reading raw JSON bytes tolerantly: gzip, truncation, invalid tokens.

This is the only place (with :mod:`traceanalyzer.load.chrome_trace`) that sees raw
JSON. Every repair is reported back as a human-readable warning with a count; a file
that cannot be repaired raises :class:`~traceanalyzer.errors.InputError`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from traceanalyzer.errors import InputError
from traceanalyzer.load.budget import Budget, open_regular

GZIP_MAGIC = b"\x1f\x8b"

# Bare tokens that are not JSON but that real exporters have written: ``inf``
# bandwidth for 0-duration memcpy (kineto #105), NaN, and the unquoted ``N/A`` the
# TensorBoard plugin worked around. They only ever appear as values, after ``:``,
# ``,`` or ``[``.
_BAD_TOKEN = re.compile(rb"([:\[,]\s*)(-?Infinity|-?inf|-?nan|NaN|N/A)(?=\s*[,\]}])")
# Raw control characters are illegal anywhere in JSON text except as whitespace
# (tab, LF, CR). Kineto wrote them into names before May 2025.
_CTRL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
# A boundary between two events of an array: ``}`` `,` ``{``.
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


@dataclass
class ParsedJSON:
    """The decoded document and the repairs that were needed to decode it."""

    doc: Any
    warnings: list[str] = field(default_factory=list)
    nbytes: int = 0


BOM = b"\xef\xbb\xbf"


def read_bytes(path: Path, budget: Budget | None = None) -> tuple[bytes, list[str]]:
    """Read a file, transparently gunzipping it (by magic bytes, not extension).

    Only regular files are read, within the input budget (see
    :mod:`traceanalyzer.load.budget`). Every gzip member is read (``cat a.gz b.gz`` is
    valid gzip); a truncated gzip stream yields what could be decompressed plus a
    warning. A UTF-8 byte-order mark is dropped.
    """
    stream = ByteStream(path, budget)
    # A plain file in one read (``join`` of one block returns it: no copy).
    size = 8 << 20 if stream.gzipped else stream.file_size + 1
    data = b"".join(stream.blocks(size))
    return data, stream.warnings


class ByteStream:
    """A file's bytes in blocks, gunzipped on the fly (by magic bytes, not extension).

    Never holds more than one compressed read and one decompressed block. After
    :meth:`blocks` is exhausted, ``nbytes`` is the total decompressed size and
    ``warnings`` says whether the gzip stream was truncated or had trailing garbage.
    Reads every member of a multi-member gzip, drops a leading UTF-8 byte-order mark,
    refuses anything but a regular file and enforces the input budget (size and
    decompression ratio) as the bytes come, before memory grows.
    """

    def __init__(self, path: Path, budget: Budget | None = None) -> None:
        self.path = path
        self.budget = budget or Budget.from_env()
        self.nbytes = 0
        self.consumed = 0  # compressed bytes fed to zlib so far
        self._room = 1 << 62  # output _gunzip may give next (set by _raw_blocks)
        self.warnings: list[str] = []
        f, st = open_regular(path)
        try:
            with f:
                head = f.read(2)
        except OSError as exc:
            raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
        if not head:
            raise InputError(path, "empty file")
        self.gzipped = head == GZIP_MAGIC
        self.file_size = st.st_size
        if not self.gzipped:
            self.budget.check_size(path, self.file_size)

    def blocks(self, size: int = 32 << 20) -> Iterator[bytes]:
        """Yield decompressed blocks of about ``size`` bytes (the last may be shorter)."""
        first = True
        for block in self._raw_blocks(size):
            if first:
                first = False
                if block.startswith(BOM):
                    block = block[len(BOM):]
                    self.nbytes -= len(BOM)
                    if not block:
                        continue
            yield block

    def _raw_blocks(self, size: int) -> Iterator[bytes]:
        path = self.path
        f, _ = open_regular(path)
        with f:
            if not self.gzipped:
                while True:
                    try:
                        block = f.read(size)
                    except OSError as exc:
                        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
                    if not block:
                        return
                    self.nbytes += len(block)
                    if self.nbytes > self.file_size:  # the file grew while read
                        self.budget.check_size(path, self.nbytes)
                    yield block
            pending: list[bytes] = []
            npending = 0
            self._room = size
            for out in self._gunzip(f, size):
                pending.append(out)
                npending += len(out)
                if npending >= size:
                    block = b"".join(pending)
                    pending, npending = [], 0
                    self._room = size
                    yield block
                else:
                    # The next piece only completes this block: a block stays at ``size``
                    # (the loader's chunk), never up to twice that, and is joined once.
                    self._room = size - npending
            if pending:
                yield b"".join(pending)
            if not self.nbytes:
                raise InputError(path, "gzip file decompresses to nothing")

    def _read(self, f: BinaryIO, n: int) -> bytes:
        try:
            raw = f.read(n)
        except OSError as exc:
            raise InputError(self.path, f"cannot read file: {exc.strerror or exc}") from None
        self.consumed += len(raw)
        return raw

    def _gunzip(self, f: BinaryIO, size: int) -> Iterator[bytes]:
        """Decompressed pieces of at most ``size`` bytes, member after member.

        ``nbytes`` counts the output; the budget is checked after every piece against
        the compressed bytes zlib has actually used (what it holds back is not counted),
        so a bomb is stopped within one piece of the limit.
        """
        path = self.path
        step = max(1 << 16, size // 32)
        dec = zlib.decompressobj(wbits=31)
        queued = b""  # compressed input read but not yet given to ``dec``
        while True:
            if dec.unconsumed_tail:
                raw = dec.unconsumed_tail
            elif queued:
                raw, queued = queued, b""
            else:
                raw = self._read(f, step)
            if not raw:
                # The input ended before the stream did (a truncated .gz): zlib may
                # still hold output it had no room for under ``size``.
                try:
                    out = dec.flush()
                except zlib.error as exc:
                    raise InputError(path, f"corrupt gzip data: {exc}") from None
                if out:
                    self.nbytes += len(out)
                    yield out
                self.warnings.append(
                    f"gzip stream is truncated: decompressed {self.nbytes:,} bytes before the data ended"
                )
                return
            try:
                # Never more than what completes the caller's block (``_room``, at most ``size``).
                out = dec.decompress(raw, min(size, self._room))
            except zlib.error as exc:
                raise InputError(path, f"corrupt gzip data: {exc}") from None
            if out:
                self.nbytes += len(out)
                self.budget.check_gzip(path, self.nbytes, self.consumed - len(dec.unconsumed_tail) - len(queued))
                yield out
            if not dec.eof:
                continue
            # End of a member: another member (``cat a.gz b.gz``), zero padding, or junk.
            rest = dec.unused_data
            while len(rest) < 2:
                more = self._read(f, step)
                if not more:
                    break
                rest += more
            if not rest:
                return
            if rest[:2] == GZIP_MAGIC:
                dec = zlib.decompressobj(wbits=31)
                queued = rest
                continue
            junk = len(rest.rstrip(b"\0")) > 0
            extra = len(rest)
            while True:
                more = self._read(f, 1 << 20)
                if not more:
                    break
                extra += len(more)
                junk = junk or len(more.rstrip(b"\0")) > 0
            if junk:
                self.warnings.append(f"ignored {extra:,} bytes after the end of the gzip data (not gzip)")
            return


def parse_json(path: Path, data: bytes, events: bool = False) -> ParsedJSON:
    """Decode ``data``; on failure, repair invalid tokens and truncation, or raise.

    Repairs, in order: bare NaN/inf/N/A → null; raw control characters → space;
    strings with raw tabs/newlines (Python's non-strict decoder); an unterminated or
    damaged document (a killed job) is cut after the last complete event of the
    ``traceEvents`` array, or after the last complete key of the keys that follow
    the array, and closed (see :func:`recover_truncated`).

    ``events`` (a chrome trace): damage inside the events array that is not where the
    file ends (see :func:`damage_inside_events`) is refused with its position instead:
    cutting there would drop every event after it.
    """
    try:
        return ParsedJSON(orjson.loads(data), [], len(data))
    except orjson.JSONDecodeError as first_error:
        error = first_error
    repaired = decode_repairing(data, error)
    if isinstance(repaired, Repaired):
        return ParsedJSON(repaired.doc, repaired.warnings(), len(data))
    if events and damage_inside_events(repaired.fixed, repaired.first_error_at()):
        raise InputError(path, f"not valid JSON ({_describe(repaired.error, data)})")
    recovered = recover_truncated(repaired.fixed)
    if recovered is not None:
        doc, cut, not_strict = recovered
        warnings = repair_warnings(repaired.n_tokens, repaired.n_ctrl, not_strict)
        warnings.append(truncation_warning(cut, len(data)))
        return ParsedJSON(doc, warnings, len(data))
    raise InputError(path, f"not valid JSON ({_describe(repaired.error, data)})")


@dataclass
class Repaired:
    """A document decoded after repairs, with what each repair changed."""

    doc: Any
    n_tokens: int = 0
    n_ctrl: int = 0
    not_strict: bool = False

    def warnings(self) -> list[str]:
        return repair_warnings(self.n_tokens, self.n_ctrl, self.not_strict)


@dataclass
class Unrepaired:
    """Text no repair made decodable: the repaired bytes, the last error, the counts, and
    the error of Python's non-strict decoder (None when it failed otherwise)."""

    fixed: bytes
    error: orjson.JSONDecodeError
    n_tokens: int = 0
    n_ctrl: int = 0
    lenient: json.JSONDecodeError | None = None

    def first_error_at(self) -> tuple[int, bool]:
        """(byte offset of the first damage, whether it is a string running to the end):
        the non-strict decoder's, which passes raw tabs/newlines in strings, else orjson's."""
        if self.lenient is not None:
            pos = self.lenient.pos  # json's position counts characters: back to bytes
            if not self.fixed.isascii():
                pos = len(self.fixed.decode("utf-8", "replace")[:pos].encode("utf-8"))
            return pos, self.lenient.msg.startswith("Unterminated string")
        return int(getattr(self.error, "pos", 0) or 0), False


# A parse error this close to the end of the text is where the file was cut off (a cut
# inside ``true``, a number, an escape fails a few bytes before the end).
_CUT_SLACK = 16
# The text after the damage that :func:`damage_inside_events` scans for the array's end.
_SCAN_AFTER_DAMAGE = 1 << 20


def damage_inside_events(text: bytes, at: tuple[int, bool]) -> bool:
    """Whether the first damage of a chrome trace's ``text`` (``at``: from
    :meth:`Unrepaired.first_error_at`) lies inside its events array *and* is not where the
    file ends: more events or the array's end follow it (a corrupted event, an
    unterminated string, garbage or a cut-off object between events …).

    Such a file is refused: recovering it as truncated would drop every event after the
    damage. A file cut off (the damage runs to its end: a killed job) or damaged in the
    keys after the array is not: the events before the damage are kept, with a warning.
    Both decoders apply this rule (the chunked path hands such files to the simple path).
    """
    pos, unterminated = at
    end = len(text.rstrip(_WS))
    if unterminated or pos >= end - _CUT_SLACK:
        return False  # cut off: the damage runs to the end of the file
    if _EVENT_BOUNDARY.search(text, pos):
        return True  # complete events follow the damage
    # Only the damaged item and what follows it are left: does the events array close
    # after the damage (a complete file whose last event is damaged: refused), or before it
    # (damage in the keys after the array: kept), or not at all (a cut-off file)? A
    # string-aware scan from the start of the item before the damage.
    lo = max(0, pos - _SCAN_AFTER_DAMAGE)
    ends = [m.end() for m in _EVENT_BOUNDARY.finditer(text, lo, pos + 1)]
    if ends:
        start = ends[-1] - 1
    else:
        k = text.find(b'"traceEvents"', 0, pos)
        start = text.find(b"[", k if k >= 0 else 0, pos) + 1
        if start <= 0:
            return False
    depth, in_str, esc = 0, False, False
    for i, c in enumerate(text[start:pos + _SCAN_AFTER_DAMAGE], start):
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
            if depth < 0:
                # the events array closes here: after the damage, a damaged item; before
                # it, damage in the keys that follow the array
                return c != 0x5D or i >= pos
    # Quotes that do not pair up in a file that does not end inside a string: damage.
    return in_str


def repair_warnings(n_tokens: int, n_ctrl: int, not_strict: bool) -> list[str]:
    """The warnings for the repairs of :func:`decode_repairing` (summed over chunks)."""
    out: list[str] = []
    if n_tokens:
        out.append(f"replaced {n_tokens:,} invalid JSON tokens (NaN/inf/N/A) with null")
    if n_ctrl:
        out.append(f"replaced {n_ctrl:,} raw control characters with spaces")
    if not_strict:
        out.append("file is not strict JSON (raw whitespace control characters in strings)")
    return out


def truncation_warning(cut: int, total: int) -> str:
    return (
        f"file is truncated or corrupt near byte {cut:,} of {total:,} "
        "(a killed job?): kept the events before that point, the rest is lost"
    )


def fix_tokens(data: bytes) -> tuple[bytes, int, int]:
    """``data`` with bare NaN/inf/N/A → null and raw control characters → space, and
    the two counts."""
    fixed, n_tokens = _BAD_TOKEN.subn(rb"\1null", data)
    fixed, n_ctrl = _CTRL.subn(b" ", fixed)
    return fixed, n_tokens, n_ctrl


def decode_repairing(data: bytes, error: orjson.JSONDecodeError | None = None) -> Repaired | Unrepaired:
    """Decode ``data`` (which strict decoding rejected with ``error``, if known) after
    replacing bare NaN/inf/N/A tokens and raw control characters, then with Python's
    non-strict decoder. Returns :class:`Repaired`, or, when no repair works,
    :class:`Unrepaired` (for truncation recovery)."""
    if error is None:
        try:
            return Repaired(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            error = exc
    fixed, n_tokens, n_ctrl = fix_tokens(data)
    if n_tokens or n_ctrl:
        try:
            return Repaired(orjson.loads(fixed), n_tokens, n_ctrl)
        except orjson.JSONDecodeError as exc:
            error = exc
    # Python's decoder accepts tabs/newlines inside strings (strict=False), which
    # orjson refuses; try it before assuming truncation.
    lenient: json.JSONDecodeError | None = None
    try:
        doc = json.loads(fixed, strict=False)
    except json.JSONDecodeError as exc:
        lenient = exc
    except (UnicodeDecodeError, RecursionError):
        pass
    else:
        # It may be strict JSON that orjson refuses for another reason (a number beyond
        # the double range, ``1e400``, which Python reads as inf): no "not strict" warning
        # then; the loader skips the event with its own warning.
        try:
            json.loads(fixed)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return Repaired(doc, n_tokens, n_ctrl, True)
        return Repaired(doc, n_tokens, n_ctrl, False)
    return Unrepaired(fixed, error, n_tokens, n_ctrl, lenient)


def describe_error(error: orjson.JSONDecodeError, offset: int, total: int) -> str:
    """``_describe`` for an error in a piece of a file that starts at byte ``offset``."""
    pos = getattr(error, "pos", None)
    msg = str(error).split(":")[0]
    if pos is not None:
        return f"{msg} at byte {offset + pos:,} of {total:,}"
    return msg


def _describe(error: orjson.JSONDecodeError, data: bytes) -> str:
    pos = getattr(error, "pos", None)
    msg = str(error).split(":")[0]
    if pos is not None:
        return f"{msg} at byte {pos:,} of {len(data):,}"
    return msg


_WS = b" \t\r\n"


def _loads(text: bytes, strict: bool) -> Any:
    """orjson, or (``strict=False``) Python's decoder that accepts raw tabs/newlines in
    strings. Raises ValueError on failure."""
    if strict:
        return orjson.loads(text)
    try:
        return json.loads(text, strict=False)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def recover_members(tail: bytes, max_tries: int = 256) -> tuple[dict[str, Any], int, bool, bool]:
    """The members of a JSON object that follow one of its members, from ``tail``.

    ``tail`` is the text after a member's value (``, "k": v, … }``). Returns
    ``(members, end, complete, not_strict)``: the members that decode, where the
    last of them ends in ``tail``, whether ``tail`` was a complete, well-formed end of
    the object (only whitespace after its ``}``), and whether Python's non-strict
    decoder was needed. A damaged tail (cut off, garbage after ``}``) keeps the
    members before the damage: a member counts only when a ``,`` or ``}`` after it
    proves it complete, so a cut-off number is never kept short.
    """
    rest = tail.lstrip(_WS)
    lead = len(tail) - len(rest)
    if rest[:1] == b"}":
        return {}, lead + 1, not rest[1:].strip(_WS), False
    if rest[:1] != b",":
        return {}, 0, False, False
    body = rest[1:]
    for strict in (True, False):
        try:
            doc = _loads(b"{" + body, strict)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc, len(tail), True, not strict
    cands = [i for i in range(len(body) - 1, -1, -1) if body[i] in b",}"][:max_tries]
    for strict in (True, False):
        for c in cands:
            closed = body[: c + 1] if body[c] == 0x7D else body[:c] + b"}"
            try:
                doc = _loads(b"{" + closed, strict)
            except ValueError:
                continue
            if not isinstance(doc, dict) or not doc:
                continue
            end = c + 1 if body[c] == 0x7D else len(body[:c].rstrip(_WS))
            return doc, lead + 1 + end, False, not strict
    return {}, 0, False, False


def recover_truncated(data: bytes, max_tries: int = 64) -> tuple[Any, int, bool] | None:
    """Cut ``data`` after the last complete event or trailing key, and close it.

    Candidate cuts, from the end backwards: after the ``]`` that closes the events
    array (the keys after it kept as far as they are complete, see
    :func:`recover_members`), and after an event's ``}`` (a ``}`` followed by
    ``, {``, or the last ``}``), closed with ``]}`` (object layout) or ``]`` (bare
    array). Returns the decoded document, the cut position and whether Python's
    non-strict decoder was needed (raw tabs/newlines in strings), or None.
    """
    head = data.lstrip()[:1]
    is_obj = head == b"{"
    closer = b"]}" if is_obj else b"]"
    if is_obj and b'"traceEvents"' not in data[: 1 << 20] and b'"traceEvents"' not in data:
        return None
    window = max(0, len(data) - (64 << 20))
    ends = [m.start() + 1 for m in _EVENT_BOUNDARY.finditer(data, window)]
    last_boundary = ends[-1] if ends else window
    tail_brace = data.rfind(b"}")
    if tail_brace > 0:
        ends.append(tail_brace + 1)
    cands: list[tuple[int, bool]] = [(e, False) for e in set(ends)]
    # ``]`` after the last event boundary may close the events array.
    k = data.rfind(b"]")
    while k >= last_boundary and len(cands) < 4 * max_tries:
        cands.append((k + 1, True))
        k = data.rfind(b"]", last_boundary, k)
    cands.sort(reverse=True)
    cands = cands[:max_tries]
    # orjson first on every candidate; Python's non-strict decoder (slow) on a few.
    for strict, tries in ((True, cands), (False, cands[:4])):
        for end, array_end in tries:
            try:
                if not array_end:
                    return _loads(data[:end] + closer, strict), end, not strict
                if not is_obj:
                    return _loads(data[:end], strict), end, not strict
                doc = _loads(data[:end] + b"}", strict)
            except ValueError:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
                continue
            members, kept, _, tail_not_strict = recover_members(data[end:])
            doc.update(members)
            return doc, end + kept, not strict or tail_not_strict
    return None
