"""The batch cache: skip inputs whose content, tool version and settings are unchanged.

One entry per input location, ``OUTDIR/.cache/<slug>-<hash of the location>.json``:
``{"key": …, "row": …}`` (the hash keeps ``a/b.json`` and ``a__b.json`` apart; an entry
is only used for the location it names).
The key is the BLAKE2b digest of the file's bytes (streamed) combined with the
traceanalyzer version and a fingerprint of the settings that change a report
(threshold overrides, output formats). An entry is only trusted when every report file
its row names still exists, so deleting a report forces a redo.

Entries are written atomically and only after the file's reports, so an interrupted
batch loses at most the files in flight: a re-run redoes exactly those.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from traceanalyzer import __version__
from traceanalyzer.batch.discover import open_binary
from traceanalyzer.report.fsutil import atomic_write_bytes

CACHE_DIR = ".cache"
_CHUNK = 1 << 20


def content_hash(path: str) -> str:
    """Hex BLAKE2b-256 of the file's bytes, read in 1 MiB chunks (local path or URL)."""
    h = hashlib.blake2b(digest_size=32)
    with open_binary(path) as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def settings_fingerprint(overrides: Mapping[str, Any], formats: Iterable[str]) -> str:
    """A short digest of everything besides the input bytes that changes a row or report."""
    doc = {"version": __version__, "overrides": dict(sorted(overrides.items())), "formats": sorted(formats)}
    return hashlib.blake2b(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def cache_key(digest: str, fingerprint: str) -> str:
    return f"{digest}:{fingerprint}"


def slug(rel: str) -> str:
    """A file-system-safe, readable name for a relative input path (not injective:
    ``a/b`` and ``a__b``, ``a b`` and ``a_b`` share one; see :func:`report_folders`)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", rel.replace("/", "__")).strip("._")
    return s[:180] or "input"


def rel_hash(rel: str) -> str:
    """8 hex digits identifying an input location."""
    return hashlib.blake2b(rel.encode("utf-8", "surrogateescape"), digest_size=4).hexdigest()


def report_folders(rels: Iterable[str]) -> dict[str, str]:
    """``rel → report folder name``, distinct for distinct locations: the :func:`slug`,
    and where several locations of the batch share one (compared without case, as macOS
    and Windows do), each of them gets ``-<rel_hash>`` appended. Deterministic for a set
    of inputs; a folder name only changes when a colliding location joins the batch."""
    rels = list(dict.fromkeys(rels))
    by_slug: dict[str, list[str]] = {}
    for rel in rels:
        by_slug.setdefault(slug(rel).lower(), []).append(rel)
    out: dict[str, str] = {}
    for group in by_slug.values():
        for rel in group:
            out[rel] = slug(rel) if len(group) == 1 else f"{slug(rel)}-{rel_hash(rel)}"
    return out


class Cache:
    """The cache of one output directory."""

    def __init__(self, outdir: Path) -> None:
        self.dir = Path(outdir) / CACHE_DIR

    def _path(self, rel: str) -> Path:
        return self.dir / f"{slug(rel)[:120]}-{rel_hash(rel)}.json"

    def get(self, rel: str, key: str, outdir: Path) -> dict[str, Any] | None:
        """The cached row for ``rel`` if its key matches and its reports still exist."""
        p = self._path(rel)
        try:
            entry = orjson.loads(p.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("row"), dict):
            return None
        row: dict[str, Any] = entry["row"]
        if row.get("file", rel) != rel:  # another location's entry
            return None
        for f in row.get("reports") or []:
            if not (Path(outdir) / f).is_file():
                return None
        return row

    def known_keys(self, rels: Iterable[str], outdir: Path) -> dict[str, str]:
        """``rel → key`` of every usable entry (workers compare against it)."""
        out: dict[str, str] = {}
        for rel in rels:
            p = self._path(rel)
            try:
                entry = orjson.loads(p.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("row"), dict):
                if self.get(rel, entry["key"], outdir) is not None:
                    out[rel] = entry["key"]
        return out

    def put(self, rel: str, key: str, row: Mapping[str, Any]) -> None:
        atomic_write_bytes(self._path(rel), orjson.dumps({"key": key, "row": dict(row)}, option=orjson.OPT_INDENT_2))
