"""load → model → analyses → rules → report → outputs, for one input.

``batch`` and ``compare`` reuse these functions; the CLI (:mod:`traceanalyzer.commands`) only
parses options, calls these and prints the terminal summaries of :mod:`traceanalyzer.report.terminal`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from traceanalyzer.analyses import Results, run_analyses
from traceanalyzer.config import Config
from traceanalyzer.errors import ConfigError
from traceanalyzer.model import Model
from traceanalyzer.report import registry as renderer_registry
from traceanalyzer.report.document import Report
from traceanalyzer.rules import Finding, Severity, run_rules
from traceanalyzer.rules import registry as rule_registry
from traceanalyzer.store.cache import load as _cached_load

#: Of a chrome trace, ``memory`` runs only the memory analyses; snapshots and timelines run all theirs.
TRACE_MEMORY_ANALYSES = ("trace_memory",)


def load(path: str | Path, use_cache: bool | None = None) -> Model:
    """Load any supported input (trace, snapshot, memory timeline), sniffed by content, through
    the model cache (:mod:`traceanalyzer.store.cache`): an unchanged file is read back from its
    Arrow IPC entry. ``use_cache=False`` parses the file and leaves the cache alone; None
    follows ``TRACEANALYZER_NO_CACHE``."""
    return _cached_load(path, use_cache)


def build_report(model: Model, config: Config | None = None, source: str | None = None) -> Report:
    """Run every applicable analysis and rule on a loaded model."""
    config = config or Config()
    return report_from_results(model, run_analyses(model, config), config, source)


def report_from_results(model: Model, results: Results, config: Config | None = None,
                        source: str | None = None) -> Report:
    """The report of a loaded model whose analyses already ran: the rules, then the document."""
    config = config or Config()
    outcome = run_rules(results, config)
    meta = model.meta.to_json() if hasattr(model, "meta") else {}
    return Report(
        source=source or str(meta.get("path", "")),
        kind=model.kind,
        meta=meta,
        results=results,
        findings=outcome.findings,
        below_floor=outcome.below_floor,
        not_run=outcome.not_run,
        rule_failures=outcome.failed,
        warnings=tuple(getattr(model, "warnings", ())),
    )


def build_memory_report(model: Model, config: Config | None = None, source: str | None = None) -> Report:
    """The memory report of a loaded model (``traceanalyzer memory``): of a chrome trace only
    :data:`TRACE_MEMORY_ANALYSES` and the rules that read them; of a snapshot or memory
    timeline every analysis and rule of its kind."""
    config = config or Config()
    only = TRACE_MEMORY_ANALYSES if model.kind == "trace" else None
    report = report_from_results(model, run_analyses(model, config, only=only), config, source)
    if model.kind != "trace":
        return report
    # Rules about other signals (kernels, steps …) would only say "could not run" here.
    specs = rule_registry()
    not_run = {k: v for k, v in report.not_run.items()
               if k in specs and set(specs[k].needs + specs[k].needs_any) & set(TRACE_MEMORY_ANALYSES)}
    return dataclasses.replace(report, not_run=not_run)


def findings_at_or_above(report: Report, severity: str) -> list[Finding]:
    """The findings of ``severity`` (``info``, ``warning``, ``critical``) or worse: what trips
    ``--fail-on``."""
    threshold = Severity.parse(severity)
    return [f for f in report.findings if f.severity >= threshold]


def default_outdir(path: str | Path) -> Path:
    """``./<file name without .json/.gz/.pickle/.pkl>.traceanalyzer`` in the current directory
    (the input's own directory may be read-only, e.g. a shared mount)."""
    name = Path(path).name
    for suffix in (".gz", ".json", ".pickle", ".pkl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path.cwd() / f"{name}.traceanalyzer"


def analyze(path: str | Path, config: Config | None = None) -> Report:
    """Load ``path`` and build its report (no files written)."""
    return build_report(load(path), config, source=str(path))


def resolve_formats(formats: Iterable[str] | None) -> list[str]:
    """Validate a list of format names (``None``/``all`` → every default format)."""
    known = renderer_registry()
    if not formats:
        return [n for n, s in known.items() if s.default]
    out: list[str] = []
    for f in formats:
        for name in (p.strip() for p in f.split(",")):
            if not name:
                continue
            if name == "all":
                out.extend(n for n, s in known.items() if s.default)
            elif name not in known:
                raise ConfigError(f"unknown format {name!r}; choose from: {', '.join(sorted(known))}")
            else:
                out.append(name)
    return list(dict.fromkeys(out))


def write_outputs(report: Report, outdir: str | Path, formats: Iterable[str] | None = None) -> list[Path]:
    """Render ``report`` into ``outdir`` in each format; returns the files written."""
    from traceanalyzer.report.fsutil import make_dir

    out = Path(outdir)
    make_dir(out)
    written: list[Path] = []
    known = renderer_registry()
    for name in resolve_formats(formats):
        written.extend(known[name].func(report, out))
    return written
