"""Name tests over event tables whose names repeat (private to the analyses package).

Thousands of events carry tens of distinct names: a regex evaluated once per distinct name
and a membership test per row is cheaper than the regex per row, above all over long kernel
names.
"""

from __future__ import annotations

import polars as pl


def contains_by_name(df: pl.DataFrame, pattern: str, col: str = "name") -> pl.Expr:
    """``pl.col(col).str.contains(pattern)`` for the rows of ``df``, the regex run once per
    distinct value of ``df[col]`` and each row tested for membership in the matching ones:
    the same values, nulls included (names repeat: thousands of events, tens of names, and a
    regex over long kernel names costs more than a hash). Only valid on ``df`` itself."""
    if df.height < 4096:  # small frames: the plain test is cheaper than the distinct pass
        return pl.col(col).str.contains(pattern)
    names = df[col].unique()
    return pl.col(col).is_in(names.filter(names.str.contains(pattern)).implode())
