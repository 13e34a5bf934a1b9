"""syncs analysis: hand-built traces, generator ground truth, sync-rich real traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import shared_results
from support import synthetic
from support.events import gpu, launch
from support.events import x as _x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.syncs import SYNC_APIS
from traceanalyzer.errors import NotApplicable
from traceanalyzer.load.chrome_trace import build_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "data" / "traces"


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int, stream: int = 7, **args: Any) -> dict[str, Any]:
    return gpu(cat, name, ts, dur, corr, stream=stream, **args)


def _kernel(ts: float, dur: float, corr: int, stream: int = 7) -> list[dict[str, Any]]:
    return launch(corr, ts - 5, 3, ts, dur, stream=stream)


def _model(events: list[dict[str, Any]], **top: Any) -> Any:
    return build_model(Path("x.json"), {"schemaVersion": 1, "traceEvents": events, **top})


def _run(model: Any) -> Any:
    r = run_analyses(model, only=("syncs",), strict=True)
    if "syncs" not in r.values:
        raise NotApplicable(r.skipped.get("syncs", "?"))
    return r["syncs"]


def _item(ts: float, corr: int, memcpy: str = "Memcpy DtoH (Device -> Pageable)", outer: str = "aten::item",
          inner: tuple[str, ...] = ("aten::_local_scalar_dense",)) -> list[dict[str, Any]]:
    """``outer > inner…`` issuing a DtoH copy (30 µs call) and a stream sync (20 µs)."""
    ev = [_x("cpu_op", outer, ts, 100)]
    ev += [_x("cpu_op", n, ts + 1 + i, 98 - 2 * i) for i, n in enumerate(inner)]
    ev.append(_x("cuda_runtime", "cudaMemcpyAsync", ts + 10, 30, correlation=corr))
    ev.append(_gpu("gpu_memcpy", memcpy, ts + 35, 2, corr, bytes=4))
    ev.append(_x("cuda_runtime", "cudaStreamSynchronize", ts + 50, 20, correlation=corr + 1))
    return ev


def test_idle_after_is_counted_once_and_inside_its_step() -> None:
    # GIVEN two .item() in a row draining into the same gap, at the end of step 1, and the next
    # kernel only in step 2 (the data loader ran in between)
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 400), _x("user_annotation", "ProfilerStep#2", 400, 600)]
    ev += _kernel(10, 100, 1)
    ev += _item(150, 10)  # calls end at 180 and 220
    ev += _item(250, 20)  # calls end at 280 and 320 (its DtoH copy runs at 285)
    ev += _kernel(900, 50, 30)
    # WHEN
    s = _run(_model(ev))
    # THEN the first point's idle ends at the second's DtoH copy (285 µs); the second sees
    # the idle up to the kernel at 900 µs, but only its part inside step 1 (to 400) counts
    assert s.points["idle_after_ns"].to_list() == [65_000, 580_000]
    assert s.points["idle_after_excl_ns"].to_list() == [65_000, 80_000]
    ps = s.per_step.row(0, named=True)
    assert ps["idle_after_ns"] == 145_000 and ps["pct_idle_after"] == pytest.approx(36.25)
    assert s.totals["idle_after_ns"] == 145_000
    assert all(v <= 100 for v in s.per_step["pct_idle_after"].to_list())


def test_item_is_one_point_with_blocked_time_and_idle_after() -> None:
    # GIVEN a step: a kernel, then loss.item() at train.py:61, then the next kernel 200 µs later
    ev = [_x("user_annotation", "ProfilerStep#3", 0, 1000)]
    ev += _kernel(10, 100, 1)
    ev += [_x("python_function", "train.py(61): compute_metrics", 100, 150)]
    ev += _item(110, 10)  # calls end at 140 and 180
    ev += _kernel(380, 50, 20)
    # WHEN
    s = _run(_model(ev))
    # THEN one sync point (two blocking calls) caused by aten::item at train.py:61
    t = s.totals
    assert (t["sync_points"], t["sync_calls"], t["blocked_ns"]) == (1, 2, 50_000)
    assert t["calls_by_kind"] == {"memcpy": 1, "stream": 1}
    p = s.points.row(0, named=True)
    assert p["cause"] == "aten::item" and p["site"] == "train.py:61 (compute_metrics)" and p["step"] == 3
    assert p["idle_after_ns"] == 200_000  # stream sync ends at 180 µs, next kernel at 380 µs
    assert s.by_cause["cause"].to_list() == ["aten::item"]
    ps = s.per_step.row(0, named=True)
    assert ps["sync_points"] == 1 and ps["blocked_ns"] == 50_000 and ps["pct_blocked"] == pytest.approx(5.0)
    assert ps["pct_idle_after"] == pytest.approx(20.0)
    json.dumps(s.to_json())


def test_explicit_syncs_boolean_mask_and_cuda_dtod_memcpy() -> None:
    ev = [_x("python_function", "train.py(88): train_step", 0, 5000)]
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", 10, 40, correlation=1))
    ev += _item(100, 10, memcpy="Memcpy DtoH (Device -> Pinned)", outer="aten::index", inner=("aten::nonzero",))
    # a CUDA device-to-device cudaMemcpy returns at once: not a sync
    ev.append(_x("cuda_runtime", "cudaMemcpy", 300, 10, correlation=30))
    ev.append(_gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 305, 3, 30, bytes=64))
    # a blocking copy API host-to-device is
    ev.append(_x("cuda_runtime", "cudaMemcpy", 400, 60, correlation=40))
    ev.append(_gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 405, 50, 40, bytes=64))
    s = _run(_model(ev))
    causes = {r["cause"]: r for r in s.by_cause.to_dicts()}
    assert set(causes) == {"cudaDeviceSynchronize", "aten::index (boolean mask)", "cudaMemcpy"}
    # the pinned DtoH copy inside nonzero is not blocking; its stream sync is
    assert causes["aten::index (boolean mask)"]["calls"] == 1
    assert causes["cudaMemcpy"]["blocked_ns"] == 60_000 and causes["cudaMemcpy"]["count"] == 1
    assert s.totals["calls_by_api"] == {"cudaDeviceSynchronize": 1, "cudaMemcpy": 1, "cudaStreamSynchronize": 1}
    assert set(s.by_site["site"]) == {"train.py:88 (train_step)"}
    assert not s.has_steps and s.per_step.height == 1  # whole-trace window


def test_hip_and_mtia_names_and_nested_syncs() -> None:
    ev = [
        _x("cuda_runtime", "hipMemcpyWithStream", 0, 50, correlation=1),
        _gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 5, 10, 1, stream=0, bytes=8),
        _x("cuda_runtime", "hipDeviceSynchronize", 100, 10, correlation=2),
        _x("mtia_runtime", "synchronizeStream", 200, 40, correlation=3),
        _x("mtia_runtime", "synchronize", 210, 20, correlation=3, pid=17, tid=3),  # driver side: not a host call
        _x("cuda_runtime", "cudaStreamSynchronize", 300, 20, correlation=4),
        _x("cuda_runtime", "cudaStreamSynchronize", 305, 10, correlation=5),  # nested in the previous: once
    ]
    s = _run(_model(ev))
    assert s.totals["calls_by_api"] == {
        "cudaStreamSynchronize": 1, "hipDeviceSynchronize": 1, "hipMemcpyWithStream": 1, "synchronizeStream": 1
    }
    assert s.totals["blocked_ns"] == 120_000


def test_idle_after_is_zero_while_another_stream_runs() -> None:
    ev = _kernel(10, 1000, 1, stream=13)  # long kernel on a side stream
    ev += _kernel(10, 50, 2)
    ev.append(_x("cuda_runtime", "cudaStreamSynchronize", 20, 50, correlation=3))
    s = _run(_model(ev))
    assert s.calls["idle_after_ns"].to_list() == [0]


def test_cpu_only_trace_is_not_applicable_and_cpu_items_cost_nothing() -> None:
    ev = [_x("cpu_op", "aten::item", 0, 10), _x("cpu_op", "aten::_local_scalar_dense", 1, 8)]
    r = run_analyses(_model(ev), only=("syncs",))
    assert "syncs" in r.skipped and "CPU-only" in r.skipped["syncs"]
    ev += _kernel(100, 10, 1)
    s = _run(_model(ev))
    assert s.totals["sync_points"] == 0 and s.totals["implied_ops_without_sync"] == 1


# --------------------------------------------------------------------------------------------
# Ground truth from the synthetic generator
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "vendor"),
    [("modern", "nvidia"), ("pt_1_13", "nvidia"), ("legacy_1_8", "nvidia"), ("modern", "amd"), ("modern", "xpu")],
)
def test_scenario_sync_bound_ground_truth(layout: str, vendor: str) -> None:
    doc, truth = synthetic.scenario_sync_bound(layout=layout, vendor=vendor)
    s = _run(build_model(Path("x.json"), doc))
    planted = truth["planted"]
    steps = truth["params"]["steps"]
    # every .item() and every explicit sync is one sync point
    assert s.totals["sync_points"] == planted["items"] + planted["explicit_syncs"]
    by_cause = {r["cause"]: r for r in s.by_cause.to_dicts()}
    assert by_cause["aten::item"]["count"] == planted["items"]
    # explicit sync API calls: exact count and CPU time
    explicit = {n for n in planted["sync_calls_by_name"]}
    calls = s.calls.filter(s.calls["api"].is_in(list(explicit)))
    assert calls.height == sum(planted["sync_calls_by_name"].values())
    assert int(calls["blocked_ns"].sum()) == truth["syncs"]["total_ns"]
    assert set(explicit) <= set(SYNC_APIS)
    # call sites: python frames in every layout but legacy_1_8, whose ops carry a `Call stack`
    # instead (the explicit sync calls sit outside any op there, so they have no frame)
    sites = {r["site"]: r["count"] for r in s.by_site.to_dicts()}
    assert s.has_stacks and sites["train.py:61 (compute_metrics)"] == planted["items"]
    if layout != "legacy_1_8":
        assert sites["train.py:88 (train_step)"] == planted["explicit_syncs"]
    else:
        assert sites["(outside any op or annotation)"] == planted["explicit_syncs"]
    assert s.per_step["sync_points"].to_list() == [s.totals["sync_points"] // steps] * steps


# --------------------------------------------------------------------------------------------
# Real traces rich in syncs: counts equal to an independent count of the runtime calls
# --------------------------------------------------------------------------------------------

REAL = [
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/inference/sglang_Qwen3-8B_decode.json.gz",
    "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
]


@pytest.mark.skipif(not TRACES.exists(), reason="../shared reference traces not present")
@pytest.mark.parametrize("rel", REAL)
def test_real_trace_explicit_sync_counts(rel: str) -> None:
    path = TRACES / rel
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    runtime_cats = {"cuda_runtime", "cuda_driver", "Runtime", "xpu_runtime", "mtia_runtime"}
    expected: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in runtime_cats and e.get("name") in SYNC_APIS:
            expected[e["name"]] = expected.get(e["name"], 0) + 1
    s = shared_results(path)["syncs"]
    got = {k: v for k, v in s.totals["calls_by_api"].items() if k in SYNC_APIS}
    assert got == expected
    assert s.totals["blocked_ns"] >= 0 and s.totals["sync_points"] <= s.totals["sync_calls"]
    json.dumps(s.to_json())
