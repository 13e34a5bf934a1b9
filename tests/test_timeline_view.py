"""timeline_view: the representative steady step's intervals, bounded, with gap ids the findings point at."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import SHARED_TRACES, needs_shared, shared_results
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.timeline_view import ALL_GAP_RULES, CAUSE_RULES, TimelineViewResult, _bound
from traceanalyzer.config import Config


def _scenario() -> Trace:
    t = Trace()
    t.step(1, 0, 100)
    t.op("aten::mm", 5, 20)
    t.launch(6, 2, 10, 20, name="K0")
    t.step(2, 100, 200)
    t.op("aten::mm", 105, 20)
    t.launch(106, 2, 110, 150, name="K0")
    t.step(3, 300, 120)  # durations 100, 200, 120: the median steady step is #3
    t.op("aten::mm", 305, 35)
    t.launch(306, 1, 310, 20, name="K1")  # 310..330 on stream 7
    t.launch(307, 1, 312, 5, name="K3", stream=8)
    t.op("aten::relu", 350, 10)
    t.launch(351, 2, 380, 10, name="K2")  # host-bound gap 330..380: launched after the GPU drained
    return t


def _run(t: Trace, **cfg: object) -> TimelineViewResult:
    r = run_analyses(t.model(), Config(cfg), only=("timeline_view",), strict=True)["timeline_view"]
    assert isinstance(r, TimelineViewResult)
    return r


def test_the_median_steady_step_with_its_lanes_items_and_gaps() -> None:
    r = _run(_scenario())
    assert r.step == 3 and r.window_start_ns == ns(300) and r.window_ns == ns(120)
    assert r.lanes["label"].to_list()[:3] == ["GPU 0 stream 7", "GPU 0 stream 8", "GPU 0 idle"]
    assert r.lanes["kind"].to_list() == ["gpu", "gpu", "gaps", "cpu"]
    gpu = r.items.filter(pl.col("kind") == "kernel").sort("start_ns")
    assert gpu["name"].to_list() == ["K1", "K3", "K2"]
    assert gpu["start_ns"].to_list() == [ns(10), ns(12), ns(80)]  # from the window start
    assert gpu["site"].to_list() == ["aten::mm", "aten::mm", "aten::relu"]  # the op around the launch call
    cpu = r.items.filter(pl.col("lane") == 3).sort("row", "start_ns")
    assert cpu.filter(pl.col("row") == 0)["name"].to_list() == ["aten::mm", "aten::relu"]
    assert set(cpu.filter(pl.col("row") == 1)["kind"].to_list()) == {"runtime"}
    # 260..310 began in step 2 (K0 ends at 260, K1 launched at 306): clipped to the window
    assert r.gaps.rows() == [("g0", 0, 0, ns(10), "host_bound", None), ("g1", 0, ns(30), ns(50), "host_bound",
                                                                         "aten::relu")]
    rules = r.gap_rules()["g1"]
    assert "host_bound_gaps" in rules and set(ALL_GAP_RULES) <= set(rules)
    assert r.n_merged == 0 and r.n_dropped == 0
    j = r.to_json()
    assert [j["strings"][i] for i in j["items"]["name"]] == r.items["name"].to_list()
    assert len(j["items"]["name"]) == r.items.height and j["cause_rules"]["host_bound"] == list(
        CAUSE_RULES["host_bound"])


def test_cpu_depth_bounds_the_cpu_rows() -> None:
    r = _run(_scenario(), **{"timeline_view.cpu_depth": 1})
    cpu = r.items.filter(pl.col("lane") == 3)
    assert set(cpu["row"].to_list()) == {0} and "runtime" not in cpu["kind"].to_list()


def test_short_items_merge_per_pixel_column_and_the_count_is_capped() -> None:
    n = 50_000
    items = pl.DataFrame({
        "lane": [0] * n, "row": [0] * n, "start_ns": [i * 20 for i in range(n)], "dur_ns": [5] * n,
        "name": ["tiny"] * n, "kind": ["kernel"] * n, "n": [1] * n, "site": [None] * n,
    }, schema={"lane": pl.Int64, "row": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "name": pl.String,
               "kind": pl.String, "n": pl.Int64, "site": pl.String})
    long = items.head(3).with_columns(start_ns=pl.Series([0, 400_000, 800_000]), dur_ns=pl.lit(100_000, pl.Int64),
                                      name=pl.lit("long"))
    out, merged, dropped = _bound(pl.concat([items, long]), 1_000_000, 4000)
    assert out.height <= 2000 + 3 and merged == n and dropped == 0
    assert int(out["n"].sum()) == n + 3  # every interval is accounted for
    assert out.filter(pl.col("name") == "long").height == 3
    assert set(out.filter(pl.col("kind") == "merged")["name"].to_list()) == {"25 short intervals"}
    capped, _, dropped = _bound(pl.concat([items, long]), 1_000_000, 100)
    assert capped.height == 100 and dropped == n + 3 - int(capped["n"].sum())
    assert capped.filter(pl.col("name") == "long").height == 3  # the longest are kept


def test_no_gpu_activity_is_not_applicable() -> None:
    t = Trace()
    t.op("aten::mm", 0, 10)
    res = run_analyses(t.model(), Config({}), only=("timeline_view",))
    assert "timeline_view" in res.skipped


def test_max_gaps_keeps_the_longest() -> None:
    r = _run(_scenario(), **{"timeline_view.max_gaps": 1})
    assert r.gaps.rows() == [("g0", 0, ns(30), ns(50), "host_bound", "aten::relu")] and r.n_gaps_dropped == 1


@pytest.mark.shared
@needs_shared
@pytest.mark.parametrize("rel", [
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/inference/vllm_graph_execution.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
])
def test_real_traces_stay_bounded_and_consistent(rel: str) -> None:
    path = SHARED_TRACES / rel
    if not path.exists():
        pytest.skip(f"{rel} not in ../shared")
    res = shared_results(path)
    r = res["timeline_view"]
    assert isinstance(r, TimelineViewResult)
    assert 0 < r.items.height <= r.thresholds["max_items"] and r.gaps.height <= r.thresholds["max_gaps"]
    assert set(r.items["lane"].to_list()) <= set(r.lanes["lane"].to_list())
    assert (r.items["start_ns"] >= 0).all() and ((r.items["start_ns"] + r.items["dur_ns"]) <= r.window_ns).all()
    assert (r.gaps["start_ns"] >= 0).all() and ((r.gaps["start_ns"] + r.gaps["dur_ns"]) <= r.window_ns).all()
    assert r.gaps["id"].n_unique() == r.gaps.height
    assert int(r.items["n"].sum()) + r.n_dropped == r.n_source_items  # every interval accounted for
    steps = res["steps"]
    if steps.has_steps:
        assert r.step in steps.table["step"].to_list()
