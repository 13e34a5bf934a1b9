"""ops analysis: hand-built traces with known counts and durations (times in µs, results in ns)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from support.events import launch
from support.events import x as _x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.ops import gemm_name_precision
from traceanalyzer.load.chrome_trace import build_model

A100 = {"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 85_000_000_000, "computeMajor": 8, "warpSize": 32}


def _kernel(ts: float, dur: float, corr: int, name: str = "k", api: str = "cudaLaunchKernel") -> list[dict[str, Any]]:
    """A launch at ``ts`` (3 µs) and its kernel starting 5 µs later on stream 7."""
    return launch(corr, ts, 3, ts + 5, dur, name, api=api)


def _memset(ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    return launch(corr, ts, 3, ts + 5, dur, "Memset (Device)", api="cudaMemsetAsync", cat="gpu_memset", bytes=1024)


def _step(n: int, ts: float, dur: float = 1000) -> dict[str, Any]:
    return _x("user_annotation", f"ProfilerStep#{n}", ts, dur)


def _ops(events: list[dict[str, Any]], props: list[dict[str, Any]] | None = None, **top: Any) -> Any:
    model = build_model(Path("x.json"), {"schemaVersion": 1, "traceEvents": events,
                                         "deviceProperties": props if props is not None else [A100], **top})
    r = run_analyses(model, only=("ops",), strict=True)
    return r["ops"]


def test_dataloader_union_per_window_and_iterator_names() -> None:
    # GIVEN two steps: step 1 holds two overlapping DataLoader ranges [10, 40) and [30, 60) µs
    # (union 50 µs), step 2 one range of 20 µs (a single-process iterator)
    ev = [_step(1, 0), _step(2, 1000)]
    ev += [_x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 10, 30),
           _x("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 30, 30),
           _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1100, 20)]
    ev += _kernel(200, 10, 1) + _kernel(1200, 10, 2)
    o = _ops(ev)
    # THEN the union per window, not the sum (60 µs) of step 1's ranges
    assert o.dataloader.select("step", "dataloader_ns", "dur_ns").rows() == [(1, 50_000, 1_000_000),
                                                                             (2, 20_000, 1_000_000)]
    assert o.dataloader_iters == ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                                  "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")


def _opt_trace(inside: list[str], outside: list[str] = (), name: str = "AdamW") -> list[dict[str, Any]]:
    """One step with an Optimizer.step range [100, 400) µs holding the ``inside`` ops and 4 kernels;
    ``outside`` ops run before it (SDPA choice, grad clipping)."""
    ev = [_step(1, 0), _x("user_annotation", f"Optimizer.step#{name}.step", 100, 300)]
    ev += [_x("cpu_op", n, 20 + 10 * i, 5) for i, n in enumerate(outside)]
    ev += [_x("cpu_op", n, 110 + 10 * i, 5) for i, n in enumerate(inside)]
    for i in range(4):
        ev += _kernel(200 + 40 * i, 6, 10 + i)
    return ev


@pytest.mark.parametrize(
    ("inside", "outside", "impl"),
    [
        (["aten::add_", "aten::mul_"], [], "for-loop"),
        (["aten::_foreach_add_", "aten::_foreach_mul_"], [], "foreach"),
        (["aten::_fused_adamw_"], [], "fused"),
        # SDPA's _fused_sdp_choice and foreach grad clipping outside the optimizer say nothing
        (["aten::add_"], ["aten::_fused_sdp_choice", "aten::_foreach_norm"], "for-loop"),
    ],
)
def test_optimizer_impl(inside: list[str], outside: list[str], impl: str) -> None:
    o = _ops(_opt_trace(inside, outside))
    assert o.optimizer_impl == impl and o.optimizer_names == ("AdamW",)


def test_optimizer_per_window_and_zero_grad_fills() -> None:
    # GIVEN a step: Optimizer.step range [100, 400) µs launching 4 kernels of 6 µs, a
    # zero_grad range [500, 560) launching 2 memsets of 4 µs and one fill kernel of 3 µs
    ev = _opt_trace(["aten::add_"])
    ev.append(_x("user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", 500, 60))
    ev += _memset(510, 4, 30) + _memset(520, 4, 31)
    ev += _kernel(530, 3, 32, name="void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >("
                                   ")")
    o = _ops(ev)
    row = o.optimizer.row(0, named=True)
    assert (row["opt_ns"], row["opt_kernels"], row["opt_gpu_ns"]) == (300_000, 4, 24_000)
    assert (row["zero_grad_ns"], row["zero_grad_kernels"], row["zero_grad_fills"], row["zero_grad_gpu_ns"]) == (
        60_000, 3, 3, 11_000)


def test_no_optimizer_is_unknown() -> None:
    ev = [_step(1, 0)] + _kernel(10, 5, 1)
    o = _ops(ev)
    assert o.optimizer_impl == "unknown" and o.optimizer_names == ()
    assert o.optimizer.row(0, named=True)["opt_kernels"] == 0


def test_kernel_classes_counts_and_steady_share() -> None:
    # GIVEN 4 steps; step 1 is warm-up (3000 µs vs 1000 µs); each step runs an sgemm of 100 µs,
    # two elementwise kernels of 10 µs and an NCHW->NHWC transpose of 7 µs; step 1 runs one more sgemm
    ev = [_step(1, 0, 3000), _step(2, 3000), _step(3, 4000), _step(4, 5000)]
    corr = 0
    for t0 in (0, 3000, 4000, 5000):
        for name, dur in (
            ("ampere_sgemm_128x64_nn", 100),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >()", 10),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >()", 10),
            ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>()", 7),
        ):
            corr += 1
            ev += _kernel(t0 + 10 * corr % 600 + 10, dur, corr, name=name)
    corr += 1
    ev += _kernel(2500, 100, corr, name="ampere_sgemm_128x64_nn")
    o = _ops(ev)
    kc = {r["name"]: r for r in o.kernel_classes.to_dicts()}
    sg = kc["ampere_sgemm_128x64_nn"]
    assert (sg["klass"], sg["name_precision"], sg["count"], sg["total_ns"]) == ("gemm", "fp32", 5, 500_000)
    # steady = steps 2..4 (step 1 is warm-up): 3 sgemms
    assert (sg["steady_count"], sg["steady_ns"]) == (3, 300_000)
    ew = kc["at::native::vectorized_elementwise_kernel"]
    assert (ew["klass"], ew["name_precision"], ew["count"], ew["total_ns"], ew["steady_ns"]) == (
        "elementwise", None, 8, 80_000, 60_000)
    tr = kc["cudnn::ops::nchwToNhwcKernel"]
    assert (tr["klass"], tr["count"], tr["total_ns"]) == ("layout_transpose", 4, 28_000)
    assert any(k == "Kernel time by class" for k, _ in o.summary())
    json.dumps(o.to_json())


def _prec(names: list[str], vendor: str) -> list[str]:
    return pl.DataFrame({"n": names}).select(gemm_name_precision(pl.col("n"), vendor).alias("p"))["p"].to_list()


def test_gemm_precision_by_vendor() -> None:
    names = ["ampere_sgemm_128x64_nn", "cutlass_80_tensorop_s1688gemm_tf32_128x128_16x4_nn",
             "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32", "volta_h884gemm_64x64_nn",
             "igemm_fwd_gtcx_nchw_fp32_bx0_ex1", "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_SN_sgemm_simt"]
    assert _prec(names, "nvidia") == ["fp32", "tf32", "low", "low", "fp32", "fp32"]
    # AMD/Intel: no NVIDIA token list ('sgemm', 'simt', 'h884', 'tensorop'): only spelled-out dtypes
    assert _prec(names, "amd") == ["unknown", "unknown", "low", "unknown", "fp32", "unknown"]
    assert _prec(names, "xpu") == _prec(names, "amd")


def test_gemm_op_dtype_is_innermost_op() -> None:
    # GIVEN record_shapes ops: aten::linear (float inputs, autocast) > aten::addmm (bf16) launching a
    # GEMM, and a plain aten::mm on float launching another
    ev = [_step(1, 0),
          _x("cpu_op", "aten::linear", 10, 100, **{"Input type": ["float", "float", "float"]}),
          _x("cpu_op", "aten::addmm", 30, 60, **{"Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]}),
          _x("cpu_op", "aten::mm", 200, 50, **{"Input type": ["float", "float"]})]
    ev += _kernel(40, 20, 1, name="Cijk_Ailk_Bljk_BBS_BH_MT128x128x32", api="hipExtModuleLaunchKernel")
    ev += _kernel(210, 20, 2, name="Cijk_Ailk_Bljk_SB_MT64x64x16", api="hipExtModuleLaunchKernel")
    o = _ops(ev, props=[], roctracer_version=4)
    assert o.vendor == "amd"
    kc = {r["name"]: r for r in o.kernel_classes.to_dicts()}
    assert kc["Cijk_Ailk_Bljk_BBS_BH_MT128x128x32"]["op_dtype"] == "bf16"
    assert kc["Cijk_Ailk_Bljk_SB_MT64x64x16"]["op_dtype"] == "fp32"
    assert {r["name_precision"] for r in kc.values()} == {"unknown"}


def test_compiled_graphs_and_data_parallel() -> None:
    # GIVEN a compiled region, a triton kernel, 2 CUDA graph launches, DataParallel twice as an
    # op and once as a module frame, and one DistributedDataParallel.forward (not DataParallel)
    ev = [_step(1, 0), _x("user_annotation", "Torch-Compiled Region: 0/0", 5, 100),
          _x("cpu_op", "DataParallel.forward", 200, 10), _x("cpu_op", "DataParallel.forward", 300, 10),
          _x("python_function", "nn.Module: DataParallel_0", 400, 10),
          _x("cpu_op", "DistributedDataParallel.forward", 500, 10)]
    ev += _kernel(10, 5, 1, name="triton_poi_fused_add_0")
    ev += _kernel(600, 5, 2, api="cudaGraphLaunch") + _kernel(700, 5, 3, api="cudaGraphLaunch")
    o = _ops(ev)
    assert o.compiled and o.graph_launches == 2 and o.data_parallel == 3
    counts = {(r["name"], r["source"]): r["count"] for r in o.op_counts.to_dicts()}
    assert counts[("DataParallel.forward", "cpu_op")] == 2
    # and an eager trace is not compiled
    o2 = _ops([_step(1, 0)] + _kernel(10, 5, 1))
    assert not o2.compiled and o2.graph_launches == 0 and o2.data_parallel == 0


def test_devices_used_and_profiler_flags() -> None:
    ev = [_step(1, 0)] + _kernel(10, 5, 1)
    idle = dict(A100, id=1)
    o = _ops(ev, props=[A100, idle], record_shapes=1, with_stack=0)
    assert [(d["id"], d["used"], d["compute_major"]) for d in o.devices] == [(0, True, 8), (1, False, 8)]
    assert o.device(1)["total_bytes"] == 85_000_000_000
    assert o.profiler_flags.get("record_shapes") is True and not o.profiler_flags.get("with_stack")
    assert o.event_counts["kernels"] == 1 and o.event_counts["runtime"] == 1
