"""The report document: the one input of every renderer.

A :class:`Report` gathers the input's metadata, the analysis results, the findings
and everything that could not be done (skipped analyses, rules that could not run,
loader warnings). ``to_json()`` is the canonical, versioned JSON form
(``docs/json_schema.md``); the other renderers read the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer import __version__
from traceanalyzer.analyses import Results, summary_of
from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.rules import Finding
from traceanalyzer.units import fmt_bytes, fmt_cell, fmt_ns

#: Evidence keys every time finding carries (the step it is priced against): never "the" evidence line.
_CONTEXT_KEYS = frozenset({"median_step_ms", "steady_steps", "device", "pct_of_step", "confidence"})

JSON_SCHEMA_VERSION = "1.1"


@dataclass(frozen=True)
class Report:
    """Everything one analysed input produced.

    ``source`` is the input path as given; ``kind`` the model kind (``trace``,
    ``snapshot`` …); ``meta`` the model's metadata as JSON; ``findings`` ranked by
    cost; ``below_floor`` the warnings whose cost is under the reporting floor
    (``rules.min_cost_pct``); ``not_run`` maps rule ids to why they could not decide; ``warnings`` are
    the loader's repairs and skips.
    """

    source: str
    kind: str
    meta: dict[str, Any]
    results: Results
    findings: list[Finding] = field(default_factory=list)
    below_floor: list[Finding] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)
    rule_failures: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: Each result's ``to_json()``, built once: summary.json and the page's timeline share it.
    _result_json: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def result_json(self, name: str) -> Any:
        """``to_json()`` of the result ``name``, built on first use and then shared by every
        reader (``to_json``, the renderers): read it, never change it."""
        if name not in self._result_json:
            self._result_json[name] = self.results[name].to_json()
        return self._result_json[name]

    def sections(self) -> list[tuple[str, str, Any]]:
        """(name, title, result) for each result, in report order."""
        specs = analysis_registry()
        names = sorted(self.results.values, key=lambda n: (specs[n].order if n in specs else 999, n))
        return [(n, specs[n].title if n in specs else n, self.results[n]) for n in names]

    def floor_line(self) -> str | None:
        """One line naming the findings held under the reporting floor (None when there are none)."""
        if not self.below_floor:
            return None
        ids = ", ".join(dict.fromkeys(f.rule_id for f in self.below_floor))
        return (f"{len(self.below_floor)} more finding(s) cost under the reporting floor (rules.min_cost_pct, "
                f"% of the median step) and are listed in summary.json under findings_below_floor: {ids}")

    def run_line(self) -> list[tuple[str, str]]:
        """The run in a few facts, what the first line of every report shows: the file, its
        device(s) (``2× NVIDIA A100``), the steps (count, numbers and the median steady step)
        or, for an input without steps, its span; the input kind when it is not a trace."""
        m = self.meta
        facts = [("File", Path(self.source).name or self.source)]
        if self.kind != "trace":
            facts.append(("Input", self.kind.replace("_", " ")))
        names = [str(d.get("name")) for d in m.get("device_properties") or []
                 if isinstance(d, Mapping) and d.get("name")]
        if names:
            counts = dict.fromkeys(names, 0)
            for n in names:
                counts[n] += 1
            facts.append(("Device", ", ".join(f"{c}× {n}" if c > 1 else n for n, c in counts.items())))
        elif isinstance(m.get("devices"), (list, tuple)) and m["devices"]:
            facts.append(("Device", ", ".join(f"cuda:{d}" if isinstance(d, int) else str(d) for d in m["devices"])))
        elif m.get("vendor") == "cpu":
            facts.append(("Device", "CPU only (no GPU activity recorded)"))
        elif m.get("vendor"):
            facts.append(("Device", f"{m['vendor']} (name not recorded)"))
        if m.get("rank") is not None and (m.get("world_size") or 1) > 1:
            facts.append(("Rank", f"{m['rank']} of {m['world_size']}"))
        steps = self.results.values.get("steps")
        table = getattr(steps, "table", None)
        if getattr(steps, "has_steps", False) and table is not None and table.height:
            nums = table["step"].to_list()
            text = f"{len(nums)} (#{nums[0]}–#{nums[-1]})" if len(nums) > 1 else f"1 (#{nums[0]})"
            stats = getattr(steps, "stats", None)
            if isinstance(stats, Mapping) and stats.get("median") is not None:
                text += f", median steady step {fmt_ns(stats['median'])}"
            facts.append(("Steps", text))
        elif m.get("span_ns"):
            facts.append(("Span", fmt_ns(m["span_ns"])))
        return facts

    def verdict(self) -> str:
        """One sentence saying what limits the run, with its number: the ``diagnosis`` verdict
        (its share of the step) when it ran; otherwise the costliest finding; otherwise why
        there is none. Read from the results, never recomputed."""
        diag = self.results.values.get("diagnosis")
        line = getattr(diag, "verdict_line", None)
        if callable(line):
            return str(line())
        if self.findings:
            f = self.findings[0]
            cost = (f"{f.cost_ms_per_step:,.2f} ms per step" if f.cost_ms_per_step is not None
                    else fmt_bytes(f.cost_bytes) if f.cost_bytes is not None else None)
            return f"Top finding: {f.title}" + (f" (costs {cost})" if cost else "")
        peak = self.results.values.get("memory_peak")
        first = summary_of(peak)[:1] if peak is not None else []
        if first:  # a snapshot without findings: its peak is the fact to state
            label, value = first[0]
            return f"No finding; {label.lower()}: {' '.join(value.split())}"
        why = self.results.skipped.get("diagnosis")
        return "No problem found by the checks that could run" + (f"; no diagnosis: {why}" if why else "")

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON document (its analyses' parts are shared: :meth:`result_json`)."""
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "tool": {"name": "traceanalyzer", "version": __version__},
            "source": self.source,
            "kind": self.kind,
            "meta": self.meta,
            "warnings": list(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "findings_below_floor": [f.to_json() for f in self.below_floor],
            "analyses": {name: self.result_json(name) for name, _, _ in self.sections()},
            "skipped_analyses": dict(sorted(self.results.skipped.items())),
            "failed_analyses": dict(sorted(self.results.failed.items())),
            "checks_not_run": dict(sorted(self.not_run.items())),
            "failed_checks": dict(sorted(self.rule_failures.items())),
        }


def key_evidence(finding: Finding) -> tuple[str, str] | None:
    """The one evidence line a ticket shows for ``finding``, as (label, value with its unit):
    the first evidence entry that is a measurement with a unit in its key (``_ms``, ``_ns``,
    ``bytes``, ``pct``; rules put the measurement behind the title first), else the first other
    number, else the first short text, skipping the step context every time finding carries
    (``median_step_ms``, ``steady_steps`` …)."""
    picks: list[tuple[int, str, int | float | str]] = []
    for key, value in finding.evidence.items():
        if key in _CONTEXT_KEYS or isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        if isinstance(value, str):
            if value and len(value) <= 300:
                picks.append((2, key, value))
            continue
        unit = {"ms", "ns", "bytes", "pct"} & set(key.split("_"))
        picks.append((0 if unit else 1, key, value))
    if not picks:
        return None
    _, key, value = min(picks, key=lambda p: p[0])  # min keeps the first of equal ranks
    tokens = key.split("_")
    if "ms" in tokens and isinstance(value, (int, float)):
        tokens.remove("ms")
        text = f"{value:,.3f} ms"
    else:
        text = fmt_cell(key, value)
    label = " ".join(tokens).replace("pct", "%")
    return label, text
