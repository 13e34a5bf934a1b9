"""Reading raw JSON bytes tolerantly: gzip, truncation, invalid tokens.

This is the only place (with :mod:`traceanalyzer.load.chrome_trace`) that sees raw
JSON. Every repair is reported back as a human-readable warning with a count; a file
that cannot be repaired raises :class:`~traceanalyzer.errors.InputError`.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from traceanalyzer.errors import InputError

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


def read_bytes(path: Path) -> tuple[bytes, list[str]]:
    """Read a file, transparently gunzipping it (by magic bytes, not extension).

    A truncated gzip stream yields what could be decompressed plus a warning.
    """
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a directory, not a trace file (use `traceanalyzer batch` for directories)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    if not raw:
        raise InputError(path, "empty file")
    if not raw.startswith(GZIP_MAGIC):
        return raw, []
    dec = zlib.decompressobj(wbits=31)
    try:
        data = dec.decompress(raw)
    except zlib.error as exc:
        raise InputError(path, f"corrupt gzip data: {exc}") from None
    warnings: list[str] = []
    if not dec.eof:
        warnings.append(
            f"gzip stream is truncated: decompressed {len(data):,} bytes before the data ended"
        )
    if not data:
        raise InputError(path, "gzip file decompresses to nothing")
    return data, warnings


class ByteStream:
    """A file's bytes in blocks, gunzipped on the fly (by magic bytes, not extension).

    Never holds more than one compressed read and one decompressed block. After
    :meth:`blocks` is exhausted, ``nbytes`` is the total decompressed size and
    ``warnings`` says whether the gzip stream was truncated (as :func:`read_bytes`).
    """

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise InputError(path, "no such file")
        if path.is_dir():
            raise InputError(path, "is a directory, not a trace file (use `traceanalyzer batch` for directories)")
        self.path = path
        self.nbytes = 0
        self.warnings: list[str] = []
        try:
            with path.open("rb") as f:
                head = f.read(2)
        except OSError as exc:
            raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
        if not head:
            raise InputError(path, "empty file")
        self.gzipped = head == GZIP_MAGIC
        self.file_size = path.stat().st_size

    def blocks(self, size: int = 32 << 20) -> Iterator[bytes]:
        """Yield decompressed blocks of about ``size`` bytes (the last may be shorter)."""
        path = self.path
        try:
            f = path.open("rb")
        except OSError as exc:
            raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
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
                    yield block
            dec = zlib.decompressobj(wbits=31)
            pending: list[bytes] = []
            npending = 0
            step = max(1 << 16, size // 32)
            while not dec.eof:
                raw = dec.unconsumed_tail or f.read(step)
                if not raw:
                    break
                try:
                    out = dec.decompress(raw, size)
                except zlib.error as exc:
                    raise InputError(path, f"corrupt gzip data: {exc}") from None
                if out:
                    pending.append(out)
                    npending += len(out)
                    if npending >= size:
                        block = b"".join(pending)
                        pending, npending = [], 0
                        self.nbytes += len(block)
                        yield block
            if pending:
                block = b"".join(pending)
                self.nbytes += len(block)
                yield block
            if not dec.eof:
                self.warnings.append(
                    f"gzip stream is truncated: decompressed {self.nbytes:,} bytes before the data ended"
                )
            if not self.nbytes:
                raise InputError(path, "gzip file decompresses to nothing")


def parse_json(path: Path, data: bytes) -> ParsedJSON:
    """Decode ``data``; on failure, repair invalid tokens and truncation, or raise.

    Repairs, in order: bare NaN/inf/N/A → null; raw control characters → space;
    an unterminated document (a killed job) is cut at the last complete event of the
    ``traceEvents`` array and closed.
    """
    try:
        return ParsedJSON(orjson.loads(data), [], len(data))
    except orjson.JSONDecodeError as first_error:
        error = first_error
    repaired = decode_repairing(data, error)
    if isinstance(repaired, Repaired):
        return ParsedJSON(repaired.doc, repaired.warnings(), len(data))
    fixed, error, warnings = repaired
    recovered = _recover_truncated(fixed)
    if recovered is not None:
        doc, cut = recovered
        warnings.append(truncation_warning(cut, len(data)))
        return ParsedJSON(doc, warnings, len(data))
    raise InputError(path, f"not valid JSON ({_describe(error, data)})")


@dataclass
class Repaired:
    """A document decoded after repairs, with what each repair changed."""

    doc: Any
    n_tokens: int = 0
    n_ctrl: int = 0
    not_strict: bool = False

    def warnings(self) -> list[str]:
        return repair_warnings(self.n_tokens, self.n_ctrl, self.not_strict)


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


def decode_repairing(
    data: bytes, error: orjson.JSONDecodeError | None = None
) -> Repaired | tuple[bytes, orjson.JSONDecodeError, list[str]]:
    """Decode ``data`` (which strict decoding rejected with ``error``, if known) after
    replacing bare NaN/inf/N/A tokens and raw control characters, then with Python's
    non-strict decoder. Returns :class:`Repaired`, or, when no repair works, the
    repaired bytes, the last decoding error and the warnings so far (for truncation
    recovery)."""
    if error is None:
        try:
            return Repaired(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            error = exc
    fixed, n_tokens = _BAD_TOKEN.subn(rb"\1null", data)
    fixed, n_ctrl = _CTRL.subn(b" ", fixed)
    if n_tokens or n_ctrl:
        try:
            return Repaired(orjson.loads(fixed), n_tokens, n_ctrl)
        except orjson.JSONDecodeError as exc:
            error = exc
    # Python's decoder accepts tabs/newlines inside strings (strict=False), which
    # orjson refuses; try it before assuming truncation.
    try:
        return Repaired(json.loads(fixed, strict=False), n_tokens, n_ctrl, True)
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return fixed, error, repair_warnings(n_tokens, n_ctrl, False)


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


def _recover_truncated(data: bytes, max_tries: int = 64) -> tuple[Any, int] | None:
    """Cut ``data`` after the last complete event and close the containers.

    Tries event boundaries from the end backwards: the prefix up to a ``}`` that is
    followed by ``, {`` is closed with ``]}`` (object layout) or ``]`` (bare array).
    Returns the decoded document and the cut position, or None.
    """
    head = data.lstrip()[:1]
    closer = b"]" if head == b"[" else b"]}"
    if head == b"{" and b'"traceEvents"' not in data[: 1 << 20] and b'"traceEvents"' not in data:
        return None
    ends = [m.start() + 1 for m in _EVENT_BOUNDARY.finditer(data, max(0, len(data) - (64 << 20)))]
    tail_brace = data.rfind(b"}")
    if tail_brace > 0:
        ends.append(tail_brace + 1)
    for end in sorted(set(ends), reverse=True)[:max_tries]:
        try:
            return orjson.loads(data[:end] + closer), end
        except orjson.JSONDecodeError:
            continue
    return None
