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
from typing import Any

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
    warnings: list[str] = []
    fixed, n_tokens = _BAD_TOKEN.subn(rb"\1null", data)
    if n_tokens:
        warnings.append(f"replaced {n_tokens:,} invalid JSON tokens (NaN/inf/N/A) with null")
    fixed, n_ctrl = _CTRL.subn(b" ", fixed)
    if n_ctrl:
        warnings.append(f"replaced {n_ctrl:,} raw control characters with spaces")
    if n_tokens or n_ctrl:
        try:
            return ParsedJSON(orjson.loads(fixed), warnings, len(data))
        except orjson.JSONDecodeError as exc:
            error = exc
    # Python's decoder accepts tabs/newlines inside strings (strict=False), which
    # orjson refuses; try it before assuming truncation.
    try:
        doc = json.loads(fixed, strict=False)
        warnings.append("file is not strict JSON (raw whitespace control characters in strings)")
        return ParsedJSON(doc, warnings, len(data))
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    recovered = _recover_truncated(fixed)
    if recovered is not None:
        doc, cut = recovered
        warnings.append(
            f"file is truncated or corrupt near byte {cut:,} of {len(data):,} "
            "(a killed job?): kept the events before that point, the rest is lost"
        )
        return ParsedJSON(doc, warnings, len(data))
    raise InputError(path, f"not valid JSON ({_describe(error, data)})")


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
