"""Queue length per stream: a hand-built timeline with known queue levels, and every real trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import REPO, SHARED_TRACES, needs_shared, shared_chrome_traces, shared_params, shared_results
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.queue_length import QueueLengthResult
from traceanalyzer.config import Config


def _run(t: Trace, **cfg: object) -> QueueLengthResult:
    res = run_analyses(t.model(), Config(cfg), only=("queue_length",), strict=True)
    r = res["queue_length"]
    assert isinstance(r, QueueLengthResult)
    return r


def pl_stream(n: int) -> pl.Expr:
    return pl.col("stream") == n


def test_known_queue_levels_per_stream() -> None:
    t = Trace()
    t.op("aten::x", 0, 100)  # the CPU side spans the whole trace: one window 0 … 100 µs
    # Stream 7: three launches at 0, 10, 20 µs; their kernels start at 30, 40, 50 µs.
    # Queue: 0-10 → 1, 10-20 → 2, 20-30 → 3, 30-40 → 2, 40-50 → 1, 50-100 → 0.
    t.launch(0, 5, 30, 10, stream=7)
    t.launch(10, 5, 40, 10, stream=7)
    t.launch(20, 5, 50, 10, stream=7)
    # Stream 9: one launch at 60 µs whose kernel starts at once (never queued) ending at 100.
    t.launch(60, 5, 60, 40, stream=9)
    r = _run(t, **{"queue_length.full_queue": 3})
    s7 = r.per_stream.filter(pl_stream(7)).row(0, named=True)
    assert s7["launches"] == 3 and s7["window_ns"] == ns(100)
    assert s7["mean_queue"] == pytest.approx((1 + 2 + 3 + 2 + 1) * 10 / 100)
    assert s7["max_queue"] == 3 and s7["p95_queue"] == 3  # 3 queued for 10 % of the time
    assert s7["empty_ns"] == ns(50) and s7["empty_pct_of_window"] == pytest.approx(50.0)
    assert s7["full_ns"] == ns(10) and s7["full_pct_of_window"] == pytest.approx(10.0)
    s9 = r.per_stream.filter(pl_stream(9)).row(0, named=True)
    assert s9["max_queue"] == 0 and s9["empty_pct_of_window"] == pytest.approx(100.0)
    # Streams by device time: stream 9's 40 µs kernel before stream 7's 3 × 10 µs.
    assert r.per_stream["stream"].to_list() == [9, 7]
    assert r.n_queued == 4


def test_p95_and_per_step() -> None:
    t = Trace()
    t.step(1, 0, 100, gpu_copy=False)
    t.step(2, 100, 100, gpu_copy=False)
    t.launch(0, 1, 90, 5)  # queued 90 µs of step 1's 100 (window 0 … 100)
    t.launch(100, 1, 101, 5)  # queued 1 µs of step 2
    r = _run(t)
    ps = r.per_step
    assert ps["step"].to_list() == [1, 2]
    assert ps["mean_queue"].to_list() == pytest.approx([0.9, 0.01])
    assert ps["empty_pct_of_window"].to_list() == pytest.approx([10.0, 99.0])
    s = r.per_stream.row(0, named=True)
    assert s["p95_queue"] == 1 and s["max_queue"] == 1  # 1 queued for 91 / 200 µs ≥ 5 %


def test_graph_launch_queues_each_replayed_kernel() -> None:
    t = Trace()
    t.op("aten::x", 0, 50)
    corr = t.runtime("cudaGraphLaunch", 0, 5)
    for i in range(3):
        t.gpu(corr, 10 + 10 * i, 10, name=f"g{i}", graph_id=1)
    r = _run(t)
    s = r.per_stream.row(0, named=True)
    assert s["launches"] == 3 and s["max_queue"] == 3
    assert s["mean_queue"] == pytest.approx((3 * 10 + 2 * 10 + 1 * 10) / 50)


def test_not_applicable_without_launches() -> None:
    t = Trace()
    t.op("aten::x", 0, 10)
    res = run_analyses(t.model(), only=("queue_length",))
    assert "no launch call" in res.skipped["queue_length"]


@pytest.mark.shared
@pytest.mark.parametrize("path", shared_params(shared_chrome_traces()))
def test_every_shared_trace(path) -> None:  # type: ignore[no-untyped-def]
    res = shared_results(path)
    r = res.values.get("queue_length")
    if r is None:
        assert "queue_length" in res.skipped
        return
    assert (r.per_stream["max_queue"].drop_nulls() >= 0).all()
    assert (r.per_stream["empty_pct_of_window"].drop_nulls() <= 100.0 + 1e-6).all()
    r.to_json()


def test_launch_bound_diagnosis_cites_the_empty_queue() -> None:
    from pathlib import Path

    from support import synthetic as S

    from traceanalyzer.load.chrome_trace import build_model

    trace, _truth = S.scenario_launch_bound()
    res = run_analyses(build_model(Path("launch_bound.json"), trace), only=("diagnosis", "queue_length"), strict=True)
    from traceanalyzer.analyses.diagnosis import DiagnosisResult

    d, q = res["diagnosis"], res["queue_length"]
    assert isinstance(d, DiagnosisResult) and isinstance(q, QueueLengthResult)
    assert d.verdict == "cpu_bound"
    busiest = q.busiest()
    assert busiest is not None and busiest["mean_queue"] < 1.0  # never more than the launch in flight
    line = [e for e in d.evidence if e.startswith("Launch queue of the busiest stream")]
    assert len(line) == 1 and f"{busiest['empty_pct_of_window']:.1f} %" in line[0]


def test_launch_bound_rule_cites_queue_and_sequences() -> None:
    from pathlib import Path

    from conftest import rule_inputs
    from support import synthetic as S

    from traceanalyzer.analyses.kernel_sequences import KernelSequencesResult
    from traceanalyzer.load.chrome_trace import build_model
    from traceanalyzer.rules import run_rules

    trace, _truth = S.scenario_launch_bound()
    res = run_analyses(build_model(Path("launch_bound.json"), trace), only=rule_inputs("launch_bound_kernels"),
                       strict=True)
    f = [x for x in run_rules(res).findings if x.rule_id == "launch_bound_kernels"]
    assert len(f) == 1
    q, ks = res["queue_length"], res["kernel_sequences"]
    assert isinstance(q, QueueLengthResult) and isinstance(ks, KernelSequencesResult)
    busiest = q.busiest()
    assert busiest is not None
    assert f[0].evidence["queue_empty_pct_of_steps"] == busiest["empty_pct_of_window"]
    seqs = f[0].evidence["frequent_sequences"]
    assert 1 <= len(seqs) <= 3 and seqs[0]["count_per_step"] == ks.top.filter(pl.col("n") == 3)["count_per_step"].max()


# ---- HTA 0.5.0's own queue length (tests/data/hta_reference/queue_length_*.json, made by
# scripts/hta_reference.py --queue-length): per stream, the same figures from our step function
# over HTA's span (the first to the last change of its series). docs/parity.md has the numbers.

HTA_QL = sorted((REPO / "tests" / "data" / "hta_reference").glob("queue_length_*.json"))


def _hta_pairs(ref_path: Path) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(HTA's figures, ours with HTA's counting rules, ours as the analysis counts) per stream."""
    import json

    from traceanalyzer.analyses.queue_length import span_stats
    from traceanalyzer.load.chrome_trace import load_chrome_trace

    ref = json.loads(ref_path.read_text())
    path = SHARED_TRACES / ref["trace"]
    if not path.exists():
        pytest.skip(f"{path} not available")
    m = load_chrome_trace(path)
    base_us = ref["min_ts"] + m.meta.base_time_ns // 1000  # HTA ignores baseTimeNanoseconds
    out = []
    for rank in ref["per_rank"].values():
        for s, h in rank["streams"].items():
            t0, t1 = (base_us + h["first_ts"]) * 1000, (base_us + h["last_ts"]) * 1000
            rows = [span_stats(m, t0, t1, hta_rules=r).filter(pl.col("stream") == int(s)).row(0, named=True)
                    for r in (True, False)]
            out.append((dict(h, stream=int(s)), rows[0], rows[1]))
    return out


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("ref_path", HTA_QL, ids=lambda p: p.stem.removeprefix("queue_length_"))
def test_queue_length_agrees_with_hta(ref_path: Path) -> None:
    """With HTA's counting rules our step function is HTA's, stream by stream: the launches
    counted, the maximum, the time-weighted mean and the time with nothing queued over HTA's span
    (to HTA's whole-µs rounding on traces with fractional timestamps). HTA's own summary
    (``describe``) averages the series' rows, not time: its mean is not comparable and is only
    recorded."""
    pairs = _hta_pairs(ref_path)
    assert pairs
    for h, o, _ in pairs:
        what = f"stream {h['stream']}"
        assert abs(o["launches"] - h["describe"]["count"] // 2) <= 1, what
        assert o["max_queue"] == h["max"], what
        assert o["window_ns"] == pytest.approx(h["span"] * 1000, abs=1000), what
        assert o["mean_queue"] == pytest.approx(h["time_weighted_mean"], rel=0.01, abs=0.002), what
        assert o["empty_ns"] / 1000 == pytest.approx(h["time_at_zero"], rel=0.002, abs=2), what
        assert h["duration_at_max_queue_length"]["1024"] is None  # no stream of these traces fills up


@needs_shared
@pytest.mark.shared
def test_queue_length_differs_from_hta_where_documented() -> None:
    """Where the definitions differ (docs/parity.md): on negative_queue_length_values_check,
    stream 7 has 345 graph-launched kernels HTA does not count and launches whose kernels start
    after HTA's range; as the analysis counts, its queue is deeper than HTA's."""
    ref = REPO / "tests" / "data" / "hta_reference" / "queue_length_negative_queue_length_values_check.json"
    by_stream = {h["stream"]: (h, ours) for h, _, ours in _hta_pairs(ref)}
    h, ours = by_stream[7]
    assert (h["max"], ours["max_queue"]) == (946, 994)
    assert h["time_weighted_mean"] == pytest.approx(612.325) and ours["mean_queue"] == pytest.approx(682.765, abs=0.01)
    h25, ours25 = by_stream[25]  # no graph launch, nothing after the range: the same
    assert ours25["max_queue"] == h25["max"] == 4
