"""CUPTI range-profiler counters: kept by both decoders, joined to their launching ops, named metrics."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import SHARED_TRACES, needs_shared, shared_model, write_trace
from support.events import Trace

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.counters import CountersResult
from traceanalyzer.load.chrome_trace import load_chrome_trace_simple
from traceanalyzer.load.chrome_trace.framing import _ChunkedLoader

CUPTI = SHARED_TRACES / "hta" / "cupti_profiler" / "benchmark_result_924719_1679055439_trace.json.gz"
SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"


def _counter_trace() -> Trace:
    """Two kernels launched by aten::mm then aten::relu (inside aten::linear), range-profiled."""
    t = Trace()
    t.op("aten::linear", 0, 30)
    t.op("aten::mm", 1, 10)
    t.runtime("cudaLaunchKernel", 2, 3)
    t.op("aten::relu", 15, 10)
    t.runtime("cudaLaunchKernel", 16, 3)
    t.runtime("cudaStreamSynchronize", 40, 3)  # not a launch
    t._x("cuda_profiler_range", "void gemm_kernel<float>(int)", 100, 500, pid=0, tid=0, **{
        "smsp__cycles_active.avg.pct_of_peak_sustained_elapsed": 91.5,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 40.0,
        SASS.format("ffma"): 1000, SASS.format("fadd"): 10, SASS.format("hmul"): 7})
    t._x("cuda_profiler_range", "relu_kernel", 700, 300, pid=0, tid=0, **{
        "smsp__cycles_active.avg.pct_of_peak_sustained_elapsed": 20.0,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 10.0,
        SASS.format("ffma"): 0, SASS.format("fadd"): 0, SASS.format("hmul"): 0})
    return t


def test_both_decoders_keep_counter_args(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "c.json", _counter_trace().doc())
    for model in (load_chrome_trace_simple(path), _ChunkedLoader(path, 256).load()):
        ev = model.other_events.filter(pl.col("cat") == "cuda_profiler_range")
        assert ev.height == 2 and ev["args"].null_count() == 0
        assert '"sm__warps_active.avg.pct_of_peak_sustained_active":40.0' in ev["args"][0]
        # Other categories keep no args.
        assert model.other_events.filter(pl.col("cat") != "cuda_profiler_range")["args"].null_count() == \
            model.other_events.filter(pl.col("cat") != "cuda_profiler_range").height


def _run(t: Trace) -> CountersResult:
    r = run_analyses(t.model(), only=("counters",), strict=True)["counters"]
    assert isinstance(r, CountersResult)
    return r


def test_counters_joined_to_launching_ops_with_named_metrics_and_flops() -> None:
    r = _run(_counter_trace())
    assert r.aligned and r.n_launches == 2 and r.note is None
    pk = r.per_kernel
    assert pk["name"].to_list() == ["gemm_kernel", "relu_kernel"]
    assert pk["cpu_op"].to_list() == ["aten::mm", "aten::relu"]
    assert pk["top_op"].to_list() == ["aten::linear", "aten::linear"]
    assert pk["sm_efficiency_pct"].to_list() == [91.5, 20.0]
    assert pk["achieved_occupancy_pct"].to_list() == [40.0, 10.0]
    assert pk["flops_fp32"].to_list() == [2 * 1000 + 10, 0] and pk["flops_fp16"].to_list() == [7, 0]
    assert pk["flops"].to_list() == [2017, 0]
    assert pk["range_dur_ns"].to_list() == [500_000, 300_000]
    assert set(r.named) == {"sm_efficiency_pct", "achieved_occupancy_pct", "flops_fp16", "flops_fp32", "flops"}
    mm = r.by_op.filter(pl.col("cpu_op") == "aten::mm").row(0, named=True)
    assert mm["kernels"] == 1 and mm["flops"] == 2017 and mm["sm_efficiency_pct"] == 91.5
    js = r.to_json()
    assert js["per_kernel"][0]["counters"][SASS.format("ffma")] == 1000.0
    assert dict(r.summary())["sm efficiency"] == "mean 55.8 % of peak over kernels"
    assert r.n_kernel_events == 0 and "range-profiler mode" in dict(r.summary())["Kernel events"]


def test_counts_that_differ_leave_ops_out() -> None:
    t = _counter_trace()
    t.runtime("cudaLaunchKernel", 50, 3)  # a third launch, no third counter event
    r = _run(t)
    assert not r.aligned and r.per_kernel["cpu_op"].null_count() == 2
    assert r.note is not None and "2 counter events but 3 kernel launch calls" in r.note


def test_not_applicable_without_counters() -> None:
    t = Trace()
    t.launch(0, 1, 2, 3)
    res = run_analyses(t.model(), only=("counters",))
    assert "no CUPTI counter events" in res.skipped["counters"]


@needs_shared
@pytest.mark.shared
def test_hta_cupti_profiler_trace() -> None:
    r = run_analyses(shared_model(CUPTI), only=("counters",), strict=True)["counters"]
    assert isinstance(r, CountersResult)
    # HTA's own test: 77 kernels, each matched to one of the 77 cudaLaunchKernel calls.
    assert r.per_kernel.height == 77 and r.aligned
    assert r.per_kernel["cpu_op"].null_count() == 0
    assert r.by_op["cpu_op"][0] == "aten::cudnn_convolution"  # most FLOPs
