"""Renderers: turn a :class:`~traceanalyzer.report.document.Report` into files.

A renderer is one module in this package with a decorated function::

    @renderer("md", description="Markdown summary for tickets")
    def render(report: Report, outdir: Path) -> list[Path]: ...

Renderers never recompute: they only format what the report holds. Modules here are
discovered automatically, so a new output format is one module plus its test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from traceanalyzer.plugins import import_submodules

if TYPE_CHECKING:
    from traceanalyzer.report.document import Report

RenderFunc = Callable[["Report", Path], list[Path]]


@dataclass(frozen=True)
class RendererSpec:
    name: str
    func: RenderFunc
    description: str
    default: bool
    in_all: bool


_REGISTRY: dict[str, RendererSpec] = {}


def renderer(name: str, *, description: str, default: bool = True,
             in_all: bool | None = None) -> Callable[[RenderFunc], RenderFunc]:
    """Register an output format; ``default`` formats are written when none is asked for, ``in_all``
    ones (default: the default ones) by ``--format all`` (``png``: not a default, being slow, but in
    ``all``)."""

    def deco(func: RenderFunc) -> RenderFunc:
        _REGISTRY[name] = RendererSpec(name, func, description, default, default if in_all is None else in_all)
        return func

    return deco


def discover() -> None:
    """Import every module of this package so their decorators register."""
    import_submodules(__name__, skip=("document",))


def registry() -> dict[str, RendererSpec]:
    discover()
    return dict(_REGISTRY)


def default_formats() -> list[str]:
    return [n for n, s in registry().items() if s.default]


def all_formats() -> list[str]:
    """What ``--format all`` writes: the default formats and the slow opt-in ones (``png``)."""
    return [n for n, s in registry().items() if s.in_all]


__all__ = ["RendererSpec", "all_formats", "default_formats", "registry", "renderer"]
