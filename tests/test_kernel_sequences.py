"""Kernel n-grams per steady step: a hand-built timeline with known sequences, and every real trace."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import shared_chrome_traces, shared_params, shared_results
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.kernel_sequences import KernelSequencesResult
from traceanalyzer.config import Config

ADD = "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float> >(int, float)"
MUL = "void at::native::unrolled_elementwise_kernel<MulFunctor<float> >(int)"
RED = "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)"
GEMM = "ampere_sgemm_128x64_nn"


def _trace() -> Trace:
    """Three steps of 100 µs; each runs on stream 7: add mul sum add mul sum gemm, 2 µs kernels
    1 µs apart, launched by aten::add / aten::mul / aten::sum / aten::mm."""
    t = Trace()
    ops = {ADD: "aten::add", MUL: "aten::mul", RED: "aten::sum", GEMM: "aten::mm"}
    for s in range(3):
        base = 100 * s
        t.step(s + 1, base, 100, gpu_copy=False)
        for i, name in enumerate((ADD, MUL, RED, ADD, MUL, RED, GEMM)):
            cpu = base + 5 * i
            t.op(ops[name], cpu, 4)
            t.launch(cpu + 1, 1, base + 50 + 3 * i, 2, name=name)
    return t


def _run(t: Trace, **cfg: object) -> KernelSequencesResult:
    r = run_analyses(t.model(), Config(cfg), only=("kernel_sequences",), strict=True)["kernel_sequences"]
    assert isinstance(r, KernelSequencesResult)
    return r


def test_known_trigrams_counts_time_and_launching_op() -> None:
    r = _run(_trace(), **{"kernel_sequences.min_n": 3, "kernel_sequences.max_n": 3})
    assert r.n_steady_steps == 3 and r.n_kernels == 21
    top = r.top
    first = top.row(0, named=True)
    add, mul, red = "at::native::vectorized_elementwise_kernel", "at::native::unrolled_elementwise_kernel", \
        "at::native::reduce_kernel"
    # add → mul → sum occurs twice per step: the most frequent 3-gram.
    assert first["sequence"] == f"{add} → {mul} → {red}"
    assert (first["count"], first["steps"], first["count_per_step"]) == (6, 3, 2.0)
    assert first["total_ns"] == 6 * ns(6) and first["ns_per_step"] == pytest.approx(2 * ns(6))
    assert first["gap_ns"] == 6 * ns(2)  # 1 µs between each pair of the three kernels
    assert first["ops"] == "aten::add → aten::mul → aten::sum" and first["cpu_op"] == "aten::add"
    assert first["fusable"] and first["classes"] == "elementwise+elementwise+reduction"
    assert first["pct_of_kernel_time"] == pytest.approx(6 * 6 / (3 * 14) * 100, abs=1e-3)
    # 5 distinct 3-grams per step (7 kernels → 5 windows, add-mul-sum twice): 4 rows.
    assert top.height == 4 and int(top["count"].sum()) == 15
    ending = top.filter(pl.col("sequence").str.ends_with("ampere_sgemm_128x64_nn")).row(0, named=True)
    assert ending["count"] == 3 and not ending["fusable"] and ending["cpu_op"] == "aten::mul"


def test_sequences_never_cross_steps_or_streams() -> None:
    t = Trace()
    t.step(1, 0, 100, gpu_copy=False)
    t.step(2, 100, 100, gpu_copy=False)
    t.step(3, 200, 100, gpu_copy=False)
    for s in range(3):
        t.launch(100 * s, 1, 100 * s + 90, 2, name="a")  # a b on stream 7 at the end of each step
        t.launch(100 * s + 1, 1, 100 * s + 93, 2, name="b")
        t.launch(100 * s + 2, 1, 100 * s + 94, 2, name="c", stream=9)  # c on another stream
    r = _run(t, **{"kernel_sequences.min_n": 2, "kernel_sequences.max_n": 3})
    assert r.top.filter(pl.col("n") == 2)["sequence"].to_list() == ["a → b"]  # never "b → a" across steps
    assert r.top.filter(pl.col("n") == 3).is_empty()


def test_not_applicable_without_kernels() -> None:
    t = Trace()
    t.op("aten::x", 0, 10)
    res = run_analyses(t.model(), only=("kernel_sequences",))
    assert "no GPU kernels" in res.skipped["kernel_sequences"]


@pytest.mark.shared
@pytest.mark.parametrize("path", shared_params(shared_chrome_traces()))
def test_every_shared_trace(path) -> None:  # type: ignore[no-untyped-def]
    res = shared_results(path)
    r = res.values.get("kernel_sequences")
    if r is None:
        assert "kernel_sequences" in res.skipped
        return
    assert (r.top["count"] >= 1).all() and (r.top["total_ns"] >= 0).all()
    r.to_json()


def test_fusion_candidates_drop_sequences_inside_longer_ones() -> None:
    r = _run(_trace(), **{"kernel_sequences.min_n": 2, "kernel_sequences.max_n": 3})
    fus = r.fusion_candidates()
    # Every memory-bound 2-gram (add → mul, mul → sum, sum → add) lies inside a memory-bound 3-gram.
    assert fus["ops"].to_list() == ["aten::add → aten::mul → aten::sum", "aten::sum → aten::add → aten::mul",
                                    "aten::mul → aten::sum → aten::add"]
    assert set(r.top.filter(pl.col("fusable") & (pl.col("n") == 2))["ops"]) == {
        "aten::add → aten::mul", "aten::mul → aten::sum", "aten::sum → aten::add"}


def test_unfused_elementwise_cites_the_fusion_candidates() -> None:
    from conftest import rule_inputs

    from traceanalyzer.rules import run_rules

    results = run_analyses(_trace().model(), only=rule_inputs("unfused_elementwise"), strict=True)
    f = [x for x in run_rules(results).findings if x.rule_id == "unfused_elementwise"]
    assert len(f) == 1
    cands = f[0].evidence["fusion_candidates"]
    assert cands[0] == {"ops": "aten::add → aten::mul → aten::sum", "count_per_step": 2.0, "ns_per_step": 12_000.0}
    assert len(cands) == 3
