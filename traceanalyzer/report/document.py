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
from traceanalyzer.analyses import Results, registry as analysis_registry
from traceanalyzer.rules import Finding

JSON_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class Report:
    """Everything one analysed input produced.

    ``source`` is the input path as given; ``kind`` the model kind (``trace``,
    ``snapshot`` …); ``meta`` the model's metadata as JSON; ``findings`` ranked by
    cost; ``not_run`` maps rule ids to why they could not decide; ``warnings`` are
    the loader's repairs and skips.
    """

    source: str
    kind: str
    meta: dict[str, Any]
    results: Results
    findings: list[Finding] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)
    rule_failures: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def sections(self) -> list[tuple[str, str, Any]]:
        """(name, title, result) for each result, in report order."""
        specs = analysis_registry()
        names = sorted(self.results.values, key=lambda n: (specs[n].order if n in specs else 999, n))
        return [(n, specs[n].title if n in specs else n, self.results[n]) for n in names]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "tool": {"name": "traceanalyzer", "version": __version__},
            "source": self.source,
            "kind": self.kind,
            "meta": self.meta,
            "warnings": list(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "analyses": {name: result.to_json() for name, _, result in self.sections()},
            "skipped_analyses": dict(sorted(self.results.skipped.items())),
            "failed_analyses": dict(sorted(self.results.failed.items())),
            "checks_not_run": dict(sorted(self.not_run.items())),
            "failed_checks": dict(sorted(self.rule_failures.items())),
        }
