"""load → model → analyses → rules → report → outputs, for one input.

``batch`` and ``compare`` reuse these functions; the CLI (:mod:`traceanalyzer.commands`) only
parses options, calls these and prints the terminal summaries of :mod:`traceanalyzer.report.terminal`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from traceanalyzer.analyses import Results, run_analyses
from traceanalyzer.analyses import discover as discover_analyses
from traceanalyzer.config import Config
from traceanalyzer.errors import ConfigError
from traceanalyzer.model import Model
from traceanalyzer.report import registry as renderer_registry
from traceanalyzer.report.document import Report
from traceanalyzer.rules import Finding, Severity, run_rules
from traceanalyzer.rules import discover as discover_rules
from traceanalyzer.rules import registry as rule_registry
from traceanalyzer.store.cache import load as _cached_load
from traceanalyzer.store.results import for_model as _result_cache

#: Of a chrome trace, ``memory`` runs only the memory analyses; snapshots and timelines run all theirs.
TRACE_MEMORY_ANALYSES = ("trace_memory",)


def load(path: str | Path, use_cache: bool | None = None) -> Model:
    """Load any supported input (trace, snapshot, memory timeline), sniffed by content, through
    the model cache (:mod:`traceanalyzer.store.cache`): an unchanged file is read back from its
    Arrow IPC entry. ``use_cache=False`` parses the file and leaves the cache alone; None
    follows ``TRACEANALYZER_NO_CACHE``.

    The warm-up (:func:`_warm_up`) starts once the file's content hash is done: during the
    hash its imports (numpy's ~0.2 s of GIL-bound work) would hold back the hash's two lanes,
    which take the GIL back after every 1 MiB they read and hash."""
    return _cached_load(path, use_cache, before_read=_warm_up)


_warming: threading.Thread | None = None


def _warm_up() -> None:
    """Once per process, import in a background thread what the analyses and rules import
    on first use (numpy, the ``numpy.ma`` polars imports the first time it reads numpy data,
    every analysis and rule module) while the caller parses its input (the model cache
    calls it before it reads the entry or the file, see :func:`load`). Those imports are
    Python work that holds the GIL; after the load they would delay the first analyses
    while the second core waits, during the load they fill the time the decoder leaves
    it. The thread only imports: anything it does not finish, the first user imports
    itself (the import system makes both wait for one import), and a failure there is
    that user's to report."""
    global _warming
    if _warming is not None:
        return

    def work() -> None:
        try:
            import numpy.ma  # noqa: F401

            discover_analyses()
            discover_rules()
        except Exception:  # noqa: BLE001, S110 - the real import, later, reports it
            pass

    _warming = threading.Thread(target=work, name="traceanalyzer-warm-up", daemon=True)
    _warming.start()


def build_report(model: Model, config: Config | None = None, source: str | None = None) -> Report:
    """Run every applicable analysis and rule on a loaded model. A model that came through the
    model cache reads back the analyses' outcomes kept there (:mod:`traceanalyzer.store.results`)
    and runs only those whose parameters or inputs changed."""
    config = config or Config()
    return report_from_results(model, run_analyses(model, config, cache=_result_cache(model)), config, source)


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
    results = run_analyses(model, config, only=only, cache=_result_cache(model))
    report = report_from_results(model, results, config, source)
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
    """Validate a list of format names (``None`` → every default format; ``all`` → those and ``png``)."""
    known = renderer_registry()
    if not formats:
        return [n for n, s in known.items() if s.default]
    out: list[str] = []
    for f in formats:
        for name in (p.strip() for p in f.split(",")):
            if not name:
                continue
            if name == "all":
                out.extend(n for n, s in known.items() if s.in_all)
            elif name not in known:
                raise ConfigError(f"unknown format {name!r}; choose from: {', '.join(sorted(known))}")
            else:
                out.append(name)
    out = list(dict.fromkeys(out))
    # The page links to the Perfetto export when it exists: write that first.
    if "perfetto" in out and "html" in out and out.index("perfetto") > out.index("html"):
        out.remove("perfetto")
        out.insert(out.index("html"), "perfetto")
    return out


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


#: Of each memory input kind, the analysis that reports its peak (bytes and time).
_PEAK_ANALYSES = {"snapshot": "memory_peak", "memory_timeline": "export_timeline"}


def build_run_report(trace: Report, memory: Sequence[Report], source: str | None = None) -> Report:
    """One report of a run: the trace's report with the memory inputs' (snapshot, memory
    timeline export) analyses and findings beside it, and ``run_memory``, where each memory
    peak lies on the trace's steps (:mod:`traceanalyzer.analyses.run_memory`).

    The inputs' analyses have distinct names per kind, so they share one ``analyses``
    mapping; a rule counts as not run only when it ran on none of the inputs. Each memory
    input's warnings are prefixed with its file name; its path is in ``meta.run_inputs``."""
    from traceanalyzer.analyses.memory_peak import MemoryPeakResult
    from traceanalyzer.analyses.run_memory import MemoryPeak, place_memory_peaks
    from traceanalyzer.analyses.steps import StepsResult

    kinds = [m.kind for m in memory]
    if len(set(kinds)) != len(kinds) or any(k == "trace" for k in kinds):
        raise ValueError(f"build_run_report takes at most one memory input of each kind, got {kinds}")
    values = dict(trace.results.values)
    skipped = dict(trace.results.skipped)
    failed = dict(trace.results.failed)
    findings = list(trace.findings)
    below = list(trace.below_floor)
    not_run = dict(trace.not_run)
    rule_failures = dict(trace.rule_failures)
    warnings = list(trace.warnings)
    peaks: list[MemoryPeak] = []
    for m in memory:
        values.update(m.results.values)
        skipped.update(m.results.skipped)
        failed.update(m.results.failed)
        findings += m.findings
        below += m.below_floor
        not_run = {k: v for k, v in not_run.items() if k in m.not_run}
        rule_failures.update(m.rule_failures)
        name = Path(m.source).name
        warnings += [f"{name}: {w}" for w in m.warnings]
        peak = m.results.values.get(_PEAK_ANALYSES.get(m.kind, ""))
        if isinstance(peak, MemoryPeakResult):
            peaks.append(MemoryPeak(m.source, m.kind, peak.device, peak.peak_allocated_bytes, peak.peak_ts_ns))
        elif peak is not None:
            total, ts = getattr(peak, "peak_total_bytes", None), getattr(peak, "peak_ts_ns", None)
            if isinstance(total, int):
                peaks.append(MemoryPeak(m.source, m.kind, None, total, ts if isinstance(ts, int) else None))
    meta = dict(trace.meta)
    if peaks:
        values["run_memory"] = place_memory_peaks(
            trace.source, int(meta.get("span_start_ns") or 0), int(meta.get("span_end_ns") or 0),
            trace.results.typed("steps", StepsResult), peaks, str(meta.get("vendor") or "") or None)
    meta["run_inputs"] = [{"path": trace.source, "kind": trace.kind},
                          *({"path": m.source, "kind": m.kind, "meta": m.meta} for m in memory)]
    results = Results(values=values, skipped=skipped, failed=failed)
    return Report(source=source or trace.source, kind=trace.kind, meta=meta, results=results,
                  findings=sorted(findings, key=Finding.sort_key), below_floor=below, not_run=not_run,
                  rule_failures=rule_failures, warnings=tuple(warnings))
