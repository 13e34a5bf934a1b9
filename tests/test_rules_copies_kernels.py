"""Copy, sync and kernel rules on hand-built traces with hand-computed evidence and costs.

Every trace has 3 identical steps of 1000 µs (ProfilerStep#1..3 at 0, 1000, 2000 µs): all
three are steady, the median step is 1 ms, so "per step" = the per-step figure below and
% of step = µs / 10. Times in the builders are µs relative to the step start ``t0``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import rule_inputs
from support.events import gpu
from support.events import x as _x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.rules import Finding, Severity, registry, run_rules

A100 = {"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 85_000_000_000, "computeMajor": 8, "warpSize": 32}
STEPS = (0, 1000, 2000)
MINE = ("pageable_memcpy", "blocking_copies", "explicit_sync", "item_sync", "htod_in_step", "fp32_gemm",
        "layout_transposes", "unfused_elementwise", "optimizer_not_fused", "zero_grad_memset")
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >()"
BF16_GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32"


class _Ids:
    n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int, **args: Any) -> dict[str, Any]:
    return gpu(cat, name, ts, dur, corr, **args)


def _kernel(ids: _Ids, ts: float, dur: float, name: str = "k", api: str = "cudaLaunchKernel") -> list[dict[str, Any]]:
    """Launch call at ``ts`` (3 µs); the kernel starts at ``ts + 5``."""
    c = ids()
    return [_x("cuda_runtime", api, ts, 3, correlation=c), _gpu("kernel", name, ts + 5, dur, c)]


def _memcpy(ids: _Ids, ts: float, dur: float, name: str, gpu_ts: float, gpu_dur: float = 1,
            api: str = "cudaMemcpyAsync", nbytes: int = 4) -> list[dict[str, Any]]:
    c = ids()
    return [_x("cuda_runtime", api, ts, dur, correlation=c), _gpu("gpu_memcpy", name, gpu_ts, gpu_dur, c, bytes=nbytes)]


def _sync(ts: float, dur: float, api: str = "cudaStreamSynchronize") -> dict[str, Any]:
    return _x("cuda_runtime", api, ts, dur)


def _trace(step: Callable[[_Ids, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    ids = _Ids()
    ev: list[dict[str, Any]] = []
    for i, t0 in enumerate(STEPS):
        ev.append(_x("user_annotation", f"ProfilerStep#{i + 1}", t0, 1000))
        ev += step(ids, t0)
    return ev


def _run(events: list[dict[str, Any]], props: list[dict[str, Any]] | None = None, config: Config | None = None,
         **top: Any) -> tuple[dict[str, Finding], dict[str, str]]:
    model = build_model(Path("x.json"), {"schemaVersion": 1, "traceEvents": events,
                                         "deviceProperties": [A100] if props is None else props, **top})
    results = run_analyses(model, config, only=rule_inputs(*MINE), strict=True)
    out = run_rules(results, config)
    assert not {k: v for k, v in out.failed.items() if k in MINE}
    mine = [f for f in out.findings if f.rule_id in MINE]
    assert len({f.rule_id for f in mine}) == len(mine)  # one finding per rule
    steps = results["steps"]
    assert steps.steady_windows() == [0, 1, 2] and steps.stats["median"] == 1_000_000
    return {f.rule_id: f for f in mine}, dict(out.not_run)


def _only(found: dict[str, Finding], rule_id: str) -> Finding:
    assert set(found) == {rule_id}, set(found)
    return found[rule_id]


# --------------------------------------------------------------------------------------------
# pageable_memcpy
# --------------------------------------------------------------------------------------------


def _pageable_step(call_us: float, memory: str = "Pageable") -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        ev = [_x("cpu_op", "aten::to", t0 + 100, call_us + 50), _x("cpu_op", "aten::_to_copy", t0 + 101, call_us + 48),
              _x("cpu_op", "aten::copy_", t0 + 102, call_us + 46)]
        ev += _memcpy(ids, t0 + 103, call_us, f"Memcpy HtoD ({memory} -> Device)", t0 + 103 + call_us - 10,
                      gpu_dur=10, nbytes=1_000_000)
        return ev + _kernel(ids, t0 + 500, 50)
    return step


def test_pageable_memcpy_costs_the_gpu_idle_it_causes() -> None:
    # GIVEN one pageable HtoD copy per step whose cudaMemcpyAsync blocks 200 µs [103, 303), the
    # GPU copying only at the end [293, 303), after the previous step's kernel ended at 555
    found, _ = _run(_trace(_pageable_step(200)))
    f = _only(found, "pageable_memcpy")
    # THEN the cost is the GPU idle while the call blocked: [103, 293) = 190 µs in steps 2 and 3
    # (in step 1 the GPU had not started yet: idle before its first activity is no gap) →
    # 380 / 3 µs per step = 12.67 % → CRITICAL (≥ 10 %); the CPU wait (200 µs) is evidence
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (
        0.127, 12.67, Severity.CRITICAL, 0.7)
    assert f.title == ("1 copy per step uses pageable host memory: the GPU idles 0.127 ms/step while the CPU "
                       "stages it")
    ev = f.evidence
    assert (ev["copies_per_step"], ev["bytes_per_step"], ev["cpu_wait_ms_per_step"]) == (1.0, 1_000_000, 0.2)
    assert (ev["gpu_idle_owned_ms_per_step"], ev["copy_gpu_ms_per_step"]) == (0.127, 0.01)
    assert ev["by_kind"] == [{"kind": "HtoD", "count": 3, "bytes": 3_000_000, "cpu_ns": 600_000}]
    assert ev["top_call_sites"][0]["count"] == 3 and ev["top_call_sites"][0]["direction"] == "HtoD"


@pytest.mark.parametrize(("call_us", "memory"), [(200, "Pinned"), (15, "Pageable")])
def test_pageable_memcpy_silent_when_pinned_or_below_threshold(call_us: float, memory: str) -> None:
    # pinned memory: no signal; pageable but 15 µs/step < min_ms_per_step 0.02 ms
    found, _ = _run(_trace(_pageable_step(call_us, memory)))
    assert "pageable_memcpy" not in found


def test_pageable_memcpy_threshold_is_overridable() -> None:
    # a 15 µs call [103, 118) whose copy runs [108, 118): the GPU idled 5 µs of it (steps 2, 3)
    found, _ = _run(_trace(_pageable_step(15)), config=Config({"pageable_memcpy.min_ms_per_step": 0.001}))
    assert found["pageable_memcpy"].cost_ms_per_step == 0.003


def test_pageable_memcpy_not_applicable_on_rocm() -> None:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return (_memcpy(ids, t0 + 10, 200, "Memcpy HtoD (Host -> Device)", t0 + 200, api="hipMemcpyAsync")
                + _kernel(ids, t0 + 500, 50, api="hipLaunchKernel"))
    found, not_run = _run(_trace(step), props=[], roctracer_version=4)
    assert "pageable_memcpy" not in found and "pinned or pageable" in not_run["pageable_memcpy"]


# --------------------------------------------------------------------------------------------
# blocking_copies
# --------------------------------------------------------------------------------------------


def _blocking_step(api: str) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return (_memcpy(ids, t0 + 100, 100, "Memcpy HtoD (Pinned -> Device)", t0 + 190, gpu_dur=5, api=api,
                        nbytes=4096) + _kernel(ids, t0 + 500, 50))
    return step


def test_blocking_copies_fires_for_sync_api() -> None:
    # GIVEN a cudaMemcpy (synchronous API) from pinned memory blocking 100 µs [100, 200) per step,
    # its copy on the GPU at [190, 195), the previous kernel done at 555 of the step before
    found, _ = _run(_trace(_blocking_step("cudaMemcpy")))
    f = _only(found, "blocking_copies")
    # THEN the GPU idles during the call and after it until the next kernel at 505 (the gap
    # [195, 505) overlaps the call: a memcpy gap): ≥ 310 µs per step, capped by the 100 µs the CPU
    # would gain without the block → 0.1 ms/step = 10 % → CRITICAL (critical_pct 10)
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.1, 10.0, Severity.CRITICAL, 0.8)
    assert f.title == "1 synchronous memcpy/memset call per step: the GPU idles 0.1 ms/step"
    ev = f.evidence
    assert (ev["calls_per_step"], ev["cpu_wait_ms_per_step"], ev["copy_waits_per_step"]) == (1.0, 0.1, 0.0)
    assert ev["by_api"] == [{"api": "cudaMemcpy", "activity": "memcpy", "kind": "HtoD", "count": 3,
                             "cpu_ns": 300_000, "bytes": 12_288, "gpu_ns": 15_000}]


def test_blocking_copies_silent_for_async_api() -> None:
    found, _ = _run(_trace(_blocking_step("cudaMemcpyAsync")))
    assert found == {}


# --------------------------------------------------------------------------------------------
# explicit_sync
# --------------------------------------------------------------------------------------------


def _explicit_step(next_launch: float) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        # kernel on the GPU [t0+55, t0+555); cudaDeviceSynchronize [t0+60, t0+555); next kernel
        # launched at ``next_launch``, starting 5 µs later
        return (_kernel(ids, t0 + 50, 500) + [_sync(t0 + 60, 495, "cudaDeviceSynchronize")]
                + _kernel(ids, t0 + next_launch, 10))
    return step


def test_explicit_sync_fires_with_min_of_idle_and_blocked() -> None:
    found, _ = _run(_trace(_explicit_step(750)))
    f = _only(found, "explicit_sync")
    # idle after = 755 − 555 = 200 µs, blocked 495 µs → cost min = 200 µs/step = 20 % → CRITICAL
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity) == (0.2, 20.0, Severity.CRITICAL)
    assert f.title == "1 explicit synchronize call per step costs 0.2 ms/step of GPU idle"
    ev = f.evidence
    assert (ev["syncs_per_step"], ev["cpu_wait_ms_per_step"], ev["gpu_idle_owned_ms_per_step"]) == (1.0, 0.495, 0.2)
    assert ev["top_call_sites"][0]["apis"] == "cudaDeviceSynchronize" and ev["top_call_sites"][0]["count"] == 3


def test_sync_on_a_busy_gpu_costs_nothing() -> None:
    # GIVEN a GPU 98.4 % busy: a 980 µs kernel per step, the CPU blocked 975 µs in
    # cudaStreamSynchronize waiting for it, the next kernel queued right after the sync returns
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return _kernel(ids, t0, 980) + [_sync(t0 + 10, 975)] + _kernel(ids, t0 + 990, 4)
    found, _ = _run(_trace(step), config=Config({"explicit_sync.min_ms_per_step": 0.0}))
    f = found["explicit_sync"]
    # THEN the cost is the 10 µs the GPU idled after the sync ([985, 995)), not the 975 µs wait
    assert (f.cost_ms_per_step, f.evidence["cpu_wait_ms_per_step"]) == (0.01, 0.975)
    # and at the default threshold (0.02 ms) it is not reported at all
    found, _ = _run(_trace(step))
    assert "explicit_sync" not in found


def test_syncs_of_two_threads_draining_one_gap_price_it_once() -> None:
    # GIVEN two threads both blocked in a synchronize until the GPU drains at 215, and the next
    # kernel only at 305: one gap of 90 µs, seen after both syncs
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return (_kernel(ids, t0 + 10, 200) + [_sync(t0 + 20, 196), _x("cuda_runtime", "cudaDeviceSynchronize",
                                                                      t0 + 30, 186, tid=200)]
                + _kernel(ids, t0 + 300, 10))
    found, _ = _run(_trace(step))
    f = _only(found, "explicit_sync")
    # THEN the gap is priced once (the later sync's span starts where the first one's ends)
    assert (f.cost_ms_per_step, f.evidence["gpu_idle_owned_ms_per_step"]) == (0.09, 0.09)
    assert f.evidence["cpu_wait_ms_per_step"] == 0.382


def test_explicit_sync_silent_when_gpu_idles_briefly() -> None:
    # next kernel starts at t0+570: 15 µs idle → cost 0.015 ms < 0.02 ms
    found, _ = _run(_trace(_explicit_step(565)))
    assert found == {}


# --------------------------------------------------------------------------------------------
# item_sync
# --------------------------------------------------------------------------------------------


def _item(ids: _Ids, t0: int, start: float, call: float, gpu_ts: float) -> list[dict[str, Any]]:
    """aten::item > _local_scalar_dense > a blocking pageable DtoH cudaMemcpyAsync of ``call`` µs."""
    ev = [
        _x("cpu_op", "aten::item", t0 + start, call + 4),
        _x("cpu_op", "aten::_local_scalar_dense", t0 + start + 1, call + 2),
    ]
    return ev + _memcpy(ids, t0 + start + 2, call, "Memcpy DtoH (Device -> Pageable)", t0 + gpu_ts)


def _item_step(first: bool) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        ev = _kernel(ids, t0 + 10, 300)  # GPU [15, 315)
        if first:  # item #1: call [22, 318) (296 µs, drains the queue), its copy at 316
            ev += _item(ids, t0, 20, 296, 316)
        ev += _kernel(ids, t0 + 360, 10)  # GPU [365, 375): idle after item #1 = 365 − 318 = 47 µs
        ev += _item(ids, t0, 380, 10, 385)  # item #2: call [382, 392), copy at 385
        ev += _kernel(ids, t0 + 450, 10)  # GPU [455, 465): idle after item #2 = 455 − 392 = 63 µs
        return ev
    return step


def test_item_sync_lead_covers_later_idle() -> None:
    found, _ = _run(_trace(_item_step(first=True)))
    f = _only(found, "item_sync")  # the pageable DtoH copies belong to item_sync, not pageable_memcpy
    # owned idle: item #1 [22, 365) holds the gap [317, 365) after its copy = 48 µs; item #2
    # [382, 455) holds [382, 385) before its copy and [386, 455) after it = 72 µs.
    # blocked b = [296, 10], idle d = [48, 72]; covered C1 = min(48, 296) = 48,
    # C2 = min(48 + 72, 296 + 10) = 120 → 120 µs/step (per-point min would say 48 + 10 = 58)
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.12, 12.0, Severity.CRITICAL, 0.7)
    assert f.title == ("2 host reads of device values per step (aten::item) stall the GPU queue: "
                       "0.12 ms/step of GPU idle")
    ev = f.evidence
    assert (ev["sync_points_per_step"], ev["cpu_wait_ms_per_step"], ev["gpu_idle_owned_ms_per_step"]) == (
        2.0, 0.306, 0.12)
    assert ev["by_cause"] == [{"cause": "aten::item", "count": 6, "blocked_ns": 918_000, "gpu_idle_ns": 360_000,
                               "cost_ns": 360_000}]


def test_item_sync_silent_below_threshold() -> None:
    # only item #2: min(63, 10) = 10 µs/step < 0.02 ms
    found, _ = _run(_trace(_item_step(first=False)))
    assert found == {}


# --------------------------------------------------------------------------------------------
# One blocking call of each kind: each rule prices its own, nothing twice
# --------------------------------------------------------------------------------------------


def _mixed_step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
    ev = _kernel(ids, t0 + 10, 200)  # GPU [15, 215)
    ev.append(_sync(t0 + 20, 195))  # explicit: blocked [20, 215); idle until K2 at 245 → 30
    ev += _kernel(ids, t0 + 240, 200)  # GPU [245, 445)
    ev += _item(ids, t0, 250, 200, 446)  # item: call [252, 452) pageable DtoH; idle until K3 at 485 → 33
    ev += _kernel(ids, t0 + 480, 100)  # GPU [485, 585)
    ev += _memcpy(ids, t0 + 490, 100, "Memcpy HtoD (Pinned -> Device)", t0 + 586, api="cudaMemcpy")  # sync API, 100
    ev += _memcpy(ids, t0 + 600, 50, "Memcpy HtoD (Pageable -> Device)", t0 + 640, gpu_dur=10)  # pageable, 50
    # .cpu() into pinned memory: aten::to > async DtoH (5 µs) + the copy's own stream sync [668, 673)
    ev.append(_x("cpu_op", "aten::to", t0 + 660, 20))
    ev += _memcpy(ids, t0 + 662, 5, "Memcpy DtoH (Device -> Pinned)", t0 + 670)
    ev.append(_sync(t0 + 668, 5))
    ev += _kernel(ids, t0 + 700, 10)  # GPU [705, 715): idle after the .cpu() sync = 705 − 673 = 32
    return ev


def test_each_blocking_call_priced_once() -> None:
    found, _ = _run(_trace(_mixed_step), config=Config({"blocking_copies.min_ms_per_step": 0.01}))
    assert set(found) == {"explicit_sync", "item_sync", "blocking_copies", "pageable_memcpy"}
    ex, it, bc, pg = (found[k] for k in ("explicit_sync", "item_sync", "blocking_copies", "pageable_memcpy"))
    # GPU idle owned, capped by the CPU wait: explicit: gap [215, 245) = min(30, 195);
    # item: gap [447, 485) = min(38, 200) (its pageable DtoH is not pageable_memcpy's);
    # blocking: the cudaMemcpy's [587, 600) = min(13, 100) (the GPU ran K3 most of the call),
    # plus the .cpu() point's [662, 670) and [671, 705) capped by its 5 µs sync = 5;
    # pageable: [600, 640) and [650, 662) = min(52, 50)
    assert (ex.cost_ms_per_step, it.cost_ms_per_step, bc.cost_ms_per_step, pg.cost_ms_per_step) == (
        0.03, 0.038, 0.018, 0.05)
    assert ex.evidence["syncs_per_step"] == 1.0  # the .cpu() sync is not an explicit one
    assert pg.evidence["copies_per_step"] == 1.0  # the item's pageable copy is not counted
    assert (bc.evidence["calls_per_step"], bc.evidence["copy_waits_per_step"]) == (1.0, 1.0)
    assert bc.title == ("1 synchronous memcpy/memset call and 1 copy waiting on the stream (non_blocking=False) "
                        "per step: the GPU idles 0.018 ms/step")
    # CPU wait per rule adds up to the blocking calls' time (195 + 200 + 100 + 5 + 50 µs), once
    blocked = [ex.evidence["cpu_wait_ms_per_step"], it.evidence["cpu_wait_ms_per_step"],
               bc.evidence["cpu_wait_ms_per_step"], pg.evidence["cpu_wait_ms_per_step"]]
    assert blocked == [0.195, 0.2, 0.105, 0.05] and sum(blocked) == pytest.approx(0.55)
    assert bc.evidence["copy_waits"][0]["blocked_ns"] == 15_000
    # the four costs together never exceed the sync/memcpy idle of the step
    assert sum(f.cost_ms_per_step for f in (ex, it, bc, pg)) <= 0.2


# --------------------------------------------------------------------------------------------
# htod_in_step
# --------------------------------------------------------------------------------------------


def _htod_step(n: int, call_us: float) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        ev: list[dict[str, Any]] = []
        for i in range(n):  # pinned async HtoD copies, GPU 2 µs each
            ev += _memcpy(ids, t0 + 10 + 20 * i, call_us, "Memcpy HtoD (Pinned -> Device)", t0 + 15 + 20 * i, gpu_dur=2)
        return ev + _kernel(ids, t0 + 500, 50)
    return step


def test_htod_in_step_fires_above_ten_per_step() -> None:
    found, _ = _run(_trace(_htod_step(12, 4)))
    f = _only(found, "htod_in_step")
    # 12 copies × 2 µs of GPU time, none hidden under a kernel = 24 µs/step = 2.4 % < 5 % → INFO
    # (it fires on the count, > 10); the 4 µs CPU launch of each is evidence, not cost
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.024, 2.4, Severity.INFO, 0.4)
    assert f.title == "12 host-to-device copies per step (0.024 ms/step of GPU copy time)"
    ev = f.evidence
    assert (ev["copies_per_step"], ev["bytes_per_step"], ev["gpu_ms_per_step"], ev["cpu_launch_ms_per_step"]) == (
        12.0, 48, 0.024, 0.048)
    assert (ev["host_blocking_per_step"], ev["copy_gpu_ms_per_step"]) == (0.0, 0.024)


def test_htod_in_step_copies_hidden_under_compute_cost_nothing() -> None:
    # the same 12 copies per step, all while a long kernel runs: the GPU hides them
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return _kernel(ids, t0, 600) + _htod_step(12, 4)(ids, t0)[:-2]
    found, _ = _run(_trace(step))
    f = _only(found, "htod_in_step")
    assert (f.cost_ms_per_step, f.evidence["gpu_ms_per_step"]) == (0.0, 0.024)


def test_htod_in_step_silent_at_ten_per_step_below_time_share() -> None:
    # 10 per step (not > 10) and 10 × 2 µs GPU = 20 µs = 2 % < 5 %
    found, _ = _run(_trace(_htod_step(10, 2)))
    assert found == {}


# --------------------------------------------------------------------------------------------
# fp32_gemm
# --------------------------------------------------------------------------------------------


def _gemm_step(gemm: str, api: str = "cudaLaunchKernel", ops: list[dict[str, Any]] | None = None
               ) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        ev = [dict(o, ts=o["ts"] + t0) for o in (ops or [])]
        return ev + _kernel(ids, t0 + 20, 300, gemm, api) + _kernel(ids, t0 + 400, 100, EW, api)
    return step


def test_fp32_gemm_fires_for_simt_sgemm_on_nvidia() -> None:
    found, _ = _run(_trace(_gemm_step("ampere_sgemm_128x64_nn")))
    f = _only(found, "fp32_gemm")
    # sgemm 300 µs of 400 µs kernel time = 75 %; cost 300 × (1 − 1/2) = 150 µs/step = 15 %
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.15, 15.0, Severity.WARNING, 0.6)
    assert f.title == "75 % of kernel time is SIMT FP32 (no tensor cores) GEMM/conv on NVIDIA (0.3 ms/step)"
    ev = f.evidence
    assert (ev["pct_of_kernel_time"], ev["fp32_gemm_ms_per_step"], ev["compute_major"], ev["evidence_from"]) == (
        75.0, 0.3, [8], "kernel names")


def test_fp32_gemm_tf32_is_info() -> None:
    found, _ = _run(_trace(_gemm_step("cutlass_80_tensorop_s1688gemm_tf32_128x128_16x4_nn")))
    f = _only(found, "fp32_gemm")
    assert (f.severity, f.cost_ms_per_step, f.evidence["tf32_gemm_ms_per_step"]) == (Severity.INFO, 0.15, 0.3)


@pytest.mark.parametrize("props", [[A100], [dict(A100, computeMajor=6)]])
def test_fp32_gemm_silent_for_bf16_or_without_tensor_cores(props: list[dict[str, Any]]) -> None:
    # bf16 GEMM: nothing to gain; an sgemm on a Pascal GPU (computeMajor 6) has no tensor cores to use
    gemm = BF16_GEMM if props == [A100] else "ampere_sgemm_128x64_nn"
    found, _ = _run(_trace(_gemm_step(gemm)), props=props)
    assert "fp32_gemm" not in found


AMD_SGEMM = "Cijk_Ailk_Bljk_SB_MT128x128x8_SN_sgemm_simt"  # 'sgemm'/'simt' would read FP32 SIMT on NVIDIA


def test_fp32_gemm_amd_does_not_apply_nvidia_names() -> None:
    # GIVEN an AMD trace whose GEMM name holds NVIDIA tokens, without record_shapes
    found, not_run = _run(_trace(_gemm_step(AMD_SGEMM, "hipLaunchKernel")), props=[], roctracer_version=4)
    # THEN no FP32 verdict from the name: the rule says it cannot decide
    assert "fp32_gemm" not in found
    assert "precision the trace does not say" in not_run["fp32_gemm"] and "record_shapes" in not_run["fp32_gemm"]


def test_fp32_gemm_amd_from_op_dtype() -> None:
    mm = [_x("cpu_op", "aten::mm", 15, 20, **{"Input type": ["float", "float"]})]
    found, _ = _run(_trace(_gemm_step(AMD_SGEMM, "hipLaunchKernel", mm)), props=[], roctracer_version=4)
    f = _only(found, "fp32_gemm")
    assert (f.cost_ms_per_step, f.confidence, f.evidence["evidence_from"]) == (0.15, 0.4, "input dtypes of the "
                                                                                          "launching ops")
    assert f.title == "75 % of kernel time is FP32 GEMM/conv on AMD (0.3 ms/step)"


def test_fp32_gemm_amd_autocast_is_silent() -> None:
    # aten::linear gets fp32 tensors, the aten::addmm inside that launches the GEMM gets bf16
    ops = [_x("cpu_op", "aten::linear", 15, 30, **{"Input type": ["float", "float", "float"]}),
           _x("cpu_op", "aten::addmm", 18, 20, **{"Input type": ["c10::BFloat16"] * 3})]
    found, not_run = _run(_trace(_gemm_step(AMD_SGEMM, "hipLaunchKernel", ops)), props=[], roctracer_version=4)
    assert "fp32_gemm" not in found and "fp32_gemm" not in not_run


# --------------------------------------------------------------------------------------------
# layout_transposes, unfused_elementwise
# --------------------------------------------------------------------------------------------

CONV = "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw_tilesize128x128x16"
NCHW2NHWC = "void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>()"


def _conv_step(transpose_us: float) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return _kernel(ids, t0 + 20, transpose_us, NCHW2NHWC) + _kernel(ids, t0 + 100, 200, CONV)
    return step


def test_layout_transposes_fires() -> None:
    found, _ = _run(_trace(_conv_step(30)))
    f = _only(found, "layout_transposes")
    # 30 µs of transposes / 200 µs of convolutions = 15 % ≥ 10 % → WARNING; cost 30 µs/step
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity) == (0.03, 3.0, Severity.WARNING)
    assert f.title == "Layout transposes cost 15 % of convolution time (0.03 ms/step): the network runs NCHW"
    assert (f.evidence["pct_of_conv_time"], f.evidence["transposes_per_step"], f.evidence["conv_ms_per_step"]) == (
        15.0, 1.0, 0.2)


def test_layout_transposes_silent_below_five_percent() -> None:
    found, _ = _run(_trace(_conv_step(8)))  # 8 / 200 = 4 %
    assert found == {}


def _ew_step(ew_us: float, gemm_us: float) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return _kernel(ids, t0 + 20, ew_us, EW) + _kernel(ids, t0 + 450, gemm_us, BF16_GEMM)
    return step


def test_unfused_elementwise_fires() -> None:
    found, _ = _run(_trace(_ew_step(400, 400)))
    f = _only(found, "unfused_elementwise")
    # 400 of 800 µs = 50 % of kernel time (WARNING from 50 %); cost 0.5 × 400 = 200 µs/step
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.2, 20.0, Severity.WARNING, 0.4)
    assert f.title == "Elementwise kernels are 50 % of kernel time and 50 % of kernels (1 per step): fuse them"
    assert (f.evidence["elementwise_ms_per_step"], f.evidence["kernels_per_step"], f.evidence["compiled"]) == (
        0.4, 1.0, False)


def test_unfused_elementwise_info_and_silent_below_thirty_percent() -> None:
    found, _ = _run(_trace(_ew_step(300, 700)))  # 300 / 1000 = 30 %: INFO, cost 0.5 × 300 µs
    assert (found["unfused_elementwise"].severity, found["unfused_elementwise"].cost_ms_per_step) == (
        Severity.INFO, 0.15)
    found, _ = _run(_trace(_ew_step(290, 710)))  # 290 / 1000 = 29 % < 30 %, 1 kernel per step < 100
    assert "unfused_elementwise" not in found


# --------------------------------------------------------------------------------------------
# optimizer_not_fused, zero_grad_memset
# --------------------------------------------------------------------------------------------


def _opt_step(inside: list[str], zero_fills: int = 0) -> Callable[[_Ids, int], list[dict[str, Any]]]:
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        ev = [_x("user_annotation", "Optimizer.step#AdamW.step", t0 + 100, 300)]
        ev += [_x("cpu_op", n, t0 + 101, 2) for n in inside]
        for i in range(12):  # 12 kernels of 3 µs launched inside the optimizer range
            ev += _kernel(ids, t0 + 110 + 20 * i, 3, EW)
        ev.append(_x("user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", t0 + 500, 50))
        for i in range(zero_fills):  # memsets of 4 µs
            c = ids()
            ev += [_x("cuda_runtime", "cudaMemsetAsync", t0 + 505 + 10 * i, 3, correlation=c),
                   _gpu("gpu_memset", "Memset (Device)", t0 + 510 + 10 * i, 4, c, bytes=4096)]
        return ev + _kernel(ids, t0 + 600, 400, BF16_GEMM)
    return step


def test_optimizer_not_fused_for_loop() -> None:
    found, _ = _run(_trace(_opt_step(["aten::add_"])))
    f = _only(found, "optimizer_not_fused")
    # for-loop, 12 kernels ≥ 10, optimizer 300 µs = 30 % of the step → WARNING; cost 0.7 × 300 = 210 µs
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity, f.confidence) == (0.21, 21.0, Severity.WARNING, 0.5)
    assert f.title == "AdamW steps parameter by parameter: 12 kernels and 0.3 ms per step"
    assert (f.evidence["implementation"], f.evidence["kernels_per_step"], f.evidence["optimizer_pct_of_step"]) == (
        "for-loop", 12.0, 30.0)
    assert "fused=True" in f.code_hint and "AdamW" in f.code_hint


def test_optimizer_behind_a_busy_gpu_costs_at_most_the_idle() -> None:
    # the same for-loop optimizer (300 µs of CPU, 12 × 3 µs kernels), but a 590 µs kernel queued
    # first keeps the GPU busy while the optimizer's CPU range runs: the GPU is 99 % busy, idle
    # (15 + 10 + 10) / 3 = 11.7 µs per step. A fused optimizer can give the GPU back at most its
    # kernels' 36 µs plus that idle: 0.7 × min(300, 36 + 11.7) = 33 µs, not 0.7 × 300 = 210 µs
    def step(ids: _Ids, t0: int) -> list[dict[str, Any]]:
        return _kernel(ids, t0 + 5, 590) + _opt_step(["aten::add_"])(ids, t0)
    found, _ = _run(_trace(step))
    f = _only(found, "optimizer_not_fused")
    assert (f.evidence["optimizer_ms_per_step"], f.evidence["optimizer_gpu_ms_per_step"]) == (0.3, 0.036)
    assert f.cost_ms_per_step == 0.033


def test_optimizer_foreach_is_info_and_fused_silent() -> None:
    found, _ = _run(_trace(_opt_step(["aten::_foreach_add_"])))
    f = _only(found, "optimizer_not_fused")
    assert (f.severity, f.cost_ms_per_step) == (Severity.INFO, 0.09)  # 0.3 × 300 µs
    found, not_run = _run(_trace(_opt_step(["aten::_fused_adamw_"])))
    assert found == {} and "optimizer_not_fused" not in not_run


def test_optimizer_rules_not_applicable_without_optimizer() -> None:
    found, not_run = _run(_trace(_ew_step(100, 400)))
    assert "Optimizer.step" in not_run["optimizer_not_fused"]
    assert "Optimizer.zero_grad" in not_run["zero_grad_memset"]


def test_zero_grad_memset_fires_and_set_to_none_is_silent() -> None:
    found, _ = _run(_trace(_opt_step(["aten::_fused_adamw_"], zero_fills=3)))
    f = _only(found, "zero_grad_memset")
    # 3 fills per step; cost max(CPU range 50 µs, GPU 3 × 4 µs) = 50 µs/step
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.severity) == (0.05, 5.0, Severity.INFO)
    assert f.title == "zero_grad() launches 3 memset/fill kernels per step (0.05 ms/step)"
    assert (f.evidence["fills_per_step"], f.evidence["zero_grad_gpu_ms_per_step"]) == (3.0, 0.012)
    found, _ = _run(_trace(_opt_step(["aten::_fused_adamw_"], zero_fills=0)))
    assert found == {}


# --------------------------------------------------------------------------------------------
# Documentation: every rule's docstring keeps the Signal / Threshold / Cost / Fix shape
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_id", MINE)
def test_docstring_shape_and_params_documented(rule_id: str) -> None:
    spec = registry()[rule_id]
    lines = [ln.strip() for ln in spec.doc.splitlines()]
    assert "Signal" in " ".join(lines) and "Cost" in lines and "Fix" in lines
    assert any(ln.startswith("Threshold") for ln in lines)
    for p in spec.params:
        assert f"``{p}``" in spec.doc, p
