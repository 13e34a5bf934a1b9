"""Memory per operator (self and total allocations, peak increase) and the memory curve per step."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import shared_chrome_traces, shared_params, shared_results
from support.events import PID, TID, Trace, memory

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.memory_per_op import MemoryPerOpResult
from traceanalyzer.config import Config


def _trace() -> Trace:
    t = Trace()
    t.step(1, 0, 100, gpu_copy=False)
    t.step(2, 100, 100, gpu_copy=False)
    t.op("aten::linear", 10, 40)
    t.op("aten::empty", 12, 2)
    t.op("aten::mm", 20, 20)
    t.op("aten::mm", 120, 20)

    def mem(ts: float, total: int, delta: int) -> None:
        t.events.append(memory(ts, total, delta, reserved=4096, pid=PID, tid=TID))

    mem(1, 1000, 1000)  # outside every op
    mem(13, 1100, 100)  # aten::empty
    mem(25, 1500, 400)  # aten::mm: workspace …
    mem(30, 1400, -100)  # … and a free
    mem(45, 1450, 50)  # aten::linear itself
    mem(125, 1650, 200)  # step 2: aten::mm
    mem(130, 1450, -200)
    return t


def _run(**cfg: object) -> MemoryPerOpResult:
    r = run_analyses(_trace().model(), Config(cfg), only=("memory_per_op",), strict=True)["memory_per_op"]
    assert isinstance(r, MemoryPerOpResult)
    return r


def test_self_total_and_peak_increase_per_op() -> None:
    r = _run()
    assert (r.n_events, r.n_outside_ops) == (7, 1)
    rows = {x["name"]: x for x in r.by_op.iter_rows(named=True)}
    assert set(rows) == {"aten::linear", "aten::empty", "aten::mm"}
    lin, mm, empty = rows["aten::linear"], rows["aten::mm"], rows["aten::empty"]
    assert lin["device"] == "cuda:0" and lin["calls"] == 1
    assert (lin["alloc_count"], lin["alloc_bytes"], lin["self_increase_bytes"]) == (1, 50, 50)
    assert (lin["total_alloc_count"], lin["total_alloc_bytes"], lin["total_free_bytes"]) == (3, 550, 100)
    assert lin["total_increase_bytes"] == 450
    assert lin["peak_increase_bytes"] == 500  # 1000 before it, 1500 at its worst
    assert (mm["calls"], mm["alloc_bytes"], mm["free_bytes"], mm["self_increase_bytes"]) == (2, 600, 300, 300)
    assert mm["peak_increase_bytes"] == 400  # call 1: 1100 → 1500; call 2: 1450 → 1650
    assert empty["peak_increase_bytes"] == 100
    assert r.by_op["name"].to_list() == ["aten::mm", "aten::linear", "aten::empty"]  # by total allocation


def test_memory_curve_per_step() -> None:
    r = _run(**{"memory_per_op.curve_points": 4})
    c = r.curve.filter(pl.col("device") == "cuda:0")
    assert c.filter(pl.col("step") == 1)["allocated_bytes"].to_list() == [1100, 1500, 1450, 1450]
    assert c.filter(pl.col("step") == 2)["allocated_bytes"].to_list() == [1450, 1650, 1450, 1450]
    assert c.filter(pl.col("step") == 2)["t_ns"].to_list() == [0, 25_000, 50_000, 75_000]
    assert (c["reserved_bytes"] == 4096).all()


def test_not_applicable_without_memory_events() -> None:
    t = Trace()
    t.op("aten::mm", 0, 10)
    res = run_analyses(t.model(), only=("memory_per_op",))
    assert "profile_memory=True" in res.skipped["memory_per_op"]


@pytest.mark.shared
@pytest.mark.parametrize("path", shared_params(shared_chrome_traces()))
def test_every_shared_trace(path) -> None:  # type: ignore[no-untyped-def]
    res = shared_results(path)
    r = res.values.get("memory_per_op")
    if r is None:
        assert "memory_per_op" in res.skipped
        return
    assert (r.by_op["total_alloc_bytes"] >= r.by_op["alloc_bytes"]).all()
    assert (r.by_op["peak_increase_bytes"] >= 0).all()
    r.to_json()
