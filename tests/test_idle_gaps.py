"""Idle gaps: every device/stream gap, its cause, CPU attribution and histogram."""

from __future__ import annotations

import polars as pl
import pytest
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.config import Config

DL = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _scenario() -> Trace:
    t = Trace()
    t.launch(0, 2, 5, 10, name="A")  # 5..15
    t.op("aten::relu", 20, 40)
    t.launch(50, 2, 55, 5, name="B")  # host-bound gap 15..55
    t.runtime("cudaStreamSynchronize", 58, 3)  # returns just after the GPU drained at 60
    t.launch(80, 2, 85, 5, name="C")  # sync gap 60..85
    t.ann(DL, 95, 105)
    t.launch(205, 2, 210, 10, name="D")  # data-loader gap 90..210
    t.op("aten::copy_", 214, 47)
    t.launch(215, 45, 220, 6, name="Memcpy DtoH (Device -> Pageable)", api="cudaMemcpyAsync",
             activity="memcpy")  # pageable: the call blocks until 260
    t.launch(262, 2, 266, 4, name="F")  # memcpy gap 226..266
    t.launch(265, 2, 300, 10, name="G")  # queued before the drain at 270: gap 270..300 "other"
    # Stream 8: a kernel queued early that waits for stream 7 (cross-stream event).
    t.launch(1, 1, 6, 2, name="S1", stream=8)
    t.launch(3, 1, 300, 5, name="S2", stream=8)
    return t


def _run(t: Trace, **cfg):
    return run_analyses(t.model(), Config(cfg), only=("idle_gaps",), strict=True)["idle_gaps"]


def test_device_gaps_and_causes_are_exactly_the_planted_ones():
    r = _run(_scenario())
    g = r.device_gaps.sort("start_ns")
    assert g["start_ns"].to_list() == [ns(x) for x in (15, 60, 90, 226, 270)]
    assert g["dur_ns"].to_list() == [ns(x) for x in (40, 25, 120, 40, 30)]
    assert g["cause"].to_list() == ["host_bound", "sync", "data_loader", "memcpy", "other"]
    assert g["next_name"].to_list() == ["B", "C", "D", "F", "G"]
    assert g["queued"].to_list() == [False, False, False, False, True]
    dev = r.per_device.row(0, named=True)
    assert dev["n_gaps"] == 5 and dev["idle_ns"] == ns(255)
    assert (dev["host_bound_ns"], dev["sync_ns"], dev["data_loader_ns"], dev["memcpy_ns"], dev["other_ns"]) == (
        ns(40), ns(25), ns(120), ns(40), ns(30))


def test_cpu_attribution_of_gaps():
    r = _run(_scenario())
    g = r.device_gaps.sort("start_ns")
    assert g["cpu_context"].to_list() == ["aten::relu", None, DL, "aten::copy_", None]
    assert g["annotation"].to_list() == [None, None, DL, None, None]
    # Only the 120 µs gap is "long" by default (≥ 100 µs).
    a = r.attribution.row(0, named=True)
    assert r.attribution.height == 1
    assert (a["cpu_context"], a["source"], a["n_gaps"], a["idle_ns"]) == (DL, "annotation", 1, ns(120))
    assert a["pct_of_idle"] == pytest.approx(120 / 255 * 100, abs=0.01)
    assert a["pct_of_long_gap_idle"] == 100.0
    assert "inside `enumerate(DataLoader)" in dict(r.summary())["Idle time attributed"]


def test_long_gap_threshold_is_configurable():
    r = _run(_scenario(), **{"idle_gaps.long_gap_us": 30})
    assert r.attribution["n_gaps"].sum() == 4  # 40, 120, 40, 30 µs
    assert r.thresholds["long_gap_us"] == 30


def test_stream_gaps_detect_cross_stream_dependency():
    r = _run(_scenario())
    s8 = r.stream_gaps.filter(stream=8)
    assert s8.height == 1
    row = s8.row(0, named=True)
    assert (row["start_ns"], row["end_ns"], row["cause"], row["queued"]) == (ns(8), ns(300), "stream_dependency", True)
    s7 = r.stream_gaps.filter(stream=7)
    assert s7["cause"].to_list() == ["host_bound", "sync", "data_loader", "memcpy", "other"]
    per = r.per_stream.filter(stream=8).row(0, named=True)
    assert per["stream_dependency_ns"] == ns(292)


def test_histogram_is_threshold_free():
    r = _run(_scenario())
    h = {row["bin"]: (row["count"], row["total_ns"]) for row in r.histogram.iter_rows(named=True)}
    assert h["10 µs – 100 µs"] == (4, ns(135))
    assert h["100 µs – 1 ms"] == (1, ns(120))
    assert sum(c for c, _ in h.values()) == 5


def test_gaps_per_step():
    t = Trace()
    t.step(1, 0, 100)
    t.launch(1, 1, 5, 10)  # 5..15
    t.launch(40, 1, 45, 10)  # gap 15..45
    t.step(2, 100, 100)
    t.launch(101, 1, 105, 10)  # gap 55..105 spans the step boundary at 100: 45 in step 1, 5 in step 2
    t.launch(150, 1, 160, 10)  # gap 115..160
    r = _run(t)
    ps = r.per_step
    assert ps["step"].to_list() == [1, 2]
    assert ps["n_gaps"].to_list() == [2, 2]
    assert ps["idle_ns"].to_list() == [ns(30 + 45), ns(5 + 45)]
    # before the first activity (0..5) and after the last (170..200): idle in no gap
    assert ps["outside_gaps_ns"].to_list() == [ns(5), ns(30)]
    # the gap listing keeps the gap whole, under the step it starts in
    g = r.device_gaps.sort("start_ns")
    assert g["step"].to_list() == [1, 1, 2] and g["dur_ns"].to_list() == [ns(30), ns(50), ns(45)]


def test_gaps_per_step_agree_with_gpu_time():
    t = Trace()
    t.step(1, 0, 100)
    t.launch(1, 1, 5, 10)
    t.step(2, 100, 100)
    t.launch(101, 1, 250, 10)  # one gap 15..250 over three windows
    t.step(3, 200, 100)
    t.launch(201, 1, 290, 5)
    res = run_analyses(t.model(), Config(), only=("idle_gaps", "gpu_time"), strict=True)
    ig = res["idle_gaps"].per_step.select(
        "window", "device", (pl.col("idle_ns") + pl.col("outside_gaps_ns")).alias("i")
    )
    gt = res["gpu_time"].per_step.select("window", "device", "idle_ns")
    j = gt.join(ig, on=["window", "device"], how="left")
    assert j["idle_ns"].to_list() == j["i"].to_list()
    assert res["idle_gaps"].per_step["n_gaps"].to_list() == [1, 1, 1]


def test_mtia_synchronize_stream_gap_is_a_sync():
    t = Trace()
    run = "runFunction - job_prep_and_submit_for_execution"
    for ts, k_ts in ((0, 5), (80, 85)):
        c = t.runtime(run, ts, 2, cat="mtia_runtime")
        t._x("mtia_ccp_events", "pe_exe", k_ts, 10, pid=17, tid=3536, stream=101, correlation=c)
    t.runtime("synchronizeStream", 12, 5, cat="mtia_runtime")  # returns just after the device drained at 15
    c = t.runtime(run, 140, 2, cat="mtia_runtime")
    t._x("mtia_ccp_events", "pe_exe", 145, 10, pid=17, tid=3536, stream=101, correlation=c)
    t.runtime("synchronize", 100, 30, cat="mtia_runtime")  # not an MTIA host sync API
    r = _run(t)
    g = r.device_gaps.sort("start_ns")
    assert g.select("device", "start_ns", "dur_ns", "cause").rows() == [
        (17, ns(15), ns(70), "sync"), (17, ns(95), ns(50), "host_bound"),
    ]
