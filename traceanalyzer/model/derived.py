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
not outlive the analyses that needed them). :func:`release` drops some of them earlier:
``run_analyses`` releases a table as soon as the last analysis that declares it (``shared=``
in :func:`~traceanalyzer.analyses.analysis`) has run, so a big trace does not hold every
shared table until the end (at 16x df_index_resolver they weigh ~0.5 GB). A table asked
for after its release is simply built again: a missing declaration costs time, never a
wrong number. :func:`rebuilds` counts those (tests check the declarations with it).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

#: id(model) -> (weak reference, key -> table, keys released by :func:`release`,
#: key -> the lock its build holds).
_MEMO: dict[
    int, tuple[weakref.ReferenceType[Any], dict[str, Any], set[str], dict[str, threading.RLock]]
] = {}
_REBUILDS: dict[str, int] = {}
# Guards the dicts above; never held while a table is built (analyses run in threads:
# a table two of them ask for at once is built by one while the other waits for it).
_LOCK = threading.Lock()


def _drop(key: int, ref: weakref.ReferenceType[Any]) -> None:
    with _LOCK:
        hit = _MEMO.get(key)
        if hit is not None and hit[0] is ref:
            del _MEMO[key]


def derived(model: Any, key: str, build: Callable[[], T]) -> T:
    """``build()``, computed once per live ``model`` and ``key`` (thread-safe: concurrent
    callers of one key wait for the one that builds it)."""
    mid = id(model)
    with _LOCK:
        hit = _MEMO.get(mid)
        if hit is None or hit[0]() is not model:
            try:
                ref = weakref.ref(model, lambda r, k=mid: _drop(k, r))
            except TypeError:  # a model type without weakref support: no memo
                hit = None
            else:
                hit = (ref, {}, set(), {})
                _MEMO[mid] = hit
        if hit is not None:
            tables = hit[1]
            if key in tables:
                return tables[key]  # type: ignore[no-any-return]
            lock = hit[3].setdefault(key, threading.RLock())
    if hit is None:
        return build()
    with lock:
        with _LOCK:
            if key in tables:  # built by another thread while this one waited
                return tables[key]  # type: ignore[no-any-return]
            rebuilt = key in hit[2]
        value = build()
        with _LOCK:
            if rebuilt:
                _REBUILDS[key] = _REBUILDS.get(key, 0) + 1
            tables[key] = value
        return value


def release(model: Any, keys: Iterable[str]) -> None:
    """Drop the tables ``keys`` memoised for ``model`` (no longer needed by anyone)."""
    with _LOCK:
        hit = _MEMO.get(id(model))
        if hit is None or hit[0]() is not model:
            return
        for key in keys:
            hit[1].pop(key, None)
            hit[2].add(key)


def rebuilds() -> dict[str, int]:
    """How often each key was built again after its :func:`release` (since the process began)."""
    with _LOCK:
        return dict(_REBUILDS)


def forget(model: Any) -> None:
    """Drop every table memoised for ``model``."""
    with _LOCK:
        hit = _MEMO.get(id(model))
        if hit is not None and hit[0]() is model:
            del _MEMO[id(model)]
