"""Tables derived from one model that several analyses share, built once per run.

Several analyses need the same intermediate tables of a trace: the launch↔GPU join, the
GPU activity with its categories, the CPU interval index behind
:func:`~traceanalyzer.model.relations.deepest_at`, the union of device activity …
A :class:`DerivedTables` holds them for one run of the analyses: ``run_analyses`` creates
one per model and hands it to every analysis in its context; the helpers that build such a
table (:func:`~traceanalyzer.model.relations.gpu_activity`, ``launches``, ``op_index`` …)
take it, or a bare model, in which case they build on a fresh object of their own (the
table is computed, not shared).

Only *pure* functions of the model belong here: the model is immutable, so a shared table is
exactly what a fresh computation would return, and analyses stay pure functions of their
context. Callers must treat returned frames as read-only (polars frames are, unless mutated
in place with ``df[col] = …``/``insert_column``, which analyses never do).

Each table is built lazily, on its first request, by one thread (analyses run in threads: a
table two of them ask for at once is built by one while the other waits). ``readers`` (key →
how many analyses of the run declare it, ``shared=`` in
:func:`~traceanalyzer.analyses.analysis`) lets :meth:`DerivedTables.done` drop a table as soon
as its last declared reader has run, so a big trace does not hold every shared table until
the end. A table asked for after its release is simply built again: a missing declaration
costs time, never a wrong number; :func:`rebuilds` counts those (tests check the
declarations with it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
M = TypeVar("M", covariant=True)

_REBUILDS: dict[str, int] = {}
_REBUILDS_LOCK = threading.Lock()


class DerivedTables(Generic[M]):
    """The shared derived tables of one ``model`` for one run (see the module docstring)."""

    def __init__(self, model: M, readers: Mapping[str, int] | None = None) -> None:
        self._model = model
        self._tables: dict[str, Any] = {}
        self._released: set[str] = set()
        self._building: dict[str, threading.RLock] = {}
        self._readers: dict[str, int] = dict(readers or {})
        # Guards the dicts above; never held while a table is built.
        self._lock = threading.Lock()

    @property
    def model(self) -> M:
        return self._model

    def get(self, key: str, build: Callable[[], T]) -> T:
        """The table ``key``: ``build()`` on the first request, the same object afterwards
        (thread-safe: concurrent callers of one key wait for the one that builds it)."""
        with self._lock:
            if key in self._tables:
                return self._tables[key]  # type: ignore[no-any-return]  # stored by this method as a T
            lock = self._building.setdefault(key, threading.RLock())
        with lock:
            with self._lock:
                if key in self._tables:  # built by another thread while this one waited
                    return self._tables[key]  # type: ignore[no-any-return]  # as above
                rebuilt = key in self._released
            value = build()
            with self._lock:
                self._tables[key] = value
            if rebuilt:
                with _REBUILDS_LOCK:
                    _REBUILDS[key] = _REBUILDS.get(key, 0) + 1
            return value

    def wanted(self, key: str) -> bool:
        """Whether an analysis of this run that declares ``key`` has yet to finish (a table
        built as a by-product of another is kept only then)."""
        with self._lock:
            return self._readers.get(key, 0) > 0

    def held(self) -> frozenset[str]:
        """The keys whose tables are held now."""
        with self._lock:
            return frozenset(self._tables)

    def release(self, keys: Iterable[str]) -> None:
        """Drop the tables ``keys`` (no longer needed by anyone)."""
        with self._lock:
            for key in keys:
                self._tables.pop(key, None)
                self._released.add(key)

    def done(self, keys: Iterable[str]) -> None:
        """One declared reader of each of ``keys`` has finished: drop the tables that have
        no declared reader left."""
        over = []
        with self._lock:
            for key in keys:
                left = self._readers.get(key, 0) - 1
                self._readers[key] = left
                if left <= 0:
                    over.append(key)
        self.release(over)

    def clear(self) -> None:
        """Drop every table."""
        with self._lock:
            self._tables.clear()


def rebuilds() -> dict[str, int]:
    """How often each key was built again after its release (since the process began)."""
    with _REBUILDS_LOCK:
        return dict(_REBUILDS)
