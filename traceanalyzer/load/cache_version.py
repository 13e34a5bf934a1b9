"""The version of what the loaders produce, for the model cache (:mod:`traceanalyzer.store.cache`).

**Rule:** bump :data:`LOADER_VERSION` in the same commit as any change that alters a loader's
output for some input: a column added, removed, renamed or retyped in a model's tables, a
value computed differently, a row kept or dropped, a meta field or a warning's wording. A
cached model keyed by an older version is then never read again (it ages out of the cache).
Refactors that leave every model identical need no bump.

The cache key also holds a digest of the source files of ``traceanalyzer/load`` and
``traceanalyzer/model`` (:func:`traceanalyzer.store.cache.source_digest`), so a change forgotten
here still misses; the constant is what a release, where sources may not be readable, relies on.
"""

from __future__ import annotations

#: Bumped whenever some input would load into a different model (see the module docstring).
LOADER_VERSION = 3

__all__ = ["LOADER_VERSION"]
