"""A codec for analysis results that never executes code: JSON for the structure, Arrow IPC for frames.

The result cache (:mod:`traceanalyzer.store.results`) stores each analysis's frozen result
dataclass with this codec, not pickle: a cache directory is a file the user (or anyone who can
write there) controls, and unpickling one runs whatever it says. Decoding here only builds
values of known kinds:

* ``None``, ``bool``, ``int`` (any size), ``float`` (NaN and ±inf included), ``str``;
* ``tuple``, ``list``, ``dict`` (any keys it can encode, insertion order kept), ``set``,
  ``frozenset``;
* ``pl.DataFrame`` and ``pl.Series``: one Arrow IPC blob each (one record batch, as the model
  cache writes tables), decoded by polars' IPC reader;
* :class:`enum.Enum` members and dataclass instances, their class named ``module:qualname``.
  On decoding a class is resolved only when its module is under ``traceanalyzer.`` and the
  object found is a dataclass or an Enum type; anything else is refused
  (:class:`CodecError`). A dataclass is rebuilt field by field without calling its
  ``__init__`` or ``__post_init__`` (as the value was, not as a constructor would redo it).

:func:`encode` raises :class:`Uncodable` for any other value (a numpy array, a callable …):
the caller then simply does not cache that result.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import math
import sys
from typing import Any, Literal

import polars as pl

#: The package whose classes a stored value may name.
TRUSTED_PREFIX = "traceanalyzer."


class Uncodable(Exception):
    """A value this codec has no stored form for (the result is not cached)."""


class CodecError(Exception):
    """A stored document this codec refuses or cannot read (the entry is treated as damaged)."""


def _class_path(cls: type) -> str:
    """``module:qualname`` of a class decoding will resolve; :class:`Uncodable` for one it would
    refuse (outside traceanalyzer, or local to a function)."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    if not cls.__module__.startswith(TRUSTED_PREFIX) or "<locals>" in cls.__qualname__:
        raise Uncodable(f"class {path} is not one decoding resolves")
    return path


#: Compression of the frame blobs. Some results hold per-event frames (the critical path's
#: nodes and edges, the idle gaps, the launches): at 16x they are hundreds of MB uncompressed;
#: zstd keeps them ~25x smaller (lz4 ~9x) and reads back as fast (docs/performance.md).
FRAME_COMPRESSION: Literal["uncompressed", "lz4", "zstd"] = "zstd"


def _frame_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    # One record batch: read back as one chunk, as the analysis built it.
    df.write_ipc(buf, compression=FRAME_COMPRESSION, record_batch_size=max(df.height, 1))
    return buf.getvalue()


def encode(value: Any) -> tuple[Any, list[bytes]]:
    """``(doc, blobs)``: a JSON-able document of ``value`` and the IPC blobs its frames refer
    to (by index). Raises :class:`Uncodable` for a value with no stored form."""
    blobs: list[bytes] = []

    def enc(v: Any) -> Any:
        # bool before int (a bool is an int); exact types: a subclass (an IntEnum …) is not a plain value.
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            return v if -(2**63) <= v < 2**63 else {"$int": str(v)}
        if t is float:
            return v if math.isfinite(v) else {"$float": repr(v)}
        if t is tuple:
            return {"$tuple": [enc(x) for x in v]}
        if t is list:
            return [enc(x) for x in v]
        if t is dict:
            return {"$dict": [[enc(k), enc(x)] for k, x in v.items()]}
        if t is set or t is frozenset:
            return {"$set" if t is set else "$frozenset": [enc(x) for x in v]}
        if t is pl.DataFrame or t is pl.Series:
            try:
                blobs.append(_frame_bytes(v if t is pl.DataFrame else v.to_frame()))
            except Exception as exc:  # noqa: BLE001 - an object column or the like: no IPC form
                raise Uncodable(f"a {t.__name__} with no IPC form ({type(exc).__name__}: {exc})") from None
            return {"$frame" if t is pl.DataFrame else "$series": len(blobs) - 1}
        if isinstance(v, enum.Enum):
            return {"$enum": _class_path(t), "name": v.name}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {"$dataclass": _class_path(t),
                    "fields": {f.name: enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        raise Uncodable(f"no stored form for a {t.__module__}.{t.__qualname__}")

    return enc(value), blobs


def resolve_class(path: str) -> type:
    """The class ``module:qualname`` names, if it is a dataclass or an Enum type of a module
    under ``traceanalyzer.``; else :class:`CodecError`."""
    module, _, qualname = path.partition(":")
    if not module.startswith(TRUSTED_PREFIX) or not qualname:
        raise CodecError(f"refusing class {path!r}: not a class of traceanalyzer")
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise CodecError(f"class {path!r}: {exc}") from None
    obj: Any = mod
    for part in qualname.split("."):
        if part.startswith("__"):  # no dunder walk (__class__, __globals__ …)
            raise CodecError(f"refusing class {path!r}")
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or not (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
        raise CodecError(f"refusing class {path!r}: not a dataclass or Enum type")
    return obj


def decode(doc: Any, blobs: list[bytes]) -> Any:
    """The value :func:`encode` stored as ``doc`` and ``blobs``. Raises :class:`CodecError` for
    a document it did not write (an unknown tag, a class outside traceanalyzer …)."""

    # Every blob read in one polars query: side by side, taking the GIL back once (a result
    # holds up to a dozen frames, and analyses read theirs in threads).
    frames = pl.collect_all([pl.scan_ipc(b) for b in blobs]) if len(blobs) > 1 else None

    def dec(d: Any) -> Any:
        if d is None or isinstance(d, (bool, int, float, str)):
            return d
        if isinstance(d, list):
            return [dec(x) for x in d]
        if not isinstance(d, dict) or len(d) not in (1, 2):
            raise CodecError(f"unexpected node {type(d).__name__}")
        if "$tuple" in d:
            return tuple(dec(x) for x in d["$tuple"])
        if "$dict" in d:
            return {dec(k): dec(x) for k, x in d["$dict"]}
        if "$set" in d:
            return {dec(x) for x in d["$set"]}
        if "$frozenset" in d:
            return frozenset(dec(x) for x in d["$frozenset"])
        if "$int" in d:
            return int(d["$int"])
        if "$float" in d:
            text = d["$float"]
            if text not in ("nan", "inf", "-inf"):
                raise CodecError(f"unexpected float {text!r}")
            return float(text)
        if "$frame" in d or "$series" in d:
            frame = "$frame" in d
            index = d["$frame" if frame else "$series"]
            if type(index) is not int:
                raise CodecError(f"unexpected blob index {index!r}")
            df = frames[index] if frames is not None else pl.read_ipc(blobs[index])
            return df if frame else df.to_series(0)
        if "$enum" in d:
            cls = resolve_class(d["$enum"])
            if not issubclass(cls, enum.Enum):
                raise CodecError(f"{d['$enum']} is not an Enum")
            return cls[d["name"]]
        if "$dataclass" in d:
            cls = resolve_class(d["$dataclass"])
            if not dataclasses.is_dataclass(cls):
                raise CodecError(f"{d['$dataclass']} is not a dataclass")
            fields = d["fields"]
            names = {f.name for f in dataclasses.fields(cls)}
            if set(fields) != names:
                raise CodecError(f"{d['$dataclass']}: stored fields differ from the class's")
            obj = object.__new__(cls)
            for name, x in fields.items():
                object.__setattr__(obj, name, dec(x))  # frozen dataclasses: as their __init__ does
            return obj
        raise CodecError(f"unknown tag {next(iter(d))!r}")

    try:
        return dec(doc)
    except CodecError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise CodecError(f"malformed document ({type(exc).__name__}: {exc})") from None


__all__ = ["TRUSTED_PREFIX", "CodecError", "Uncodable", "decode", "encode", "resolve_class"]
