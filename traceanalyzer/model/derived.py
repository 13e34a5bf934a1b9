"""Memo of pure tables derived from one live model (shared by several analyses).

Several analyses need the same intermediate tables of a trace: the launch↔GPU join, the
GPU activity with its categories, the CPU interval index behind
:func:`~traceanalyzer.model.relations.deepest_at`, the union of device activity …
Computing each once per model instead of once per analysis is most of what keeps the
analyses a small fraction of load time.

:func:`derived` memoises ``build()`` under ``key`` for as long as ``model`` lives (keyed
by identity, held by a weak reference: the memo never keeps a model alive, and a new
model at a recycled address never sees an old model's tables). Only *pure* functions of
the model belong here: the model is immutable, so a memoised table is exactly what a
fresh computation would return, and analyses stay pure functions of (model, results,
config). Callers must treat returned frames as read-only (polars frames are, unless
mutated in place with ``df[col] = …``/``insert_column``, which analyses never do).

:func:`forget` drops a model's tables (``run_analyses`` calls it when done, so they do
not outlive the analyses that needed them).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_MEMO: dict[int, tuple["weakref.ReferenceType[Any]", dict[str, Any]]] = {}


def _drop(key: int, ref: "weakref.ReferenceType[Any]") -> None:
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is ref:
        del _MEMO[key]


def derived(model: Any, key: str, build: Callable[[], T]) -> T:
    """``build()``, computed once per live ``model`` and ``key``."""
    mid = id(model)
    hit = _MEMO.get(mid)
    if hit is None or hit[0]() is not model:
        try:
            ref = weakref.ref(model, lambda r, k=mid: _drop(k, r))
        except TypeError:  # a model type without weakref support: no memo
            return build()
        hit = (ref, {})
        _MEMO[mid] = hit
    tables = hit[1]
    if key not in tables:
        tables[key] = build()
    return tables[key]  # type: ignore[no-any-return]


def forget(model: Any) -> None:
    """Drop every table memoised for ``model``."""
    hit = _MEMO.get(id(model))
    if hit is not None and hit[0]() is model:
        del _MEMO[id(model)]
