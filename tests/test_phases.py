"""phases: the phase of a point (PhaseContext.classify), by binary search or by as-of joins."""

from __future__ import annotations

import random

import polars as pl
import pytest

from traceanalyzer.analyses import phases as P

_IV = {"pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64}


def _ctx(intervals: dict[str, list[tuple[int, int, int, int]]]) -> P.PhaseContext:
    ivs = {n: pl.DataFrame(intervals.get(n, []), schema=_IV, orient="row") for n in P.CPU_PRECEDENCE}
    windows = pl.DataFrame({"window": [0, 1], "step": [5, 6], "start_ns": [10, 100], "end_ns": [90, 180]})
    bwd = pl.DataFrame({"window": [0], "bwd_start_ns": [50]}, schema={"window": pl.Int64, "bwd_start_ns": pl.Int64})
    return P.PhaseContext(ivs, bwd, windows, {}, {n: P._merge_phase(iv) for n, iv in ivs.items()})


@pytest.mark.parametrize("joins", [False, True])
def test_classify_known_points(monkeypatch: pytest.MonkeyPatch, joins: bool) -> None:
    """Precedence, half-open unions per thread, and forward/other around the step's first backward op."""
    if joins:
        monkeypatch.setattr(P, "_phase_flags", lambda *_: None)
    ctx = _ctx({
        "communication": [(1, 1, 20, 30)],
        "optimizer": [(1, 1, 25, 40)],
        "backward": [(1, 2, 60, 70)],
    })
    pts = pl.DataFrame({
        "pid": [1, 1, 1, 1, 1, 1, 1, 1],
        "tid": [1, 1, 1, 2, 1, 1, 2, 1],
        "t": [25, 30, 39, 60, 45, 55, 70, 120],
    })
    got = ctx.classify(pts).to_list()
    # 25: communication wins over optimizer; 30: communication has ended (half-open);
    # 60 on thread 2: backward; 45 / 55: no phase, before / after the window's backward start;
    # 70: backward has ended; 120: window 1 has no backward, so forward.
    assert got == ["communication", "optimizer", "optimizer", "backward", "forward", "other", "other", "forward"]


def test_classify_binary_search_matches_the_joins(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    for _ in range(40):
        intervals = {}
        for name in P.CPU_PRECEDENCE:
            rows = []
            for _ in range(rng.randint(0, 12)):
                s = rng.randint(0, 200)
                rows.append((rng.randint(1, 2), rng.randint(1, 3), s, s + rng.choice([0, 1, 5, 30])))
            intervals[name] = rows
        ctx = _ctx(intervals)
        n = rng.randint(1, 40)
        pts = pl.DataFrame({"pid": [rng.randint(1, 3) for _ in range(n)], "tid": [rng.randint(1, 4) for _ in range(n)],
                            "t": [rng.randint(-5, 240) for _ in range(n)]})
        fast = ctx.classify(pts)
        with monkeypatch.context() as m:
            m.setattr(P, "_phase_flags", lambda *_: None)
            assert ctx.classify(pts).equals(fast)
