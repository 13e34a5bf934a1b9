"""FP32 matmuls/convolutions not using tensor (matrix) cores: mixed precision would speed them up.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules fp32_gemm`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, time_finding, top_rows


@rule("fp32_gemm", needs=("steps", "ops"), severity=Severity.WARNING,
      params={"min_pct_of_kernel_time": 10.0, "expected_speedup": 2.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """FP32 matmuls/convolutions not using tensor (matrix) cores: mixed precision would speed them up.

    Signal (vendor-aware; from the ``ops`` analysis)
        GEMM/conv kernels (by name class) with their precision:

        * NVIDIA: cuBLAS/cuDNN/CUTLASS names — ``sgemm``/``simt``/``scudnn`` = FP32 on SIMT
          cores (no tensor cores), ``tf32``/``tensorop_s1688`` = FP32 tensors on TF32 tensor
          cores, ``bf16``/``h884``/``16816`` … = low precision. The SIMT case needs a device with
          tensor cores (``computeMajor`` ≥ 7).
        * AMD, Intel and others: **no NVIDIA name list is applied** (tb_plugin's allowlist fires
          falsely on every MI300 trace). Only dtype tokens spelled out in the kernel name
          (``igemm_fwd_…_fp32_…``) or the input dtype of the launching op (``record_shapes``:
          ``aten::mm``/``conv`` with ``float`` inputs) count.
        * Any vendor, kernel name silent: the launching GEMM op's input dtype ``fp32``.
    Threshold
        FP32 (SIMT, or op-dtype fp32) GEMM time ≥ ``min_pct_of_kernel_time`` (10) % of kernel
        time → WARNING (tb_plugin fires when *no* kernel uses tensor cores; peers' suggested 20 %
        of GPU time — we fire earlier but price it). TF32 GEMM time ≥ the same share → INFO
        (AMP still ~2× on GEMMs).
    Cost
        GEMM time per step × (1 − 1/``expected_speedup``) with ``expected_speedup`` 2.0 (bf16
        vs TF32 is ~2×; vs SIMT FP32 much more — conservative). Confidence 0.6, 0.4 when only
        the op dtype says FP32.
    Fix
        ``torch.autocast("cuda", dtype=torch.bfloat16)`` (AMP); at least
        ``torch.set_float32_matmul_precision("high")`` (TF32) on NVIDIA; keep GEMM dims
        multiples of 8.
    """
    o = results["ops"]
    kc = o.kernel_classes
    total = float(kc["total_ns"].sum() or 0)
    gemm = kc.filter(pl.col("klass") == "gemm")
    if gemm.is_empty() or total <= 0:
        return
    n_windows = max(results["steps"].n_windows, 1)
    used = [d for d in o.devices if d.get("used")] or list(o.devices)
    majors = [d.get("compute_major") for d in used if d.get("compute_major") is not None]
    has_tc = o.vendor != "nvidia" or not majors or max(majors) >= 7
    by_name = pl.col("name_precision")
    fp32_name = (by_name == "fp32")
    fp32_op = (by_name.is_null() | (by_name == "unknown")) & (pl.col("op_dtype") == "fp32")
    groups = [
        ("fp32", gemm.filter(fp32_name), 0.6),
        ("fp32 (op dtype)", gemm.filter(fp32_op), 0.4),
        ("tf32", gemm.filter(by_name == "tf32"), 0.6),
    ]
    fp32_rows = pl.concat([groups[0][1], groups[1][1]])
    tf32_rows = groups[2][1]
    speed = max(float(params.expected_speedup), 1.0)
    fix = ("Run matmuls/convolutions in bf16/fp16 with autocast (AMP); on NVIDIA at least allow TF32 with "
           "torch.set_float32_matmul_precision('high'); keep GEMM dimensions multiples of 8.")
    hint = "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)"
    fp32_ns = float(fp32_rows["total_ns"].sum() or 0)
    if fp32_rows.height and has_tc and fp32_ns * 100.0 / total >= params.min_pct_of_kernel_time:
        conf = 0.6 if groups[0][1].height else 0.4
        what = "SIMT (no tensor cores)" if o.vendor == "nvidia" and groups[0][1].height else "FP32"
        yield time_finding(
            "fp32_gemm", Severity.WARNING,
            f"{fp32_ns * 100.0 / total:.0f} % of kernel time is {what} GEMM/conv on {o.vendor.upper()} "
            f"({ms(fp32_ns / n_windows)} ms/step)",
            {"vendor": o.vendor, "pct_of_kernel_time": round(fp32_ns * 100.0 / total, 1),
             "fp32_gemm_ms_per_step": ms(fp32_ns / n_windows), "evidence_from": "kernel names" if groups[0][1].height
             else "input dtypes of the launching ops", "compute_major": majors,
             "top_kernels": top_rows(fp32_rows.sort("total_ns", descending=True), 5,
                                     ("name", "name_precision", "op_dtype", "count", "total_ns"))},
            fix, hint, fp32_ns / n_windows * (1 - 1 / speed), results, confidence=conf,
        )
        return
    tf32_ns = float(tf32_rows["total_ns"].sum() or 0)
    if tf32_rows.height and tf32_ns * 100.0 / total >= params.min_pct_of_kernel_time:
        yield time_finding(
            "fp32_gemm", Severity.INFO,
            f"{tf32_ns * 100.0 / total:.0f} % of kernel time is TF32 GEMM/conv (fp32 tensors): bf16 autocast "
            f"would roughly halve it ({ms(tf32_ns / n_windows)} ms/step)",
            {"vendor": o.vendor, "pct_of_kernel_time": round(tf32_ns * 100.0 / total, 1),
             "tf32_gemm_ms_per_step": ms(tf32_ns / n_windows),
             "top_kernels": top_rows(tf32_rows.sort("total_ns", descending=True), 5,
                                     ("name", "name_precision", "op_dtype", "count", "total_ns"))},
            fix, hint, tf32_ns / n_windows * (1 - 1 / speed), results, confidence=0.6,
        )
