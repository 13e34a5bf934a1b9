"""run_analyses: dependency order, two analyses at once, shared tables built once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import traceanalyzer.analyses as analyses_mod
from traceanalyzer.analyses import AnalysisContext, AnalysisSpec, run_analyses
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable


class FakeModel:
    kind = "fake"


def _spec(name: str, func: Any, depends_on: tuple[str, ...] = (), after: tuple[str, ...] = (),
          order: int = 100, shared: tuple[str, ...] = (), heavy: bool = False, wide: bool = False) -> AnalysisSpec:
    return AnalysisSpec(name=name, func=func, input="fake", depends_on=depends_on, title=name, order=order,
                        doc="", after=after, shared=shared, heavy=heavy, wide=wide)


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, AnalysisSpec]:
    reg: dict[str, AnalysisSpec] = {}
    monkeypatch.setattr(analyses_mod, "registry", lambda: dict(reg))
    return reg


def test_parallel_run_respects_dependencies_and_keeps_dependency_order(fake_registry: dict[str, AnalysisSpec]) -> None:
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    builds: list[str] = []
    running = {"now": 0, "max": 0}

    def make(name: str, pause: float, reads: tuple[str, ...] = ()) -> Any:
        def run(ctx: AnalysisContext[Any]) -> str:
            with lock:
                log.append(("start", name))
                running["now"] += 1
                running["max"] = max(running["max"], running["now"])
            for dep in reads:
                assert dep in ctx.results.values, f"{name} started before {dep} finished"
            # Both slow analyses ask for one shared table: it is built once.
            if name in ("slow_a", "slow_b"):
                ctx.tables.get("table", lambda: (builds.append(name), time.sleep(0.05), 42)[-1])
            time.sleep(pause)
            with lock:
                running["now"] -= 1
                log.append(("end", name))
            return f"{name}-result"
        return run

    def skipped(ctx: AnalysisContext[Any]) -> str:
        raise NotApplicable("nothing to see")

    fake_registry.update({
        "base": _spec("base", make("base", 0.01), order=1),
        "slow_a": _spec("slow_a", make("slow_a", 0.1, ("base",)), ("base",), order=2, shared=("table",)),
        "slow_b": _spec("slow_b", make("slow_b", 0.1, ("base",)), ("base",), order=3, shared=("table",)),
        "late": _spec("late", make("late", 0.0, ("slow_a", "slow_b")), ("slow_a",), after=("slow_b",), order=0),
        "nope": _spec("nope", skipped, order=5),
        "needs_nope": _spec("needs_nope", make("needs_nope", 0.0), ("nope",), order=6),
    })
    model = FakeModel()
    res = run_analyses(model, Config(), strict=True, workers=2)
    # Dependency order whatever order they finished in (late's order=0 puts it first among
    # the ready ones, never before what it reads).
    assert list(res.values) == ["base", "slow_a", "slow_b", "late"]
    assert res.values["late"] == "late-result"
    assert res.skipped["nope"] == "nothing to see"
    assert res.skipped["needs_nope"].startswith("needs nope")
    assert running["max"] == 2  # the two slow ones overlapped
    assert builds in (["slow_a"], ["slow_b"])  # the shared table was built once
    serial = run_analyses(FakeModel(), Config(), strict=True, workers=1)
    assert serial.values == res.values and serial.skipped == res.skipped


def test_heavy_analysis_starts_first_among_the_ready_ones(fake_registry: dict[str, AnalysisSpec]) -> None:
    """A long analysis that dependency order puts last starts as soon as its input is done,
    so that it does not run alone at the end; the results keep dependency order."""
    starts: list[str] = []
    lock = threading.Lock()

    def make(name: str) -> Any:
        def run(ctx: AnalysisContext[Any]) -> str:
            with lock:
                starts.append(name)
            time.sleep(0.02)
            return name
        return run

    fake_registry.update({
        "base": _spec("base", make("base"), order=1),
        **{f"light{i}": _spec(f"light{i}", make(f"light{i}"), ("base",), order=2 + i) for i in range(4)},
        "long": _spec("long", make("long"), ("base",), order=50, heavy=True),
    })
    res = run_analyses(FakeModel(), Config(), strict=True, workers=2)
    assert starts[:2] == ["base", "long"]
    assert list(res.values) == ["base", "light0", "light1", "light2", "light3", "long"]
    starts.clear()
    run_analyses(FakeModel(), Config(), strict=True, workers=1)  # one worker: plain dependency order
    assert starts == ["base", "light0", "light1", "light2", "light3", "long"]


def _recorder(starts: list[str]) -> Any:
    """``make(name)``: an analysis function that appends ``name`` to ``starts`` when it runs
    and returns it (one worker: no lock needed)."""
    def make(name: str) -> Any:
        def run(ctx: AnalysisContext[Any]) -> str:
            starts.append(name)
            return name
        return run
    return make


def test_wide_analysis_runs_first_among_the_ready_ones_with_one_worker(
        fake_registry: dict[str, AnalysisSpec]) -> None:
    """With one worker a wide analysis runs as soon as what it reads is done (``after`` too),
    before lighter ones that are ready, while few results are held; the results keep
    dependency order and are the same as in dependency order."""
    starts: list[str] = []
    make = _recorder(starts)

    fake_registry.update({
        "base": _spec("base", make("base"), order=1),
        **{f"light{i}": _spec(f"light{i}", make(f"light{i}"), ("base",), order=2 + i) for i in range(3)},
        "wide": _spec("wide", make("wide"), ("base",), after=("light1",), order=50, wide=True),
        "wide_free": _spec("wide_free", make("wide_free"), order=60, wide=True),
    })
    res = run_analyses(FakeModel(), Config(), strict=True, workers=1)
    assert starts == ["wide_free", "base", "light0", "light1", "wide", "light2"]
    assert list(res.values) == ["base", "light0", "light1", "light2", "wide", "wide_free"]
    starts.clear()
    parallel = run_analyses(FakeModel(), Config(), strict=True, workers=2)
    assert parallel.values == res.values


def test_last_reader_of_a_held_table_runs_next_with_one_worker(
        fake_registry: dict[str, AnalysisSpec]) -> None:
    """With one worker, once a (wide) analysis has built a shared table that one other analysis
    also reads, that reader runs next (its table is then dropped), not where ``order`` puts it;
    a table with several readers still to run does not pull them forward."""
    starts: list[str] = []
    make = _recorder(starts)

    fake_registry.update({
        "base": _spec("base", make("base"), order=1),
        "wide": _spec("wide", make("wide"), ("base",), order=10, shared=("pair", "many"), wide=True),
        **{f"light{i}": _spec(f"light{i}", make(f"light{i}"), ("base",), order=20 + i) for i in range(3)},
        "many1": _spec("many1", make("many1"), order=40, shared=("many",)),
        "many2": _spec("many2", make("many2"), order=41, shared=("many",)),
        "late": _spec("late", make("late"), ("base",), order=90, shared=("pair",)),
    })
    res = run_analyses(FakeModel(), Config(), strict=True, workers=1)
    assert starts == ["base", "wide", "late", "light0", "light1", "light2", "many1", "many2"]
    assert list(res.values) == ["base", "wide", "light0", "light1", "light2", "many1", "many2", "late"]


def test_parallel_run_records_or_raises_failures(fake_registry: dict[str, AnalysisSpec]) -> None:
    def boom(ctx: AnalysisContext[Any]) -> str:
        raise ValueError("bug")

    def fine(ctx: AnalysisContext[Any]) -> str:
        time.sleep(0.02)
        return "ok"

    fake_registry.update({"boom": _spec("boom", boom), "fine": _spec("fine", fine), "after_boom": _spec(
        "after_boom", fine, ("boom",))})
    res = run_analyses(FakeModel(), Config(), workers=2)
    assert res.failed == {"boom": "ValueError: bug"}
    assert res.values == {"fine": "ok"}
    assert "after_boom" in res.skipped
    with pytest.raises(ValueError, match="bug"):
        run_analyses(FakeModel(), Config(), strict=True, workers=2)


def test_workers_default_follows_config(fake_registry: dict[str, AnalysisSpec]) -> None:
    threads: set[str] = set()

    def who(ctx: AnalysisContext[Any]) -> str:
        threads.add(threading.current_thread().name)
        return "x"

    fake_registry.update({"a": _spec("a", who), "b": _spec("b", who)})
    run_analyses(FakeModel(), Config({"analyses.workers": 1}))
    assert threads == {threading.main_thread().name}


def test_big_models_run_one_analysis_at_a_time_by_default(
    fake_registry: dict[str, AnalysisSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    import polars as pl

    threads: set[str] = set()

    def who(ctx: AnalysisContext[Any]) -> str:
        threads.add(threading.current_thread().name)
        return "x"

    fake_registry.update({"a": _spec("a", who), "b": _spec("b", who)})
    model = FakeModel()
    model.table = pl.DataFrame({"x": list(range(1000))})  # type: ignore[attr-defined]
    monkeypatch.setattr(analyses_mod, "PARALLEL_MAX_MODEL_BYTES", 1000)  # the table is 8 kB: "big"
    run_analyses(model, Config())
    assert threads == {threading.main_thread().name}
    if pl.thread_pool_size() >= 2:  # small enough, and two polars threads: two at once
        monkeypatch.setattr(analyses_mod, "PARALLEL_MAX_MODEL_BYTES", 10**9)
        threads.clear()
        run_analyses(model, Config())
        assert threads and threading.main_thread().name not in threads


def test_context_gives_declared_params_and_only_declared_results(fake_registry: dict[str, AnalysisSpec]) -> None:
    seen: dict[str, Any] = {}

    def base(ctx: AnalysisContext[Any]) -> str:
        return "base-result"

    def reader(ctx: AnalysisContext[Any]) -> str:
        seen["top_n"], seen["ratio"] = ctx.params.top_n, ctx.params.ratio
        seen["base"] = ctx.need("base", str)
        seen["opt"] = ctx.typed("missing", str)  # declared in after, not registered: None
        with pytest.raises(AttributeError, match="no parameter 'typo'"):
            ctx.params.typo  # noqa: B018 - the read is the test
        with pytest.raises(KeyError, match="without declaring"):
            ctx.typed("other", str)
        return "ok"

    fake_registry.update({
        "base": _spec("base", base),
        "other": _spec("other", base),
        "reader": AnalysisSpec(name="reader", func=reader, input="fake", depends_on=("base",), title="r", order=9,
                               doc="", after=("missing",), params={"top_n": 20, "ratio": 0.5}),
    })
    res = run_analyses(FakeModel(), Config({"reader.ratio": "0.25"}), strict=True, workers=1)  # type: ignore[arg-type]
    assert res.values["reader"] == "ok"
    assert seen == {"top_n": 20, "ratio": 0.25, "base": "base-result", "opt": None}


def test_analyses_import_from_each_other_only_the_result_classes_they_declare() -> None:
    """Shared helpers live in the private modules (``analyses/_*.py``); an analysis imports from
    another analysis only its result class, and only of one it declares (depends_on/after)."""
    import ast
    from pathlib import Path

    specs = analyses_mod.registry()
    by_module = {s.func.__module__.rsplit(".", 1)[-1]: s for s in specs.values()}
    root = Path(analyses_mod.__file__).parent
    bad = []
    for path in sorted(root.glob("[a-z]*.py")):
        spec = by_module.get(path.stem)
        declared = set(spec.depends_on) | set(spec.after) if spec else set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("traceanalyzer.analyses."):
                other = node.module.rsplit(".", 1)[-1]
                if other.startswith("_"):
                    continue
                names = [a.name for a in node.names]
                if not all(n.endswith("Result") for n in names) or specs[other].name not in declared:
                    bad.append(f"{path.stem} imports {names} from {other}")
    assert bad == []
