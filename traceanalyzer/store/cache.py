"""The model cache: a loaded model written once as Arrow IPC, read back instead of parsing.

Decoding a trace's JSON is most of an ``analyze`` run; reading the same tables back from
Arrow IPC takes a small fraction of it. So the first load of a file writes its model here and
every later load of the same bytes (another ``--set``, other ``--format``, ``memory``,
``export``, a ``batch`` or ``compare`` that includes it) reads the entry.

**Location**: ``$TRACEANALYZER_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceanalyzer``, else
``~/.cache/traceanalyzer``; entries under ``models/``. **Off** for one run with
``--no-cache`` (``analyze``, ``memory``, ``export``, ``batch``), everywhere with
``TRACEANALYZER_NO_CACHE=1``.

**Key**: the SHA-256 digest of the file's bytes (streamed; the compressed bytes of a
``.gz``), its kind, :data:`~traceanalyzer.load.cache_version.LOADER_VERSION`, the
traceanalyzer and polars versions, a digest of the loader and model sources
(:func:`source_digest`) and the input budget in force (``--max-input-size`` …, which decides
whether a file loads at all: a hit never bypasses a tighter budget). The content hash always
decides: size and modification time are only compared before and after a load, so that a
file rewritten while it was parsed is not stored under the hash of its old bytes.

**Entry**: ``models/<key>/`` holding one ``<table>.arrow`` per table (IPC,
:data:`IPC_COMPRESSION`) and ``entry.json`` (the key's parts, meta, warnings, each table's
rows, schema and SHA-256 digest). It is written in a temporary directory renamed into place, so
an entry is whole or absent. One that fails to read (a file truncated, edited or missing, its
digest, schema or row count differing from ``entry.json``) is removed and the file is loaded
again; the note goes to stderr only in verbose mode (``TRACEANALYZER_VERBOSE=1``). Load
warnings are stored with the model: a hit reports the same warnings.

**Size cap**: ``TRACEANALYZER_CACHE_MAX`` (a size such as ``5G``, ``500M``; default
:data:`DEFAULT_MAX_BYTES`; ``0`` stores nothing). After each write the least recently used
entries (by the time of their last hit) are removed until the total fits; a model larger than
the cap alone is not stored.

A cache that cannot be written (read-only home, full disk) never fails a run: the model
loaded from the file is used and the note goes to verbose output.

**Results**: a model this module stored or read back is remembered with its entry, so that
:func:`traceanalyzer.store.results.for_model` gives the pipeline the entry's result cache
(``models/<key>/results/``, :mod:`traceanalyzer.store.results`): the analyses' outcomes, kept
under the same cap, evicted and cleared with the model.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import orjson
import polars as pl

from traceanalyzer import __version__
from traceanalyzer.errors import ConfigError
from traceanalyzer.load import load as load_file
from traceanalyzer.load import sniff
from traceanalyzer.load.budget import Budget, check_regular, open_regular
from traceanalyzer.load.cache_version import LOADER_VERSION
from traceanalyzer.load.pickle_budget import PickleBudget
from traceanalyzer.model import Model
from traceanalyzer.store import NotStorable, join_model, schema_doc, split_model
from traceanalyzer.store.results import remember, result_files

ENV_CACHE_DIR = "TRACEANALYZER_CACHE_DIR"
ENV_NO_CACHE = "TRACEANALYZER_NO_CACHE"
ENV_CACHE_MAX = "TRACEANALYZER_CACHE_MAX"
ENV_VERBOSE = "TRACEANALYZER_VERBOSE"

#: Default size cap of the whole cache (``TRACEANALYZER_CACHE_MAX``).
DEFAULT_MAX_BYTES = 5 << 30
#: Compression of the IPC files: lz4 reads about as fast as uncompressed IPC from the page
#: cache and keeps entries several times smaller, so more traces fit under the cap
#: (docs/performance.md, "Model cache").
IPC_COMPRESSION: Literal["uncompressed", "lz4", "zstd"] = "lz4"
#: Layout of an entry directory; part of the key, bumped when this module writes differently
#: (4: the content hash is SHA-256, and results are kept in the entry, :mod:`.results`; 5: the
#: content hash is over two lanes, :func:`content_digest`).
ENTRY_FORMAT = 5
ENTRY_FILE = "entry.json"
MODELS_DIR = "models"
_TMP_PREFIX = ".tmp-"
# A temporary directory this old is a crashed writer's: eviction and ``cache clear`` remove it.
_STALE_TMP_S = 3600.0
_CHUNK = 1 << 20
#: Lanes of :func:`content_digest`: one per core of the machines the tool is sized for.
_LANES = 2
_KEY = re.compile(r"[0-9a-f]{32}")
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)i?B?\s*", re.I)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _note(text: str) -> None:
    """A line on stderr in verbose mode (``TRACEANALYZER_VERBOSE=1``); nothing otherwise."""
    if os.environ.get(ENV_VERBOSE, "").strip() not in ("", "0"):
        print(f"cache: {text}", file=sys.stderr)


def cache_enabled() -> bool:
    """False when ``TRACEANALYZER_NO_CACHE`` is set (to anything but ``0`` or empty)."""
    return os.environ.get(ENV_NO_CACHE, "").strip() in ("", "0")


def default_root() -> Path:
    """The cache directory (see the module docstring)."""
    explicit = os.environ.get(ENV_CACHE_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec: a relative XDG_CACHE_HOME is invalid and ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "traceanalyzer"


def parse_size(text: str, what: str = ENV_CACHE_MAX) -> int:
    """``5G``, ``500M``, ``1.5GiB``, ``1000000`` → bytes (``0`` allowed); else ConfigError."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{what}={text!r}: expected a size such as 5G, 500M or 1000000")
    return int(float(m.group(1)) * _UNIT[m.group(2).upper()])


def default_max_bytes() -> int:
    raw = os.environ.get(ENV_CACHE_MAX, "").strip()
    return parse_size(raw) if raw else DEFAULT_MAX_BYTES


def content_digest(path: Path) -> str:
    """The file's content key: hex SHA-256 over its size and the SHA-256 of each of its
    :data:`_LANES` lanes (equal byte ranges, the last one takes the rest), each lane read in
    1 MiB chunks and hashed on a thread of its own (regular files only). Two lanes halve the
    wall time of the hash on two cores; hashlib and the reads leave the GIL. SHA-256, not
    BLAKE2b: CPUs with SHA extensions (most x86 since 2017-2019, ARMv8) hash it ~2x faster,
    and a plain multi-GB trace pays this on every run (docs/performance.md, "Model cache")."""
    f, st = open_regular(path)
    f.close()
    size = st.st_size
    lane = -(-size // _LANES) if size > _CHUNK else max(size, 1)

    def digest(start: int) -> bytes:
        # A handle per lane (portable: no pread on Windows), each checked as the first was.
        h = hashlib.sha256()
        view = memoryview(bytearray(_CHUNK))
        end = min(start + lane, size)
        handle, _ = open_regular(path)
        with handle:
            lf = cast(io.BufferedReader, handle)  # open_regular's handle is an fdopen(fd, "rb")
            lf.seek(start)
            pos = start
            while pos < end and (n := lf.readinto(view[: min(_CHUNK, end - pos)])):
                h.update(view[:n])
                pos += n
        return h.digest()

    starts = list(range(0, size, lane)) or [0]
    if len(starts) == 1:
        lanes = [digest(0)]
    else:
        with ThreadPoolExecutor(len(starts), thread_name_prefix="traceanalyzer-digest") as pool:
            lanes = list(pool.map(digest, starts))
    top = hashlib.sha256(b"traceanalyzer lanes\0%d\0%d\0" % (size, len(lanes)))
    for d in lanes:
        top.update(d)
    return top.hexdigest()


@functools.cache
def source_digest() -> str:
    """A digest of the ``.py`` sources of ``traceanalyzer/load`` and ``traceanalyzer/model``
    (names and bytes); empty when they cannot be read (a frozen build), where
    :data:`LOADER_VERSION` alone decides."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    try:
        for part in ("load", "model"):
            for p in sorted((pkg / part).rglob("*.py")):
                h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes() + b"\0")
    except OSError:
        return ""
    return h.hexdigest()


def key_parts(path: Path, kind: str) -> dict[str, Any]:
    """Everything an entry is keyed on, for ``path`` of ``kind`` (hashes the file)."""
    budget: dict[str, Any] = asdict(PickleBudget.from_env() if kind == "snapshot" else Budget.from_env())
    return {
        "entry_format": ENTRY_FORMAT,
        "content": content_digest(path),
        "kind": kind,
        "loader_version": LOADER_VERSION,
        "traceanalyzer": __version__,
        "polars": pl.__version__,
        "sources": source_digest(),
        "budget": budget,
    }


def key_of(parts: dict[str, Any]) -> str:
    """The entry name: 32 hex digits of BLAKE2b over the key's parts."""
    return hashlib.blake2b(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One cache entry on disk: its key, size in bytes and time of last use (epoch seconds)."""

    key: str
    path: Path
    bytes: int
    last_used: float
    source: str | None
    results: int = 0  # analysis results kept in the entry (:mod:`traceanalyzer.store.results`)


def _digest(data: bytes) -> str:
    """SHA-256 of an entry file's bytes (recorded in ``entry.json``, checked on reading)."""
    return hashlib.sha256(data).hexdigest()


def _dir_bytes(path: Path) -> int:
    """Bytes of the files in ``path`` and its sub-directories (the entry's ``results/``; 0 once
    another process has removed it)."""
    total = 0
    try:
        with os.scandir(path) as it:
            children = list(it)
    except OSError:
        return 0
    for e in children:
        try:
            total += _dir_bytes(Path(e.path)) if e.is_dir(follow_symlinks=False) else e.stat().st_size
        except OSError:
            pass
    return total


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class ModelCache:
    """The model cache in ``root`` (``root/models/<key>/``), capped at ``max_bytes``."""

    def __init__(self, root: Path | None = None, max_bytes: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self.models = self.root / MODELS_DIR

    # -- reading ---------------------------------------------------------------------------

    def get(self, key: str, path: str | None = None) -> Model | None:
        """The model of entry ``key`` (``meta.path`` set to ``path``), or None when absent. A
        damaged entry is removed (noted in verbose mode) and None returned."""
        where = self.models / key
        entry_file = where / ENTRY_FILE
        if not entry_file.is_file():
            return None
        try:
            doc = orjson.loads(entry_file.read_bytes())
            specs: dict[str, Any] = doc["tables"]
            blobs = []
            for name, spec in specs.items():
                data = (where / f"{name}.arrow").read_bytes()
                # Checked before polars parses it: a flipped bit never becomes a wrong value, and a
                # mangled file never reaches the reader (which may panic on one).
                if _digest(data) != spec["sha256"]:
                    raise ValueError(f"{name}.arrow does not match its digest")
                blobs.append(data)
            # One query for every table: polars reads them side by side and takes the GIL once
            # (13 reads one after the other each wait for it, behind the warm-up's imports).
            tables = dict(zip(specs, pl.collect_all([pl.scan_ipc(b) for b in blobs]), strict=True))
            for name, spec in specs.items():
                df = tables[name]
                if df.height != spec["rows"] or schema_doc(df) != spec["schema"]:
                    raise ValueError(f"table {name} differs from {ENTRY_FILE}")
            model = join_model(doc["model"], tables, path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any damage (I/O, IPC, JSON, a key missing; a reader's
            # panic on a mangled file is pyo3's PanicException, a BaseException) means: rebuild
            _note(f"ignoring damaged entry {where} ({type(exc).__name__}: {exc}); loading the file again")
            _rmtree(where)
            return None
        try:
            os.utime(entry_file)  # last use: what eviction orders by
        except OSError:
            pass
        return model

    # -- writing ---------------------------------------------------------------------------

    def put(self, key: str, parts: dict[str, Any], model: Model, source: str | None = None) -> bool:
        """Store ``model`` as entry ``key`` (atomically), then evict down to the cap. False when
        not stored: over the cap, not storable, or the cache location refused the write."""
        if self.max_bytes <= 0:
            return False
        try:
            tables, model_doc = split_model(model)
        except NotStorable as exc:
            _note(f"not caching {source or key}: {exc}")
            return False
        if sum(df.estimated_size() for df in tables.values()) > self.max_bytes * 4:
            # IPC compression rarely wins more than 4x on these tables: surely over the cap.
            _note(f"not caching {source or key}: larger than the cache cap")
            return False
        tmp = self.models / f"{_TMP_PREFIX}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            # Private to the user: entries hold the trace's names, shapes and timings.
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.models.mkdir(exist_ok=True, mode=0o700)
            tmp.mkdir()
            doc: dict[str, Any] = {"key": parts, "source": source, "model": model_doc, "tables": {}}
            for name, df in tables.items():
                target = tmp / f"{name}.arrow"
                # One record batch per table: read back as one chunk, as the loader builds it (polars'
                # default batches would give a 16x trace's tables 7+ chunks, slower in every analysis).
                df.write_ipc(target, compression=IPC_COMPRESSION, record_batch_size=max(df.height, 1))
                doc["tables"][name] = {"rows": df.height, "schema": schema_doc(df),
                                       "sha256": _digest(target.read_bytes())}
            (tmp / ENTRY_FILE).write_bytes(orjson.dumps(doc))
            size = _dir_bytes(tmp)
            if size > self.max_bytes:
                _note(f"not caching {source or key}: {size:,} bytes, over the cache cap of {self.max_bytes:,}")
                _rmtree(tmp)
                return False
            try:
                os.rename(tmp, self.models / key)
            except OSError:
                # Another process stored the same entry first (the target exists): keep theirs.
                _rmtree(tmp)
                return (self.models / key / ENTRY_FILE).is_file()
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written never fails the run
            _note(f"could not write {tmp} ({type(exc).__name__}: {exc})")
            _rmtree(tmp)
            return False
        self.evict(keep=key)
        return True

    # -- listing, eviction, clearing -------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Every whole entry, least recently used first."""
        out: list[Entry] = []
        try:
            children = list(self.models.iterdir())
        except OSError:
            return out
        for d in children:
            if not _KEY.fullmatch(d.name):
                continue
            try:
                used = (d / ENTRY_FILE).stat().st_mtime
                source: Any = orjson.loads((d / ENTRY_FILE).read_bytes()).get("source")
            except (OSError, orjson.JSONDecodeError, AttributeError):
                used, source = 0.0, None  # damaged or half-removed: first to go
            out.append(Entry(d.name, d, _dir_bytes(d), used, source if isinstance(source, str) else None,
                             result_files(d)[0]))
        return sorted(out, key=lambda e: (e.last_used, e.key))

    def _stale_tmps(self, max_age_s: float) -> list[Path]:
        try:
            children = list(self.models.iterdir())
        except OSError:
            return []
        now = time.time()
        out = []
        for d in children:
            if d.name.startswith(_TMP_PREFIX):
                try:
                    if now - d.stat().st_mtime >= max_age_s:
                        out.append(d)
                except OSError:
                    pass
        return out

    def evict(self, keep: str | None = None) -> list[Entry]:
        """Remove least recently used entries (never ``keep``) until the total fits the cap;
        also crashed writers' temporary directories. Returns the entries removed."""
        for d in self._stale_tmps(_STALE_TMP_S):
            _rmtree(d)
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        removed = []
        for e in entries:
            if total <= self.max_bytes:
                break
            if e.key == keep:
                continue
            _rmtree(e.path)
            total -= e.bytes
            removed.append(e)
            _note(f"evicted {e.source or e.key} ({e.bytes:,} bytes; cap {self.max_bytes:,})")
        return removed

    def clear(self) -> tuple[int, int]:
        """Remove every entry (and temporary directory); ``(entries, bytes)`` removed."""
        entries = self.entries()
        for e in entries:
            _rmtree(e.path)
        for d in self._stale_tmps(0.0):
            _rmtree(d)
        return len(entries), sum(e.bytes for e in entries)


def load(path: str | Path, use_cache: bool | None = None, cache: ModelCache | None = None,
         before_read: Callable[[], object] | None = None) -> Model:
    """Load ``path`` like :func:`traceanalyzer.load.load`, through the model cache.

    ``use_cache``: None follows ``TRACEANALYZER_NO_CACHE``; False loads the file and neither
    reads nor writes the cache. Anything that is not a regular file goes to the loader as is
    (its one-line refusal is the user's answer). ``before_read`` is called once, before the
    entry or the file is read: after the content hash where there is one (the hash's two lanes
    want both cores), at once otherwise."""
    if use_cache is None:
        use_cache = cache_enabled()
    p = Path(path)
    if before_read is None:
        before_read = _nothing
    if not use_cache or not p.is_file():
        before_read()
        return load_file(p)
    kind = sniff(p)
    store = cache or ModelCache()
    before = check_regular(p)
    if before.st_size > Budget.from_env().max_input_bytes:
        before_read()
        return load_file(p, kind=kind)  # its refusal, without hashing the whole file first
    try:
        parts = key_parts(p, kind)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the loader gives the user's error; the cache just steps aside
        _note(f"not using the cache for {p} ({type(exc).__name__}: {exc})")
        parts = None
    before_read()
    if parts is None:
        return load_file(p, kind=kind)
    key = key_of(parts)
    model = store.get(key, str(p))
    if model is not None:
        _note(f"hit {key} for {p}")
        remember(model, store.models / key, key)
        return model
    model = load_file(p, kind=kind)
    try:
        after = os.stat(p)
    except OSError:
        return model
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        _note(f"not caching {p}: it changed while it was read")
        return model
    if store.put(key, parts, model, source=str(p)):
        _note(f"stored {key} for {p}")
        remember(model, store.models / key, key)
    return model


def _nothing() -> None:
    pass


__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV_CACHE_DIR",
    "ENV_CACHE_MAX",
    "ENV_NO_CACHE",
    "ENV_VERBOSE",
    "Entry",
    "IPC_COMPRESSION",
    "ModelCache",
    "cache_enabled",
    "content_digest",
    "default_root",
    "key_of",
    "key_parts",
    "load",
    "parse_size",
    "source_digest",
]
