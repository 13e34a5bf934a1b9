"""CUDA memory snapshot pickles → :class:`~traceanalyzer.model.memory.SnapshotModel`.

Accepts every layout PyTorch has written (``docs/memory.md``, shared
``SNAPSHOT_FORMAT.md``): the ``_dump_snapshot``/``_snapshot`` dict of 2.1 → today,
2.0 legacy dicts whose blocks carry ``history``, the bare segment list of
``torch.cuda.memory_snapshot()``, gzip-compressed pickles, protocols 0–5, integers up
to ``2**64-1``, several devices, any subset of optional keys. The pickle is read
with :mod:`traceanalyzer.load.safe_pickle`: no class is ever imported, no code runs.

Memory: an unpickled object tree holds several Python objects per trace entry, so files
over :data:`STREAM_MIN_BYTES` are read by :mod:`~traceanalyzer.load.pickle_stream`, which
hands the trace entries over in batches; :class:`_TraceSink` turns them into columns every
``_CHUNK`` entries and drops them, so the tables (a fraction of the object tree) are what
stays (docs/memory.md, "Large snapshots"). Smaller files take the faster C unpickler.
"""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.pickle_budget import BudgetExceeded, PickleBudget
from traceanalyzer.load.pickle_stream import StreamFallback, StreamTruncated, stream_load
from traceanalyzer.load.safe_pickle import (
    DEFAULT_SCAN_LIMIT,
    RestrictedUnpickler,
    UnsafePickleError,
    legacy_protocol,
    scan_opcodes,
)
from traceanalyzer.model.memory import (
    ACTIONS,
    SNAPSHOT_SCHEMAS,
    SnapshotMeta,
    SnapshotModel,
    empty_snapshot_table,
)

_U64 = (1 << 64) - 1
_SCALAR_TYPES = frozenset({int, float, str, bool, type(None)})
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


# ---------------------------------------------------------------------------------------
# Reading the pickle
# ---------------------------------------------------------------------------------------

class _BoundedGzip:
    """A gzip stream that refuses to unpack more than ``limit`` bytes (a gzip bomb
    expands 1000×: a megabyte becomes a gigabyte of opcodes)."""

    def __init__(self, g: Any, limit: int, budget: PickleBudget) -> None:
        self._g, self._limit, self._budget, self._n = g, limit, budget, 0
        self._cut: EOFError | None = None

    def read(self, n: int = -1) -> bytes:
        if self._cut is not None:
            raise self._cut
        want = n if n is not None and n >= 0 else self._limit + 1 - self._n
        parts: list[bytes] = []
        got = 0
        while got < want:
            # in pieces: on gzip data cut short, what was unpacked before the cut is returned
            # (and the EOFError raised by the next read), so a truncated file can be salvaged
            try:
                chunk = self._g.read1(min(want - got, 1 << 18))
            except EOFError as exc:
                if not parts:
                    raise
                self._cut = exc
                break
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._n += len(out)
        if self._n > self._limit:
            raise self._budget.exceeded(
                "max_gzip_ratio", f"gzip data unpacking to more than {self._limit:,} bytes "
                f"(over {self._budget.max_gzip_ratio}× the compressed size + 32 MB)")
        return out

    def readline(self) -> bytes:
        out: bytes = self._g.readline()
        self._n += len(out)
        return out

    def close(self) -> None:
        self._g.close()


def _unpacked_exceeds(f: BinaryIO, limit: int) -> bool:
    """Whether the gzip stream ``f`` unpacks to more than ``limit`` bytes (rewinds ``f``)."""
    n = 0
    g = gzip.GzipFile(fileobj=f, mode="rb")
    try:
        while n <= limit:
            chunk = g.read1(1 << 20)
            if not chunk:
                break
            n += len(chunk)
    except (OSError, EOFError, zlib.error):
        pass  # cut short or corrupt: the reader reports it
    f.seek(0)
    return n > limit


def _open(path: Path, budget: PickleBudget | None = None) -> tuple[BinaryIO, int]:
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a directory, not a memory snapshot")
    try:
        size = path.stat().st_size
        f: BinaryIO = path.open("rb")
    except OSError as exc:
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    if size == 0:
        f.close()
        raise InputError(path, "empty file")
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        b = budget or PickleBudget.from_env()
        limit = (32 << 20) + b.max_gzip_ratio * size
        # The declared size first (the gzip trailer: unpacked bytes mod 2**32). Past the
        # limit, a bare unpack (no pickle parsing, far cheaper) confirms it before
        # the reader spends long on the opcodes; a file cut short has a meaningless
        # trailer and ends before the limit. A forged trailer still meets the limit while reading.
        try:
            f.seek(-4, 2)
            declared = int.from_bytes(f.read(4), "little")
            f.seek(0)
        except OSError:
            declared = 0
        if declared > limit and _unpacked_exceeds(f, limit):
            f.close()
            raise InputError(path, str(b.exceeded(
                "max_gzip_ratio", f"gzip data unpacking to more than {limit:,} bytes "
                f"(over {b.max_gzip_ratio}× the compressed size + 32 MB)")))
        g = gzip.GzipFile(fileobj=f, mode="rb")
        return _BoundedGzip(g, limit, b), size  # type: ignore[return-value]
    f.seek(0)
    return f, size


def _pickle_head(path: Path, f: BinaryIO) -> tuple[bytes, int | None]:
    """The first bytes read and the protocol; refuses a file that does not start as a pickle.

    Protocol 2+ starts with PROTO (0x80, then the protocol); a protocol 0/1 pickle has no
    PROTO opcode and is told by its first opcodes (:func:`legacy_protocol`, on up to
    4 KiB: the bytes read are handed back to be read again)."""
    head = f.read(2)
    if head[:1] == b"\x80":
        return head, (head[1] if len(head) > 1 else None)
    head += f.read(4094)
    proto = legacy_protocol(head)
    if proto is None:
        raise InputError(path, "not a pickle (a memory snapshot starts with the pickle protocol byte 0x80, or "
                               "with a dict or list of protocol 0/1)")
    return head, proto


def pickle_protocol_of(path: Path) -> int | None:
    """The protocol byte of ``path`` (plain or gzip), ``None`` when unreadable."""
    try:
        f, _ = _open(path)
        try:
            head = f.read(2)
            if head[:1] != b"\x80":
                head += f.read(4094)
        finally:
            f.close()
    except Exception:  # noqa: BLE001 - only a detail of the model's metadata
        return None
    return head[1] if len(head) == 2 and head[0] == 0x80 else legacy_protocol(head)


def _input_error(path: Path, exc: BaseException) -> InputError:
    """One line for any failure while reading untrusted pickle bytes (both readers)."""
    if isinstance(exc, InputError):
        return exc
    if isinstance(exc, (UnsafePickleError, BudgetExceeded)):
        return InputError(path, str(exc))
    if isinstance(exc, RecursionError):
        return InputError(path, "corrupt or hostile pickle: nesting too deep")
    if isinstance(exc, MemoryError):
        return InputError(path, "pickle too large to load in the available memory")
    truncated = ("exhausted before seeing STOP", "not enough data", "remain")
    if isinstance(exc, ValueError) and any(m in str(exc) for m in truncated):
        return InputError(path, f"truncated file: {exc}")  # the opcode scan reached the end of the data
    if isinstance(exc, (OSError, EOFError, zlib.error)):
        return InputError(path, f"truncated or corrupt file: {exc or type(exc).__name__}")
    return InputError(path, f"corrupt pickle: {type(exc).__name__}: {exc}")

class _TooLargeToBuild(Exception):
    """A gzip file unpacks past the opcode scan's limit: read it with the streaming reader."""


def read_snapshot_object(path: str | Path, scan_limit: int = DEFAULT_SCAN_LIMIT,
                         budget: PickleBudget | None = None) -> tuple[Any, int | None, int]:
    """Safely unpickle ``path`` (plain or gzip); returns (object, protocol, file bytes).

    Only inputs up to ``scan_limit`` bytes (file and unpacked) are read here: they are
    opcode-scanned first, so a hostile file is refused with the exact opcode and the
    input budget is checked before anything is built, then unpickled with the
    class-refusing unpickler. A larger input raises :class:`_TooLargeToBuild` (the
    streaming reader, with the same budget, takes it): the C unpickler never runs on
    bytes the scan has not passed.
    """
    p = Path(path)
    budget = budget or PickleBudget.from_env()
    f, size = _open(p, budget)
    try:
        head, protocol = _pickle_head(p, f)
        if size > scan_limit:
            raise _TooLargeToBuild
        # bounded: a small gzip can unpack to gigabytes; past the scan limit it streams
        data = head + f.read(scan_limit + 1)
        if len(data) > scan_limit + len(head):
            raise _TooLargeToBuild
        scan_opcodes(data, budget)
        obj = RestrictedUnpickler(_BytesReader(data)).load()
    except _TooLargeToBuild:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        raise _input_error(p, exc) from None
    finally:
        f.close()
    return obj, protocol, size


# Files larger than this are read by the streaming machine (bounded memory, more CPU
# time than the C unpickler); smaller ones by the C unpickler after the opcode scan
# (its memory is several times the file, so this size bounds it). The scan's limit: every
# file is either scanned or streamed, both under the whole budget.
STREAM_MIN_BYTES = DEFAULT_SCAN_LIMIT


def _stream_snapshot_object(path: Path, sink: _TraceSink, budget: PickleBudget | None = None,
                            salvage: bool = False) -> tuple[Any, int | None, int]:
    """Like :func:`read_snapshot_object`, but trace entries go to ``sink`` as they are read.
    ``salvage``: a file cut short raises :class:`StreamTruncated` with what precedes the cut."""
    budget = budget or PickleBudget.from_env()
    f, size = _open(path, budget)
    try:
        head, protocol = _pickle_head(path, f)
        obj = stream_load(_Prefixed(head, f), sink.add, budget, salvage=salvage)  # type: ignore[arg-type]
    except (StreamFallback, StreamTruncated):
        raise
    except EOFError as exc:  # gzip data cut short: nothing of the last block survives
        if salvage:
            raise StreamTruncated(None, 0) from None
        raise _input_error(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        raise _input_error(path, exc) from None
    finally:
        f.close()
    return obj, protocol, size


class _BytesReader:
    """Minimal file-like over bytes (``io.BytesIO`` without the copy on ``read``)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = self._view[self._pos:end].tobytes()
        self._pos = end
        return out

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), len(self._view) - self._pos)
        buf[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def readline(self) -> bytes:
        # Found in place: protocol 0/1 pickles call this once per text opcode, so copying the
        # rest of the data each time would cost the file's size squared.
        i = self._data.find(b"\n", self._pos)
        end = len(self._data) if i < 0 else i + 1
        line = self._view[self._pos:end].tobytes()
        self._pos = end
        return line


class _Prefixed:
    """A stream whose first bytes were already consumed (the sniffed header)."""

    def __init__(self, head: bytes, f: BinaryIO) -> None:
        self._head = head
        self._f = f

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                out, self._head = self._head + self._f.read(), b""
                return out
            out, self._head = self._head[:n], self._head[n:]
            if len(out) < n:
                out += self._f.read(n - len(out))
            return out
        return self._f.read(n)

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            return out + self._f.readline()
        return self._f.readline()


# ---------------------------------------------------------------------------------------
# Columns
# ---------------------------------------------------------------------------------------

class _Fix:
    """Counts of values the loader had to repair, reported as warnings."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()


def _series(path: Path, fix: _Fix, name: str, values: list[Any], dtype: Any) -> pl.Series:
    """Build a typed column; repair what can be repaired, refuse what cannot.

    Unsigned columns (addresses, streams) wrap negative ints modulo 2**64 (some
    back-ends write them signed); signed columns map out-of-range ints (a frame line of
    2**64−1 means "no line") to null.
    """
    # Only scalars take the fast path: polars converts a nested list element by element
    # before failing, which on a memo-shared nested list takes minutes.
    if set(map(type, values)) <= _SCALAR_TYPES:
        try:
            return pl.Series(name, values, dtype=dtype)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            pass
    out: list[Any] = []
    bad = 0
    text = dtype == pl.String or dtype == pl.Categorical
    for v in values:
        if v is None:
            out.append(None)
        elif text:
            # Scalars read as text (as ever); a container is damage, never str()-ed: a memo-shared
            # nested list prints exponentially (a tiny pickle would become gigabytes of text).
            if isinstance(v, (str, int, float)):
                out.append(str(v))
            else:
                bad += 1
                out.append(None)
        elif isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                out.append(int(v))
            else:
                bad += 1
                out.append(None)
        elif dtype == pl.UInt64:
            out.append(v & _U64)
        elif _I64_MIN <= v <= _I64_MAX:
            out.append(v)
        else:
            fix.counts[f"{name} out of the 64-bit range (set to null)"] += 1
            out.append(None)
    if bad and text:
        fix.counts[f"{name} not a string (treated as missing)"] += bad
    elif bad:
        if bad > max(10, len(values) // 100):
            raise InputError(path, f"malformed snapshot: {bad:,} values of {name!r} are not integers")
        fix.counts[f"{name} not an integer (set to null)"] += bad
    return pl.Series(name, out, dtype=dtype)


class _Stacks:
    """Interns frame lists into stack ids.

    Real snapshots share frame-list objects between entries (pickle memo), so the
    fast path is a lookup by object identity; distinct but equal lists are merged by
    content. The interned lists are pinned so their ids stay valid while the object
    tree is released piece by piece.
    """

    def __init__(self) -> None:
        self.by_id: dict[int, int | None] = {}
        self.by_content: dict[tuple[Any, ...], int] = {}
        self._pinned: list[Any] = []
        self.stack_id: list[int] = []
        self.depth: list[int] = []
        self.name: list[Any] = []
        self.filename: list[Any] = []
        self.line: list[Any] = []
        # frames whose name/filename is not a string or whose line is not an integer
        self.bad: Counter[str] = Counter()

    def intern(self, frames: Any) -> int | None:
        key = id(frames)
        sid = self.by_id.get(key, -1)
        if sid != -1:
            return sid
        self._pinned.append(frames)
        sid = self._intern_content(frames)
        self.by_id[key] = sid
        return sid

    def _intern_content(self, frames: Any) -> int | None:
        if not frames or not isinstance(frames, (list, tuple)):
            return None
        rows = []
        for fr in frames:
            if isinstance(fr, dict):
                rows.append((self._text(fr.get("name"), "name"), self._text(fr.get("filename"), "filename"),
                             self._line(fr.get("line"))))
            elif isinstance(fr, str):  # forward_frames-like pre-formatted strings
                rows.append((fr, None, None))
        content = tuple(rows)
        if not content:
            return None
        sid = self.by_content.get(content)
        if sid is None:
            sid = len(self.by_content)
            self.by_content[content] = sid
            for depth, (n, fn, ln) in enumerate(content):
                self.stack_id.append(sid)
                self.depth.append(depth)
                self.name.append(n)
                self.filename.append(fn)
                self.line.append(ln)
        return sid

    def _text(self, v: Any, what: str) -> str | None:
        """A frame's name/filename: strings as they are, numbers as text (as ever); anything
        else (a list, a dict) is damage, treated as missing and counted."""
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return str(v)
        self.bad[f"frames with a non-string {what} (treated as missing)"] += 1
        return None

    def _line(self, v: Any) -> Any:
        """A frame's line: an int (range-checked later), else missing and counted."""
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        self.bad["frames with a non-integer line (treated as missing)"] += 1
        return None

    def table(self, path: Path, fix: _Fix) -> pl.DataFrame:
        if not self.stack_id:
            return empty_snapshot_table("frames")
        return pl.DataFrame([
            pl.Series("stack_id", self.stack_id, dtype=pl.Int64),
            pl.Series("depth", self.depth, dtype=pl.Int64),
            pl.Series("name", self.name, dtype=pl.String),
            pl.Series("filename", self.filename, dtype=pl.String),
            _series(path, fix, "line", self.line, pl.Int64),
        ])


def _pool_text(v: Any, fix: _Fix) -> str:
    """A pool id as text ("0,0" = the default pool). A flat tuple/list of a few scalars is
    joined as ever; anything else (a nested list, a dict) is damage: treated as missing
    (the default pool) and counted, never str()-ed (a memo-shared nested list prints
    exponentially)."""
    if v is None:
        return "0,0"
    if isinstance(v, (tuple, list)):
        if len(v) <= 8 and all(isinstance(x, (int, str)) for x in v):
            return ",".join(str(x) for x in v)
    elif isinstance(v, (int, str)):
        return str(v)
    fix.counts["segment_pool_id not a flat pair of integers (treated as missing: default pool)"] += 1
    return "0,0"


def _typed_int(d: dict[str, Any], key: str, what: str, fix: _Fix) -> int | None:
    """``d[key]`` as an int; a value of the wrong type is treated as missing and counted
    (a float holding an integer is taken as that integer)."""
    v = d.get(key)
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    fix.counts[f"{what} not an integer (treated as missing)"] += 1
    return None


def _typed_text(d: dict[str, Any], key: str, what: str, fix: _Fix) -> str | None:
    v = d.get(key)
    if v is None or isinstance(v, str):
        return v
    fix.counts[f"{what} not a string (treated as missing)"] += 1
    return None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------------------------
# Segments and blocks
# ---------------------------------------------------------------------------------------

def _block_frames(b: dict[str, Any]) -> Any:
    frames = b.get("frames")
    if frames:
        return frames
    hist = b.get("history")
    # 2.0 legacy: the last history entry is the block's current allocation; its stack
    # only describes the block while the block is in use.
    if hist and isinstance(hist, list) and b.get("state") != "inactive":
        last = hist[-1] if isinstance(hist[-1], dict) else {}
        return last.get("frames") or last.get("cpp_frames")
    return None


def _segments_and_blocks(path: Path, segs: list[Any], stacks: _Stacks, fix: _Fix
                         ) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    s_cols: dict[str, list[Any]] = {k: [] for k in SNAPSHOT_SCHEMAS["segments"]}
    b_cols: dict[str, list[Any]] = {k: [] for k in SNAPSHOT_SCHEMAS["blocks"]}
    warnings: list[str] = []
    n_sum_mismatch = 0
    n_not_dict = 0
    # A real snapshot never holds the same segment dict, blocks list or block dict twice
    # (every one is a fresh object); a pickle can, through its memo, so that a few bytes
    # name a million-block list ten thousand times. A repeat is skipped and counted:
    # the tables stay linear in the file.
    seen: set[int] = set()
    n_repeat_seg = n_repeat_blocks = 0
    for i, s in enumerate(segs):
        if not isinstance(s, dict):
            n_not_dict += 1
            continue
        if id(s) in seen:
            n_repeat_seg += 1
            continue
        seen.add(id(s))
        addr = _typed_int(s, "address", "segment address", fix)
        dev = _typed_int(s, "device", "segment device", fix)
        total = _typed_int(s, "total_size", "segment total_size", fix)
        blocks = s.get("blocks") or []
        if not isinstance(blocks, list):
            fix.counts["segment blocks not a list (treated as missing)"] += 1
            blocks = []
        elif blocks:
            if id(blocks) in seen:
                n_repeat_blocks += len(blocks)
                blocks = []
            else:
                seen.add(id(blocks))
        pool = _pool_text(s.get("segment_pool_id"), fix)
        s_cols["segment_idx"].append(i)
        s_cols["device"].append(dev if dev is not None else 0)
        s_cols["address"].append(addr)
        s_cols["total_bytes"].append(total)
        s_cols["allocated_bytes"].append(_typed_int(s, "allocated_size", "segment allocated_size", fix))
        s_cols["active_bytes"].append(_typed_int(s, "active_size", "segment active_size", fix))
        s_cols["requested_bytes"].append(_typed_int(s, "requested_size", "segment requested_size", fix))
        s_cols["stream"].append(_typed_int(s, "stream", "segment stream", fix))
        s_cols["segment_type"].append(_typed_text(s, "segment_type", "segment_type", fix))
        s_cols["pool_id"].append(pool)
        s_cols["is_private_pool"].append(pool not in ("0,0", "0"))
        s_cols["is_expandable"].append(bool(s.get("is_expandable", False)))
        s_cols["stack_id"].append(stacks.intern(s.get("frames")))
        cursor = addr
        block_sum = 0
        for b in blocks:
            if not isinstance(b, dict):
                continue
            if id(b) in seen:
                n_repeat_blocks += 1
                continue
            seen.add(id(b))
            size = _typed_int(b, "size", "block size", fix) or 0
            baddr = _typed_int(b, "address", "block address", fix)
            if baddr is None:  # 2.0 legacy: blocks are contiguous from the segment base
                baddr = cursor
            b_cols["segment_idx"].append(i)
            b_cols["device"].append(dev if dev is not None else 0)
            b_cols["address"].append(baddr)
            b_cols["bytes"].append(size)
            b_cols["requested_bytes"].append(_typed_int(b, "requested_size", "block requested_size", fix))
            b_cols["state"].append(_typed_text(b, "state", "block state", fix))
            b_cols["stack_id"].append(stacks.intern(_block_frames(b)))
            cursor = None if baddr is None else baddr + size
            block_sum += size
        if total is not None and blocks and block_sum != total:
            n_sum_mismatch += 1
    if n_not_dict:
        warnings.append(f"{n_not_dict:,} segment entries are not dicts (skipped)")
    if n_repeat_seg or n_repeat_blocks:
        warnings.append(f"{n_repeat_seg:,} segments and {n_repeat_blocks:,} blocks repeat an object already read "
                        "(a pickle memo reference, never in a real snapshot): skipped")
    if n_sum_mismatch:
        warnings.append(f"{n_sum_mismatch:,} segments whose block sizes do not add up to total_size "
                        "(synthetic or hand-edited snapshot?)")
    seg_df = pl.DataFrame([_series(path, fix, k, v, SNAPSHOT_SCHEMAS["segments"][k]) for k, v in s_cols.items()])
    blk_df = pl.DataFrame([_series(path, fix, k, v, SNAPSHOT_SCHEMAS["blocks"][k]) for k, v in b_cols.items()])
    return seg_df, blk_df, warnings


# ---------------------------------------------------------------------------------------
# Trace entries
# ---------------------------------------------------------------------------------------

_CHUNK = 200_000


def _trace_device(path: Path, device: int, entries: list[Any], stacks: _Stacks, fix: _Fix) -> pl.DataFrame:
    """One device's entries → columns, consuming ``entries`` from the end in chunks so
    each chunk's dicts are released as soon as its columns exist (the object tree is
    the dominant memory cost). Non-dict entries are dropped."""
    if not all(isinstance(e, dict) for e in entries):
        entries[:] = [e for e in entries if isinstance(e, dict)]
    parts: list[pl.DataFrame] = []
    while entries:
        start = max(0, len(entries) - _CHUNK)
        chunk = entries[start:]
        del entries[start:]
        parts.append(_trace_chunk(path, device, start, chunk, stacks, fix))
        del chunk
    if not parts:
        return empty_snapshot_table("trace")
    return pl.concat(parts[::-1], rechunk=True)


def _trace_chunk(path: Path, device: int, offset: int, entries: list[dict[str, Any]], stacks: _Stacks,
                 fix: _Fix) -> pl.DataFrame:
    """One batch of a device's trace entries → rows of the ``trace`` table (``event_idx``
    from ``offset``), frames interned into ``stacks``.

    One comprehension per column (a C-level loop each) rather than one Python loop
    appending to ten lists: cheaper per entry."""
    n = len(entries)
    intern = stacks.intern
    by_id = stacks.by_id
    empty: list[Any] = []

    def sid(e: dict[str, Any]) -> int | None:
        fr = e.get("frames") or e.get("cpp_frames") or empty
        s = by_id.get(id(fr), -1)
        return intern(fr) if s == -1 else s

    cols = [
        pl.Series("device", [device] * n, dtype=pl.Int64) if n else pl.Series("device", [], dtype=pl.Int64),
        pl.Series("event_idx", range(offset, offset + n), dtype=pl.Int64),
        _series(path, fix, "action", [e.get("action") for e in entries], pl.Categorical),
        _series(path, fix, "addr", [e.get("addr") for e in entries], pl.UInt64),
        _series(path, fix, "bytes", [e.get("size") for e in entries], pl.Int64),
        _series(path, fix, "stream", [e.get("stream") for e in entries], pl.UInt64),
        _series(path, fix, "ts_ns", [e.get("time_us") for e in entries], pl.Int64) * 1000,
        _series(path, fix, "device_free_bytes", [e.get("device_free") for e in entries], pl.Int64),
        pl.Series("stack_id", [sid(e) for e in entries], dtype=pl.Int64),
        _series(path, fix, "compile_context", [e.get("compile_context") for e in entries], pl.Categorical),
        _series(path, fix, "user_metadata", [e.get("user_metadata") for e in entries], pl.Categorical),
    ]
    return pl.DataFrame(cols)


class _TraceSink:
    """Receives batches of trace entries from the streaming reader and turns them into
    columns every ``_CHUNK`` entries, so at most one chunk of entry dicts is alive.

    Keyed by the identity of the list the entries were appended to (the device's
    list in ``device_traces``, which the reader leaves empty). The device number is
    only known once the whole file is read, so chunks carry device 0 until
    :meth:`finish` sets it. Same rules as :func:`_trace_device`: non-dict items are
    dropped and ``event_idx`` counts the dicts.
    """

    def __init__(self, path: Path, stacks: _Stacks, fix: _Fix) -> None:
        self.path, self.stacks, self.fix = path, stacks, fix
        self._lists: dict[int, list[Any]] = {}       # id → the list (kept alive: ids stay valid)
        self._pending: dict[int, list[Any]] = {}
        self._parts: dict[int, list[pl.DataFrame]] = {}
        self._offset: dict[int, int] = {}
        self.samples: dict[int, list[Any]] = {}       # first 20 items (release hint)

    def add(self, target: list[Any], items: list[Any]) -> None:
        key = id(target)
        pending = self._pending.get(key)
        if pending is None:
            self._lists[key] = target
            pending = self._pending[key] = []
            self._parts[key] = []
            self._offset[key] = 0
            self.samples[key] = []
        sample = self.samples[key]
        if len(sample) < 20:
            sample.extend(items[:20 - len(sample)])
        pending.extend(items)
        if len(pending) >= _CHUNK:
            self._flush(key)

    def _flush(self, key: int) -> None:
        entries = self._pending[key]
        self._pending[key] = []
        if not all(type(e) is dict for e in entries):
            entries = [e for e in entries if isinstance(e, dict)]
        if entries:
            off = self._offset[key]
            self._parts[key].append(_trace_chunk(self.path, 0, off, entries, self.stacks, self.fix))
            self._offset[key] = off + len(entries)

    def owns(self, lst: Any) -> bool:
        return id(lst) in self._lists and self._lists[id(lst)] is lst

    def finish(self, lst: list[Any], device: int) -> pl.DataFrame | None:
        """The device's table (None when every item was dropped); forgets the list."""
        key = id(lst)
        if lst:  # items appended outside the absorbed batches: order cannot be kept
            raise StreamFallback("a trace list mixes absorbed and plain items")
        self._flush(key)
        parts = self._parts.pop(key)
        del self._lists[key], self._pending[key], self._offset[key]
        if not parts:
            return None
        # No rechunk: a contiguous copy would double the table at its largest moment.
        df = pl.concat(parts, rechunk=False) if len(parts) > 1 else parts[0]
        return df.with_columns(device=pl.lit(device, dtype=pl.Int64))

    def leftover(self) -> bool:
        return bool(self._lists)


def _canonical_stack_ids(seg_df: pl.DataFrame, blk_df: pl.DataFrame, trace: pl.DataFrame,
                         frames: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Renumber stacks by first use: each segment then its blocks, then the trace by
    device and ``event_idx``. The numbering then does not depend on the order in
    which the reader met the stacks (the streaming reader sees traces before it
    converts segments); for inputs with under ``_CHUNK`` entries per device it is the
    order :class:`_Stacks` already gives, so nothing changes there."""
    if frames.is_empty():
        return seg_df, blk_df, trace, frames
    seg_order = pl.concat([
        seg_df.select(pl.col("segment_idx").alias("s"), pl.lit(-1, dtype=pl.Int64).alias("b"), "stack_id"),
        blk_df.with_row_index("b").select(pl.col("segment_idx").alias("s"), pl.col("b").cast(pl.Int64), "stack_id"),
    ]).sort(["s", "b"], maintain_order=True).get_column("stack_id")
    # The trace is built device by device in event order: no sort needed.
    tr_order = trace.get_column("stack_id")
    order = pl.concat([seg_order, tr_order]).drop_nulls().unique(maintain_order=True)
    if (order == pl.Series(range(order.len()), dtype=pl.Int64)).all():
        return seg_df, blk_df, trace, frames
    mapping = {o: i for i, o in enumerate(order.to_list())}

    def remap(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.col("stack_id").replace_strict(mapping, default=None, return_dtype=pl.Int64))

    frames = remap(frames).sort(["stack_id", "depth"])
    return remap(seg_df), remap(blk_df), remap(trace), frames


def _annotations(path: Path, anns: Any, fix: _Fix) -> pl.DataFrame:
    if not isinstance(anns, list) or not anns:
        return empty_snapshot_table("annotations")
    anns = [a for a in anns if isinstance(a, dict)]
    return pl.DataFrame([
        _series(path, fix, "device", [a.get("device", 0) for a in anns], pl.Int64),
        _series(path, fix, "ts_ns", [a.get("time_us") for a in anns], pl.Int64) * 1000,
        _series(path, fix, "name", [a.get("name") for a in anns], pl.String),
        _series(path, fix, "stage", [a.get("stage") for a in anns], pl.String),
    ])


def _release_hint(doc: dict[str, Any], sample_entries: Iterable[dict[str, Any]], legacy: bool,
                  segs: list[Any]) -> str:
    if legacy:
        return "2.0"
    keys: set[str] = set()
    for e in sample_entries:
        keys.update(k for k in e if isinstance(k, str))
    settings = doc.get("allocator_settings")
    if not isinstance(settings, dict):
        settings = {}
    if "max_round_threshold" in settings:
        return ">=2.13"
    if "pool_id" in keys:
        return ">=2.12"
    if "forward_frames" in keys:
        return ">=2.11"
    if "user_metadata" in keys:
        return ">=2.10"
    if "graph_capture_record_stream_reuse" in settings:
        return ">=2.9"
    if "compile_context" in keys:
        return ">=2.8"
    if "external_annotations" in doc:
        return ">=2.5"
    if "allocator_settings" in doc:
        return ">=2.3"
    if "time_us" in keys:
        return ">=2.2"
    if any(isinstance(s, dict) and "segment_pool_id" in s for s in segs[:5]):
        return ">=2.1"
    return "unknown"


def _plain_settings(settings: Any) -> tuple[dict[str, Any] | None, int]:
    """``allocator_settings`` keeping only a string name with a scalar value (or a short
    flat list or dict of scalars); returns (settings or None, entries dropped). Reports print the
    values, and a memo-shared nested list prints exponentially."""
    if not isinstance(settings, dict):
        return None, 0
    out: dict[str, Any] = {}
    for k, v in settings.items():
        if isinstance(k, str) and (type(v) in _SCALAR_TYPES or (
                isinstance(v, (list, tuple)) and len(v) <= 64 and all(type(x) in _SCALAR_TYPES for x in v)) or (
                isinstance(v, dict) and len(v) <= 64  # e.g. roundup_power2_divisions {"1": 0, "2": 0, …}
                and all(type(x) in _SCALAR_TYPES for kv in v.items() for x in kv))):
            out[k] = v
    return out, len(settings) - len(out)


def _drop_duplicate_blocks(blk_df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Keep the first block at each (device, address); returns (blocks, number dropped).

    Blocks tile their segments, so two blocks at one address only occur in a damaged or
    forged file; every analysis matches blocks to allocations by address, and n blocks
    at one address made those joins n² in time and memory."""
    if blk_df.height < 2:
        return blk_df, 0
    keep = pl.col("address").is_null() | pl.struct("device", "address").is_first_distinct()
    if blk_df.select(keep.all()).item():
        return blk_df, 0
    kept = blk_df.filter(keep)
    return kept, blk_df.height - kept.height


def _count_truncation(trace: pl.DataFrame) -> int:
    """Frees whose allocation is not in the history (recorded before it started): frees
    of an address before its first ``alloc`` on that device (or with none at all).

    A join against each address's first alloc, not a window over every event: the
    window sorted and copied the whole history (≈ 60 B per event at its peak)."""
    if trace.is_empty():
        return 0
    lf = trace.lazy().select("device", "addr", "event_idx", "action")
    first = lf.filter(pl.col("action") == "alloc").group_by("device", "addr").agg(
        first_alloc=pl.col("event_idx").min())
    frees = lf.filter(pl.col("action").is_in(["free_requested", "free_completed"])).select(
        "device", "addr", "event_idx")
    return int(frees.join(first, on=["device", "addr"], how="left", nulls_equal=True).filter(
        pl.col("first_alloc").is_null() | (pl.col("event_idx") < pl.col("first_alloc"))
    ).select(pl.len()).collect().item())


def load_snapshot(path: str | Path, streaming: bool | None = None,
                  budget: PickleBudget | None = None) -> SnapshotModel:
    """Load a CUDA memory snapshot pickle (see the module docstring).

    ``streaming``: read with :mod:`~traceanalyzer.load.pickle_stream` (trace entries
    become columns while the file is read; bounded memory) instead of the C
    unpickler. ``None`` streams files larger than :data:`STREAM_MIN_BYTES`. Both
    give the same model; a file the streaming reader cannot reproduce exactly is
    read the ordinary way.

    ``budget``: the limits the pickle must fit in (default: :meth:`PickleBudget.from_env`);
    a file past one is refused with an :class:`InputError` naming the limit.
    """
    p = Path(path)
    budget = budget or PickleBudget.from_env()
    if streaming is None:
        try:
            streaming = p.stat().st_size > STREAM_MIN_BYTES
        except OSError:
            streaming = False
    if not streaming:
        try:
            return _load_snapshot(p, False, budget)
        except _TooLargeToBuild:  # a gzip that unpacks past the scan limit
            streaming = True
        except InputError as exc:
            if "truncated" not in str(exc):
                raise
            try:  # cut short: keep what precedes the cut, as for traces
                return _load_snapshot(p, True, budget, salvage=True)
            except (InputError, StreamFallback):
                raise exc from None
    try:
        return _load_snapshot(p, True, budget)
    except StreamFallback:
        pass
    except InputError as exc:
        if "truncated" not in str(exc):
            raise
        # Cut short: keep what precedes the cut, as for traces (refused if nothing usable).
        try:
            return _load_snapshot(p, True, budget, salvage=True)
        except (InputError, StreamFallback):
            raise exc from None
    try:
        return _load_snapshot(p, False, budget)
    except _TooLargeToBuild:
        raise InputError(p, f"refused: a snapshot of more than {DEFAULT_SCAN_LIMIT:,} bytes that refers back to "
                            "a trace entry through the pickle memo (no real snapshot does; the streaming reader "
                            "does not reproduce it)") from None


def _load_snapshot(p: Path, streaming: bool, budget: PickleBudget, salvage: bool = False) -> SnapshotModel:
    fix = _Fix()
    stacks = _Stacks()
    sink: _TraceSink | None = None
    if streaming:
        sink = _TraceSink(p, stacks, fix)
        try:
            obj, protocol, size = _stream_snapshot_object(p, sink, budget, salvage=salvage)
        except StreamTruncated as cut:
            obj, protocol, size = cut.partial, pickle_protocol_of(p), p.stat().st_size
            truncated_at: int | None = cut.at
            if not (isinstance(obj, list) and obj) and not (isinstance(obj, dict) and isinstance(
                    obj.get("segments"), list) and (obj["segments"] or obj.get("device_traces"))):
                raise InputError(p, f"truncated file: cut at byte {cut.at:,}, before any segment or "
                                    "trace entry could be read") from None
        else:
            truncated_at = None
    else:
        obj, protocol, size = read_snapshot_object(p, budget=budget)
        truncated_at = None
    warnings: list[str] = []
    if truncated_at is not None:
        warnings.append(f"snapshot cut short at byte {truncated_at:,} of the pickle: kept what precedes the "
                        "cut; the segments, blocks and trace entries after it are lost")
    if isinstance(obj, list) and obj and not any(isinstance(s, dict) for s in obj[:1000]):
        # torch.cuda.memory_snapshot() is a list of segment dicts (empty when nothing was
        # allocated); a list of anything else is some other pickle, not an empty snapshot.
        raise InputError(p, f"a pickle of a list, but not a memory snapshot (its items are not segments; "
                            f"the first is {_a(type(obj[0]).__name__)})")
    if isinstance(obj, list):
        layout = "segments-list"
        doc: dict[str, Any] = {"segments": obj}
        warnings.append("bare segment list (torch.cuda.memory_snapshot()): state at dump time only, no history")
    elif isinstance(obj, dict) and isinstance(obj.get("segments"), list):
        doc = obj
        layout = "dict"
    elif isinstance(obj, dict):
        keys = ", ".join(sorted(map(str, obj))[:8])
        raise InputError(p, f"a pickle, but not a memory snapshot (no 'segments' list; top-level keys: {keys})")
    else:
        raise InputError(p, f"a pickle of {_a(type(obj).__name__)}, not a memory snapshot")
    del obj

    segs: list[Any] = doc["segments"]
    def _blocks(s: Any) -> list[Any]:
        b = s.get("blocks") if isinstance(s, dict) else None
        return b if isinstance(b, list) else []

    legacy = any(isinstance(b, dict) and "history" in b
                 for s in segs[:50] for b in _blocks(s)[:50]) or (
        bool(segs) and all(isinstance(s, dict) and "segment_pool_id" not in s and "is_expandable" not in s
                           for s in segs[:50])
        and any(_blocks(s) and isinstance(_blocks(s)[0], dict) and "address" not in _blocks(s)[0]
                for s in segs[:50])
    )
    if legacy and layout == "dict":
        layout = "dict-legacy"
    seg_df, blk_df, seg_warnings = _segments_and_blocks(p, segs, stacks, fix)
    warnings += seg_warnings
    blk_df, n_dup = _drop_duplicate_blocks(blk_df)
    if n_dup:
        warnings.append(f"{n_dup:,} blocks share a device and address with an earlier block (damaged snapshot: "
                        "blocks tile their segments without overlap): dropped")

    traces = doc.get("device_traces")
    if traces is None:
        traces = []
    if not isinstance(traces, list):
        if sink is not None and sink.leftover():
            raise StreamFallback("trace entries outside 'device_traces'")
        raise InputError(p, "malformed snapshot: 'device_traces' is not a list")
    sample = [e for t in traces if isinstance(t, list)
              for e in (sink.samples.get(id(t), t) if sink is not None and sink.owns(t) else t)[:20]
              if isinstance(e, dict)]
    hint = _release_hint(doc, sample, legacy, segs)
    frames_per_dev: list[pl.DataFrame] = []
    for dev in range(len(traces)):
        lst = traces[dev]
        if sink is not None and sink.owns(lst):
            df = sink.finish(lst, dev)
            if df is not None:
                frames_per_dev.append(df)
        elif isinstance(lst, list) and lst:
            frames_per_dev.append(_trace_device(p, dev, lst, stacks, fix))
        traces[dev] = None  # release the object tree as we go (peak memory)
        del lst
    if sink is not None and sink.leftover():  # entries absorbed from a list that is not a device trace
        raise StreamFallback("trace entries outside 'device_traces'")
    trace = pl.concat(frames_per_dev) if frames_per_dev else empty_snapshot_table("trace")
    if truncated_at is not None and not trace.height and seg_df.get_column("address").null_count() == seg_df.height:
        raise InputError(p, f"truncated file: cut at byte {truncated_at:,}, before any segment or "
                            "trace entry could be read")
    unknown = trace.filter(~pl.col("action").is_in(list(ACTIONS)))
    if unknown.height:
        names = ", ".join(sorted(set(str(a) for a in unknown["action"].unique().to_list()))[:5])
        warnings.append(f"{unknown.height:,} trace entries with unknown actions ({names}): ignored by the replay")
    annotations = _annotations(p, doc.get("external_annotations"), fix)
    settings, n_bad_settings = _plain_settings(doc.get("allocator_settings"))
    if n_bad_settings:
        warnings.append(f"{n_bad_settings:,} allocator_settings entries are not a name and a plain value "
                        "(treated as missing)")
    frames = stacks.table(p, fix)
    n_stacks = len(stacks.by_content)
    stacks_bad = stacks.bad
    del doc, segs, traces, stacks, sample, sink  # nothing below needs the object tree
    seg_df, blk_df, trace, frames = _canonical_stack_ids(seg_df, blk_df, trace, frames)

    for what, n in sorted(fix.counts.items()):
        warnings.append(f"{n:,} values of {what}")
    for what, n in sorted(stacks_bad.items()):
        warnings.append(f"{n:,} {what}")
    devices = sorted(set(seg_df["device"].to_list()) | set(trace["device"].unique().to_list()))
    n_trunc = _count_truncation(trace)
    live_blocks = blk_df.filter(pl.col("state") != "inactive").height
    has_history = bool(trace.height) and bool(trace.select(pl.col("action").is_in(
        ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"]).any()).item())
    if layout != "segments-list" and not has_history:
        if trace.height:
            warnings.append(f"the history holds only {trace.height} entr{'y' if trace.height == 1 else 'ies'} "
                            "and no allocation (ring buffer of size 1, the 2.0 default): state at dump only")
        else:
            warnings.append("no allocation history (recorded without _record_memory_history or "
                            "include_traces=False): state at dump only")
    if n_trunc:
        warnings.append(f"history truncated: {n_trunc:,} frees of allocations made before recording started "
                        "(ring buffer or late start); their allocation time is unknown")
    meta = SnapshotMeta(
        path=str(p),
        file_bytes=size,
        protocol=protocol,
        layout=layout,
        release_hint=hint,
        devices=tuple(int(d) for d in devices),
        n_segments=seg_df.height,
        n_blocks=blk_df.height,
        n_trace_entries=trace.height,
        n_stacks=n_stacks,
        has_history=has_history,
        has_time=bool(trace.height) and trace["ts_ns"].null_count() < trace.height,
        has_stacks=frames.height > 0,
        history_truncated=n_trunc > 0,
        allocator_settings=settings if isinstance(settings, dict) else None,
        extra={"live_blocks": live_blocks,
               "n_annotations": annotations.height},
    )
    return SnapshotModel(
        meta=meta,
        segments=seg_df,
        blocks=blk_df,
        trace=trace,
        frames=frames,
        annotations=annotations,
        warnings=tuple(warnings),
    )


__all__ = ["STREAM_MIN_BYTES", "load_snapshot", "read_snapshot_object"]


def _a(noun: str) -> str:
    """``noun`` with its indefinite article (a list, an int)."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"
