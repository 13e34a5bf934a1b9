"""Timeline rules on hand-built traces: each fires with exactly the numbers worked out by hand
in the comments, stays silent on a healthy or just-below-threshold trace, and honours its
threshold overrides (Config, ``--set``, ``--config``).

Rules: low_gpu_utilization, host_bound_gaps, dataloader_bottleneck, launch_bound_kernels,
kernel_count, step_outliers, profiler_overhead, comm_exposed, data_parallel, rank_imbalance.
Times in the traces are µs (see ``support.events.Trace``); costs in findings are ms per steady step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import write_trace
from support.events import Trace, ns
from support.synthetic import dumps_trace, scenario_multi_rank, write_bytes

from traceanalyzer.analyses import Results, run_analyses
from traceanalyzer.batch.multirank import multirank
from traceanalyzer.cli import cli
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.rules import Finding, RuleOutcome, Severity, run_rules

DL_SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
DL_MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


# --------------------------------------------------------------------------- helpers


def _analyse(src: Trace | dict[str, Any], **cfg: Any) -> tuple[Results, RuleOutcome]:
    """Analyses then rules, as pipeline.build_report runs them."""
    doc = src.doc() if isinstance(src, Trace) else src
    config = Config(cfg)
    results = run_analyses(build_model(Path("x.json"), doc), config, strict=True)
    return results, run_rules(results, config)


def _found(out: RuleOutcome, rid: str) -> list[Finding]:
    assert rid not in out.failed, out.failed[rid]
    return [f for f in out.findings if f.rule_id == rid]


def _one(src: Trace | dict[str, Any], rid: str, **cfg: Any) -> Finding:
    _, out = _analyse(src, **cfg)
    fs = _found(out, rid)
    assert len(fs) == 1, [f.title for f in fs]
    return fs[0]


def _silent(src: Trace | dict[str, Any], rid: str, **cfg: Any) -> RuleOutcome:
    _, out = _analyse(src, **cfg)
    assert _found(out, rid) == [], [f.title for f in _found(out, rid)]
    return out


def _healthy() -> Trace:
    """3 steps of 1000 µs, one 980 µs kernel each ([t0+10, t0+990)): GPU 98 % busy, two 20 µs
    host-bound gaps in all (40 µs / 3 steps = 1.3 % of the step), no loader, no collectives."""
    t = Trace()
    for n in range(3):
        t0 = 1000 * n
        t.step(n + 1, t0, 1000, gpu_copy=False)
        t.launch(t0 + 1, 5, t0 + 10, 980)
    return t


HEALTHY_SILENT = ("low_gpu_utilization", "host_bound_gaps", "launch_bound_kernels", "kernel_count", "step_outliers",
                  "profiler_overhead", "comm_exposed", "data_parallel")


def test_healthy_trace_no_timeline_finding_and_undecidable_checks_say_why() -> None:
    out = _analyse(_healthy())[1]
    for rid in HEALTHY_SILENT:
        assert _found(out, rid) == [], rid
        assert rid not in out.not_run, (rid, out.not_run.get(rid))
    # no DataLoader range: the loader check cannot decide, and says so
    assert "no DataLoader ranges" in out.not_run["dataloader_bottleneck"]
    # one trace cannot show a straggler
    assert "several ranks" in out.not_run["rank_imbalance"]


# --------------------------------------------------------------------------- GPU idle: low utilisation, host-bound


def _host_bound(u: float = 1.0) -> Trace:
    """3 steps of 1000·u µs. Per step (t0 = 1000·u·n): kernel [t0+50u, t0+250u) launched at t0+10u,
    a ``log_metrics`` annotation [t0+260u, t0+640u), kernel [t0+650u, t0+750u) launched at
    t0+645u. Busy 300u of 1000u = 30 %; idle 700u per step.
    Device gaps (all host-bound: the next kernel is launched after the drain, nothing else
    overlaps): [250,650) 400 (midpoint inside log_metrics), [750,1050) 300 (no CPU activity),
    per step; the last step has only the first → (700 + 700 + 400)·u / 3 = 600u µs per step.
    The remaining idle (700u − 600u = 100u per step) lies outside any gap: the head of step 1
    and the tail of step 3."""
    t = Trace()
    for n in range(3):
        t0 = 1000 * u * n
        t.step(n + 1, t0, 1000 * u, gpu_copy=False)
        t.launch(t0 + 10 * u, 5 * u, t0 + 50 * u, 200 * u)
        t.ann("log_metrics", t0 + 260 * u, 380 * u)
        t.launch(t0 + 645 * u, 5 * u, t0 + 650 * u, 100 * u)
    return t


def test_low_gpu_utilization_fires_with_idle_and_its_causes() -> None:
    f = _one(_host_bound(), "low_gpu_utilization")
    assert f.severity == Severity.WARNING  # 30 % busy: below 50, not below 20
    assert f.title == ("GPU 0 is busy only 30.0 % of the step: 0.7 ms/step idle, largest cause: host-bound launches "
                       "(0.6 ms/step)")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.7, 70.0, 0.5)
    ev = f.evidence
    assert ev["busy_pct"] == 30.0 and ev["median_step_ms"] == 1.0 and ev["steady_steps"] == 3
    assert ev["ms_per_step"] == {"compute": 0.3, "communication": 0.0, "memcpy": 0.0, "memset": 0.0, "idle": 0.7}
    assert ev["idle_ms_per_step_by_cause"] == {"host_bound": 0.6, "outside_gaps": 0.1}
    assert ev["see_rules"] == ["host_bound_gaps"]
    assert [s["step"] for s in ev["least_busy_steps"]] == [1, 2, 3]
    assert "CUDA graphs" in f.fix  # NVIDIA trace (cudaLaunchKernel)


def test_low_gpu_utilization_without_steps_speaks_of_the_whole_trace() -> None:
    # no ProfilerStep#: one window, the 1000 µs span (a CPU op covers it); one 100 µs kernel → 10 %
    t = Trace()
    t.op("aten::generate", 0, 1000)
    t.launch(1, 5, 10, 100)
    f = _one(t, "low_gpu_utilization")
    assert f.severity == Severity.CRITICAL  # < 20 %
    assert f.title == "GPU 0 is busy only 10.0 % of the whole trace (no ProfilerStep#): 0.9 ms idle"
    assert f.evidence["idle_ms_per_step_by_cause"] == {"outside_gaps": 0.9}


def test_low_gpu_utilization_silent_at_exactly_half_busy_and_threshold_override() -> None:
    t = Trace()
    for n in range(3):  # one 500 µs kernel per 1000 µs step: busy exactly 50 %, not below
        t.step(n + 1, 1000 * n, 1000, gpu_copy=False)
        t.launch(1000 * n + 200, 5, 1000 * n + 250, 500)
    _silent(t, "low_gpu_utilization")
    f = _one(t, "low_gpu_utilization", **{"low_gpu_utilization.min_busy_pct": 60})
    assert f.evidence["busy_pct"] == 50.0 and f.cost_ms_per_step == 0.5
    # the 30 %-busy trace is CRITICAL once 30 % counts as critical, silent below a 25 % bar
    assert _one(_host_bound(), "low_gpu_utilization", **{"low_gpu_utilization.critical_busy_pct": 31}).severity \
        == Severity.CRITICAL
    _silent(_host_bound(), "low_gpu_utilization", **{"low_gpu_utilization.min_busy_pct": 25})


def test_host_bound_gaps_fires_with_cpu_context() -> None:
    f = _one(_host_bound(), "host_bound_gaps")
    # 0.6 ms/step = 60 % of the 1 ms median step: CRITICAL (≥ 30 %)
    assert f.severity == Severity.CRITICAL
    assert f.title == ("GPU 0 waits for the CPU to launch work: 0.6 ms/step of host-bound idle, "
                       "mostly inside `log_metrics`")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.6, 60.0, 0.7)
    ev = f.evidence
    assert ev["host_bound_ms_per_step"] == 0.6 and ev["gaps_per_step"] == round(5 / 3, 2)
    assert ev["top_cpu_contexts"] == [
        {"cpu_context": "log_metrics", "n_gaps": 3, "idle_ns": ns(1200)},
        {"cpu_context": "<no CPU activity on the launching thread>", "n_gaps": 2, "idle_ns": ns(600)},
    ]
    assert [(g["step"], g["dur_ns"]) for g in ev["longest_gaps"]] == [
        (1, ns(400)), (2, ns(400)), (3, ns(400)), (1, ns(300)), (2, ns(300))]


def test_host_bound_gaps_silent_below_the_ms_floor_and_override() -> None:
    # a tenth of the scale: 60 µs/step is 60 % of the step but below min_ms_per_step (0.1 ms)
    small = _host_bound(0.1)
    _silent(small, "host_bound_gaps")
    f = _one(small, "host_bound_gaps", **{"host_bound_gaps.min_ms_per_step": 0.05})
    assert (f.cost_ms_per_step, f.cost_pct_of_step) == (0.06, 60.0)
    # healthy: 40 µs over 3 steps = 1.3 % of the step, below min_pct_of_step (5)
    _silent(_healthy(), "host_bound_gaps")
    f = _one(_healthy(), "host_bound_gaps", **{"host_bound_gaps.min_pct_of_step": 1.0,
                                                "host_bound_gaps.min_ms_per_step": 0.01})
    assert (f.severity, f.cost_ms_per_step, f.cost_pct_of_step) == (Severity.INFO, 0.013, 1.33)


# --------------------------------------------------------------------------- data loading


def _loader(dl_us: list[float], name: str = DL_MULTI, gpu: bool = True) -> Trace:
    """One 1000 µs step per entry: the loader range [t0, t0+d), then (GPU) a launch at t0+d+2
    (4 µs) of a kernel [t0+d+10, t0+960), or (CPU-only) an ``aten::conv2d`` op. The loader runs
    while nothing else does, so its exclusive (tb_plugin) time is d as well."""
    t = Trace()
    for n, d in enumerate(dl_us):
        t0 = 1000 * n
        t.step(n + 1, t0, 1000, gpu_copy=False)
        t.ann(name, t0, d)
        if gpu:
            t.launch(t0 + d + 2, 4, t0 + d + 10, 950 - d)
        else:
            t.op("aten::conv2d", t0 + d + 2, 500)
    return t


def test_dataloader_single_process_on_gpu() -> None:
    f = _one(_loader([250, 250, 250], DL_SINGLE), "dataloader_bottleneck")
    # 250 µs of 1000: 25 % → WARNING (10 ≤ 25 < 30)
    assert f.severity == Severity.WARNING
    assert f.title == ("The step waits for input data: 0.25 ms/step in the DataLoader (25.0 % of the median step), "
                       "single-process loader (num_workers=0)")
    # cost: the GPU idle of the data-loader gaps [t0-40, t0+260), split per step and capped by
    # the step's 250 µs in the loader: step 1 holds the 40 µs tail of step 2's gap (its own start
    # is before the GPU's first activity: no gap), step 2 min(40 + 260, 250), step 3
    # min(260, 250) → 540 / 3 = 180 µs/step
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.18, 18.0, 0.9)
    ev = f.evidence
    assert ev["dataloader_ms_by_step"] == {"1": 0.25, "2": 0.25, "3": 0.25}
    assert ev["gpu_idle_owned_ms_per_step"] == 0.18 and ev["single_process"] is True and ev["iterators"] == [DL_SINGLE]
    assert "num_workers" in f.fix and "pin_memory=True" in f.fix


def test_dataloader_cpu_only_trace_costs_loader_time_without_pin_memory_advice() -> None:
    f = _one(_loader([250, 250, 250], DL_SINGLE, gpu=False), "dataloader_bottleneck")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.25, 25.0, 0.7)
    assert "pin_memory" not in f.fix and "pin_memory" not in f.code_hint


def test_dataloader_peak_step_named_and_critical() -> None:
    # 100 + 100 + 700 = 900 µs over 3 steps = 300 µs/step = 30 % → CRITICAL; step 3 ≥ 2× the mean
    f = _one(_loader([100, 100, 700]), "dataloader_bottleneck")
    assert f.severity == Severity.CRITICAL
    assert f.title == ("The step waits for input data: 0.3 ms/step in the DataLoader (30.0 % of the median step); "
                       "up to 0.7 ms on step #3")
    # GPU idle owned per step, capped by the loader time: 40, min(110 + 40, 100), min(710, 700)
    assert f.cost_ms_per_step == 0.28 and f.evidence["single_process"] is False


def test_dataloader_severity_floor_thresholds_and_override() -> None:
    # 80 µs = 8 %: INFO for a worker-process loader, WARNING for num_workers=0
    assert _one(_loader([80] * 3), "dataloader_bottleneck").severity == Severity.INFO
    assert _one(_loader([80] * 3, DL_SINGLE), "dataloader_bottleneck").severity == Severity.WARNING
    # 40 µs = 4 %: below min_pct_of_step (5), silent ... unless the bar is lowered
    _silent(_loader([40] * 3), "dataloader_bottleneck")
    f = _one(_loader([40] * 3), "dataloader_bottleneck", **{"dataloader_bottleneck.min_pct_of_step": 3})
    # the data-loader gaps hold 40 + 90 + 50 µs, each step capped by its 40 µs in the loader
    assert (f.severity, f.cost_ms_per_step, f.cost_pct_of_step) == (Severity.INFO, 0.04, 4.0)


# --------------------------------------------------------------------------- launch-bound, kernel count


def _tiny(n: int, launch_us: float, delay_us: float, kernel_us: float, api: str = "cudaLaunchKernel",
          cat: str = "cuda_runtime") -> Trace:
    """3 steps of 1000 µs, ``n`` launches per step every 1000/n µs, each ``launch_us`` long, its
    kernel starting ``delay_us`` after the call start and running ``kernel_us``."""
    t = Trace()
    period = 1000 / n
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        for i in range(n):
            ts = t0 + i * period
            t.launch(ts, launch_us, ts + delay_us, kernel_us, api=api, cat=cat)
    return t


def test_launch_bound_kernels_fires_with_cpu_vs_gpu_numbers() -> None:
    # 100 launches of 8 µs per step, each kernel 2 µs: 800 µs CPU for 200 µs GPU (ratio 4), the
    # GPU 20 % busy (< 80): every step launch-bound; cost = idle 800 µs/step = 80 % → CRITICAL
    f = _one(_tiny(100, 8, 8, 2), "launch_bound_kernels")
    assert f.severity == Severity.CRITICAL
    assert f.title == ("Launch-bound: in 3 of 3 steady steps the CPU spends longer in launch calls than the GPU runs "
                       "their work (300 of 300 kernels shorter than their launch)")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.8, 80.0, 0.6)
    ev = f.evidence
    assert ev["launch_bound_steps"] == [1, 2, 3]
    assert (ev["launch_cpu_ms_per_step"], ev["launched_gpu_ms_per_step"], ev["cpu_to_gpu_ratio"]) == (0.8, 0.2, 4.0)
    assert (ev["kernels_per_step"], ev["pct_kernels_shorter_than_launch"]) == (100.0, 100.0)
    assert (ev["median_launch_cpu_us"], ev["median_gpu_us"], ev["graph_launches"]) == (8.0, 2.0, 0)
    assert "CUDA graphs" in f.fix and "reduce-overhead" in f.code_hint


def test_launch_bound_advice_follows_the_vendor() -> None:
    amd = _one(_tiny(100, 8, 8, 2, api="hipLaunchKernel"), "launch_bound_kernels")
    assert "HIP graphs" in amd.fix and "CUDA graphs" not in amd.fix
    xpu = _one(_tiny(100, 8, 8, 2, api="urEnqueueKernelLaunch", cat="xpu_runtime"), "launch_bound_kernels")
    assert "graph" not in xpu.fix.lower() and "reduce-overhead" not in xpu.code_hint
    assert xpu.cost_ms_per_step == 0.8
    # the same work without ProfilerStep#: one whole-trace window, said so in the title
    t = Trace()
    for i in range(100):
        t.launch(10 * i, 8, 10 * i + 8, 2)
    f = _one(t, "launch_bound_kernels")
    assert f.title.startswith("Launch-bound over the whole trace (no ProfilerStep#): the CPU spends longer")
    assert f.cost_ms_per_step == 0.8


def test_launch_bound_cost_is_capped_by_the_launch_time() -> None:
    # 50 launches (8 µs each, 2 µs kernels) in the first half of each step, then 490 µs of CPU
    # work: launch CPU 400 µs ≥ GPU 100 µs and 10 % busy → launch-bound. Idle is 900 µs/step, but
    # fewer launches can give back at most the 400 µs spent launching: cost 0.4 ms = 40 %.
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        for i in range(50):
            t.launch(t0 + 10 * i, 8, t0 + 10 * i + 8, 2)
        t.op("aten::python_work", t0 + 500, 490)
    f = _one(t, "launch_bound_kernels")
    assert (f.severity, f.cost_ms_per_step, f.cost_pct_of_step) == (Severity.CRITICAL, 0.4, 40.0)
    assert (f.evidence["idle_ms_per_step"], f.evidence["launch_cpu_ms_per_step"]) == (0.9, 0.4)


def test_launch_bound_silent_when_launches_are_a_sliver_of_the_step() -> None:
    # 2 launches of 5 µs per 1000 µs step (2 µs kernels): CPU 10 ≥ GPU 4 µs and 0.4 % busy, so the
    # steps pass the launches test, but launching costs 10 µs = 1 % of the step (< 5 %)
    t = _tiny(2, 5, 5, 2)
    res, out = _analyse(t)
    assert all(res["launches"].per_step["launch_bound"].to_list())
    assert _found(out, "launch_bound_kernels") == []
    f = _one(t, "launch_bound_kernels", **{"launch_bound_kernels.min_pct_of_step": 0.5})
    assert (f.cost_ms_per_step, f.cost_pct_of_step) == (0.01, 1.0)


def _graph_decode_with_blocking_copy() -> Trace:
    """3 steps of 1000 µs like a graph-replayed decode step: a 10 µs cudaGraphLaunch replaying ten
    50 µs kernels [t0+20, t0+520), then a synchronous cudaMemcpy [t0+20, t0+540) whose DtoH copy
    runs [t0+530, t0+540). Busy 510 µs (51 %). The copy call's 520 µs of CPU is waiting, not
    launching: launch CPU 10 µs vs 500 µs of GPU work → not launch-bound."""
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        corr = t.runtime("cudaGraphLaunch", t0, 10)
        for i in range(10):
            t.gpu(corr, t0 + 20 + 50 * i, 50, name=f"graph_k{i}")
        t.launch(t0 + 20, 520, t0 + 530, 10, name="Memcpy DtoH (Device -> Pinned)", api="cudaMemcpy",
                 activity="memcpy")
    return t


def test_launch_bound_silent_when_cpu_time_is_a_blocking_copy() -> None:
    res, out = _analyse(_graph_decode_with_blocking_copy())
    assert _found(out, "launch_bound_kernels") == []
    ps = res["launches"].per_step
    assert ps["launch_cpu_ns"].to_list() == [ns(10)] * 3 and ps["launched_gpu_ns"].to_list() == [ns(500)] * 3
    assert ps["blocking_cpu_ns"].to_list() == [ns(520)] * 3 and not any(ps["launch_bound"].to_list())
    # just below the step share: 1 of 3 steps launch-bound (33 % < 50 %) stays silent
    t = _tiny(100, 8, 8, 2)
    for s in (1, 2):  # steps 2 and 3 get a 700 µs kernel: busy 90 %, not launch-bound
        t.launch(1000 * s + 1, 1, 1000 * s + 100, 700, stream=8)
    res, out = _analyse(t)
    assert res["launches"].per_step["launch_bound"].to_list() == [True, False, False]
    assert _found(out, "launch_bound_kernels") == []
    assert len(_found(_analyse(t, **{"launch_bound_kernels.min_steps_pct": 30})[1], "launch_bound_kernels")) == 1


def test_kernel_count_fires_with_launch_cost_capped_by_idle() -> None:
    # 1000 launches per step (0.5 µs each), kernels 0.3 µs, all < 10 µs: 1000 kernels per step.
    # cost = min(1000 × 0.5 µs = 500 µs, idle 1000 − 300 = 700 µs) = 0.5 ms = 50 % of the step
    f = _one(_tiny(1000, 0.5, 0.6, 0.3), "kernel_count")
    assert f.severity == Severity.INFO
    assert f.title == "1,000 kernels launched per step, 100 % shorter than 10 µs: launch overhead adds up"
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.5, 50.0, 0.3)
    ev = f.evidence
    assert (ev["kernels_per_step"], ev["graph_replayed_kernels_per_step"], ev["pct_short"]) == (1000.0, 0.0, 100.0)
    assert ev["median_launch_cpu_us"] == 0.5
    assert ev["top_kernels_by_count_in_trace"][0]["count"] == 3000


def test_kernel_count_silent_below_threshold_and_for_graph_replays() -> None:
    # 100 kernels per step: below max_kernels_per_step (1000) ...
    _silent(_tiny(100, 8, 8, 2), "kernel_count")
    # ... fires when the bar is lowered: cost = min(100 × 8 µs, idle 800 µs) = 0.8 ms
    f = _one(_tiny(100, 8, 8, 2), "kernel_count", **{"kernel_count.max_kernels_per_step": 100})
    assert (f.evidence["kernels_per_step"], f.cost_ms_per_step) == (100.0, 0.8)
    # 1000 kernels per step replayed by one cudaGraphLaunch: no per-kernel launch cost
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        corr = t.runtime("cudaGraphLaunch", t0, 10)
        for i in range(1000):
            t.gpu(corr, t0 + 20 + 0.9 * i, 0.3)
    res, _ = _analyse(t)
    assert res["kernels"].per_step["n_kernels"].to_list() == [1000] * 3
    _silent(t, "kernel_count", **{"kernel_count.max_kernels_per_step": 1})


# --------------------------------------------------------------------------- step outliers, warm-up


def _steps(durs: list[float], loader: dict[int, float] | None = None) -> Trace:
    """Steps of the given lengths; each launches (2 µs at t0+d+1) a 490 µs kernel at t0+d+10,
    where d is the loader time planted in that step (``loader``: step → µs, at the step start)."""
    t = Trace()
    t0 = 0.0
    for n, dur in enumerate(durs, start=1):
        t.step(n, t0, dur, gpu_copy=False)
        d = (loader or {}).get(n, 0)
        if d:
            t.ann(DL_MULTI, t0, d)
        t.launch(t0 + d + 1, 2, t0 + d + 10, 490)
        t0 += dur
    return t


def test_step_outlier_with_the_category_that_grew() -> None:
    # steps 1000, 1000, 1800, 1000, 1000 µs: median 1000, step 3 is 1.8× (> 1.5×).
    # cost = (1800 − 1000) / 5 steady steps = 160 µs = 16 % → WARNING (≥ 10 %).
    # Step 3 holds an 800 µs loader range; every other category equals the other steps'.
    f = _one(_steps([1000, 1000, 1800, 1000, 1000], loader={3: 800}), "step_outliers")
    assert f.severity == Severity.WARNING
    assert f.title == ("1 of 5 steps takes over 1.5× the median step (1.0 ms): step #3; the extra time is mostly "
                       "data loading (+0.8 ms per slow step)")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.16, 16.0, 0.5)
    ev = f.evidence
    assert ev["outliers"] == [{"step": 3, "dur_ms": 1.8, "x_median": 1.8}]
    assert ev["step_ms"] == {"1": 1.0, "2": 1.0, "3": 1.8, "4": 1.0, "5": 1.0}
    assert ev["outlier_excess_ms_by_category"]["dataloader"] == 0.8
    assert ev["outlier_excess_ms_by_category"]["kernel"] == 0.0


def test_step_outlier_with_more_gpu_work_costs_no_gpu_time() -> None:
    # step 3 is 1.8× the median because its kernel runs 1290 µs instead of 490: the GPU idles as
    # long as in the other steps (500 µs), so steadier pacing gives the GPU nothing back
    t = Trace()
    t0 = 0.0
    for n, dur in enumerate([1000, 1000, 1800, 1000, 1000], start=1):
        t.step(n, t0, dur, gpu_copy=False)
        t.launch(t0 + 1, 2, t0 + 10, 1290 if n == 3 else 490)
        t0 += dur
    f = _one(t, "step_outliers")
    assert (f.severity, f.cost_ms_per_step, f.evidence["excess_ms_per_step"]) == (Severity.INFO, 0.0, 0.16)


def test_step_outliers_silent_at_the_factor_and_override() -> None:
    t = _steps([1000, 1000, 1500, 1000, 1000])  # 1.5× is not over 1.5×
    _silent(t, "step_outliers")
    f = _one(t, "step_outliers", **{"step_outliers.outlier_factor": 1.4})
    # (1500 − 1000) / 5 = 100 µs = 10 % → WARNING; the extra 500 µs is CPU time outside any op
    assert (f.severity, f.cost_ms_per_step, f.cost_pct_of_step) == (Severity.WARNING, 0.1, 10.0)
    assert "outside any op" in f.title
    # too few steady steps to call anything an outlier
    _silent(_steps([1000, 1800]), "step_outliers")
    # no ProfilerStep# at all: step times unknown, the check says it could not run
    t = Trace()
    t.launch(0, 2, 10, 500)
    out = _silent(t, "step_outliers")
    assert "no ProfilerStep# ranges" in out.not_run["step_outliers"]


def test_warmup_step_reported_without_cost() -> None:
    # step 1 (2500 µs) > 2 × the median of the others (1000): warm-up, excluded from the stats
    f = _one(_steps([2500, 1000, 1000, 1000]), "step_outliers")
    assert f.severity == Severity.INFO and f.cost_ms_per_step is None and f.cost_pct_of_step is None
    assert f.title == ("Warm-up inside the profiled window: step #1 took 2.5× the median step "
                       "(excluded from the statistics)")
    assert f.evidence["warmup_steps"] == [1] and f.evidence["warmup_ms"] == [2.5]
    assert f.evidence["steady_steps"] == 3 and "schedule(wait=1, warmup=1" in f.fix


# --------------------------------------------------------------------------- profiler overhead


def _profiled(py_frames: int, overhead_us: float, with_stack: bool = True) -> dict[str, Any]:
    """A 1000 µs trace with 4 non-Python events (ProfilerStep annotation, one CPU op, one launch
    call, its kernel), ``py_frames`` Python frames and an optional ``overhead`` event."""
    t = Trace()
    t.step(1, 0, 1000, gpu_copy=False)
    t.op("aten::mm", 10, 100)
    t.launch(20, 5, 30, 200)
    for i in range(py_frames):
        t._x("python_function", f"train.py({i}): f", 5 + i, 1)
    if overhead_us:
        t._x("overhead", "Activity Buffer Request", 500, overhead_us, pid=-1, tid=0)
    doc = t.doc()
    doc["with_stack"] = int(with_stack)
    doc["record_shapes"] = 1
    return doc


def test_profiler_overhead_python_frames() -> None:
    # 5 Python frames of 9 events = 55.6 % ≥ 50 %
    f = _one(_profiled(5, 0), "profiler_overhead")
    assert f.severity == Severity.INFO and f.cost_ms_per_step is None
    assert f.title == "Timings include profiler overhead: 56 % of the events are Python frames (with_stack=True)"
    assert f.evidence["python_frames"] == 5 and f.evidence["events"] == 9
    assert f.evidence["python_pct_of_events"] == 55.6
    assert f.evidence["profiler_flags"] == ["record_shapes", "with_stack"]


def test_profiler_overhead_buffer_flushes_and_thresholds() -> None:
    # a 10 µs flush in a 1000 µs trace = 1.0 % ≥ 1 %
    f = _one(_profiled(0, 10), "profiler_overhead")
    assert f.title == "Timings include profiler overhead: profiler buffer flushes take 1.0 % of the trace"
    assert f.evidence["overhead_events"] == 1 and f.evidence["overhead_pct_of_span"] == 1.0
    # 4 frames of 8 events is exactly 50 % → fires; just below: 3 frames of 8 events (the flush is
    # an event too) = 37.5 % and a 9 µs flush (0.9 %) stay silent
    assert _one(_profiled(4, 0), "profiler_overhead").evidence["python_pct_of_events"] == 50.0
    _silent(_profiled(3, 9), "profiler_overhead")
    f = _one(_profiled(3, 9), "profiler_overhead", **{"profiler_overhead.max_python_pct": 35})
    assert f.evidence["python_pct_of_events"] == 37.5 and f.evidence["overhead_pct_of_span"] == 0.9


# --------------------------------------------------------------------------- communication


def _comm(nccl_start: float, nccl_dur: float, warmup: bool = True) -> Trace:
    """Optional warm-up step 1 (3000 µs) with a 2000 µs all-reduce, then 3 steps of 1000 µs: a
    compute kernel [t0+10, t0+500) on stream 7 and an all-reduce [t0+start, t0+start+dur) on
    stream 20."""
    t = Trace()
    t0, n = 0, 1
    if warmup:
        t.step(1, 0, 3000, gpu_copy=False)
        t.launch(1, 2, 10, 490, name="sm80_gemm")
        t.launch(3, 2, 600, 2000, name=NCCL, stream=20)
        t0, n = 3000, 2
    for i in range(3):
        s = t0 + 1000 * i
        t.step(n + i, s, 1000, gpu_copy=False)
        t.launch(s + 1, 2, s + 10, 490, name="sm80_gemm")
        t.launch(s + 3, 2, s + nccl_start, nccl_dur, name=NCCL, stream=20)
    return t


def test_comm_not_overlapped_per_steady_step() -> None:
    # all-reduce [400, 700), compute [10, 500): 300 µs of communication, 200 exposed (20 % of the
    # step → WARNING); overlap 1 − 200/300 = 33.3 %. The warm-up step's 2000 µs all-reduce is
    # not in the per-step numbers (it would make 725 µs/step over all 4 windows).
    f = _one(_comm(400, 300), "comm_exposed")
    assert f.severity == Severity.WARNING
    assert f.title == ("Communication not overlapped: 0.2 ms/step of communication with no compute under it "
                       "(20.0 % of the step; 33.3 % of the communication is hidden)")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.2, 20.0, 0.6)
    ev = f.evidence
    assert (ev["comm_ms_per_step"], ev["exposed_ms_per_step"], ev["hidden_pct_of_comm"]) == (0.3, 0.2, 33.33)
    assert ev["steady_steps"] == 3 and ev["device"] == 0
    assert ev["by_type"][0]["type"] == "all_reduce" and ev["by_type"][0]["count"] == 4
    assert ev["recognised_by"] == {"name": 4} and ev["weak_signal_kernels"] == 4  # name only: no launching op


def test_comm_dominant_but_overlapped_is_info_and_thresholds() -> None:
    # all-reduce [100, 400) entirely under compute: nothing exposed, 300 µs = 30 % of the step
    f = _one(_comm(100, 300), "comm_exposed")
    assert f.severity == Severity.INFO
    assert f.title == ("Communication is large but hidden: 0.3 ms/step (30.0 % of the step), 100.0 % of it under "
                       "compute: not the bottleneck")
    assert (f.cost_ms_per_step, f.cost_pct_of_step) == (0.0, 0.0)
    # 50 µs hidden all-reduce = 5 %: under max_comm_pct (10), silent unless lowered
    _silent(_comm(100, 50), "comm_exposed")
    assert _one(_comm(100, 50), "comm_exposed", **{"comm_exposed.max_comm_pct": 5}).severity == Severity.INFO
    # all-reduce [480, 540): 40 µs exposed = 4 % < max_exposed_pct (5), 60 µs = 6 % < max_comm_pct (10)
    _silent(_comm(480, 60), "comm_exposed")
    f = _one(_comm(480, 60), "comm_exposed", **{"comm_exposed.max_exposed_pct": 4})
    assert (f.severity, f.cost_ms_per_step) == (Severity.WARNING, 0.04)
    # no collective at all: nothing to say
    _silent(_healthy(), "comm_exposed")


# --------------------------------------------------------------------------- DataParallel


def _dp(name: str = "DataParallel.forward", devices: tuple[int, ...] = (0, 1)) -> Trace:
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        t.ann(name, t0 + 1, 600)
        for i, d in enumerate(devices):
            t.launch(t0 + 2 + 2 * i, 1, t0 + 10, 500, device=d)
    return t


def test_data_parallel_on_two_gpus() -> None:
    f = _one(_dp(), "data_parallel")
    assert f.severity == Severity.WARNING and f.cost_ms_per_step is None and f.confidence == 0.9
    assert f.title == "nn.DataParallel drives 2 GPUs from one process: use DistributedDataParallel"
    assert f.evidence == {"data_parallel_calls": 3, "devices_used": 2}
    assert "DistributedDataParallel" in f.code_hint


def test_data_parallel_silent_on_one_gpu_and_for_ddp() -> None:
    _silent(_dp(devices=(0,)), "data_parallel")  # a no-op wrapper on one device
    _silent(_dp(name="DistributedDataParallel.forward"), "data_parallel")
    _silent(_dp(), "data_parallel", **{"data_parallel.min_devices": 3})


# --------------------------------------------------------------------------- rank imbalance (batch path)


def _rank_row(rank: int, exposed: float, comm: float, kernel: float, loader: float) -> dict[str, Any]:
    """A batch row as ``batch.summary.report_metrics`` writes it: 10 ms steps on every rank."""
    return {"file": f"rank-{rank}.json", "run": "run", "kind": "trace", "status": "ok", "rank": rank,
            "world_size": 3, "metrics": {
                "step_ms": 10.0, "window_ms_per_step": 10.0, "exposed_comm_ms_per_step": exposed,
                "comm_ms_per_step": comm, "gpu_busy_pct": 80.0,
                "breakdown_ms_per_step": {"kernel": kernel, "dataloader": loader, "communication": comm}}}


HAND_ROWS = [_rank_row(0, 2.0, 3.0, 6.0, 1.0), _rank_row(1, 1.8, 2.8, 6.1, 1.0), _rank_row(2, 0.2, 1.0, 6.0, 2.7)]


def test_rank_imbalance_from_the_multirank_summary() -> None:
    # work = window − exposed: 8.0, 8.2, 9.8 ms → straggler rank 2, imbalance 9.8 − median(8.0, 8.2)
    # = 1.7 ms = 17 % of the 10 ms step → WARNING (< 20 %). Its loader is 2.7 − 1.0 = +1.7 ms/step,
    # its kernels 6.0 − 6.05 = −0.05. The others wait 2.0 and 1.8 ms in collectives (comm − 1.0).
    mr = multirank(HAND_ROWS)
    assert mr["straggler"] == 2
    f = mr["finding"]
    assert f["rule_id"] == "rank_imbalance" and f["severity"] == "warning"
    assert f["title"] == ("Rank 2 is a straggler: 1.70 ms/step more work than the other ranks (17.0 % of the step); "
                          "it spent the extra time in dataloader (+1.70 ms/step)")
    assert (f["cost_ms_per_step"], f["cost_pct_of_step"], f["confidence"]) == (1.7, 17.0, 0.8)
    ev = f["evidence"]
    assert ev["work_ms_by_rank"] == {"0": 8.0, "1": 8.2, "2": 9.8}
    assert ev["excess_ms_per_step"] == {"dataloader": 1.7, "kernel": -0.05}
    assert ev["others_wait_in_collectives_ms_per_step"] == 1.9
    assert "DataLoader" in f["fix"]


def test_rank_imbalance_thresholds() -> None:
    assert multirank(HAND_ROWS, {"critical_pct": 15.0})["finding"]["severity"] == "critical"
    assert multirank(HAND_ROWS, {"min_imbalance_pct": 17.5})["finding"] is None
    assert multirank(HAND_ROWS, {"min_imbalance_ms": 2.0})["finding"] is None
    balanced = [_rank_row(0, 1.0, 2.0, 6.0, 1.0), _rank_row(1, 1.0, 2.0, 6.2, 1.0)]  # 0 ms of imbalance
    assert multirank(balanced)["finding"] is None


@pytest.fixture(scope="module")
def ddp_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("ddp")
    truth: dict[str, Any] = {}
    for r in (0, 1):
        trace, truth = scenario_multi_rank(rank=r, world_size=2, straggler_rank=1, steps=3)
        write_bytes(root / "run" / f"rank-{r}.json.gz", dumps_trace(trace))
    return root, truth["planted"]


def test_rank_imbalance_through_batch_cli(ddp_dir: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, planted = ddp_dir
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["batch", str(root), "-o", str(out), "--jobs", "1", "--no-cache"])
    assert res.exit_code == 0, res.output
    (run,) = orjson.loads((out / "index.json").read_bytes())["runs"]
    f = run["multirank"]["finding"]
    assert f["rule_id"] == "rank_imbalance" and run["straggler"] == planted["straggler_rank"] == 1
    # the planted straggler's loader is 4 ms slower per step
    assert f["cost_ms_per_step"] == pytest.approx(planted["straggler_delay_us"] / 1000, rel=0.1)
    assert "dataloader" in f["title"] and "straggler" in run["top_finding"]
    # --set reaches the rule in batch mode too
    out2 = tmp_path / "out2"
    res = CliRunner().invoke(cli, ["batch", str(root), "-o", str(out2), "--jobs", "1", "--no-cache",
                                   "--set", "rank_imbalance.min_imbalance_pct=90"])
    assert res.exit_code == 0, res.output
    (run,) = orjson.loads((out2 / "index.json").read_bytes())["runs"]
    assert run["multirank"]["finding"] is None and run["straggler"] is None
    assert run["multirank"]["imbalance_pct"] < 90


def test_rank_imbalance_not_run_on_one_trace(ddp_dir: tuple[Path, dict[str, Any]]) -> None:
    root, _ = ddp_dir
    from traceanalyzer.pipeline import analyze

    rep = analyze(root / "run" / "rank-1.json.gz")
    assert "use `traceanalyzer batch`" in rep.not_run["rank_imbalance"]
    assert not [f for f in rep.findings if f.rule_id == "rank_imbalance"]


# --------------------------------------------------------------------------- CLI overrides


def test_set_and_config_file_reach_the_rules(tmp_path: Path) -> None:
    src = write_trace(tmp_path / "t.json", _host_bound().doc())

    def rule_ids(*extra: str) -> set[str]:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        res = CliRunner().invoke(cli, ["analyze", str(src), "-o", str(out), "--format", "json", "-q", *extra])
        assert res.exit_code == 0, res.output
        return {f["rule_id"] for f in orjson.loads((out / "summary.json").read_bytes())["findings"]}

    assert {"low_gpu_utilization", "host_bound_gaps"} <= rule_ids()
    assert "low_gpu_utilization" not in rule_ids("--set", "low_gpu_utilization.min_busy_pct=25")
    cfg = tmp_path / "thresholds.toml"
    cfg.write_text("[host_bound_gaps]\nmin_pct_of_step = 61\n")
    got = rule_ids("--config", str(cfg))
    assert "host_bound_gaps" not in got and "low_gpu_utilization" in got
