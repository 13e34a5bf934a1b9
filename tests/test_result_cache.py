"""The result cache (traceanalyzer.store.results) and its codec (traceanalyzer.store.codec).

Functional only (no timings): a hit gives a byte-identical summary.json without running the
analyses; one changed parameter reruns that analysis and what reads it, nothing else; a changed
source digest or loader version misses; a damaged result is ignored and rebuilt; every
registered analysis's result round-trips through the codec; a stored class outside
traceanalyzer is refused. Every test uses its own cache directory (the session one,
tests/conftest.py, is off).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, needs_shared, shared_results
from polars.testing import assert_frame_equal, assert_series_equal

import traceanalyzer.analyses as analyses_mod
from traceanalyzer.analyses import CachedOutcome, Results, registry, run_analyses, tables_of
from traceanalyzer.cli import cli
from traceanalyzer.config import Config
from traceanalyzer.load.cache_version import LOADER_VERSION
from traceanalyzer.pipeline import build_report, load, report_from_results, write_outputs
from traceanalyzer.store import cache as cache_mod
from traceanalyzer.store import results as results_mod
from traceanalyzer.store.codec import CodecError, Uncodable, decode, encode, resolve_class
from traceanalyzer.store.results import ResultStore, for_model

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "resnet_like_a100.json.gz"
LEGACY = REPO / "sample_traces" / "legacy_pt18.json"
SNAPSHOT = REPO / "tests" / "data" / "snapshot_2.13_oom_small.pickle"
REAL = SHARED_TRACES / "hta" / "trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache on, in a directory of this test's own."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRACEANALYZER_CACHE_DIR", str(root))
    monkeypatch.delenv("TRACEANALYZER_NO_CACHE", raising=False)
    return root


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the analyses actually run (not read back from the cache), in call order."""
    seen: list[str] = []
    for name, spec in registry().items():
        def spy(ctx: Any, _func: Any = spec.func, _name: str = name) -> Any:
            seen.append(_name)
            return _func(ctx)

        monkeypatch.setitem(analyses_mod._REGISTRY, name, dataclasses.replace(spec, func=spy))
    return seen


def _result_files(root: Path) -> list[Path]:
    return sorted((root / "models").glob("*/results/*.res"))


def _summary(path: Path, out: Path, config: Config | None = None) -> bytes:
    write_outputs(build_report(load(path), config, source=str(path)), out, ["json"])
    return (out / "summary.json").read_bytes()


def _readers_of(names: set[str], kind: str) -> set[str]:
    """``names`` and every analysis of ``kind`` that reads one of them, directly or not."""
    specs = {n: s for n, s in registry().items() if s.input == kind}
    out = set(names)
    grew = True
    while grew:
        grew = False
        for n, s in specs.items():
            if n not in out and out & set(s.depends_on + s.after):
                out.add(n)
                grew = True
    return out


# -- a hit is the same report, without running the analyses -------------------------------------

@pytest.mark.parametrize("path", [SAMPLE, LEGACY, SNAPSHOT], ids=lambda p: p.name)
def test_hit_gives_identical_summary_without_running(path: Path, tmp_path: Path, cache_dir: Path,
                                                     calls: list[str]) -> None:
    first = _summary(path, tmp_path / "first")
    ran = list(calls)
    assert ran, "the first run must run the analyses"
    stored = _result_files(cache_dir)
    assert stored
    calls.clear()
    second = _summary(path, tmp_path / "second")
    assert calls == [], f"analyses ran on a full hit: {calls}"
    assert second == first


@needs_shared
@pytest.mark.shared
def test_hit_gives_identical_summary_real_trace(tmp_path: Path, cache_dir: Path, calls: list[str]) -> None:
    first = _summary(REAL, tmp_path / "first")
    calls.clear()
    assert _summary(REAL, tmp_path / "second") == first
    assert calls == []


def test_stats_count_hits_and_stores(cache_dir: Path) -> None:
    model = load(SAMPLE)
    store = for_model(model)
    assert store is not None
    first = run_analyses(model, cache=store)
    n = len(first.values) + len(first.skipped)
    assert store.stats.stored == n and store.stats.hits == 0 and not store.stats.uncodable
    again = for_model(load(SAMPLE))
    assert again is not None
    second = run_analyses(load(SAMPLE), cache=again)
    assert again.stats.hits == n and again.stats.misses == 0 and again.stats.stored == 0
    assert list(second.values) == list(first.values) and second.skipped == first.skipped


def test_parallel_and_serial_runs_share_entries(cache_dir: Path, calls: list[str]) -> None:
    model = load(SAMPLE)
    serial = run_analyses(model, workers=1, cache=for_model(model))
    calls.clear()
    parallel = run_analyses(model, workers=2, cache=for_model(model))
    assert calls == []
    assert {k: v.to_json() for k, v in serial.values.items()} == {k: v.to_json() for k, v in parallel.values.items()}


# -- what a change recomputes ---------------------------------------------------------------------

def test_one_param_reruns_its_analysis_and_readers_only(tmp_path: Path, cache_dir: Path, calls: list[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _summary(SAMPLE, tmp_path / "first")
    calls.clear()
    other = Config({"idle_gaps.long_gap_us": 250, "rules.min_cost_pct": 0.5})
    cached = _summary(SAMPLE, tmp_path / "second", other)
    expected = _readers_of({"idle_gaps"}, "trace")
    assert "idle_gaps" in calls
    assert set(calls) <= expected, f"ran without a changed input: {sorted(set(calls) - expected)}"
    report = build_report(load(SAMPLE), other)
    # Every reader that ran is recomputed; one skipped for a missing input never calls its function.
    assert set(calls) == {n for n in expected if not report.results.skipped.get(n, "").startswith("needs ")}
    monkeypatch.setenv("TRACEANALYZER_NO_CACHE", "1")
    assert cached == _summary(SAMPLE, tmp_path / "fresh", other), "a partial hit must equal a fresh run"
    # The first thresholds' results are still there: going back is a full hit.
    monkeypatch.delenv("TRACEANALYZER_NO_CACHE")
    calls.clear()
    _summary(SAMPLE, tmp_path / "back")
    assert calls == []


def test_rule_threshold_alone_reruns_no_analysis(tmp_path: Path, cache_dir: Path, calls: list[str]) -> None:
    _summary(SAMPLE, tmp_path / "first")
    calls.clear()
    _summary(SAMPLE, tmp_path / "second", Config({"rules.min_cost_pct": 0.5}))
    assert calls == []


def test_changed_source_digest_misses(cache_dir: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(SAMPLE)
    run_analyses(model, cache=for_model(model))
    calls.clear()
    monkeypatch.setattr(results_mod, "analysis_source_digest", lambda: "an edited analysis")
    run_analyses(model, cache=for_model(model))
    assert len(calls) == len([s for s in registry().values() if s.input == "trace"]) - _skipped_for_inputs(model)


def _skipped_for_inputs(model: Any) -> int:
    return sum(1 for r in run_analyses(model).skipped.values() if r.startswith("needs "))


def test_loader_version_bump_misses(cache_dir: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(SAMPLE)
    run_analyses(model, cache=for_model(model))
    calls.clear()
    monkeypatch.setattr(cache_mod, "LOADER_VERSION", LOADER_VERSION + 1)
    again = load(SAMPLE)
    run_analyses(again, cache=for_model(again))
    assert "kernels" in calls and "steps" in calls


def test_no_cache_keeps_no_results(tmp_path: Path, cache_dir: Path, calls: list[str]) -> None:
    res = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", str(tmp_path / "o"), "-f", "json", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert _result_files(cache_dir) == []
    model = load(SAMPLE, use_cache=False)
    assert for_model(model) is None
    assert set(run_analyses(model).values)  # the runner without a cache, as every other test uses it


def test_cache_info_counts_results_and_clear_removes_them(tmp_path: Path, cache_dir: Path) -> None:
    _summary(SAMPLE, tmp_path / "o")
    n = len(_result_files(cache_dir))
    res = CliRunner().invoke(cli, ["cache", "info"])
    assert res.exit_code == 0, res.output
    assert f"{n} results" in res.output
    (entry,) = cache_mod.ModelCache(cache_dir).entries()
    assert entry.results == n and entry.bytes > sum(p.stat().st_size for p in _result_files(cache_dir))
    res = CliRunner().invoke(cli, ["cache", "clear"])
    assert res.exit_code == 0 and _result_files(cache_dir) == []


# -- damage -----------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "flipped_bit", "empty", "other_key"])
def test_damaged_result_is_ignored_and_rebuilt(tmp_path: Path, cache_dir: Path, calls: list[str],
                                               damage: str) -> None:
    first = _summary(SAMPLE, tmp_path / "first")
    files = {orjson.loads(_header(p))["analysis"]: p for p in _result_files(cache_dir)}
    target = files["kernels"]
    data = target.read_bytes()
    before = results_mod._decode_entry(data, target.stem)
    if damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flipped_bit":
        b = bytearray(data)
        b[-len(b) // 3] ^= 0x04
        target.write_bytes(bytes(b))
    elif damage == "empty":
        target.write_bytes(b"")
    else:  # a whole, valid entry under another analysis's name
        target.write_bytes(files["steps"].read_bytes())
    calls.clear()
    assert _summary(SAMPLE, tmp_path / "second") == first
    assert "kernels" in calls
    assert set(calls) <= _readers_of({"kernels"}, "trace")
    # Stored again, whole (the same values; not always the same bytes: polars lays string buffers out
    # as it computed them).
    again = results_mod._decode_entry(target.read_bytes(), target.stem)
    assert again.value is not None and before.value is not None
    assert again.value.to_json() == before.value.to_json()


def _header(path: Path) -> bytes:
    data = path.read_bytes()[len(results_mod.MAGIC) + 32:]
    n = int.from_bytes(data[:8], "little")
    return data[8:8 + n]


def test_failure_is_not_kept_nor_what_reads_it(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = registry()

    def broken(ctx: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setitem(analyses_mod._REGISTRY, "steps", dataclasses.replace(specs["steps"], func=broken))
    model = load(SAMPLE)
    store = for_model(model)
    assert store is not None
    res = run_analyses(model, cache=store)
    assert "steps" in res.failed
    kept = {orjson.loads(_header(p))["analysis"] for p in _result_files(cache_dir)}
    tainted = _readers_of({"steps"}, "trace")
    assert kept and not (kept & tainted), f"kept outcomes computed from a failure: {sorted(kept & tainted)}"


# -- the codec ---------------------------------------------------------------------------------

def _same(a: Any, b: Any, where: str = "") -> None:
    """Deep equality, frames by value and dtype, NaN equal to NaN."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, pl.DataFrame):
        assert_frame_equal(a, b, check_exact=True)
        assert b.width == 0 or b.n_chunks() == 1
    elif isinstance(a, pl.Series):
        assert_series_equal(a, b, check_exact=True)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _round_trips(results: Results) -> Iterator[str]:
    for name, value in results.values.items():
        doc, blobs = encode(value)
        back = decode(orjson.loads(orjson.dumps(doc)), blobs)
        _same(value, back, name)
        assert orjson.dumps(back.to_json()) == orjson.dumps(value.to_json()), name
        for title, df in tables_of(value).items():
            assert_frame_equal(tables_of(back)[title], df, check_exact=True)
        yield name


def test_every_result_round_trips_sample_and_snapshot() -> None:
    for path in (SAMPLE, LEGACY, SNAPSHOT):
        res = run_analyses(load(path, use_cache=False), strict=True)
        assert len(list(_round_trips(res))) == len(res.values) > 0


@needs_shared
@pytest.mark.shared
def test_every_registered_result_round_trips_real_trace() -> None:
    res = shared_results(REAL)
    names = set(_round_trips(res))
    trace_specs = {n for n, s in registry().items() if s.input == "trace"}
    # Every trace analysis that ran here round-trips; most of the registry runs on this trace.
    assert names == set(res.values) and len(names) >= len(trace_specs) - 4


class _Colour(enum.Enum):
    RED = "red"


def test_codec_values() -> None:
    values: list[Any] = [None, True, 0, -1, 2**70, -(2**64), 1.5, -0.0, float("inf"), float("-inf"), "x",
                         (1, (2, "a")), [1, [2.0]], {1: "a", "b": (None,)}, {3, 4}, frozenset({"z"}),
                         pl.Series("s", [1, None, 3]), pl.DataFrame({"a": [1.0, float("nan")], "b": ["x", None]}),
                         pl.DataFrame({"a": [[1, 2], []], "c": pl.Series([1, 2], dtype=pl.UInt32)}),
                         pl.DataFrame()]
    for v in values:
        doc, blobs = encode(v)
        back = decode(orjson.loads(orjson.dumps(doc)), blobs)
        _same(v, back, repr(v)[:40])
    nan_doc, _ = encode(float("nan"))
    assert math.isnan(decode(orjson.loads(orjson.dumps(nan_doc)), []))
    # A bool stays a bool, an int an int, a float a float.
    assert [type(decode(encode(v)[0], [])) for v in (True, 1, 1.0)] == [bool, int, float]


def test_codec_refuses_what_it_cannot_store() -> None:
    # _Colour is an Enum of this test module: decoding would refuse it, so encoding does.
    for v in (np.arange(3), lambda: 1, object(), _Colour.RED, pl.DataFrame({"o": [object()]}, schema={"o": pl.Object})):
        with pytest.raises(Uncodable):
            encode(v)

    @dataclasses.dataclass(frozen=True)
    class Local:
        x: int

    with pytest.raises(Uncodable):
        encode(Local(1))


@pytest.mark.parametrize("path", ["os:system", "builtins:dict", "collections:OrderedDict", "subprocess:Popen",
                                  "traceanalyzer:__version__", "traceanalyzer.store.cache:ModelCache",
                                  "traceanalyzer.store.cache:load", "traceanalyzer.store.cache:os.system",
                                  "traceanalyzer.nonexistent:X", "traceanalyzerx.mod:X",
                                  "traceanalyzer.analyses.kernels:KernelsResult.__class__"])
def test_codec_refuses_classes_outside_traceanalyzer(path: str) -> None:
    with pytest.raises(CodecError):
        resolve_class(path)
    with pytest.raises(CodecError):
        decode({"$dataclass": path, "fields": {}}, [])
    with pytest.raises(CodecError):
        decode({"$enum": path, "name": "X"}, [])


def test_entry_naming_a_foreign_class_is_refused_and_removed(cache_dir: Path, calls: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(SAMPLE)
    run_analyses(model, cache=for_model(model))
    store = for_model(model)
    assert store is not None
    # A hostile writer stores a well-formed entry (digest and all) naming a class outside the package.
    target = next(p for p in _result_files(cache_dir) if orjson.loads(_header(p))["analysis"] == "kernels")
    key = target.stem
    doc = {"$dataclass": "subprocess:Popen", "fields": {"args": ["touch", str(cache_dir / "pwned")]}}
    monkeypatch.setattr(results_mod, "encode", lambda v: (doc, []))
    store.put(key, CachedOutcome(value=None, skipped=None))
    monkeypatch.undo()
    assert b"subprocess:Popen" in target.read_bytes()
    assert store.get(key) is None and not target.exists()
    assert not (cache_dir / "pwned").exists()
    assert store.stats.damaged == 1


def test_uncodable_result_is_computed_every_run_and_counted(cache_dir: Path) -> None:
    model = load(SAMPLE)
    store = for_model(model)
    assert isinstance(store, ResultStore)
    key = store.key("kernels", {}, {})
    assert key is not None

    @dataclasses.dataclass(frozen=True)
    class Odd:
        arr: Any

        def to_json(self) -> dict[str, Any]:
            return {}

    store.put(key, CachedOutcome(value=Odd(np.arange(3))))
    assert store.get(key) is None and "kernels" in store.stats.uncodable and store.stats.stored == 0
    assert store.key("kernels", {"x": object()}, {}) is None  # a parameter JSON cannot hold: not keyable


def test_key_depends_on_params_and_inputs(cache_dir: Path) -> None:
    model = load(SAMPLE)
    store = for_model(model)
    assert store is not None
    base = store.key("kernels", {"top_n": 20}, {"steps": "k1"})
    assert base == store.key("kernels", {"top_n": 20}, {"steps": "k1"})
    assert len({base, store.key("kernels", {"top_n": 21}, {"steps": "k1"}),
                store.key("kernels", {"top_n": 20.0}, {"steps": "k1"}),
                store.key("kernels", {"top_n": 20}, {"steps": "k2"}),
                store.key("kernels", {"top_n": 20}, {"steps": analyses_mod.ABSENT}),
                store.key("ops", {"top_n": 20}, {"steps": "k1"})}) == 6


def test_bad_param_value_fails_its_analysis_as_without_cache(cache_dir: Path) -> None:
    model = load(SAMPLE)
    bad = Config({"idle_gaps.long_gap_us": "not a number"})
    plain = run_analyses(model, bad)
    cached = run_analyses(model, bad, cache=for_model(model))
    assert "idle_gaps" in plain.failed and cached.failed == plain.failed
    assert list(cached.values) == list(plain.values)


# -- shared derived tables ----------------------------------------------------------------------

@pytest.fixture
def keep_every_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shared table built is kept, however cheap its build (the sample traces build theirs
    in a few milliseconds, under the thresholds)."""
    monkeypatch.setattr(analyses_mod, "STORE_TABLE_MIN_S", 0.0)
    monkeypatch.setattr(analyses_mod, "STORE_TABLE_S_PER_BYTE", 0.0)


def _table_files(root: Path) -> list[Path]:
    return sorted((root / "models").glob("*/results/*.tab"))


@pytest.mark.parametrize("path", [SAMPLE, LEGACY], ids=lambda p: p.name)
def test_partial_hit_reads_shared_tables_back_and_equals_a_fresh_run(
    path: Path, tmp_path: Path, cache_dir: Path, keep_every_table: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept: dict[str, Any] = {}
    put_table = ResultStore.put_table

    def recording(self: ResultStore, key: str, name: str, value: object) -> None:
        kept[key] = (name, value)
        put_table(self, key, name, value)

    monkeypatch.setattr(ResultStore, "put_table", recording)
    _summary(path, tmp_path / "first")
    files = _table_files(cache_dir)
    assert files and len(files) == len(kept), "every table built is kept with the thresholds at 0"
    # Each reads back as the value that was built.
    model = load(path)
    store = for_model(model)
    assert store is not None
    for key, (name, value) in kept.items():
        found = store.get_table(key)
        assert found is not None, name
        _same(value, found.value, name)
    # Another threshold reruns idle_gaps and its readers, which read the tables back instead of
    # building them; the report is a fresh run's.
    other = Config({"idle_gaps.long_gap_us": 250, "rules.min_cost_pct": 0.5})
    store = for_model(model)
    assert store is not None
    results = run_analyses(model, other, cache=store)
    assert store.stats.tables_read > 0 and store.stats.tables_stored == 0 and store.stats.damaged == 0
    write_outputs(report_from_results(model, results, other, source=str(path)), tmp_path / "second", ["json"])
    monkeypatch.setenv("TRACEANALYZER_NO_CACHE", "1")
    assert (tmp_path / "second" / "summary.json").read_bytes() == _summary(path, tmp_path / "fresh", other)


def test_damaged_table_is_ignored_and_rebuilt(tmp_path: Path, cache_dir: Path, keep_every_table: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _summary(SAMPLE, tmp_path / "first")
    files = _table_files(cache_dir)
    assert files
    for i, f in enumerate(files):
        data = bytearray(f.read_bytes())
        if i % 2:
            data[len(data) // 2] ^= 0x10  # a flipped bit
        else:
            del data[len(data) // 3:]  # truncated
        f.write_bytes(bytes(data))
    other = Config({"idle_gaps.long_gap_us": 250})
    model = load(SAMPLE)
    store = for_model(model)
    assert store is not None
    results = run_analyses(model, other, cache=store)
    assert store.stats.tables_read == 0 and store.stats.damaged > 0
    write_outputs(report_from_results(model, results, other, source=str(SAMPLE)), tmp_path / "second", ["json"])
    monkeypatch.setenv("TRACEANALYZER_NO_CACHE", "1")
    assert (tmp_path / "second" / "summary.json").read_bytes() == _summary(SAMPLE, tmp_path / "fresh", other)


def test_table_entry_is_not_a_result_nor_the_reverse(cache_dir: Path) -> None:
    """A table's file renamed to a result's name (or the reverse) is refused, never used."""
    model = load(SAMPLE)
    store = for_model(model)
    assert store is not None
    key = store.table_key("some_table")
    store.put_table(key, "some_table", pl.DataFrame({"a": [1, 2]}))
    assert store.get(key) is None  # no .res under that key
    store.path(key).write_bytes(store.path(key, results_mod.TABLE_SUFFIX).read_bytes())
    assert store.get(key) is None and store.stats.damaged == 1 and not store.path(key).exists()
    found = store.get_table(key)
    assert found is not None and found.value.equals(pl.DataFrame({"a": [1, 2]}))


def test_only_a_costly_build_is_kept_and_nested_builds_count_for_themselves(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table is kept when its own build (not the tables it asked for) took long enough: here
    the inner table sleeps past the threshold, the outer one only waits for it."""
    import time

    monkeypatch.setattr(analyses_mod, "STORE_TABLE_MIN_S", 0.05)
    monkeypatch.setattr(analyses_mod, "STORE_TABLE_S_PER_BYTE", 0.0)
    kept: list[str] = []

    class Tables:
        def table_key(self, name: str) -> str:
            return name

        def get_table(self, key: str) -> Any:
            return None

        def put_table(self, key: str, name: str, value: object) -> None:
            kept.append(name)

    assert isinstance(Tables(), analyses_mod.TableCache)
    t = analyses_mod._StoredTables(load(SAMPLE), {}, Tables())

    def inner() -> int:
        time.sleep(0.08)
        return 1

    assert t.get("outer", lambda: t.get("inner", inner) + 1) == 2
    assert kept == ["inner"]
