"""The resource budget a snapshot pickle must fit in before it is built (docs/memory.md).

A pickle is a program: a few bytes can name one object many times through the memo
(``MEMOIZE``/``GET``), so a 184-byte file can describe a billion-element tree, and a
gzip can expand a megabyte into a gigabyte of ``APPENDS``. The opcode walk of
:func:`~traceanalyzer.load.safe_pickle.scan_opcodes` (and the streaming reader for
large files, :mod:`~traceanalyzer.load.pickle_stream`) checks each limit as it goes and
refuses the file with one line naming the limit and how to raise it, before the loader
builds anything from it.

Limits, each raised with an environment variable (``TRACEANALYZER_SNAPSHOT_<NAME>``,
e.g. ``TRACEANALYZER_SNAPSHOT_MAX_OBJECTS=4000000000``) or
``load_snapshot(path, budget=PickleBudget(...))``:

``max_objects``
    Objects built, counting every memo reference as the whole object it names *again*
    (everything that object held at that moment): a reference to a 1 M-element list
    costs 1 M. Shared references therefore cannot multiply past the budget.
``max_items``
    Elements in one container, and in one ``APPENDS``/``SETITEMS``/``LIST``/``DICT``.
``max_string_bytes``
    Length of one string or bytes value.
``max_depth``
    Nesting depth of containers (a real snapshot nests 7 deep).
``max_gzip_ratio``
    Unpacked bytes of a gzip-compressed snapshot per compressed byte, beyond a free
    32 MB (real snapshots compress 4-40×; a gzip bomb ≈ 1000×).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

ENV_PREFIX = "TRACEANALYZER_SNAPSHOT_"


class BudgetExceeded(Exception):
    """The pickle would build more than the budget allows; the message says which limit,
    its value and how to raise it."""


@dataclass(frozen=True)
class PickleBudget:
    """Limits on what one snapshot pickle may build (see the module docstring).

    Defaults leave a wide margin over the real snapshots in ``../shared`` (largest:
    0.21 M objects counted with memo references (0.43 per file byte), 5,163 elements
    in one container, strings ≤ 122 bytes, depth 9, gzip ratio ≤ 37). Every limit is
    checked on every path: by the opcode scan of the files built whole in memory
    (≤ 16 MB unpacked), and by the streaming reader that takes the larger ones."""

    max_objects: int = 500_000_000
    max_items: int = 200_000_000
    max_string_bytes: int = 64 << 20
    max_depth: int = 100
    max_gzip_ratio: int = 100

    @classmethod
    def from_env(cls) -> PickleBudget:
        """The defaults, overridden by ``TRACEANALYZER_SNAPSHOT_MAX_*`` variables."""
        kw: dict[str, int] = {}
        for f in fields(cls):
            raw = os.environ.get(ENV_PREFIX + f.name.upper())
            if raw:
                try:
                    kw[f.name] = int(float(raw))
                except ValueError:
                    pass  # a malformed override keeps the default rather than failing every load
        return cls(**kw)

    def exceeded(self, name: str, what: str) -> BudgetExceeded:
        """The one-line refusal for limit ``name`` (a field of this class)."""
        limit = getattr(self, name)
        return BudgetExceeded(
            f"refused: {what} exceeds the snapshot budget ({name} = {limit:,}); if the file is genuine, "
            f"raise it with --snapshot-limit {name}=N (or {ENV_PREFIX}{name.upper()}=N; "
            "docs/memory.md, 'Input budget')")


# (what the limit counts, what trips it) per field, for the budget table
# (:data:`traceanalyzer.load.budget.LIMITS`).
LIMIT_TEXT: dict[str, tuple[str, str]] = {
    "max_objects": ("objects a snapshot pickle builds, each memo reference counted as the whole object again",
                    "a 'billion laughs' pickle (one list referenced thousands of times)"),
    "max_items": ("elements of one list/dict/tuple of a snapshot pickle",
                  "a pickle of 10^9 APPENDS, a forged container length"),
    "max_string_bytes": ("bytes of one string of a snapshot pickle", "a forged or huge string"),
    "max_depth": ("nesting levels of a snapshot pickle's containers (real snapshots nest 9 deep)",
                  "nested lists/tuples built to overflow a stack"),
    "max_gzip_ratio": ("unpacked bytes per compressed byte of a .pickle.gz, beyond a free 32 MB",
                       "a gzip bomb"),
}


__all__ = ["BudgetExceeded", "ENV_PREFIX", "LIMIT_TEXT", "PickleBudget"]
