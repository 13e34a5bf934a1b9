"""Name tests over event tables whose names repeat (private to the analyses package).

Thousands of events carry tens of distinct names: a regex evaluated once per distinct name
and a membership test per row is cheaper than the regex per row, above all over long kernel
names.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import polars as pl

# Per (frame, column): the frame (weakly), its distinct values and the ones each pattern
# matched. The model's tables are asked about many patterns by many analyses (``cpu_ops``
# alone about a dozen per run): the distinct values are found once per frame, not once per
# pattern, and a pattern asked twice is not run again. Frames are read-only (analyses never
# mutate one in place), so what a frame's column held when first asked is what it holds; an
# entry goes with its frame (the weak reference's callback).
_SEEN: dict[tuple[int, str], tuple[weakref.ref[pl.DataFrame], pl.Series, dict[str, pl.Series]]] = {}
_LOCK = threading.Lock()


def _dropper(key: tuple[int, str]) -> Callable[[weakref.ref[pl.DataFrame]], None]:
    """The weak reference's callback: forget ``key`` once its frame is gone."""
    def drop(_: weakref.ref[pl.DataFrame]) -> None:
        with _LOCK:
            _SEEN.pop(key, None)
    return drop


def _matching(df: pl.DataFrame, pattern: str, col: str) -> pl.Series:
    """The distinct values of ``df[col]`` that ``pattern`` matches (nulls excluded)."""
    key = (id(df), col)
    with _LOCK:
        hit = _SEEN.get(key)
    if hit is None or hit[0]() is not df:
        hit = (weakref.ref(df, _dropper(key)), df[col].unique(), {})
        with _LOCK:
            _SEEN[key] = hit
    found = hit[2].get(pattern)
    if found is None:
        names = hit[1]
        found = names.filter(names.str.contains(pattern))
        hit[2][pattern] = found
    return found


def contains_by_name(df: pl.DataFrame, pattern: str, col: str = "name") -> pl.Expr:
    """``pl.col(col).str.contains(pattern)`` for the rows of ``df``, the regex run once per
    distinct value of ``df[col]`` and each row tested for membership in the matching ones:
    the same values, nulls included (names repeat: thousands of events, tens of names, and a
    regex over long kernel names costs more than a hash). Only valid on ``df`` itself."""
    if df.height < 4096:  # small frames: the plain test is cheaper than the distinct pass
        return pl.col(col).str.contains(pattern)
    return pl.col(col).is_in(_matching(df, pattern, col).implode())
