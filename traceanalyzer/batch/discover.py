"""Find traces and snapshots under directories, globs or fsspec URLs, and group runs.

Finding
-------
Candidates are files named ``*.json``, ``*.pickle``, ``*.pkl``, each optionally ``.gz`` (found
recursively; hidden directories and the batch's own output directory are skipped). Each
candidate's first bytes (decompressed) decide what it is:

* a pickle → ``snapshot``; a JSON array of arrays → ``memory_timeline``;
* JSON holding ``"traceEvents"`` or a ``"ph"`` event key → ``trace``;
* a *complete* JSON document with neither (a truth file, a config, a PyTorch Execution
  Trace …) → **ignored**, listed in the index with the reason, not counted as a failure;
* a ``*.json``/``*.pickle``/``*.pkl`` compressed with anything but gzip (``.zst``,
  ``.bz2``, ``.xz`` …), which the loader does not read → **ignored** the same way;
* anything else (empty, binary, truncated beyond the first bytes) → kept as a
  ``trace`` candidate so the analysis reports the precise error for that file.

Grouping into runs
------------------
A *run* is the set of files one job wrote. Files are grouped per directory and kind;
inside a directory, files that carry a rank (``distributedInfo.rank`` in the trace, else
``rank<N>`` in the file name) form one multi-rank run per ``world_size``. When the same
rank appears twice in a directory (several profiling windows in one folder), files are
further split by their name with digits masked (``worker#_#.pt.trace.json``); files that
still collide, and files without a rank, are runs of their own.
"""

from __future__ import annotations

import glob as _glob
import os
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from traceanalyzer.errors import InputError
from traceanalyzer.load.budget import open_regular

SUFFIXES = (".json", ".json.gz", ".pickle", ".pkl", ".pickle.gz", ".pkl.gz")
HEAD_BYTES = 256 * 1024

_RANK_NAME_RE = re.compile(r"(?i)(?:^|[^a-z])rank[-_.]?(\d+)")
_DIST_RE = re.compile(rb'"distributedInfo"\s*:\s*\{')
_INT_KEY_RE = {k: re.compile(rb'"' + k.encode() + rb'"\s*:\s*(-?\d+)') for k in ("rank", "world_size")}


def is_url(text: str) -> bool:
    """True for fsspec URLs (``s3://…``, ``gs://…``, ``memory://…``), not Windows drives."""
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+://", text))


#: Trace/snapshot names under a compression the loader does not read: listed as ignored
#: with the reason (never skipped silently).
UNSUPPORTED_COMPRESSION = re.compile(r"(?i)\.(?:json|pickle|pkl)\.(zst|zstd|bz2|xz|lz4|zip|7z|tar)$")


def is_candidate(name: str) -> bool:
    return name.lower().endswith(SUFFIXES) or bool(UNSUPPORTED_COMPRESSION.search(name))


@dataclass(frozen=True)
class Input:
    """One file to analyse.

    ``path`` is a local path or an fsspec URL; ``rel`` a short unique display path
    (relative to the common root of the inputs) that also names its report folder;
    ``run`` the id of its run (see :func:`group_runs`).
    """

    path: str
    rel: str
    kind: str
    size: int
    rank: int | None = None
    world_size: int | None = None
    run: str = ""

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "rel": self.rel, "kind": self.kind, "size": self.size,
                "rank": self.rank, "world_size": self.world_size, "run": self.run}


@dataclass
class Discovery:
    """What :func:`discover` found: inputs to analyse, and candidates it ignored (with why)."""

    inputs: list[Input] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Reading heads
# ---------------------------------------------------------------------------------------------


def open_binary(path: str) -> IO[bytes]:
    """Open a local path or fsspec URL for reading bytes."""
    if is_url(path):
        try:
            import fsspec
        except ImportError:
            raise InputError(path, "reading URLs needs fsspec: pip install 'traceanalyzer[dask]'") from None
        return fsspec.open(path, "rb").open()  # type: ignore[no-any-return]
    # Only regular files, opened without blocking: a FIFO in a batch directory must not hang it.
    return open_regular(Path(path))[0]


def read_head(path: str, n: int = HEAD_BYTES) -> tuple[bytes, bool]:
    """The first ``n`` decompressed bytes and whether that is the whole file."""
    with open_binary(path) as f:
        raw = f.read(n + 1)
        if raw[:2] != b"\x1f\x8b":
            return raw[:n], len(raw) <= n
        rest = raw + f.read(4 * n)  # compressed data of ≥ n decompressed bytes, usually
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(rest, n + 1)
    except zlib.error:
        return b"", False
    complete = d.eof and len(out) <= n
    return out[:n], complete


def _dist_info(head: bytes) -> tuple[int | None, int | None]:
    m = _DIST_RE.search(head)
    if not m:
        return None, None
    chunk = head[m.end(): m.end() + 4096]
    depth, end = 1, len(chunk)
    for i, c in enumerate(chunk):
        if c == ord("{"):
            depth += 1
        elif c == ord("}"):
            depth -= 1
            if depth == 0:
                end = i
                break
    chunk = chunk[:end]
    out: list[int | None] = []
    for key in ("rank", "world_size"):
        km = _INT_KEY_RE[key].search(chunk)
        out.append(int(km.group(1)) if km else None)
    return out[0], out[1]


def classify(path: str) -> tuple[str | None, str, int | None, int | None]:
    """``(kind, reason, rank, world_size)`` for one candidate; ``kind`` is ``None`` when ignored."""
    unsupported = UNSUPPORTED_COMPRESSION.search(path)
    if unsupported:
        return (None, f"compressed with .{unsupported.group(1).lower()}, which is not read: decompress it, or "
                      "recompress it with gzip (.gz)", None, None)
    try:
        head, complete = read_head(path)
    except InputError as exc:  # not a regular file (FIFO, socket, device, symlink loop …)
        return None, exc.problem, None, None
    except (OSError, EOFError) as exc:
        return "trace", f"unreadable: {exc}", None, None
    name_rank = _RANK_NAME_RE.search(os.path.basename(path.rstrip("/")))
    rank = int(name_rank.group(1)) if name_rank else None
    if head[:1] == b"\x80":
        return "snapshot", "", rank, None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"[" and text[1:].lstrip()[:1] == b"[":
        return "memory_timeline", "", rank, None
    if text[:1] in (b"{", b"["):
        if b'"traceEvents"' in head or b'"ph"' in head:
            drank, world = _dist_info(head)
            return "trace", "", drank if drank is not None else rank, world
        if complete:
            if b'"nodes"' in head and b'"schema"' in head:
                return None, "a PyTorch Execution Trace, not a profiler (chrome) trace", None, None
            return None, "JSON, but not a profiler trace (no traceEvents)", None, None
    return "trace", "", rank, None


# ---------------------------------------------------------------------------------------------
# Walking
# ---------------------------------------------------------------------------------------------


def _walk_local(root: Path, exclude: Path | None) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            sub = (here / d)
            if d.startswith(".") or (exclude is not None and _same(sub, exclude)):
                continue
            keep.append(d)
        dirnames[:] = keep
        for fn in sorted(filenames):
            if is_candidate(fn) and not fn.startswith("."):
                yield here / fn


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _expand(spec: str, exclude: Path | None) -> tuple[list[str], str]:
    """The candidate files of one argument and the root they are relative to."""
    if is_url(spec):
        try:
            import fsspec
        except ImportError:
            raise InputError(spec, "reading URLs needs fsspec: pip install 'traceanalyzer[dask]'") from None
        fs, _, paths = fsspec.get_fs_token_paths(spec)
        proto = spec.split("://", 1)[0]
        found: list[str] = []
        for p in paths:
            if fs.isdir(p):
                found += [f for f in fs.find(p) if is_candidate(f)]
            elif is_candidate(p) or not any(c in spec for c in "*?["):
                found.append(p)
        root = paths[0] if paths and fs.isdir(paths[0]) else os.path.dirname(paths[0]) if paths else ""

        def unstrip(p: str) -> str:
            return p if is_url(p) else f"{proto}://{p}"

        return sorted(unstrip(f) for f in set(found)), unstrip(root)
    p = Path(spec)
    if any(c in spec for c in "*?["):
        matches = sorted(_glob.glob(spec, recursive=True))
        files: list[str] = []
        for m in matches:
            mp = Path(m)
            if mp.is_dir():
                files += [str(f) for f in _walk_local(mp, exclude)]
            elif mp.is_file() and is_candidate(mp.name):
                files.append(str(mp))
        prefix = re.split(r"[*?\[]", spec, maxsplit=1)[0]
        root = prefix if prefix.endswith(os.sep) else os.path.dirname(prefix)
        return files, root or "."
    if p.is_dir():
        return [str(f) for f in _walk_local(p, exclude)], str(p)
    if p.is_file():
        return [str(p)], str(p.parent)
    raise InputError(spec, "no such file or directory")


def _rel(path: str, root: str) -> str:
    if is_url(path):
        r = path[len(root):].lstrip("/") if root and path.startswith(root) else path.split("://", 1)[1]
        return r or os.path.basename(path)
    try:
        return os.path.relpath(path, root)
    except ValueError:  # other drive on Windows
        return path


def discover(specs: Iterable[str], exclude: str | Path | None = None) -> Discovery:
    """Find every input under ``specs`` (directories, files, globs, fsspec URLs).

    ``exclude`` is a directory never searched (the batch output). Files reached twice
    are analysed once. Raises :class:`InputError` for a path that does not exist.
    """
    ex = Path(exclude) if exclude is not None else None
    specs = list(specs)
    seen: set[str] = set()
    per_spec: list[tuple[list[str], str]] = []
    for s in specs:
        files, root = _expand(s, ex)
        per_spec.append((files, root))
    multi_root = len({root for _, root in per_spec}) > 1
    out = Discovery()
    for files, root in per_spec:
        root_name = Path(root.rstrip("/")).name if multi_root else ""
        for f in files:
            key = f if is_url(f) else str(Path(f).resolve())
            if key in seen:
                continue
            seen.add(key)
            kind, reason, rank, world = classify(f)
            if kind is None:
                out.ignored.append((f, reason))
                continue
            rel = _rel(f, root)
            if root_name and not rel.startswith(root_name + "/"):
                rel = f"{root_name}/{rel}"
            size = _size(f)
            out.inputs.append(Input(path=f, rel=rel.replace(os.sep, "/"), kind=kind, size=size,
                                    rank=rank, world_size=world))
    _dedupe_rels(out.inputs)
    out.inputs = group_runs(out.inputs)
    return out


def _size(path: str) -> int:
    try:
        if is_url(path):
            import fsspec

            fs, _, (p,) = fsspec.get_fs_token_paths(path)
            return int(fs.size(p) or 0)
        return os.path.getsize(path)
    except Exception:  # noqa: BLE001 - size is informative only
        return 0


def _dedupe_rels(inputs: list[Input]) -> None:
    counts: dict[str, int] = {}
    for i, inp in enumerate(inputs):
        n = counts.get(inp.rel, 0)
        counts[inp.rel] = n + 1
        if n:
            inputs[i] = replace(inp, rel=f"{inp.rel}~{n}")


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _parent(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else "."


def _masked(rel: str) -> str:
    return re.sub(r"\d+", "#", rel.rsplit("/", 1)[-1])


def group_runs(inputs: list[Input]) -> list[Input]:
    """Assign ``run`` ids (see the module docstring); order is kept."""
    groups: dict[tuple[str, str, int | None], list[int]] = {}
    run_of: dict[int, str] = {}
    for i, inp in enumerate(inputs):
        if inp.rank is None:
            run_of[i] = inp.rel
            continue
        groups.setdefault((_parent(inp.rel), inp.kind, inp.world_size), []).append(i)
    for (parent, kind, world), idx in groups.items():
        ranks = [inputs[i].rank for i in idx]
        if len(set(ranks)) == len(ranks):
            parts = [idx]
        else:
            by_name: dict[str, list[int]] = {}
            for i in idx:
                by_name.setdefault(_masked(inputs[i].rel), []).append(i)
            parts = list(by_name.values())
        for part in parts:
            pranks = [inputs[i].rank for i in part]
            if len(part) == 1 or len(set(pranks)) != len(pranks):
                for i in part:
                    run_of[i] = inputs[i].rel
                continue
            name = parent if len(parts) == 1 else f"{parent}/{_masked(inputs[part[0]].rel)}"
            if kind != "trace":
                name = f"{name} [{kind}]"
            if world is not None and any(run_of.get(j) == name for j in run_of):
                name = f"{name} (world {world})"
            for i in part:
                run_of[i] = name
    return [replace(inp, run=run_of[i]) for i, inp in enumerate(inputs)]


def read_bytes(path: str) -> bytes:
    """All bytes of a local path or URL."""
    with open_binary(path) as f:
        return f.read()


def discover_some(specs: Iterable[str], exclude: str | Path | None = None) -> Discovery:
    """:func:`discover`, raising :class:`InputError` when it finds no input at all (what
    ``batch`` needs: an empty batch is a usage mistake, not a success)."""
    specs = list(specs)
    found = discover(specs, exclude=exclude)
    if not found.inputs:
        extra = f" ({len(found.ignored)} JSON files are not traces)" if found.ignored else ""
        raise InputError(", ".join(specs), f"no traces or snapshots found (*.json, *.pickle, *.pkl, also .gz){extra}")
    return found
