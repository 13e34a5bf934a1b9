"""Module discovery for the registries (analyses, rules, renderers, commands).

Each registry is a package whose modules register themselves with a decorator when
imported; importing every public module of the package once fills the registry, so
adding an analysis, a rule or a format is one new module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType

_done: set[str] = set()


def import_submodules(package: str, skip: Iterable[str] = ()) -> list[ModuleType]:
    """Import the public (not ``_``-prefixed) modules of ``package``, once per process.

    Returns the modules imported by this call (empty when already done).
    """
    if package in _done:
        return []
    pkg = importlib.import_module(package)
    skipped = set(skip)
    modules = [
        importlib.import_module(f"{package}.{m.name}")
        for m in pkgutil.iter_modules(pkg.__path__)
        if not m.name.startswith("_") and m.name not in skipped
    ]
    _done.add(package)
    return modules
