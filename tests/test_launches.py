"""Launch calls joined to GPU work: delays, graph attribution, APIs HTA ignores, verdict."""

from __future__ import annotations

import pytest
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.config import Config


def _run(t: Trace, **cfg):
    return run_analyses(t.model(), Config(cfg), only=("launches",), strict=True)


def test_per_launch_numbers_and_every_launch_api():
    t = Trace()
    t.launch(0, 10, 30, 5, name="k1")  # delay 30 - 10 = 20, shorter than its 10 µs launch
    t.launch(10, 4, 35, 50, name="triton_k", api="cuLaunchKernel", cat="cuda_driver")  # queued behind k1
    t.launch(20, 6, 90, 3, name="hip_k", api="hipExtModuleLaunchKernel")
    t.launch(30, 2, 93, 1, name="Memset (Device)", api="cudaMemsetAsync", activity="memset")
    t.runtime("cudaLaunchKernel", 40, 3)  # kernel not captured
    r = _run(t)["launches"]
    assert (r.n_calls, r.n_joined, r.n_unjoined_calls) == (4, 4, 1)
    tab = r.table.sort("cpu_ts_ns")
    assert tab["launch_delay_ns"].to_list() == [ns(20), ns(21), ns(64), ns(61)]
    assert tab["start_delay_ns"].to_list() == [ns(30), ns(25), ns(70), ns(63)]
    assert tab["shorter_than_launch"].to_list() == [True, False, True, True]
    apis = set(r.by_api["api"].to_list())
    assert apis == {"cudaLaunchKernel", "cuLaunchKernel", "hipExtModuleLaunchKernel", "cudaMemsetAsync"}
    assert r.cpu_dur_ns["count"] == 4 and r.cpu_dur_ns["max"] == ns(10)


def test_cuda_graph_launch_attributed_to_each_replayed_kernel():
    t = Trace()
    corr = t.runtime("cudaGraphLaunch", 0, 12)
    for i in range(4):
        t.gpu(corr, 20 + 10 * i, 8, name=f"graph_k{i}", graph_id=1)
    r = _run(t)["launches"]
    assert r.n_graph_launches == 1 and r.n_graph_kernels == 4 and r.n_calls == 1
    assert r.table["gpu_name"].to_list() == [f"graph_k{i}" for i in range(4)]
    assert r.table["cpu_share_ns"].to_list() == [ns(3)] * 4
    assert not any(r.table["shorter_than_launch"].to_list())  # 8 µs kernels vs a 3 µs share


def test_launch_bound_verdict_per_step():
    t = Trace()
    # Step 1: tiny kernels, each launch costs more CPU than the kernel's GPU time.
    t.step(1, 0, 100)
    for i in range(10):
        t.launch(i * 10, 8, i * 10 + 9, 2)
    # Step 2: big kernels keep the GPU busy.
    t.step(2, 100, 100)
    t.launch(100, 8, 110, 88)
    t.launch(110, 8, 198, 2)
    res = _run(t)
    ps = res["launches"].per_step
    assert ps["step"].to_list() == [1, 2]
    assert ps["launch_bound"].to_list() == [True, False]
    assert ps["cpu_to_gpu_ratio"][0] == pytest.approx(4.0)
    assert ps["busy_pct"][0] == pytest.approx(20 / 101 * 100, abs=1e-3)  # window ends at 101


def test_not_applicable_when_no_kernel_captured():
    t = Trace()
    t.op("aten::mm", 0, 10)
    t.runtime("cudaLaunchKernel", 1, 3)
    t.gpu(None, 0, 1, name="orphan")  # some GPU activity but not this launch's
    res = run_analyses(t.model(), only=("launches",))
    assert "none of the 1 launch calls" in res.skipped["launches"]


RUN_FUNCTION = "runFunction - job_prep_and_submit_for_execution"


def _mtia_work(t: Trace, corr: int, ts: float, dur: float, name: str = "pe_exe", stream: int = 101) -> None:
    """An MTIA processing-element execution as the MTIA activity profiler writes it (pid = device 17)."""
    t._x("mtia_ccp_events", name, ts, dur, pid=17, tid=3500 + stream, stream=stream, correlation=corr,
         column="0", row="0")


def test_mtia_asynchronous_run_function_and_copy_enqueue_are_launches():
    t = Trace()
    t.step(1, 0, 1000)
    # The inference runtime: an 8 µs call, its work starts later; a tiny work item
    # right after its call is still a launch, not a wait.
    for i, (k_ts, k_dur) in enumerate(((20, 500), (530, 300), (840, 5))):
        c = t.runtime(RUN_FUNCTION, 10 * i, 8, cat="mtia_runtime")
        _mtia_work(t, c, k_ts, k_dur)
    c = t.runtime("enqueueCommand memcpyHtoDAsync", 40, 1, cat="mtia_runtime")
    t._x("mtia_ccp_events", "dma_request", 45, 3, pid=17, tid=3601, stream=101, correlation=c,
         direction="HOST_TO_DEVICE", size=4096)
    r = _run(t)["launches"]
    tab = r.table.sort("cpu_ts_ns")
    assert tab["api"].to_list() == [RUN_FUNCTION] * 3 + ["enqueueCommand memcpyHtoDAsync"]
    assert tab["activity"].to_list() == ["kernel", "kernel", "kernel", "memcpy"]
    assert tab["launch_delay_ns"].to_list() == [ns(12), ns(512), ns(812), ns(4)]
    assert tab["blocking"].to_list() == [False, False, False, False]


def test_mtia_synchronous_run_function_is_blocking_not_launch_bound():
    t = Trace()
    t.step(1, 0, 2000)
    # An older runtime: ~300 µs of preparation, then the call waits for its work. The
    # clocks differ: one call appears to return 2 µs before its work started.
    starts = []
    for i, (k_dur, tail) in enumerate(((40, 10), (100, -5), (40, -42))):
        ts = 500 * i
        k_ts = ts + 300
        c = t.runtime(RUN_FUNCTION, ts, 300 + k_dur + tail, cat="mtia_runtime")
        _mtia_work(t, c, k_ts, k_dur, name="add-dtype_Float", stream=1)
        starts.append(k_ts)
    r = _run(t)["launches"]
    tab = r.table.sort("cpu_ts_ns")
    assert tab["gpu_ts_ns"].to_list() == [ns(x) for x in starts]
    assert tab["blocking"].to_list() == [True, True, True]
    ps = r.per_step.row(0, named=True)
    assert (ps["launch_cpu_ns"], ps["launched_gpu_ns"], ps["blocking_cpu_ns"]) == (0, 0, ns(350 + 395 + 298))
    # No non-blocking launch: not launch-bound (0 ≥ 0 is no evidence).
    assert ps["launch_bound"] is False
