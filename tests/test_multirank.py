"""Multi-rank summary: per-rank numbers, straggler naming and what it spent the time on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.synthetic import dumps_trace, scenario_multi_rank, write_bytes

from traceanalyzer.batch.multirank import multirank, per_rank_table, summarize_runs
from traceanalyzer.batch.summary import report_metrics
from traceanalyzer.pipeline import analyze


def _rows(tmp: Path, world: int, straggler: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    truth: dict[str, Any] = {}
    for r in range(world):
        trace, truth = scenario_multi_rank(rank=r, world_size=world, straggler_rank=straggler, steps=3)
        p = write_bytes(tmp / f"rank{r}.json", dumps_trace(trace))
        rep = analyze(p)
        rows.append({"file": p.name, "run": "run", "kind": "trace", "status": "ok", "rank": rep.meta["rank"],
                     "world_size": rep.meta["world_size"], "metrics": report_metrics(rep)})
    return rows, truth["planted"]


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return _rows(tmp_path_factory.mktemp("mr3"), 3, 2)


def test_straggler_named_with_its_cause(three_ranks: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    rows, planted = three_ranks
    # WHEN the three ranks are summarised
    mr = multirank(rows)
    assert mr["n_ranks"] == 3 and mr["world_size"] == 3
    # THEN the planted straggler is named, with the DataLoader as what it spent the time on
    assert mr["straggler"] == planted["straggler_rank"] == 2
    f = mr["finding"]
    assert f and f["rule_id"] == "rank_imbalance" and "Rank 2" in f["title"] and "dataloader" in f["title"]
    assert mr["straggler_spent_on"] == "dataloader"
    # the imbalance is about the planted delay (4 ms per step) and is the finding's cost
    assert mr["imbalance_ms"] == pytest.approx(planted["straggler_delay_us"] / 1000, rel=0.1)
    assert f["cost_ms_per_step"] == pytest.approx(mr["imbalance_ms"], abs=1e-3)
    # the fast ranks wait inside collectives, the straggler does not
    ranks = {e["rank"]: e for e in mr["ranks"]}
    assert ranks[2]["wait_ms"] == 0
    waits_truth = planted["collective_wait_ns_by_rank"]
    for r in (0, 1):
        assert ranks[r]["comm_ms"] > ranks[2]["comm_ms"]
        assert ranks[r]["wait_ms"] * 1e6 * 3 == pytest.approx(waits_truth[r] - waits_truth[2], rel=0.05)
    # step times are equal across ranks (lock-step), so step time alone would not find it
    assert mr["step_ms_spread_pct"] < 1
    for e in mr["ranks"]:
        assert 0 <= e["overlap_pct"] <= 100 and e["busy_pct"] is not None and e["exposed_comm_ms"] > 0


def test_balanced_run_has_no_finding(tmp_path: Path) -> None:
    rows, _ = _rows(tmp_path, 2, None)
    mr = multirank(rows)
    assert mr["finding"] is None
    assert abs(mr["imbalance_pct"]) < 5


def test_threshold_from_params(three_ranks: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    rows, _ = three_ranks
    mr = multirank(rows, {"min_imbalance_pct": 90.0})
    assert mr["straggler"] == 2 and mr["finding"] is None


def test_run_summary_uses_slowest_rank_and_straggler_finding(three_ranks: tuple[list[dict[str, Any]],
                                                                                dict[str, Any]]) -> None:
    rows, _ = three_ranks
    bad = {"file": "rank3.json", "run": "run", "kind": "trace", "status": "error", "rank": 3, "error": "empty file",
           "metrics": {}}
    (run,) = summarize_runs([*rows, bad])
    assert run["n_files"] == 4 and run["n_failed"] == 1 and run["ranks"] == [0, 1, 2, 3]
    assert run["step_ms"] == max(r["metrics"]["step_ms"] for r in rows)
    assert run["straggler"] == 2 and "straggler" in run["top_finding"]


def test_hand_rows_without_communication() -> None:
    # GIVEN ranks that do not communicate (e.g. data-parallel inference): the slow one
    # simply has the longest steps, and its extra time is in kernels
    def row(rank: int, step: float, kernel: float) -> dict[str, Any]:
        return {"rank": rank, "kind": "trace", "status": "ok", "file": f"r{rank}", "metrics": {
            "step_ms": step, "window_ms_per_step": step, "gpu_busy_pct": 90.0, "exposed_comm_ms_per_step": 0.0,
            "breakdown_ms_per_step": {"kernel": kernel, "dataloader": 1.0, "communication": 0.0}}}

    mr = multirank([row(0, 10.0, 8.0), row(1, 10.2, 8.1), row(2, 13.0, 11.0)])
    assert mr["straggler"] == 2 and mr["straggler_spent_on"] == "kernel"
    assert mr["imbalance_ms"] == pytest.approx(2.9)
    assert per_rank_table([row(0, 1.0, 1.0)])[0]["wait_ms"] is None
    assert multirank([row(0, 1.0, 1.0)]) is None
