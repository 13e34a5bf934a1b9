"""Diagnosis: baseline statistics, phases, and the bottleneck verdict on traces built to have one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest
from conftest import shared_model
from support import synthetic as S
from support.events import Trace, ns

from traceanalyzer.analyses import registry, run_analyses
from traceanalyzer.analyses._kernels import kernel_class
from traceanalyzer.analyses._phases import PHASES
from traceanalyzer.analyses.baseline import step_stats
from traceanalyzer.analyses.diagnosis import VERDICTS
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import build_model

REPO = Path(__file__).resolve().parents[1]


def _diagnose(model, **cfg):
    return run_analyses(model, Config(cfg), only=("diagnosis",), strict=True)


_CACHE: dict[str, object] = {}


def _scenario(name: str):
    if name not in _CACHE:
        trace, _truth = getattr(S, f"scenario_{name}")()
        _CACHE[name] = _diagnose(build_model(Path(f"{name}.json"), trace))
    return _CACHE[name]


SCENARIOS = {
    "input_bound": "input_bound",
    "launch_bound": "cpu_bound",
    "compute_bound": "compute_bound",
    "comm_bound": "comm_bound",
    "sync_bound": "sync_bound",
}


@pytest.mark.parametrize("scenario,verdict", list(SCENARIOS.items()))
def test_scenario_gets_its_verdict_overall_and_per_step(scenario: str, verdict: str) -> None:
    res = _scenario(scenario)
    d = res["diagnosis"]
    assert d.verdict == verdict, d.narrative()
    assert d.resource == "gpu"
    assert d.per_step["verdict"].to_list() == [verdict] * d.per_step.height
    assert d.steady_agree == d.n_steady == res["steps"].table.height
    assert 0 < d.share_pct <= 100
    assert d.evidence and d.moves
    text = "\n".join(d.narrative())
    assert VERDICTS[verdict] in text and "Baseline:" in text and "What would move it:" in text
    orjson.dumps(d.to_json())  # JSON-safe


def test_scenario_shares_and_phases_match_what_was_planted() -> None:
    inp = _scenario("input_bound")["diagnosis"]
    assert inp.dominant_phase == "data_loading"
    assert inp.share_pct == pytest.approx(86.5, abs=2.0)  # DataLoader waits 20-30 ms of ~30 ms steps
    comp = _scenario("compute_bound")["diagnosis"]
    assert comp.share_pct > 99 and comp.dominant_phase == "forward"
    assert comp.top_ops["name"][0] == "aten::linear" and "gemm" in comp.top_ops["top_kernel"][0]
    comm = _scenario("comm_bound")["diagnosis"]
    assert comm.dominant_phase == "communication" and comm.share_pct > 50
    sync = _scenario("sync_bound")["diagnosis"]
    assert any("train.py:61" in e for e in sync.evidence) and any("train.py:88" in e for e in sync.evidence)
    launch = _scenario("launch_bound")["diagnosis"]
    assert launch.share_pct > 75 and any("launch-bound" in e for e in launch.evidence)
    assert any("CUDA graphs" in m for m in launch.moves)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_phases_and_causes_add_up_to_the_step(scenario: str) -> None:
    res = _scenario(scenario)
    ph = res["phases"]
    cpu = ph.cpu
    assert (cpu.select(pl.sum_horizontal([f"{p}_ns" for p in PHASES])).to_series() == cpu["total_ns"]).all()
    assert cpu.select(pl.min_horizontal([f"{p}_ns" for p in PHASES]) >= 0).to_series().all()
    gpu = ph.gpu
    assert gpu.height
    assert (
        gpu.select(pl.sum_horizontal([*(f"{p}_ns" for p in PHASES), "idle_ns"])).to_series() == gpu["total_ns"]
    ).all()
    st = res["diagnosis"].per_step
    parts = ["productive_pct", "communication_pct", "input_pct", "sync_pct", "host_pct", "other_pct"]
    assert st.select(pl.sum_horizontal(parts)).to_series().to_list() == pytest.approx([100.0] * st.height, abs=0.05)
    # the step windows are the steps analysis' windows
    assert st["dur_ns"].to_list() == res["steps"].table["dur_ns"].to_list()


def test_forward_backward_ratio_of_a_training_step() -> None:
    ph = _scenario("input_bound")["phases"]
    assert ph.fwd_bwd_ratio_gpu == pytest.approx(2.0, abs=0.3)  # conv dgrad+wgrad ≈ 2.3× fprop
    assert ph.sources["autograd_threads"] == 1 and ph.sources["fwdbwd_flow_ops"] > 0
    assert ph.gpu_mean["optimizer_ns"] > 0 and ph.gpu_mean["data_loading_ns"] > 0  # HtoD batch copy


def test_baseline_stats_match_numpy() -> None:
    vals = [10_000_000, 12_500_000, 11_000_000, 30_000_000, 9_000_000, 10_500_000, 10_250_000]
    s = step_stats(pl.Series(vals))
    a = np.array(vals, dtype=float)
    assert s["count"] == len(vals)
    assert s["mean"] == pytest.approx(a.mean(), abs=0.1)
    assert s["median"] == pytest.approx(np.median(a), abs=0.1)
    assert s["std"] == pytest.approx(a.std(ddof=1), abs=0.1)
    assert s["p95"] == pytest.approx(np.percentile(a, 95), abs=0.1)
    assert s["p99"] == pytest.approx(np.percentile(a, 99), abs=0.1)
    assert (s["min"], s["max"]) == (min(vals), max(vals))
    assert s["cv"] == pytest.approx(a.std(ddof=1) / a.mean(), abs=1e-4)
    one = step_stats(pl.Series([5]))
    assert one["count"] == 1 and one["std"] == 0.0 and one["p99"] == 5.0
    assert step_stats(pl.Series([], dtype=pl.Int64))["count"] == 0


def _training_trace(warmup_us: float = 1000.0) -> Trace:
    """Step 1 is a long warm-up; steps 2-5 are 100 µs each, laid out phase by phase:
    DataLoader [0,10), forward aten::linear [10,30), backward on the autograd thread [40,70),
    optimizer [75,90), nothing [90,100). Each phase launches one kernel on the GPU."""
    t = Trace()
    t.events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 200, "args": {"name": "pt_autograd_0"}})
    starts = [0.0, warmup_us] + [warmup_us + 100.0 * i for i in range(1, 4)]
    for n, t0 in enumerate(starts, 1):
        dur = warmup_us if n == 1 else 100.0
        t.step(n, t0, dur)
        t.ann("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0, 10)
        t.op("aten::linear", t0 + 10, 20)
        t.launch(t0 + 12, 4, t0 + 20, 8, name="ampere_sgemm_128x64_nn")  # forward GEMM 8 µs
        t.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 40, 30, tid=200)
        t.launch(t0 + 42, 4, t0 + 50, 16, name="ampere_sgemm_64x64_tn", tid=200)  # backward 16 µs
        t.ann("Optimizer.step#SGD.step", t0 + 75, 15)
        t.op("aten::_foreach_add_", t0 + 76, 10)
        t.launch(t0 + 77, 3, t0 + 82, 4, name="multi_tensor_apply_kernel")  # optimizer 4 µs
    return t


def test_warmup_excluded_and_phases_on_a_hand_built_step() -> None:
    res = _diagnose(_training_trace().model())
    bl = res["baseline"]
    assert bl.warmup["step"].to_list() == [1]
    assert bl.stats["count"] == 4 and bl.stats["mean"] == pytest.approx(ns(100)) and bl.stats["max"] == ns(100)
    assert "warm-up #1" in bl.headline()
    ph = res["phases"]
    cpu = ph.cpu.filter(pl.col("step") == 3).row(0, named=True)
    assert {p: cpu[f"{p}_ns"] for p in PHASES} == {
        "data_loading": ns(10), "forward": ns(20), "backward": ns(30), "optimizer": ns(15),
        "communication": 0, "other": ns(25),
    }
    gpu = ph.gpu.filter(pl.col("step") == 3).row(0, named=True)
    assert (gpu["forward_ns"], gpu["backward_ns"], gpu["optimizer_ns"], gpu["idle_ns"]) == (
        ns(8), ns(16), ns(4), ns(72))
    assert ph.fwd_bwd_ratio_gpu == pytest.approx(2.0) and ph.fwd_bwd_ratio_cpu == pytest.approx(1.5)
    d = res["diagnosis"]
    assert d.n_steady == 4 and 1 not in d.per_step.filter("steady")["step"].to_list()
    # GPU busy 28 %; idle: DataLoader 10 µs, the rest with nothing queued while the CPU works.
    row = d.per_step.filter(pl.col("step") == 3).row(0, named=True)
    assert row["productive_pct"] == pytest.approx(28.0)
    assert row["verdict"] == "cpu_bound"


def test_thresholds_are_overridable() -> None:
    trace, _ = S.scenario_sync_bound()
    model = build_model(Path("s.json"), trace)
    d = _diagnose(model, **{"diagnosis.gpu_bound_pct": 80.0})["diagnosis"]  # 82 % busy is now enough
    assert d.verdict == "compute_bound" and d.thresholds["gpu_bound_pct"] == 80.0
    d = _diagnose(model, **{"diagnosis.dominant_pct": 90.0})["diagnosis"]  # syncs hold ~67 % of the lost time
    assert d.verdict == "mixed"


def test_memory_bound_when_elementwise_kernels_fill_the_gpu() -> None:
    t = Trace()
    for n in range(1, 4):
        t0 = 100.0 * (n - 1)
        t.step(n, t0, 100)
        t.op("aten::add", t0, 5)
        t.launch(t0 + 1, 2, t0, 100, name="void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor>()")
    d = _diagnose(t.model())["diagnosis"]
    assert d.verdict == "memory_bound" and d.share_pct == pytest.approx(100.0)
    assert any("Fuse" in m for m in d.moves)


def test_kernel_classes() -> None:
    names = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "flash_fwd_kernel", "ampere_bf16_s16816gemm_bf16_128x128",
             "sm80_xmma_fprop_implicit_gemm_tf32", "Cijk_Ailk_Bljk_BBS_BH", "void at::native::reduce_kernel<512>",
             "cudnn::bn_fw_tr_1C11_kernel_NCHW", "void at::native::vectorized_elementwise_kernel<4>",
             "triton_poi_fused_add_0", "triton_red_fused_sum_1", "some_custom_kernel"]
    got = pl.select(kernel_class(pl.Series(names)).alias("c"))["c"].to_list()
    assert got == ["communication", "attention", "gemm", "gemm", "gemm", "reduction", "reduction", "elementwise",
                   "elementwise", "reduction", "other"]


def test_cpu_only_trace_gets_a_cpu_verdict() -> None:
    model = shared_model(REPO / "sample_traces" / "cpu_real_torch.json.gz")  # cost_invariants loads it too
    res = _diagnose(model)
    assert "gpu_time" in res.skipped and "diagnosis" in res.values
    d = res["diagnosis"]
    assert d.resource == "cpu" and d.verdict == "cpu_compute"
    assert d.phase_means["cpu"]["backward_ns"] > 0 and d.phase_means["cpu"]["forward_ns"] > 0
    assert d.top_ops.height and d.rank_by == "cpu_ns"
    bl = res["baseline"]
    assert bl.batch_size == 16 and bl.samples_per_s == pytest.approx(2151.71)
    assert bl.conditions["first_step"] == 2 and "2 step(s) ran before it" in bl.conditions["schedule"]
    orjson.dumps(d.to_json())


def test_nothing_to_diagnose_is_not_applicable() -> None:
    t = Trace()
    t._x("python_function", "train.py(3): main", 0, 50)  # Python frames only: no op, no device activity
    res = run_analyses(t.model(), Config(), only=("diagnosis",))
    assert "diagnosis" not in res.values and "diagnosis" not in res.failed
    assert res.skipped["diagnosis"]


def test_diagnosis_is_the_first_section() -> None:
    specs = registry()
    assert specs["diagnosis"].order == 1
    assert all(s.order > 1 for n, s in specs.items() if n != "diagnosis" and s.input == "trace")
    assert set(specs["diagnosis"].after) >= {"gpu_time", "idle_gaps", "kernels", "launches", "syncs"}


@pytest.mark.parametrize(("productive", "causes", "verdict"), [
    (86.5, {"communication": 9.8, "host": 3.7}, "compute_bound"),  # mostly busy, losses spread thin
    (87.0, {"host": 12.0, "other": 1.0}, "compute_bound"),
    (85.0, {"host": 15.0}, "cpu_bound"),  # the cause reaches cause_min_pct: it names the verdict
    (82.4, {"sync": 11.8, "input": 4.2, "host": 1.6}, "sync_bound"),  # below mostly_busy_pct
    (91.0, {"sync": 9.0}, "compute_bound"),  # gpu_bound_pct alone
])
def test_mostly_busy_gpu_with_small_losses_is_gpu_bound(productive: float, causes: dict[str, float],
                                                        verdict: str) -> None:
    from traceanalyzer.analyses.diagnosis import LOST_CAUSES, apply_verdicts

    row = {"dur_ns": 100_000, "productive_ns": int(productive * 1000), "compute_kernel_ns": 10, "memory_kernel_ns": 1}
    row.update({f"{c}_ns": int(causes.get(c, 0.0) * 1000) for c in LOST_CAUSES})
    out = apply_verdicts(pl.DataFrame([row]), 90.0, 50.0, 85.0, 15.0)
    assert out["verdict"][0] == verdict


def test_stepless_trace_is_judged_over_the_device_active_span() -> None:
    """Without ProfilerStep# ranges the whole trace is the window: the idle before the device's
    first activity (profiler start-up, or work queued that the trace does not explain) and after
    its last is left out of the GPU verdict, which is judged over the active span and says so."""
    t = Trace()
    t.op("prepare", 0, 1500)  # the host prepares inputs, then launches once and idles
    for i in range(20):
        t.launch(1500 + i, 5, 8000 + i * 500, 480, name="ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn")
    t.op("tail", 19000, 1000)
    res = run_analyses(t.model(), strict=True)
    d = res["diagnosis"]
    assert d.verdict == "compute_bound"
    assert d.base_label == "GPU 0's active span"
    assert d.breakdown["dur_ns"] == ns(19 * 500 + 480)  # first kernel start to last kernel end
    assert "active span" in d.verdict_line() and any("left out" in n for n in d.notes)
