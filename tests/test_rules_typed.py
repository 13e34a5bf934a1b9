"""Rules read their inputs typed (issue 18): through ``results.need(name, ResultClass)`` for a
result they declare (``needs`` / ``needs_any``) or ``results.typed(name, ResultClass)`` for an
optional one, never by subscripting or probing ``results``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import traceanalyzer.rules as rules_pkg
from traceanalyzer.analyses import Results
from traceanalyzer.config import Config
from traceanalyzer.rules import Params, registry, run_rules

RULES_DIR = Path(inspect.getfile(rules_pkg)).parent


def _calls(tree: ast.AST, method: str) -> list[str]:
    """The literal result names passed to ``results.<method>(name, ...)`` in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "results"):
            first = node.args[0]
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.unparse(node)
            out.append(first.value)
    return out


def _untyped_reads(tree: ast.AST) -> list[str]:
    """``results[...]``, ``results.get(...)``, ``results.values`` and ``getattr(results, ...)``."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "results":
            bad.append(ast.unparse(node))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "results"
              and node.attr in ("get", "values")):
            bad.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "results"):
            bad.append(ast.unparse(node))
    return bad


@pytest.mark.parametrize("path", sorted(RULES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_rules_read_results_typed(path: Path) -> None:
    assert _untyped_reads(ast.parse(path.read_text())) == []


def test_rules_need_only_what_they_declare() -> None:
    specs = registry()
    checked = 0
    for rid, spec in specs.items():
        module = inspect.getmodule(spec.func)
        assert module is not None and module.__file__ is not None
        needed = _calls(ast.parse(Path(module.__file__).read_text()), "need")
        undeclared = sorted(set(needed) - set(spec.needs) - set(spec.needs_any))
        assert undeclared == [], f"{rid} needs {undeclared} without declaring them"
        checked += len(needed)
    assert checked >= 25  # most rules read a declared input this way


def test_a_result_of_the_wrong_class_is_a_failed_rule_not_a_wrong_number() -> None:
    """A result stored under a rule's input name with another class is a bug: ``need`` raises
    TypeError and the engine lists the rule as failed (strict: it propagates)."""
    results = Results(values={"ops": object(), "overview": object()})
    out = run_rules(results)
    assert out.failed["profiler_overhead"].startswith("TypeError: result 'ops' is a object, not a OpsResult")
    with pytest.raises(TypeError):
        spec = registry()["profiler_overhead"]
        list(spec.func(results, Config(), Params("profiler_overhead", spec.params, Config())))


def _reads_by_helper() -> dict[str, tuple[set[str], set[str]]]:
    """Helper function (rules/_*.py) → (result names it reads itself, names it calls)."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for path in RULES_DIR.glob("_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                out[node.name] = (_literal_reads(node), _called(node))
    return out


def _literal_reads(tree: ast.AST) -> set[str]:
    """Names passed as a literal to any ``.need(...)``/``.typed(...)`` in ``tree``."""
    return {n.args[0].value for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("need", "typed")
            and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)}


def _called(tree: ast.AST) -> set[str]:
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def test_every_input_a_rule_reads_is_declared() -> None:
    """What a rule reads (its own need/typed calls, and those of the rules/_*.py helpers it
    calls, transitively) is in its ``needs``, ``needs_any`` or ``uses``: the engine hands each
    rule a view that refuses anything else, so an undeclared read would be a failed rule."""
    helpers = _reads_by_helper()
    missing = {}
    for rid, spec in registry().items():
        module = inspect.getmodule(spec.func)
        assert module is not None and module.__file__ is not None
        tree = ast.parse(Path(module.__file__).read_text())
        reads, seen, todo = _literal_reads(tree), set(), list(_called(tree))
        while todo:
            name = todo.pop()
            if name in helpers and name not in seen:
                seen.add(name)
                reads |= helpers[name][0]
                todo.extend(helpers[name][1])
        if reads - set(spec.reads):
            missing[rid] = sorted(reads - set(spec.reads))
    assert missing == {}
    assert "context" in registry()["blocking_copies"].uses  # read through rules/_advice.for_engine


def test_an_undeclared_read_fails_the_rule() -> None:
    """The view a rule gets refuses a name it did not declare, with the rule's name."""
    view = Results(values={"ops": object()}).declared(("steps",), "rule x")
    with pytest.raises(KeyError, match="rule x reads 'ops' without declaring it"):
        view.typed("ops", object)
    assert view.typed("steps", object) is None  # declared, absent: None
