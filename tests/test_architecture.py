"""The package's layers point one way (docs/architecture.md).

Each top-level part of ``traceanalyzer`` has a rank; a module may import only from parts of a
lower rank or from its own part. Imports made for type checking only (under
``if TYPE_CHECKING:``) do not count: they never run. The test reads the source (ast), so it
also catches an import inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

PKG = Path(__file__).resolve().parent.parent / "traceanalyzer"

#: Lower first. The base modules know nothing of the pipeline; models know only the base;
#: loaders fill models; the store caches and exports loaded models; analyses read models; rules
#: read results; the report renders them;
#: the pipeline strings these together; batch and compare drive the pipeline; commands parse
#: options and call them; the CLI registers the commands.
RANK = {
    "errors": 0, "units": 0, "timeutil": 0, "plugins": 0, "progress": 0, "supervise": 0,
    "config": 1, "model": 1, "fsutil": 1,
    "load": 2, "analyses": 2,
    "rules": 3, "store": 3,
    "params": 4, "report": 4,
    "pipeline": 5,
    "batch": 6,
    "compare": 7,
    "commands": 8,
    "cli": 9, "": 9,  # "" is traceanalyzer/__init__.py, the public API
    "__main__": 10,
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of the package outside ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "traceanalyzer":
                out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "traceanalyzer")
    return out


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_part_has_a_rank() -> None:
    parts = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in _modules()}
    parts.discard("__init__")
    assert parts <= set(RANK), f"parts without a rank in this test: {sorted(parts - set(RANK))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path: Path) -> None:
    rel = path.relative_to(PKG)
    part = "" if rel.parts == ("__init__.py",) else rel.parts[0].removesuffix(".py")
    bad = []
    for line, module, names in _runtime_imports(ast.parse(path.read_text())):
        target = _part(module)
        if target == "" and names == ["__version__"]:
            continue  # the version string: a constant, not the API the package root re-exports
        if target != part and RANK[target] >= RANK[part]:
            bad.append(f"line {line}: {module} ({target or 'traceanalyzer'}, rank {RANK[target]})")
    assert not bad, f"{rel} ({part or 'traceanalyzer'}, rank {RANK[part]}) imports upwards: {bad}"


def test_no_lower_layer_formats_through_report() -> None:
    """Unit formatting lives in traceanalyzer/units.py: nothing under load/, model/,
    analyses/ or rules/ reaches into report/ (the rank check covers it; this names it)."""
    offenders = [
        str(p.relative_to(PKG))
        for part in ("load", "model", "analyses", "rules")
        for p in (PKG / part).rglob("*.py")
        if any(_part(m) == "report" for _, m, _ in _runtime_imports(ast.parse(p.read_text())))
    ]
    assert offenders == []


def test_the_test_generator_is_not_installed() -> None:
    """The synthetic trace generator lives in tests/support/, outside the package."""
    assert not (PKG / "testing").exists()
    assert all("support" not in m for p in _modules() for _, m, _ in _runtime_imports(ast.parse(p.read_text())))


def _public_modules(part: str) -> set[str]:
    return {p.stem for p in (PKG / part).glob("*.py") if not p.stem.startswith("_")}


def test_every_public_module_registers_itself() -> None:
    """docs/architecture.md counts an analysis, a rule or an output format as one module (plus
    its test) because each package discovers its modules: every public module of analyses/,
    rules/ and report/ (but the shared ones named here) registers at least one entry."""
    from traceanalyzer.analyses import registry as analyses
    from traceanalyzer.report import discover as discover_report
    from traceanalyzer.report import registry as renderers
    from traceanalyzer.report.charts import registry as charts
    from traceanalyzer.rules import registry as rules

    def owners(specs: dict[str, Any]) -> set[str]:
        return {s.func.__module__.rsplit(".", 1)[1] for s in specs.values()}

    assert _public_modules("analyses") == owners(dict(analyses()))
    assert _public_modules("rules") == owners(dict(rules()))
    # report/: the document, charts, terminal summaries, text and file helpers are shared parts; a module of
    # its own may register a chart (roofline) instead of an output format.
    discover_report()
    own_charts = owners(dict(charts())) - {"charts"}
    assert _public_modules("report") - {"document", "charts", "terminal", "text", "fsutil"} == owners(
        dict(renderers())) | own_charts


def test_architecture_doc_names_files_that_exist() -> None:
    """Every repository path the addition tables of docs/architecture.md name exists (a
    placeholder like ``<kind>`` excepted)."""
    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    section = doc[doc.index("### What an addition touches"):doc.index("## Errors and exit codes")]
    import re

    named = set(re.findall(r"`((?:traceanalyzer/|tests/|docs/|scripts/)?[a-z_/]+\.(?:py|md))`", section))
    missing = []
    for path in sorted(named):
        if "<" in path:
            continue
        # A bare or partial name is relative to the part the sentence is about (load/ …).
        if not (PKG.parent / path).exists() and not any(PKG.rglob(path)):
            missing.append(path)
    assert missing == []
