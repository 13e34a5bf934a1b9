"""Kernel statistics, name normalisation, per step / per launching op, short kernels."""

from __future__ import annotations

import pytest
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._kernels import normalize_kernel_name

EW = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
      "at::native::FillFunctor<float>, std::array<char*, 1ul>)")
EW2 = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >("
       "int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")


@pytest.mark.parametrize(
    ("full", "short"),
    [
        (EW, "at::native::vectorized_elementwise_kernel"),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::("
            "anonymous "
            "namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
            "at::native::cunn_SoftMaxForward",
        ),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
        ("volta_sgemm_128x64_tn", "volta_sgemm_128x64_tn"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>("
            "cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
            "cutlass::Kernel",
        ),
    ],
)
def test_normalize_kernel_name(full, short):
    assert normalize_kernel_name(full) == short


def _scenario() -> Trace:
    t = Trace()
    t.step(1, 0, 100)
    t.op("aten::fill_", 0, 20)
    t.launch(1, 5, 10, 2, name=EW)
    t.launch(8, 5, 20, 4, name=EW)
    t.op("aten::mm", 30, 20)
    t.launch(31, 5, 40, 50, name="volta_sgemm_128x64_tn")
    t.step(2, 100, 100)
    t.op("aten::add", 100, 10)
    t.launch(101, 5, 110, 30, name=EW2)
    t.launch(120, 5, 150, 8, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", stream=9)
    return t


def test_kernel_stats_per_name_step_and_op():
    r = run_analyses(_scenario().model(), only=("kernels",), strict=True)["kernels"]
    assert r.n_kernels == 5 and r.total_ns == ns(94)
    bn = {row["name"]: row for row in r.by_name.iter_rows(named=True)}
    ew = bn["at::native::vectorized_elementwise_kernel"]
    assert (ew["count"], ew["total_ns"], ew["n_variants"], ew["min_ns"], ew["max_ns"]) == (3, ns(36), 2, ns(2), ns(30))
    assert ew["median_ns"] == ns(4)
    assert bn["volta_sgemm_128x64_tn"]["pct_of_kernel_time"] == pytest.approx(50 / 94 * 100, abs=1e-3)
    assert bn["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["is_comm"]
    assert r.by_name["name"][0] == "volta_sgemm_128x64_tn"  # sorted by total time
    assert r.per_step["n_kernels"].to_list() == [3, 2]
    assert r.per_step["n_short"].to_list() == [2, 1]
    ops = {row["cpu_op"]: (row["n_kernels"], row["kernel_ns"]) for row in r.by_cpu_op.iter_rows(named=True)}
    assert ops == {"aten::mm": (1, ns(50)), "aten::add": (1, ns(30)), "aten::fill_": (2, ns(6)),
                   "<no launching CPU op>": (1, ns(8))}
    assert (r.n_short, r.short_total_ns) == (3, ns(14))
    h = {row["bin"]: row["count"] for row in r.short_histogram.iter_rows(named=True)}
    assert h["2 µs – 5 µs"] == 2 and h["5 µs – 10 µs"] == 1 and h["20 µs – 50 µs"] == 1 and h["50 µs – 100 µs"] == 1
    assert r.to_json()["duration_ns"]["count"] == 5


def test_on_distinct_equals_row_by_row_and_skips_all_null_keys():
    import polars as pl

    from traceanalyzer.analyses._kernels import normalize_kernel_names, on_distinct

    df = pl.DataFrame({"name": ["void k<1>(int)", "void k<2>(float)", "gemm", "void k<1>(int)", None],
                       "comm_name": [None, None, None, None, None], "x": [1, 2, 3, 4, 5]},
                      schema={"name": pl.String, "comm_name": pl.String, "x": pl.Int64})
    expr = {"norm": normalize_kernel_names(pl.col("name")), "has": pl.col("comm_name").is_not_null()}
    got = on_distinct(df, ["name", "comm_name"], **expr)
    assert got.equals(df.with_columns(**expr))
    assert got["norm"].to_list() == ["k", "k", "gemm", "k", None]
    with_comm = df.with_columns(comm_name=pl.Series(["allreduce", None, None, None, None]))
    assert on_distinct(with_comm, ["name", "comm_name"], **expr)["has"].to_list() == [True, False, False, False, False]
