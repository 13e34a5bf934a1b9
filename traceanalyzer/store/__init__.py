"""Loaded models on disk: the columnar model cache and the Parquet export.

* :mod:`traceanalyzer.store.cache` — a loaded model written once as Arrow IPC in the user cache
  directory, keyed by the file's content hash and the loader version; a re-run of an unchanged
  file reads it back instead of parsing (docs/performance.md, "Model cache").
* :mod:`traceanalyzer.store.export` — ``traceanalyzer export``: the model's tables as Parquet
  files for polars or DuckDB (docs/export.md).

Both split a model the same way (:func:`split_model`): its ``pl.DataFrame`` fields are the
tables, ``meta`` (a frozen dataclass) and ``warnings`` go to JSON. A model with any other
field is not stored (:class:`NotStorable`), so a new kind of field never round-trips wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import polars as pl

from traceanalyzer.model import MemoryTimelineModel, Model, SnapshotModel, TraceModel
from traceanalyzer.model.memory import MemoryTimelineMeta, SnapshotMeta
from traceanalyzer.model.trace import TraceMeta

#: kind → (model class, meta class): what :func:`join_model` rebuilds.
MODEL_CLASSES: dict[str, tuple[type[Any], type[Any]]] = {
    "trace": (TraceModel, TraceMeta),
    "snapshot": (SnapshotModel, SnapshotMeta),
    "memory_timeline": (MemoryTimelineModel, MemoryTimelineMeta),
}


class NotStorable(Exception):
    """A model that does not round-trip through tables + JSON (an unknown field, a meta value
    JSON changes, such as a NaN or a nested tuple); it is simply not cached."""


def model_tables(model: Model) -> dict[str, pl.DataFrame]:
    """The model's tables (every ``pl.DataFrame`` field), in declaration order."""
    return {f.name: v for f in dataclasses.fields(model) if isinstance(v := getattr(model, f.name), pl.DataFrame)}


def split_model(model: Model) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """``(tables, doc)``: the tables and a JSON-able document of everything else (kind, meta
    fields, which of them are tuples, warnings). Raises :class:`NotStorable` when
    :func:`join_model` would not give back an equal model."""
    if model.kind not in MODEL_CLASSES:
        raise NotStorable(f"no stored form for models of kind {model.kind!r}")
    tables = model_tables(model)
    extra = [f.name for f in dataclasses.fields(model) if f.name not in tables and f.name not in ("meta", "warnings")]
    if extra:
        raise NotStorable(f"model fields with no stored form: {', '.join(extra)}")
    meta = model.meta
    fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
    doc = {
        "kind": model.kind,
        "meta": {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()},
        "meta_tuples": [k for k, v in fields.items() if isinstance(v, tuple)],
        "warnings": list(model.warnings),
    }
    try:
        again = orjson.loads(orjson.dumps(doc))
    except TypeError as exc:  # a value JSON cannot hold
        raise NotStorable(f"meta does not convert to JSON: {exc}") from None
    if _meta_from(again) != meta or tuple(again["warnings"]) != model.warnings:
        raise NotStorable("meta changes through JSON (a NaN, a nested tuple …)")
    return tables, doc


def _meta_from(doc: dict[str, Any]) -> Any:
    _, meta_cls = MODEL_CLASSES[doc["kind"]]
    fields = dict(doc["meta"])
    for k in doc["meta_tuples"]:
        fields[k] = tuple(fields[k])
    return meta_cls(**fields)


def join_model(doc: dict[str, Any], tables: dict[str, pl.DataFrame], path: str | None = None) -> Model:
    """The model :func:`split_model` took apart; ``path`` replaces ``meta.path`` (the same bytes
    read from another location name that location, as the loader would)."""
    model_cls, _ = MODEL_CLASSES[doc["kind"]]
    meta = _meta_from(doc)
    if path is not None and hasattr(meta, "path"):
        meta = dataclasses.replace(meta, path=path)
    model: Model = model_cls(meta=meta, warnings=tuple(doc["warnings"]), **tables)
    return model


def schema_doc(df: pl.DataFrame) -> dict[str, str]:
    """``column → dtype`` as text (what an entry records and checks on reading)."""
    return {name: str(dtype) for name, dtype in df.schema.items()}


__all__ = ["MODEL_CLASSES", "NotStorable", "join_model", "model_tables", "schema_doc", "split_model"]
