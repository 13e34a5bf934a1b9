"""Run-vs-run (or trace-vs-trace) comparison as pure functions over analysed sides.

A *side* is one trace, or every trace under a directory (the ranks of a run). Each
input is loaded and analysed once with :mod:`traceanalyzer.pipeline`; what the
comparison needs is kept (:class:`Side`) and the model is dropped:

* step-time samples: every steady step of every rank (``steps``), pooled;
* the compact metrics of :mod:`traceanalyzer.batch.summary` (busy %, idle %,
  communication, memory peak), averaged over ranks (peak: the maximum);
* kernels per normalised name (``kernels.by_name``: count, total time);
* CPU ops per name: count and inclusive time (an op's duration includes its children).

Per-name times are compared **per step and per rank** (total ÷ number of step
windows summed over ranks; a trace without ``ProfilerStep`` is one window), so runs
with different step or rank counts compare fairly. Deltas are ranked by impact, the
absolute change of time per step; names present on one side only are ``new`` or
``vanished``. The step-time verdict comes from :mod:`traceanalyzer.compare.stats`.

Before any of that, :mod:`traceanalyzer.compare.comparability` checks that the two sides
ran on the same hardware (device model and count, vendor, world size) and software
(versions, batch size); each input's facts are kept in ``Side.facts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer.compare.comparability import Comparability, check_comparability, input_facts
from traceanalyzer.compare.stats import StepTimeChange, step_time_change
from traceanalyzer.config import Config
from traceanalyzer.errors import InputError
from traceanalyzer.model import KIND_WORDS


@dataclass
class Side:
    """What one side of a comparison contributes (see the module docstring)."""

    label: str
    files: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    n_windows: int = 0
    has_steps: bool = True
    step_samples_ms: list[float] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    kernels: dict[str, tuple[int, int]] = field(default_factory=dict)  # name → (count, total_ns)
    ops: dict[str, tuple[int, int]] = field(default_factory=dict)
    facts: list[dict[str, Any]] = field(default_factory=list)  # per input, comparability.input_facts
    #: (file, warning) of every input the loader had to repair or cut short (truncation,
    #: skipped events …): the comparison states them first, since a truncated side's
    #: missing kernels would otherwise read as "new" on the other side.
    load_warnings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def n_ranks(self) -> int:
        return len(self.files)

    def mean(self, key: str) -> float | None:
        v = [m.get(key) for m in self.metrics if isinstance(m.get(key), (int, float))]
        return round(sum(v) / len(v), 6) if v else None  # type: ignore[arg-type]

    def peak_memory(self) -> int | None:
        v = [m["peak_memory_bytes"] for m in self.metrics if isinstance(m.get("peak_memory_bytes"), int)]
        return max(v) if v else None


def _add(acc: dict[str, tuple[int, int]], df: pl.DataFrame, name: str, count: str, total: str) -> None:
    if df.is_empty() or name not in df.columns:
        return
    for n, c, t in df.select(name, count, total).iter_rows():
        if n is None:
            continue
        c0, t0 = acc.get(n, (0, 0))
        acc[n] = (c0 + int(c or 0), t0 + int(t or 0))


def cpu_op_table(cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """``name, count, total_ns`` (inclusive time) of CPU ops."""
    if cpu_ops.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "count": pl.Int64, "total_ns": pl.Int64})
    return cpu_ops.group_by("name").agg(count=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum())


def add_report(side: Side, source: str, model: Any, report: Any) -> None:
    """Fold one analysed input into ``side``."""
    from traceanalyzer.batch.summary import report_metrics

    m = report_metrics(report)
    side.files.append(source)
    side.kinds.append(report.kind)
    side.metrics.append(m)
    side.facts.append(input_facts(model, report))
    side.load_warnings += [(source, str(w)) for w in (getattr(report, "warnings", None) or ())]
    steps = report.results.values.get("steps")
    if steps is not None:
        side.n_windows += max(1, int(getattr(steps, "n_windows", 1)))
        side.has_steps = side.has_steps and bool(getattr(steps, "has_steps", False))
    else:
        side.n_windows += 1
        side.has_steps = False
    side.step_samples_ms += list(m.get("step_times_ms") or [])
    kr = report.results.values.get("kernels")
    if kr is not None:
        _add(side.kernels, kr.by_name, "name", "count", "total_ns")
    if getattr(model, "kind", None) == "trace":
        _add(side.ops, cpu_op_table(model.cpu_ops), "name", "count", "total_ns")


def inputs_of(path: str) -> list[str]:
    """The files of one side: the file itself, or every trace/snapshot under a directory."""
    p = Path(path)
    if p.is_dir():
        from traceanalyzer.batch.discover import discover

        found = discover([str(p)])
        files = [i.path for i in found.inputs]
        if not files:
            raise InputError(p, "no traces or snapshots found in this directory")
        return files
    if not p.exists():
        raise InputError(p, "no such file or directory")
    return [str(p)]


def load_side(path: str, config: Config | None = None) -> Side:
    """Load and analyse every input of one side. A single bad file raises
    :class:`InputError`; in a directory, bad files are recorded in ``errors`` (all bad: raise)."""
    from traceanalyzer.pipeline import build_report, load

    files = inputs_of(path)
    side = Side(label=path)
    for f in files:
        try:
            model = load(f)
            report = build_report(model, config, source=f)
        except InputError as exc:
            if len(files) == 1:
                raise
            side.errors.append((f, exc.problem))
            continue
        add_report(side, f, model, report)
        del model, report
    if not side.files:
        raise InputError(path, "no input of this side could be analysed: "
                               + "; ".join(f"{Path(f).name}: {e}" for f, e in side.errors))
    return side


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Everything ``compare`` reports; ``to_json()`` is the JSON output."""

    baseline: Side
    candidate: Side
    comparability: Comparability
    step_time: StepTimeChange
    metrics: list[dict[str, Any]]  # name, unit, baseline, candidate, delta, delta_pct
    kernels: pl.DataFrame
    ops: pl.DataFrame
    per: str  # "step" or "trace": what the per-name times are divided by

    def new_kernels(self) -> pl.DataFrame:
        return self.kernels.filter(pl.col("status") == "new")

    def vanished_kernels(self) -> pl.DataFrame:
        return self.kernels.filter(pl.col("status") == "vanished")

    def slower_than(self, pct: float) -> bool:
        """The ``--fail-if-slower`` gate: the median step time grew by more than ``pct`` %
        and the confidence interval excludes no change (without enough steps for an
        interval, the point difference alone decides)."""
        st = self.step_time
        if st.diff_pct is None:
            return False
        if st.diff_pct <= pct:
            return False
        return st.ci_low_ms is None or st.ci_low_ms > 0

    def gate_refusal(self, allow_mismatch: bool = False) -> str | None:
        """Why the ``--fail-if-slower`` gate refuses to judge (``None``: it may): the sides ran
        on different hardware and ``allow_mismatch`` is off."""
        if allow_mismatch or self.comparability.comparable:
            return None
        what = "; ".join(f.phrase() for f in self.comparability.hardware_mismatches)
        return (f"{self.candidate.label}: not comparable with {self.baseline.label} ({what}); the "
                f"--fail-if-slower gate does not call a regression across different hardware "
                f"(pass --allow-mismatch to gate anyway)")

    def input_warnings(self) -> list[str]:
        """One line per load warning of either side, ``baseline <file>: <warning>``: stated
        at the top of every output (a truncated input misses kernels and steps, which the
        comparison would otherwise report as new, vanished or faster)."""
        return [f"{which} {f}: {w}" for which, s in (("baseline", self.baseline), ("candidate", self.candidate))
                for f, w in s.load_warnings]

    def to_json(self, top: int = 200) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            return {"label": s.label, "files": s.files, "errors": [{"file": f, "error": e} for f, e in s.errors],
                    "load_warnings": [{"file": f, "warning": w} for f, w in s.load_warnings],
                    "kinds": sorted(set(s.kinds)), "n_ranks": s.n_ranks, "n_windows": s.n_windows,
                    "has_steps": s.has_steps, "step_times_ms": s.step_samples_ms, "facts": s.facts}

        return {
            "comparability": self.comparability.to_json(),
            "input_warnings": self.input_warnings(),
            "baseline": side(self.baseline),
            "candidate": side(self.candidate),
            "per": self.per,
            "step_time": self.step_time.to_json(),
            "verdict": self.step_time.verdict,
            "metrics": self.metrics,
            "kernels": self.kernels.head(top).to_dicts(),
            "n_kernels_compared": self.kernels.height,
            "new_kernels": self.new_kernels()["name"].to_list(),
            "vanished_kernels": self.vanished_kernels()["name"].to_list(),
            "ops": self.ops.head(top).to_dicts(),
            "n_ops_compared": self.ops.height,
        }


DELTA_SCHEMA = {
    "name": pl.String, "status": pl.String, "base_count": pl.Float64, "cand_count": pl.Float64,
    "count_delta": pl.Float64, "base_ms": pl.Float64, "cand_ms": pl.Float64, "delta_ms": pl.Float64,
    "delta_pct": pl.Float64,
}


def delta_table(base: Mapping[str, tuple[int, int]], cand: Mapping[str, tuple[int, int]],
                base_div: float, cand_div: float) -> pl.DataFrame:
    """Per-name deltas of time per step (ms) and counts, ranked by |Δ time per step|.

    ``*_div`` divides each side's totals (number of step windows summed over ranks).
    Counts are divided the same way (calls per step and rank).
    """
    rows = []
    for name in set(base) | set(cand):
        bc, bt = base.get(name, (0, 0))
        cc, ct = cand.get(name, (0, 0))
        bms = bt / 1e6 / base_div
        cms = ct / 1e6 / cand_div
        status = ("new" if name not in base else "vanished" if name not in cand
                  else "unchanged" if bc == cc and bt == ct and base_div == cand_div else "changed")
        rows.append({
            "name": name, "status": status,
            "base_count": round(bc / base_div, 3), "cand_count": round(cc / cand_div, 3),
            "count_delta": round(cc / cand_div - bc / base_div, 3),
            "base_ms": round(bms, 6), "cand_ms": round(cms, 6), "delta_ms": round(cms - bms, 6),
            "delta_pct": round(100.0 * (cms - bms) / bms, 3) if bms > 0 else None,
        })
    if not rows:
        return pl.DataFrame(schema=DELTA_SCHEMA)
    df = pl.DataFrame(rows, schema=DELTA_SCHEMA)
    return (df.with_columns(_impact=pl.col("delta_ms").abs())
            .sort(["_impact", "name"], descending=[True, False]).drop("_impact"))


_METRICS: tuple[tuple[str, str, str], ...] = (
    ("step_ms", "Step time (median)", "ms"),
    ("gpu_busy_pct", "GPU busy", "%"),
    ("idle_pct", "GPU idle", "%"),
    ("compute_ms_per_step", "Compute per step", "ms"),
    ("comm_ms_per_step", "Communication per step", "ms"),
    ("exposed_comm_ms_per_step", "Exposed communication per step", "ms"),
    ("kernel_ms", "Kernel time (summed, whole trace)", "ms"),
    ("n_kernels", "Kernels (whole trace)", "count"),
)


def _metric_row(key: str, label: str, unit: str, b: float | None, c: float | None) -> dict[str, Any]:
    delta = None if b is None or c is None else round(c - b, 6)
    pct = None if delta is None or not b else round(100.0 * delta / b, 3)
    return {"key": key, "metric": label, "unit": unit, "baseline": b, "candidate": c, "delta": delta,
            "delta_pct": pct}


def compare_sides(base: Side, cand: Side) -> Comparison:
    """The comparison of two loaded sides (pure: no I/O). Comparability is checked first."""
    comparability = check_comparability(base.facts, cand.facts)
    st = step_time_change(base.step_samples_ms, cand.step_samples_ms)
    metrics = [_metric_row(k, label, unit, base.mean(k), cand.mean(k)) for k, label, unit in _METRICS]
    metrics.append(_metric_row("peak_memory_bytes", "Peak memory allocated", "bytes",
                               base.peak_memory(), cand.peak_memory()))
    bd, cd = max(1, base.n_windows), max(1, cand.n_windows)
    return Comparison(
        baseline=base,
        candidate=cand,
        comparability=comparability,
        step_time=st,
        metrics=metrics,
        kernels=delta_table(base.kernels, cand.kernels, bd, cd),
        ops=delta_table(base.ops, cand.ops, bd, cd),
        per="step" if base.has_steps and cand.has_steps else "trace",
    )


def compare_paths(baseline: str, candidate: str, config: Config | None = None) -> Comparison:
    """Load both sides and compare them. Sides of different kinds (traces against memory
    snapshots) are refused: every kernel of the trace side would read as new or vanished."""
    base = load_side(baseline, config)
    cand = load_side(candidate, config)
    bk, ck = set(base.kinds), set(cand.kinds)
    if bk.isdisjoint(ck):
        def words(kinds: set[str]) -> str:
            return " and ".join(KIND_WORDS[k][1] if k in KIND_WORDS else k for k in sorted(kinds))

        raise InputError(candidate, f"holds {words(ck)}, the baseline {words(bk)}: compare needs the same "
                                    "kind of input on both sides")
    return compare_sides(base, cand)


def top_changes(cmp: Comparison, n: int = 5) -> Iterable[dict[str, Any]]:
    """The ``n`` kernel deltas with the most impact."""
    return cmp.kernels.head(n).to_dicts()
