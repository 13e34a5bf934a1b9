"""Analyses: pure functions from one :class:`AnalysisContext` to a frozen result.

Contract
--------
An analysis is registered with :func:`analysis`::

    @analysis("kernels", input="trace", depends_on=("steps",), title="Kernels",
              params={"top_n": 20, "short_kernel_us": 10.0}, shared=("op_nesting",))
    def kernels(ctx: AnalysisContext[TraceModel]) -> KernelsResult: ...

* It is pure: no I/O, no plotting, no printing, no logging-as-error-handling.
* Everything it reads comes from its context: ``ctx.model`` (the model of kind ``input``),
  the results it declares (``ctx.need(name, Cls)`` for one in ``depends_on``,
  ``ctx.typed(name, Cls)`` for one in ``after``, None when it did not run), its declared
  parameters (``ctx.params.top_n``: the default of ``params=`` unless the config key
  ``<name>.<param>`` overrides it) and the run's shared derived tables (``ctx.tables``,
  :class:`~traceanalyzer.model.derived.DerivedTables`, passed to the helpers that build
  them; ``shared=`` names those it reads, so each is dropped after its last reader).
* It imports helpers from the private modules of this package (``_steps``, ``_kernels`` …),
  never from another analysis; it may import the result class of an analysis it declares,
  for typing.
* When the signal it needs is absent it raises
  :class:`~traceanalyzer.errors.NotApplicable` with a reason users can act on; the
  pipeline records it and the report lists the check as "could not run".
* It returns a frozen dataclass implementing :class:`Result`: ``to_json()`` (every
  number, JSON-safe) plus optional ``summary()`` (label, value) pairs and
  ``tables()`` (title → polars frame) that generic renderers show.

The declared parameters are also what ``--set``/``--config`` validation reads
(:mod:`traceanalyzer.params`). Modules in this package are discovered automatically: adding
an analysis is one new module plus its test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

import polars as pl

from traceanalyzer.config import Config, Params
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import Model
from traceanalyzer.model.derived import DerivedTables
from traceanalyzer.plugins import import_submodules

M = TypeVar("M", bound=Model)
M_co = TypeVar("M_co", bound=Model, covariant=True)

#: The analysis runner's own settings (config owner ``analyses``), declared like an analysis's
#: parameters: ``workers``, how many analyses run at once (its default is chosen per model,
#: see :func:`run_analyses`; this value only gives its type).
RUNNER_PARAMS: dict[str, Any] = {"workers": 1}


@runtime_checkable
class Result(Protocol):
    """What every analysis result offers renderers and rules."""

    def to_json(self) -> dict[str, Any]:
        """Every number of the result, JSON-safe (ints for ns and bytes)."""
        ...


def summary_of(result: Any) -> list[tuple[str, str]]:
    """``result.summary()`` if defined, else nothing: key numbers as (label, text)."""
    fn = getattr(result, "summary", None)
    return list(fn()) if callable(fn) else []


def tables_of(result: Any) -> dict[str, pl.DataFrame]:
    """``result.tables()`` if defined, else nothing: titled tables for reports."""
    fn = getattr(result, "tables", None)
    return dict(fn()) if callable(fn) else {}


R = TypeVar("R")
T = TypeVar("T")
Res = TypeVar("Res", bound=Result)

#: What the registry stores: the runner passes each analysis a context whose model is of the
#: kind its ``input`` names (:func:`analysis` accepts the narrower signature).
AnalysisFunc: TypeAlias = Callable[["AnalysisContext[Model]"], Result]


@dataclass(frozen=True)
class AnalysisSpec:
    name: str
    func: AnalysisFunc
    input: str
    depends_on: tuple[str, ...]
    title: str
    order: int
    doc: str
    after: tuple[str, ...] = ()  # optional inputs: run first when present, never required
    shared: tuple[str, ...] = ()  # DerivedTables keys it reads (directly or through a helper)
    params: Mapping[str, Any] = field(default_factory=dict)  # parameter -> default
    heavy: bool = False  # one of the longest: started first among those ready (see _run_parallel)
    wide: bool = False  # a large working set: run first among those ready with one worker (_serial_order)


_REGISTRY: dict[str, AnalysisSpec] = {}


def analysis(
    name: str,
    *,
    input: str = "trace",
    depends_on: tuple[str, ...] = (),
    title: str | None = None,
    order: int = 100,
    after: tuple[str, ...] = (),
    shared: tuple[str, ...] = (),
    params: Mapping[str, Any] | None = None,
    heavy: bool = False,
    wide: bool = False,
) -> Callable[[Callable[[AnalysisContext[M]], Res]], Callable[[AnalysisContext[M]], Res]]:
    """Register an analysis. ``input`` is the model ``kind`` it applies to;
    ``order`` sorts report sections (lower first). ``depends_on`` names the results it
    needs (it is skipped, with their reason, when one is missing); ``after`` names optional
    inputs: they run first when registered, but their absence does not skip this analysis
    (it reads them with ``ctx.typed``). ``params`` declares its parameters with their
    defaults (``ctx.params.x``; config key ``<name>.x``, converted to the default's type).
    ``shared`` names the :class:`~traceanalyzer.model.derived.DerivedTables` keys it may
    read, directly or through a helper that builds them (``launches`` reads
    ``gpu_activity``): :func:`run_analyses` drops each table once the last analysis naming
    it has run. A missing name costs a rebuild, not a wrong number. ``heavy`` marks one of
    the longest analyses: with several workers it starts as soon as its inputs are done,
    before lighter ones that are ready too, so that it does not run alone at the end. ``wide``
    marks an analysis whose working set is large for its trace: with one worker it runs as
    soon as its inputs are done, while the results held are still few (the peak is the held
    results and tables plus the working set of the analysis running)."""

    def deco(func: Callable[[AnalysisContext[M]], Res]) -> Callable[[AnalysisContext[M]], Res]:
        if name in _REGISTRY and _REGISTRY[name].func is not func:
            raise ValueError(f"analysis {name!r} registered twice")
        _REGISTRY[name] = AnalysisSpec(
            name=name,
            # The runner passes only models of kind ``input``: the narrower signature is safe.
            func=cast(AnalysisFunc, func),
            input=input,
            depends_on=depends_on,
            title=title or name.replace("_", " ").capitalize(),
            order=order,
            doc=(func.__doc__ or "").strip(),
            after=after,
            shared=shared,
            params=dict(params or {}),
            heavy=heavy,
            wide=wide,
        )
        return func

    return deco


def discover() -> None:
    """Import every module of this package so their decorators register."""
    import_submodules(__name__)


def registry() -> dict[str, AnalysisSpec]:
    discover()
    return dict(_REGISTRY)


@dataclass
class Results(Mapping[str, Result]):
    """Results of one run: name → result, plus the analyses that could not run.

    ``skipped`` maps an analysis name to the reason it could not run (its own
    :class:`NotApplicable` reason, or a missing dependency); ``failed`` maps a name to
    an internal error message (a bug: reported, never silently dropped).
    """

    # ``values`` shadows Mapping.values(): every reader (rules, report, tests) uses the dict.
    values: dict[str, Result] = field(default_factory=dict)  # type: ignore[assignment]
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Result:
        return self.values[key]

    def typed(self, name: str, kind: type[R]) -> R | None:
        """The result of analysis ``name`` as a ``kind`` (its result class), or None when it
        did not run. A result of another class is a bug and raises ``TypeError``."""
        value = self.values.get(name)
        if value is None:
            return None
        if not isinstance(value, kind):
            raise TypeError(f"result {name!r} is a {type(value).__name__}, not a {kind.__name__}")
        return value

    def need(self, name: str, kind: type[R]) -> R:
        """:meth:`typed` for a result the caller declared it needs (``depends_on`` of an
        analysis, ``needs`` of a rule): the runner guarantees it is present."""
        value = self.typed(name, kind)
        if value is None:
            raise KeyError(f"result {name!r} is not available (not declared as needed?)")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def declared(self, names: Iterable[str], owner: str) -> Results:
        """A view of these results for a reader that declared it reads ``names`` (a rule's
        ``needs``, ``needs_any`` and ``uses``): :meth:`typed` and :meth:`need` of any other
        name raise ``KeyError`` naming ``owner``, so an undeclared input is a bug caught
        wherever the reader runs, never a silently absent result."""
        return _DeclaredResults(self.values, self.skipped, self.failed, frozenset(names), owner)


@dataclass
class _DeclaredResults(Results):
    """:meth:`Results.declared`: the same results, readable only by the names declared."""

    names: frozenset[str] = frozenset()
    owner: str = ""

    def typed(self, name: str, kind: type[R]) -> R | None:
        if name not in self.names:
            raise KeyError(f"{self.owner} reads {name!r} without declaring it (needs, needs_any or uses)")
        return super().typed(name, kind)


@dataclass(frozen=True)
class AnalysisContext(Generic[M_co]):
    """Everything one analysis reads (see the module docstring): its ``model``, its declared
    ``params``, the run's shared derived ``tables`` and, through :meth:`need` and
    :meth:`typed`, the results it declares (``depends_on``, ``after``)."""

    name: str
    model: M_co
    params: Params
    tables: DerivedTables[M_co]
    results: Results = field(repr=False)
    depends_on: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def need(self, name: str, kind: type[R]) -> R:
        """The result of ``name``, one of ``depends_on`` (the runner ran it first)."""
        if name not in self.depends_on:
            raise KeyError(f"analysis {self.name!r} reads {name!r} without declaring it in depends_on")
        return self.results.need(name, kind)

    def typed(self, name: str, kind: type[R]) -> R | None:
        """The result of ``name``, one of ``depends_on`` or ``after``; None when it did not run."""
        if name not in self.depends_on and name not in self.after:
            raise KeyError(f"analysis {self.name!r} reads {name!r} without declaring it in depends_on or after")
        return self.results.typed(name, kind)


def context_for(spec: AnalysisSpec, model: M, config: Config, results: Results,
                tables: DerivedTables[M] | None = None) -> AnalysisContext[M]:
    """The context :func:`run_analyses` gives ``spec`` (tests call analyses with it too)."""
    return AnalysisContext(
        name=spec.name, model=model, params=Params(spec.name, spec.params, config),
        tables=tables if tables is not None else DerivedTables(model), results=results,
        depends_on=spec.depends_on, after=spec.after,
    )


@dataclass(frozen=True)
class CachedOutcome:
    """What a :class:`ResultCache` keeps of one analysis: its result, or the reason it did not
    apply (its own :class:`NotApplicable`). Failures are never kept."""

    value: Result | None = None
    skipped: str | None = None


class ResultCache(Protocol):
    """Where :func:`run_analyses` keeps and finds analysis outcomes between runs
    (:mod:`traceanalyzer.store.results` is the one on disk).

    :meth:`key` names one analysis's outcome from everything it is a function of besides the
    model, which the cache itself is bound to: the analysis ``name``, the resolved values of
    its declared ``params`` and, for each name in its ``depends_on`` and ``after``, the key of
    that input (``"absent"`` when no such analysis applies to this model). None: not keyable
    (the outcome is computed, not kept). :meth:`get` and :meth:`put` never raise: a cache
    that cannot read or write simply misses."""

    def key(self, name: str, params: Mapping[str, Any], inputs: Mapping[str, str]) -> str | None: ...

    def get(self, key: str) -> CachedOutcome | None: ...

    def put(self, key: str, outcome: CachedOutcome) -> None: ...

    def done(self) -> None:
        """The run is over (called once, however it ended)."""
        ...


@runtime_checkable
class TableCache(Protocol):
    """A :class:`ResultCache` that also keeps the run's shared derived tables
    (:class:`~traceanalyzer.model.derived.DerivedTables`: pure functions of the model), so a
    run that recomputes an analysis reads back the tables it shares with the others instead
    of building them alone (:mod:`traceanalyzer.store.results` is the one on disk).
    :meth:`get_table` gives an object whose ``value`` is the table, or None; like
    :meth:`ResultCache.get` and :meth:`ResultCache.put` these never raise."""

    def table_key(self, name: str) -> str: ...

    def get_table(self, key: str) -> Any: ...

    def put_table(self, key: str, name: str, value: object) -> None: ...


#: A shared table is kept in a :class:`TableCache` when its build took at least
#: ``STORE_TABLE_MIN_S + STORE_TABLE_S_PER_BYTE × its size`` (its own work, not the tables it
#: asked for; the size is polars' estimate of its frames): reading one back costs ~1.5-4 ms per
#: MB of frames and writing it ~2-9 ms, so the many cheap tables (often large frames, such as
#: the launch join) are built each run and the costly small ones (the CPU-op tree and nesting,
#: the communication classes) are read back.
STORE_TABLE_MIN_S = 0.01
STORE_TABLE_S_PER_BYTE = 4e-9


class _StoredTables(DerivedTables[M]):
    """The run's :class:`~traceanalyzer.model.derived.DerivedTables`, each table read from
    ``cache`` where it is kept there, else built (and kept when its build took at least
    :data:`STORE_TABLE_MIN_S`)."""

    def __init__(self, model: M, readers: Mapping[str, int], cache: TableCache) -> None:
        super().__init__(model, readers)
        self._cache = cache
        self._local = threading.local()  # per thread: the nested builds' seconds, innermost last

    def get(self, key: str, build: Callable[[], T]) -> T:
        return super().get(key, lambda: self._read_or_build(key, build))

    def _read_or_build(self, key: str, build: Callable[[], T]) -> T:
        entry = self._cache.table_key(key)
        found = self._cache.get_table(entry)
        if found is not None:
            return cast(T, found.value)
        stack: list[float] = self._local.__dict__.setdefault("nested", [])
        stack.append(0.0)
        start = time.perf_counter()
        try:
            value = build()
        finally:
            took = time.perf_counter() - start
            nested = stack.pop()
            if stack:
                stack[-1] += took
        if took - nested >= STORE_TABLE_MIN_S + STORE_TABLE_S_PER_BYTE * _frame_bytes(value):
            self._cache.put_table(entry, key, value)
        return value


def _frame_bytes(value: object) -> int:
    """polars' estimate of the bytes of the frames and series in ``value`` (a frame, a series,
    or tuples, lists, dicts and dataclasses of them)."""
    if isinstance(value, (pl.DataFrame, pl.Series)):
        return int(value.estimated_size())
    if isinstance(value, (tuple, list)):
        return sum(_frame_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_frame_bytes(v) for v in value.values())
    if is_dataclass(value) and not isinstance(value, type):
        return sum(_frame_bytes(getattr(value, f.name)) for f in fields(value))
    return 0


#: The input key of a declared input that no registered analysis of this model's kind provides.
ABSENT = "absent"


def _toposort(specs: dict[str, AnalysisSpec]) -> list[AnalysisSpec]:
    done: list[AnalysisSpec] = []
    seen: set[str] = set()

    def visit(spec: AnalysisSpec, stack: tuple[str, ...]) -> None:
        if spec.name in seen:
            return
        if spec.name in stack:
            raise ValueError(f"dependency cycle: {' -> '.join(stack + (spec.name,))}")
        for dep in (*spec.depends_on, *spec.after):
            if dep in specs:
                visit(specs[dep], stack + (spec.name,))
        seen.add(spec.name)
        done.append(spec)

    for spec in sorted(specs.values(), key=lambda s: (s.order, s.name)):
        visit(spec, ())
    return done


def run_analyses(
    model: Model,
    config: Config | None = None,
    only: tuple[str, ...] | None = None,
    strict: bool = False,
    workers: int | None = None,
    cache: ResultCache | None = None,
) -> Results:
    """Run every registered analysis for ``model.kind`` in dependency order.

    ``only`` restricts to those names (and their dependencies). With ``strict``,
    an internal error propagates (tests use it); otherwise it is recorded in
    ``Results.failed`` and the run goes on.

    Each analysis gets its :class:`AnalysisContext`; they share one
    :class:`~traceanalyzer.model.derived.DerivedTables` of the model, whose tables are
    dropped after their last declared reader and all at the end.

    With one worker the ``wide`` analyses run first among those whose inputs are done
    (:func:`_serial_order`): the peak is the results and tables held plus the working set of
    the analysis running, so the widest run while few are held.

    ``workers`` analyses run at once (threads; polars leaves the GIL while it computes),
    each as soon as its inputs are done; the results are the same (analyses are pure,
    shared tables are built once) and kept in dependency order whatever order they finish
    in. The second analysis's working set costs memory, so the default (config
    ``analyses.workers`` overrides it) is 2 for models under
    :data:`PARALLEL_MAX_MODEL_BYTES` when polars has two threads or more, else 1.

    ``cache`` (a :class:`ResultCache` bound to this model) keeps outcomes between runs: an
    analysis whose key (its params and its inputs' keys) is found there is not run. An
    outcome is kept only when it is a pure function of its key: a failure is not, and
    neither is anything computed from one (a result whose ``after`` input failed).
    """
    config = config or Config()
    specs = {n: s for n, s in registry().items() if s.input == model.kind}
    if only is not None:
        wanted: set[str] = set()
        todo = [n for n in only if n in specs]
        while todo:
            n = todo.pop()
            if n not in wanted:
                wanted.add(n)
                todo.extend(d for d in (*specs[n].depends_on, *specs[n].after) if d in specs)
        specs = {n: s for n, s in specs.items() if n in wanted}
    order = _toposort(specs)
    if workers is None:
        small = _model_bytes(model) < PARALLEL_MAX_MODEL_BYTES
        auto = min(2, pl.thread_pool_size()) if small else 1
        workers = config.get("analyses.workers", auto)  # declared in RUNNER_PARAMS
    results = Results()
    # Each shared table is dropped as soon as every analysis that names it has run.
    readers: dict[str, int] = {}
    for spec in order:
        for key in spec.shared:
            readers[key] = readers.get(key, 0) + 1
    tables: DerivedTables[Model] = (_StoredTables(model, readers, cache) if isinstance(cache, TableCache)
                                    else DerivedTables(model, readers))
    keyed = _Keyed(cache, _result_keys(order, specs, config, cache)) if cache is not None else None

    def finished(spec: AnalysisSpec) -> None:
        tables.done(spec.shared)

    try:
        if workers <= 1 or len(order) <= 1:
            for spec in _serial_order(order, specs):
                _run_one(spec, model, tables, config, results, strict, keyed)
                finished(spec)
        else:
            _run_parallel(order, specs, model, tables, config, results, strict, workers, finished, keyed)
    finally:
        tables.clear()
        if cache is not None:
            cache.done()
    rank = {spec.name: i for i, spec in enumerate(order)}
    results.values = dict(sorted(results.values.items(), key=lambda kv: rank[kv[0]]))
    results.skipped = dict(sorted(results.skipped.items(), key=lambda kv: rank[kv[0]]))
    results.failed = dict(sorted(results.failed.items(), key=lambda kv: rank[kv[0]]))
    return results


#: Models above this many bytes (polars' estimate, ~0.43× the trace JSON: a ~1.2 GB trace)
#: run their analyses one at a time by default: there memory runs out before time does.
PARALLEL_MAX_MODEL_BYTES = 512 * 2**20


@dataclass
class _Keyed:
    """A :class:`ResultCache` with this run's keys, and the analyses whose outcome is not a
    pure function of its key (failed, or computed from a failed input): never stored."""

    cache: ResultCache
    keys: dict[str, str | None]
    tainted: set[str] = field(default_factory=set)


def _result_keys(order: list[AnalysisSpec], specs: dict[str, AnalysisSpec], config: Config,
                 cache: ResultCache) -> dict[str, str | None]:
    """Each analysis's key in ``cache`` (None: not keyable, nor is anything that reads it)."""
    keys: dict[str, str | None] = {}
    for spec in order:
        inputs = {dep: keys.get(dep) if dep in specs else ABSENT for dep in (*spec.depends_on, *spec.after)}
        try:
            params = Params(spec.name, spec.params, config).as_dict()
        except Exception:  # noqa: BLE001 - a bad value fails the analysis itself, as without a cache
            params = None
        keyed = {dep: k for dep, k in inputs.items() if k is not None}
        keyable = params is not None and len(keyed) == len(inputs)
        keys[spec.name] = cache.key(spec.name, params, keyed) if keyable and params is not None else None
    return keys


def _model_bytes(model: object) -> int:
    """The estimated size of the model's tables."""
    attrs = getattr(model, "__dict__", {})
    return sum(int(v.estimated_size()) for v in attrs.values() if isinstance(v, pl.DataFrame))


def _serial_order(order: list[AnalysisSpec], specs: dict[str, AnalysisSpec]) -> list[AnalysisSpec]:
    """The order one worker runs ``order`` in: each time, the first ``wide`` analysis whose
    inputs (``depends_on``, ``after``) are done, else the first ready one that is the last
    reader of a shared table an earlier one built (running it drops that table), else the
    first in ``order`` that is ready. Results are the same in any order (analyses are pure);
    the peak memory is not: every result and shared table still held adds to the working set
    of the analysis running, so the widest run while the fewest are held, and a table two
    analyses share is not kept through the rest of the run for a reader that could run next
    (a wide analysis's by-product, say, whose other reader comes late in ``order``)."""
    todo = sorted(order, key=lambda s: not s.wide)  # stable: dependency order otherwise
    readers: dict[str, int] = {}
    for s in order:
        for key in s.shared:
            readers[key] = readers.get(key, 0) + 1
    held: set[str] = set()  # tables an analysis already run has read, with readers still to run
    done: set[str] = set()
    out: list[AnalysisSpec] = []

    def ready(s: AnalysisSpec) -> bool:
        return all(d in done for d in (*s.depends_on, *s.after) if d in specs)

    while todo:
        spec = next((s for s in todo if s.wide and ready(s)), None) or next(
            (s for s in todo if ready(s) and any(k in held and readers[k] == 1 for k in s.shared)), None
        ) or next((s for s in todo if ready(s)), todo[0])
        todo.remove(spec)
        done.add(spec.name)
        out.append(spec)
        for key in spec.shared:
            readers[key] -= 1
            if readers[key]:
                held.add(key)
            else:
                held.discard(key)
    return out


def _run_parallel(
    order: list[AnalysisSpec],
    specs: dict[str, AnalysisSpec],
    model: Model,
    tables: DerivedTables[Model],
    config: Config,
    results: Results,
    strict: bool,
    workers: int,
    finished: Callable[[AnalysisSpec], None],
    keyed: _Keyed | None = None,
) -> None:
    """:func:`run_analyses` with up to ``workers`` analyses at once, in threads; each starts
    once the analyses it reads (``depends_on``, ``after``) are done, the ``heavy`` ones
    first, then earliest in ``order`` (longest first: a long analysis started last would
    run alone while the other workers wait). Bookkeeping happens in this thread only."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    todo = sorted(order, key=lambda s: not s.heavy)  # stable: dependency order otherwise
    done: set[str] = set()
    running: dict[Future[None], AnalysisSpec] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="analysis") as pool:
        try:
            while todo or running:
                for spec in list(todo):
                    if len(running) >= workers:
                        break
                    if all(d in done for d in (*spec.depends_on, *spec.after) if d in specs):
                        todo.remove(spec)
                        fut = pool.submit(_run_one, spec, model, tables, config, results, strict, keyed)
                        running[fut] = spec
                if not running:  # cannot happen with an acyclic order; never spin on it
                    raise RuntimeError(f"no analysis can start: {[s.name for s in todo]}")
                over, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in over:
                    spec = running.pop(fut)
                    fut.result()  # only raises under ``strict``: _run_one records the rest
                    done.add(spec.name)
                    finished(spec)
        except BaseException:
            for fut in running:
                fut.cancel()
            raise


def _run_one(spec: AnalysisSpec, model: Model, tables: DerivedTables[Model], config: Config, results: Results,
             strict: bool, keyed: _Keyed | None = None) -> None:
    """Run one analysis into ``results`` (value, skip reason or failure), or take its outcome
    from the cache."""
    missing = [d for d in spec.depends_on if d not in results.values]
    if missing:
        why = "; ".join(results.skipped.get(d) or results.failed.get(d) or f"{d} is not available" for d in missing)
        results.skipped[spec.name] = f"needs {', '.join(missing)}: {why}"
        if keyed is not None and any(d in keyed.tainted for d in missing):
            keyed.tainted.add(spec.name)
        return
    key = keyed.keys.get(spec.name) if keyed is not None else None
    if keyed is not None and key is not None:
        hit = keyed.cache.get(key)
        if hit is not None:
            if hit.value is not None:
                results.values[spec.name] = hit.value
            else:
                results.skipped[spec.name] = hit.skipped or ""
            return
    outcome: CachedOutcome | None = None
    try:
        value = spec.func(context_for(spec, model, config, results, tables))
        results.values[spec.name] = value
        outcome = CachedOutcome(value=value)
    except NotApplicable as na:
        results.skipped[spec.name] = na.reason
        outcome = CachedOutcome(skipped=na.reason)
    except Exception as exc:  # noqa: BLE001 - one broken analysis must not sink the report
        if keyed is not None:
            keyed.tainted.add(spec.name)
        if strict:
            raise
        results.failed[spec.name] = f"{type(exc).__name__}: {exc}"
    if keyed is None or outcome is None:
        return
    if any(d in keyed.tainted for d in (*spec.depends_on, *spec.after)):
        keyed.tainted.add(spec.name)  # computed from a failure: not what its key names
    elif key is not None:
        keyed.cache.put(key, outcome)


__all__ = [
    "RUNNER_PARAMS",
    "AnalysisContext",
    "AnalysisSpec",
    "CachedOutcome",
    "Model",
    "Result",
    "ResultCache",
    "Results",
    "analysis",
    "context_for",
    "discover",
    "registry",
    "run_analyses",
    "summary_of",
    "tables_of",
]
