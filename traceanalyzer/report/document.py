"""The report document: the one input of every renderer.

A :class:`Report` gathers the input's metadata, the analysis results, the findings
and everything that could not be done (skipped analyses, rules that could not run,
loader warnings). ``to_json()`` is the canonical, versioned JSON form
(``docs/json_schema.md``); the other renderers read the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traceanalyzer import __version__
from traceanalyzer.analyses import Results
from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.rules import Finding

JSON_SCHEMA_VERSION = "1.0"


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

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "tool": {"name": "traceanalyzer", "version": __version__},
            "source": self.source,
            "kind": self.kind,
            "meta": self.meta,
            "warnings": list(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "findings_below_floor": [f.to_json() for f in self.below_floor],
            "analyses": {name: result.to_json() for name, _, result in self.sections()},
            "skipped_analyses": dict(sorted(self.results.skipped.items())),
            "failed_analyses": dict(sorted(self.results.failed.items())),
            "checks_not_run": dict(sorted(self.not_run.items())),
            "failed_checks": dict(sorted(self.rule_failures.items())),
        }
