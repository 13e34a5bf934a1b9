"""Ground truth: the synthetic generator's planted gaps, steps and launches are found exactly."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import polars as pl
import pytest
from support import synthetic

from traceanalyzer.analyses import run_analyses
from traceanalyzer.load.chrome_trace import build_model

LAYOUTS = ("modern", "pt_1_13", "legacy_1_8")
HOST_CAUSES = {"host_bound", "data_loader", "sync", "memcpy"}
#: The innermost CPU frame over a DataLoader gap, as each layout records it.
LOADER_FRAME = {"modern": "torch/utils/data/dataloader.py(1458): _next_data",
                "pt_1_13": "torch/utils/data/dataloader.py(708): __next__",
                "legacy_1_8": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"}


@cache
def _run(scenario: str, layout: str, vendor: str = "nvidia"):
    doc, truth = synthetic.SCENARIOS[scenario](layout=layout, vendor=vendor)
    model = build_model(Path(f"{scenario}.json"), doc)
    names = ("steps", "gpu_time", "idle_gaps", "kernels", "launches")
    return run_analyses(model, only=names, strict=True), truth


@pytest.mark.parametrize("layout", LAYOUTS)
def test_planted_idle_gaps_found_exactly(layout):
    res, truth = _run("idle_gaps", layout)
    threshold = truth["gaps"]["threshold_ns"]
    ours = res["idle_gaps"].stream_gaps.filter(pl.col("dur_ns") >= threshold).sort("start_ns")
    planted = sorted(truth["planted"]["gaps"], key=lambda g: g["start_ns"])
    assert truth["planted"]["max_unplanted_gap_ns"] < threshold
    assert [(g["stream"], g["start_ns"], g["end_ns"]) for g in planted] == list(
        ours.select("stream", "start_ns", "end_ns").iter_rows()
    )
    for g, row in zip(planted, ours.iter_rows(named=True)):
        assert g["cause"] == "host" and row["cause"] in HOST_CAUSES and not row["queued"]
        if g["annotation"]:  # inside the DataLoader wait
            assert row["cause"] == "data_loader"
            assert row["cpu_context"] == LOADER_FRAME[layout]
        else:  # the log_metrics python frame
            assert row["cause"] == "host_bound"
            if layout != "legacy_1_8":  # legacy traces have no python_function events
                assert row["cpu_context"] == g["python_frame"]
    # Threshold-free totals: every gap, per stream and for the device.
    per_stream = {str(r["stream"]): r["idle_ns"] for r in res["idle_gaps"].per_stream.iter_rows(named=True)}
    assert per_stream == truth["gaps"]["idle_ns_by_stream"]
    span = res["gpu_time"].gpu_span.row(0, named=True)
    assert span["busy_ns"] == truth["gpu"]["busy_ns"]
    assert span["idle_ns"] == truth["gpu"]["idle_ns"]
    assert res["idle_gaps"].per_device["idle_ns"][0] == truth["gpu"]["idle_ns"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_steps_match_planted_steps(layout):
    res, truth = _run("idle_gaps", layout)
    t = res["steps"].table
    assert t["cpu_start_ns"].to_list() == [s["cpu_start_ns"] for s in truth["steps"]]
    assert t["cpu_end_ns"].to_list() == [s["cpu_end_ns"] for s in truth["steps"]]
    assert t["step"].to_list() == [s["number"] for s in truth["steps"]]


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "xpu"])
def test_launch_bound_scenario(vendor):
    res, truth = _run("launch_bound", "modern", vendor)
    k = res["kernels"]
    assert k.n_kernels == truth["counts"]["kernels"]
    assert k.total_ns == truth["kernels"]["total_ns"]
    lr = res["launches"]
    kern = lr.table.filter(pl.col("activity") == "kernel")
    assert kern.height == truth["counts"]["kernels"]
    assert int(kern["shorter_than_launch"].sum()) == truth["kernels"]["shorter_than_launch"]
    assert lr.per_step["launch_bound"].to_list() == [True] * len(truth["steps"])
    # Per-step kernel counts are those launched in each step.
    assert k.per_step["n_kernels"].to_list() == [s["kernels_launched"] for s in truth["steps"]]


def test_compute_bound_scenario_is_not_launch_bound():
    res, truth = _run("compute_bound", "modern")
    assert not any(res["launches"].per_step["launch_bound"].to_list())
    for row in res["gpu_time"].per_step.iter_rows(named=True):
        assert row["busy_pct"] > 90
