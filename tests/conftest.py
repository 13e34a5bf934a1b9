"""Shared test fixtures: the ../shared reference data and tiny hand-built traces."""

from __future__ import annotations

import functools
import gzip
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.events import kineto_doc  # noqa: F401  (re-exported: tests import it from conftest)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_TRACES = SHARED / "data" / "traces"

needs_shared = pytest.mark.skipif(not SHARED_TRACES.exists(), reason="../shared reference data not present")


def shared_trace_files() -> list[Path]:
    """Every JSON(.gz) file under ../shared/data/traces (empty if absent)."""
    if not SHARED_TRACES.exists():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".gz")))


#: ../shared files that are not chrome traces and that the loader must refuse with this message
#: (test_shared_traces checks the refusal; the other real-trace sweeps leave them out).
REFUSED = {"hta/execution_trace/benchmark_simple_add_et.json.gz": "Execution Trace"}


@functools.cache
def shared_chrome_traces() -> tuple[Path, ...]:
    """The ../shared files that are chrome traces (:func:`shared_trace_files` less :data:`REFUSED`
    and the memory-timeline exports), for the sweeps where a load failure must fail the test."""
    from traceanalyzer.load import sniff

    return tuple(p for p in shared_trace_files()
                 if str(p.relative_to(SHARED_TRACES)) not in REFUSED and sniff(p) == "trace")


#: The ../shared/data files the default run sweeps (small, one of each kind: CPU-only, AMD, MTIA,
#: CUDA graphs, counters, plain JSON, a memory-timeline export, the refused Execution Trace, an
#: OOM snapshot …); the other files run in the slow set (``pytest -m slow``), which CI runs too.
REPRESENTATIVE = frozenset({
    "traces/hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "traces/hta/execution_trace/benchmark_simple_add_et.json.gz",
    "traces/hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "traces/hta/call_stack/backward_thread.json",
    "traces/hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "traces/hta/memory_analysis/memory_timeline.raw.gz",
    "traces/hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "traces/hta/trace_filter/sampled_rank-0.json.gz",
    "traces/kineto/gpu_metrics_input.json",
    "traces/tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "traces/tracelens/inference/vllm_graph_execution.json.gz",
    "traces/tracelens/misc/torch_compile_triton.json.gz",
    "snapshots/DocuBox__dump_snapshot.pickle",
    "snapshots/Yiyi__oom_snapshot.pickle",
    "snapshots/synthetic/snap_2.0_legacy_ring1.pickle",
    "snapshots/synthetic/snap_2.13.pickle",
    "snapshots/synthetic/snap_2.13_state_oom.pickle",
    "profiler_cpu/timeline.json.gz",
    "profiler_cpu/timeline.raw.json.gz",
})


def shared_params(files: Iterable[Path]) -> list[Any]:
    """``files`` (under ../shared/data) as pytest params named by their path under
    ../shared/data/traces (or ../shared/data for the other inputs), those outside
    :data:`REPRESENTATIVE` marked ``slow``."""
    data = SHARED / "data"
    out = []
    for p in files:
        rel = str(p.relative_to(data))
        name = str(p.relative_to(SHARED_TRACES)) if p.is_relative_to(SHARED_TRACES) else rel
        out.append(pytest.param(p, id=name, marks=() if rel in REPRESENTATIVE else pytest.mark.slow))
    return out


@pytest.fixture(scope="session", autouse=True)
def _private_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The model cache (traceanalyzer.store.cache) is off for the whole session and points into a
    temporary directory: tests load real files and must exercise the loaders, never a cached model,
    and nothing may land in the user's ~/.cache. Tests of the cache itself turn it on for a
    temporary directory of their own (tests/test_model_cache.py). Set on os.environ, so the
    subprocesses a test starts (batch workers, the CLI) inherit it."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
    mp.setenv("TRACEANALYZER_NO_CACHE", "1")
    mp.delenv("TRACEANALYZER_CACHE_DIR", raising=False)
    mp.delenv("TRACEANALYZER_CACHE_MAX", raising=False)
    yield
    mp.undo()


def write_trace(path: Path, doc: Any) -> Path:
    data = orjson.dumps(doc)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


# One load (and one full analysis run) per real trace for the whole session: several
# test modules check different things on the same ~50 files, and loading dominates.
@functools.cache
def shared_model(path: Path) -> Any:
    """The model of a ../shared trace, loaded once per test session (raises InputError as load does)."""
    from traceanalyzer.load import load

    return load(path)


@functools.cache
def shared_results(path: Path) -> Any:
    """Every analysis run once (strict: internal errors propagate) on :func:`shared_model`."""
    from traceanalyzer.analyses import run_analyses

    return run_analyses(shared_model(path), strict=True)


def rule_inputs(*rule_ids: str) -> tuple[str, ...]:
    """The analyses the rules ``rule_ids`` read (``needs``, ``needs_any`` and ``uses``): a rule
    test runs only these (``run_analyses(model, only=...)`` adds their dependencies), not every
    analysis."""
    from traceanalyzer.rules import registry

    specs = registry()
    return tuple(sorted({name for rid in rule_ids for name in specs[rid].reads}))


def fail_writes(monkeypatch: Any, err_no: int, after: int = 0) -> dict[str, int]:
    """Make every output write after the first ``after`` fail with ``err_no`` (a full disk, a
    read-only mount), half of its data written first. Only writes: ``os.fdopen`` (what
    ``report/fsutil.py`` writes through) is patched for the whole process, and the loader opens
    inputs with it too. Returns the write counter."""
    import os

    real_fdopen = os.fdopen
    calls = {"n": 0}

    class _Full:
        def __init__(self, fd: int) -> None:
            self.f = real_fdopen(fd, "wb")

        def __enter__(self) -> _Full:
            return self

        def __exit__(self, *a: object) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            calls["n"] += 1
            if calls["n"] <= after:
                return self.f.write(data)
            self.f.write(data[: len(data) // 2])
            raise OSError(err_no, os.strerror(err_no))

    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: (
        _Full(fd) if "w" in mode else real_fdopen(fd, mode, *a, **k)))
    return calls
