"""The result cache: each analysis's outcome kept beside its model's cache entry.

An analysis is a pure function of the model, its declared parameters, the results it declares
(``depends_on``, ``after``) and shared derived tables that are themselves functions of the
model (:mod:`traceanalyzer.analyses`). So a re-run of an unchanged file with other thresholds
needs to recompute only the analyses whose parameters changed, and those that read them: the
others' outcomes are read back from here.

**Key** of one outcome (:meth:`ResultStore.key`): BLAKE2b-128 over the model's cache key
(:mod:`traceanalyzer.store.cache`: the file's content hash, loader version …), the analysis
name, :func:`analysis_source_digest` (the sources that can change a result), the
traceanalyzer and polars versions, :data:`RESULT_FORMAT`, the resolved values of its declared
parameters as canonical JSON and, for each input it declares, that input's key (``"absent"``
when no analysis of that name applies to the model). A changed parameter thus changes the key
of its analysis and, through the input keys, of every analysis reading it, and nothing else.

**Kept**: a result (encoded by :mod:`traceanalyzer.store.codec`, never pickle) or the reason
its analysis did not apply (``NotApplicable``). Never a failure, nor anything computed from
one (:func:`~traceanalyzer.analyses.run_analyses` decides). A result the codec has no form for
is computed again each run (counted in :class:`ResultStats`); it never fails the run.

**Shared derived tables** (:class:`~traceanalyzer.model.derived.DerivedTables`, pure functions
of the model) whose build is costly for their size (:data:`traceanalyzer.analyses.STORE_TABLE_MIN_S`)
are kept too, as ``<key>.tab`` entries of the same form keyed by the model's key, the table's
name, :func:`analysis_source_digest` and the versions: an analysis recomputed for another
threshold reads back the tables the first run's analyses shared instead of building them alone.

**Entry**: ``models/<model key>/results/<key>.res``: :data:`MAGIC`, the SHA-256 digest of
the rest, then the rest: an 8-byte length, a JSON header (the key's parts, the encoded value,
each frame blob's size) and the frames' Arrow IPC blobs. Written to a temporary file renamed
into place (whole or absent). A file whose digest, header or value does not decode is removed
and its analysis runs again. Results live inside their model's entry: they count toward its
size under the cache cap, go with it when it is evicted or cleared, and are kept only while
the model is (a model not stored, e.g. over the cap, keeps no results).
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import sys
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceanalyzer import __version__
from traceanalyzer.analyses import CachedOutcome, Result
from traceanalyzer.model import Model
from traceanalyzer.store.codec import CodecError, Uncodable, decode, encode

#: Bumped when this module or the codec writes differently (part of every key).
RESULT_FORMAT = 2
RESULTS_DIR = "results"
SUFFIX = ".res"
#: Shared derived tables kept beside the results (:meth:`ResultStore.put_table`).
TABLE_SUFFIX = ".tab"
MAGIC = b"TARES\x01\n"
_DIGEST = 32  # SHA-256: in hardware on most CPUs, ~2x BLAKE2b on the large entries
_LEN = struct.Struct("<Q")

# What can change an analysis's outcome for a given model: the analyses and model packages
# (the derived tables live in model/derived.py) and the modules they import from outside them,
# the parameter conversion (config.py), and the codec that stores the result.
_SOURCES = ("analyses", "model", "errors.py", "units.py", "timeutil.py", "config.py",
            "store/codec.py", "store/results.py")


@functools.cache
def analysis_source_digest() -> str:
    """A digest of the files that can change an analysis's outcome (names and bytes, see
    ``_SOURCES``); empty when they cannot be read (a frozen build), where the package
    version alone decides."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    try:
        for part in _SOURCES:
            root = pkg / part
            files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and p.suffix not in (".pyc", ".pyo")) if root.is_dir() else [root]
            for p in files:
                h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes() + b"\0")
    except OSError:
        return ""
    return h.hexdigest()


@dataclass
class ResultStats:
    """What one :class:`ResultStore` did: outcomes read back (``hits``), not found
    (``misses``), written (``stored``), not stored because the codec has no form for them
    (``uncodable``, by analysis), damaged entries removed (``damaged``) and writes that
    failed (``write_errors``)."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    uncodable: dict[str, str] = field(default_factory=dict)
    damaged: int = 0
    write_errors: int = 0
    tables_read: int = 0  # shared derived tables read back (:meth:`ResultStore.get_table`)
    tables_stored: int = 0  # and written (:meth:`ResultStore.put_table`)


def _note(text: str) -> None:
    """A line on stderr in verbose mode (``TRACEANALYZER_VERBOSE=1``), as the model cache's."""
    if os.environ.get("TRACEANALYZER_VERBOSE", "").strip() not in ("", "0"):
        print(f"cache: {text}", file=sys.stderr)


class ResultStore:
    """The outcomes of the analyses of one model (cache key ``model_key``), in
    ``model_dir/results/``: the :class:`~traceanalyzer.analyses.ResultCache` that
    :func:`~traceanalyzer.analyses.run_analyses` is given."""

    def __init__(self, model_dir: Path, model_key: str) -> None:
        self.model_dir = model_dir
        self.model_key = model_key
        self.dir = model_dir / RESULTS_DIR
        self.stats = ResultStats()
        self._names: dict[str, str] = {}  # key -> analysis name (for notes and stats)
        self._lock = threading.Lock()  # analyses may run in threads

    def key(self, name: str, params: Mapping[str, Any], inputs: Mapping[str, str]) -> str | None:
        parts = {
            "result_format": RESULT_FORMAT,
            "model": self.model_key,
            "analysis": name,
            "sources": analysis_source_digest(),
            "traceanalyzer": __version__,
            "polars": pl.__version__,
            "params": dict(params),
            "inputs": dict(inputs),
        }
        try:
            text = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        except TypeError:
            return None  # a parameter value JSON cannot hold: computed every run
        key = hashlib.blake2b(text, digest_size=16).hexdigest()
        with self._lock:
            self._names[key] = name
        return key

    def path(self, key: str, suffix: str = SUFFIX) -> Path:
        return self.dir / f"{key}{suffix}"

    def get(self, key: str) -> CachedOutcome | None:
        found = self._read(key, SUFFIX, "result", "running the analysis again")
        if not isinstance(found, CachedOutcome):
            with self._lock:
                self.stats.misses += 1
            return None
        with self._lock:
            self.stats.hits += 1
        return found

    def put(self, key: str, outcome: CachedOutcome) -> None:
        name = self._names.get(key, "?")
        if self._write(key, SUFFIX, {"analysis": name, "skipped": outcome.skipped}, outcome.value,
                       f"the result of {name}"):
            with self._lock:
                self.stats.stored += 1

    # -- shared derived tables ----------------------------------------------------------------

    def table_key(self, name: str) -> str:
        """The key of the shared derived table ``name`` of this model
        (:class:`~traceanalyzer.model.derived.DerivedTables`: a pure function of the model,
        so its key is the model's, the table's name and the sources that compute it)."""
        parts = {
            "result_format": RESULT_FORMAT,
            "model": self.model_key,
            "table": name,
            "sources": analysis_source_digest(),
            "traceanalyzer": __version__,
            "polars": pl.__version__,
        }
        return hashlib.blake2b(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()

    def get_table(self, key: str) -> CachedTable | None:
        """The table stored under ``key`` (:meth:`table_key`), None when absent or damaged
        (a damaged one is removed: the caller builds the table again)."""
        found = self._read(key, TABLE_SUFFIX, "table", "building it again")
        if not isinstance(found, CachedTable):
            return None
        with self._lock:
            self.stats.tables_read += 1
        return found

    def put_table(self, key: str, name: str, value: object) -> None:
        """Keep ``value``, the shared derived table ``name``, under ``key`` (a value the codec
        has no form for is simply not kept)."""
        if self._write(key, TABLE_SUFFIX, {"table": name}, value, f"the table {name}"):
            with self._lock:
                self.stats.tables_stored += 1

    # -- the entry files ------------------------------------------------------------------------

    def _read(self, key: str, suffix: str, what: str, then: str) -> Any:
        """The decoded entry ``key`` (:class:`CachedOutcome` or :class:`CachedTable`), None
        when absent; a damaged one is removed (noted in verbose mode) and counted."""
        path = self.path(key, suffix)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            return _decode_entry(data, key, table=suffix == TABLE_SUFFIX)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any damage (a reader's panic is a BaseException): recompute
            _note(f"ignoring damaged {what} {path} ({type(exc).__name__}: {exc}); {then}")
            try:
                path.unlink()
            except OSError:
                pass
            with self._lock:
                self.stats.damaged += 1
            return None

    def _write(self, key: str, suffix: str, fields: dict[str, Any], value: object, what: str) -> bool:
        """Write ``value`` as entry ``key`` (atomically); False when not written (not encodable,
        the model entry gone, the location refused it)."""
        name = str(fields.get("analysis", fields.get("table")))
        try:
            value_doc, blobs = encode(value)
        except Uncodable as exc:
            _note(f"not caching {what}: {exc}")
            if "analysis" in fields:  # a table with no stored form is simply built each run
                with self._lock:
                    self.stats.uncodable[name] = str(exc)
            return False
        kind = "analysis" if "analysis" in fields else "table"
        header = {"key": key, kind: fields[kind], "model": self.model_key,
                  **{k: v for k, v in fields.items() if k != kind}, "value": value_doc,
                  "blobs": [len(b) for b in blobs]}
        try:
            head = orjson.dumps(header)
        except TypeError as exc:
            if "analysis" in fields:
                with self._lock:
                    self.stats.uncodable[name] = str(exc)
            return False
        rest = b"".join([_LEN.pack(len(head)), head, *blobs])
        data = MAGIC + hashlib.sha256(rest).digest() + rest
        tmp = self.dir / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if not self.model_dir.is_dir():
                return False  # the model entry was evicted or cleared meanwhile: nothing to attach to
            self.dir.mkdir(exist_ok=True, mode=0o700)
            tmp.write_bytes(data)
            os.replace(tmp, self.path(key, suffix))
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written never fails the run
            _note(f"could not write {what} ({type(exc).__name__}: {exc})")
            try:
                tmp.unlink()
            except OSError:
                pass
            with self._lock:
                self.stats.write_errors += 1
            return False
        return True

    def done(self) -> None:
        """The run is over: evict down to the cache cap if this run stored anything."""
        if self.stats.stored or self.stats.tables_stored:
            from traceanalyzer.store.cache import ModelCache

            ModelCache(self.model_dir.parent.parent).evict(keep=self.model_key)


@dataclass(frozen=True)
class CachedTable:
    """A shared derived table read back (:meth:`ResultStore.get_table`)."""

    value: Any


def _decode_entry(data: bytes, key: str, table: bool = False) -> Any:
    """The outcome a ``.res`` file holds (:class:`CachedOutcome`), or with ``table`` the
    :class:`CachedTable` a ``.tab`` file holds (:class:`ValueError`/:class:`CodecError` when
    damaged)."""
    if not data.startswith(MAGIC):
        raise ValueError("not a result entry")
    digest, rest = data[len(MAGIC):len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST:]
    if hashlib.sha256(rest).digest() != digest:
        raise ValueError("does not match its digest")
    (n,) = _LEN.unpack_from(rest)
    header = orjson.loads(rest[_LEN.size:_LEN.size + n])
    if header.get("key") != key:
        raise ValueError("holds another key")
    blobs: list[bytes] = []
    pos = _LEN.size + n
    for size in header["blobs"]:
        blobs.append(rest[pos:pos + size])
        pos += size
    if pos != len(rest):
        raise ValueError("blob sizes differ from the file")
    value = decode(header["value"], blobs)
    if table:
        if not isinstance(header.get("table"), str):
            raise CodecError("not a table entry")
        return CachedTable(value)
    if "analysis" not in header:
        raise CodecError("not a result entry")
    skipped = header.get("skipped")
    if value is None and not isinstance(skipped, str):
        raise CodecError("neither a result nor a skip reason")
    if value is not None and not isinstance(value, Result):
        raise CodecError(f"a {type(value).__name__} is not an analysis result")
    return CachedOutcome(value=value, skipped=skipped if value is None else None)


# -- which loaded model has which cache entry --------------------------------------------------

_MODEL_ENTRIES: dict[int, tuple[weakref.ref[Model], Path, str]] = {}
_MODEL_LOCK = threading.Lock()


def remember(model: Model, entry_dir: Path, model_key: str) -> None:
    """Record that ``model`` is the one stored in cache entry ``entry_dir`` (key ``model_key``):
    :func:`for_model` then gives it a :class:`ResultStore`. Called by the model cache on a hit
    or a store."""
    ident = id(model)

    def forget(_: object) -> None:
        with _MODEL_LOCK:
            if ident in _MODEL_ENTRIES and _MODEL_ENTRIES[ident][0]() is None:
                del _MODEL_ENTRIES[ident]

    with _MODEL_LOCK:
        _MODEL_ENTRIES[ident] = (weakref.ref(model, forget), entry_dir, model_key)


def for_model(model: Model) -> ResultStore | None:
    """The result cache of ``model`` when it came from (or went into) the model cache; None
    otherwise (loaded with the cache off, built by hand, not stored)."""
    with _MODEL_LOCK:
        found = _MODEL_ENTRIES.get(id(model))
    if found is None or found[0]() is not model:
        return None
    _, entry_dir, model_key = found
    if not entry_dir.is_dir():
        return None
    return ResultStore(entry_dir, model_key)


def result_files(entry_dir: Path) -> tuple[int, int]:
    """``(count, bytes)`` of the results kept in a model's entry directory."""
    n = size = 0
    try:
        with os.scandir(entry_dir / RESULTS_DIR) as it:
            for e in it:
                if e.name.endswith(SUFFIX):
                    try:
                        size += e.stat().st_size
                        n += 1
                    except OSError:
                        pass
    except OSError:
        pass
    return n, size


__all__ = [
    "MAGIC",
    "TABLE_SUFFIX",
    "CachedTable",
    "RESULTS_DIR",
    "RESULT_FORMAT",
    "ResultStats",
    "ResultStore",
    "analysis_source_digest",
    "for_model",
    "remember",
    "result_files",
]
