"""FP32 matmuls/convolutions not using tensor (matrix) cores: mixed precision would speed them up.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules fp32_gemm`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of
from traceanalyzer.rules._util import ms, n_steady, time_finding, top_rows


@rule("fp32_gemm", needs=("steps", "ops", "kernels"), severity=Severity.WARNING,
      params={"min_pct_of_kernel_time": 10.0, "expected_speedup": 2.0}, uses=("context",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """FP32 matmuls/convolutions not using tensor (matrix) cores: mixed precision would speed them up.

    Signal (vendor-aware; from the ``ops`` analysis, kernels of the steady steps)
        GEMM/conv kernels (by name class) with their precision:

        * NVIDIA: cuBLAS/cuDNN/CUTLASS names — ``sgemm``/``simt``/``scudnn`` = FP32 on SIMT
          cores (no tensor cores), ``tf32``/``tensorop_s1688`` = FP32 tensors on TF32 tensor
          cores, ``bf16``/``h884``/``16816`` … = low precision. The SIMT case needs a device with
          tensor cores (``computeMajor`` ≥ 7; unknown counts as yes).
        * AMD, Intel and others: **no NVIDIA name list is applied** (tb_plugin's allowlist fires
          falsely on every MI300 trace). Only dtype tokens spelled out in the kernel name
          (``igemm_fwd_…_fp32_…``) or the input dtype of the launching op count.
        * Any vendor, kernel name silent: the input dtype of the innermost GEMM/conv op around
          the launch (``record_shapes``: ``aten::mm``/``addmm``/``convolution`` … with ``float``
          inputs; innermost, so autocast's bf16 ``addmm`` under an fp32 ``linear`` reads bf16).
    Threshold
        FP32 (SIMT, or op-dtype fp32) GEMM time ≥ ``min_pct_of_kernel_time`` (10) % of kernel
        time → WARNING (tb_plugin fires when *no* kernel uses tensor cores; peers' suggested 20 %
        of GPU time — we fire earlier but price it). Otherwise TF32 GEMM time ≥ the same share
        → INFO (AMP still ~2× on GEMMs). When GEMMs of unknown precision reach that share and
        nothing else decides, the rule cannot run and says why (profile with
        ``record_shapes=True``).
    Cost
        That GEMM time per steady step × (1 − 1/``expected_speedup``) with ``expected_speedup``
        2.0 (bf16 vs TF32 is ~2×; vs SIMT FP32 much more — conservative). Confidence 0.6 from
        kernel names, 0.4 when only the op dtype says FP32.
    Fix
        ``torch.autocast("cuda", dtype=torch.bfloat16)`` (AMP); at least
        ``torch.set_float32_matmul_precision("high")`` (TF32) on NVIDIA; keep GEMM dims
        multiples of 8. On pre-Ampere NVIDIA devices (Volta, Turing: ``context.device_arch``, else
        ``computeMajor`` < 8) neither bf16 nor TF32 exists: the fix is fp16 autocast with a
        GradScaler, and says why.
    """
    o = results.need("ops", OpsResult)
    kc = o.kernel_classes
    total = float(kc["steady_ns"].sum() or 0)
    gemm = kc.filter((pl.col("klass") == "gemm") & (pl.col("steady_ns") > 0))
    if gemm.is_empty() or total <= 0:
        return
    n = n_steady(results)
    used = [d for d in o.devices if d.get("used")] or list(o.devices)
    majors = sorted({d["compute_major"] for d in used if d.get("compute_major") is not None})
    has_tc = o.vendor != "nvidia" or not majors or max(majors) >= 7
    by_name = pl.col("name_precision")
    silent_name = by_name.is_null() | (by_name == "unknown")
    fp32_by_name = gemm.filter(by_name == "fp32")
    fp32_by_op = gemm.filter(silent_name & (pl.col("op_dtype") == "fp32"))
    fp32_rows = pl.concat([fp32_by_name, fp32_by_op])
    tf32_rows = gemm.filter(by_name == "tf32")
    unknown_rows = gemm.filter(silent_name & pl.col("op_dtype").is_null())
    speed = max(float(params.expected_speedup), 1.0)
    cols = ("name", "name_precision", "op_dtype", "steady_count", "steady_ns")
    ctx = context_of(results)
    arch = ctx.device_arch if ctx is not None else None
    # No bf16 and no TF32 on pre-Ampere NVIDIA tensor cores (Volta, Turing: fp16 only).
    old_nv = o.vendor == "nvidia" and (arch in ("volta", "turing", "pascal", "older") or (
        arch is None and bool(majors) and max(majors) < 8))
    if old_nv:
        dev = ((ctx.device_name if ctx is not None else None) or "this device") + (f" ({arch})" if arch else "")
        fix = (f"Run matmuls/convolutions in fp16 with autocast and a GradScaler: the tensor cores of {dev} take "
               "fp16 only (bf16 and TF32 need Ampere or newer, so neither applies here); keep GEMM dimensions "
               "multiples of 8.")
        hint = ("scaler = torch.cuda.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                "    loss = model(x)\nscaler.scale(loss).backward()")
    else:
        fix = ("Run matmuls/convolutions in bf16/fp16 with autocast (AMP); on NVIDIA at least allow TF32 with "
               "torch.set_float32_matmul_precision('high'); keep GEMM dimensions multiples of 8.")
        hint = "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)"
    fp32_ns = float(fp32_rows["steady_ns"].sum() or 0)
    fp32_pct = fp32_ns * 100.0 / total
    if fp32_rows.height and has_tc and fp32_pct >= params.min_pct_of_kernel_time:
        from_names = fp32_by_name.height > 0
        what = "SIMT FP32 (no tensor cores)" if o.vendor == "nvidia" and from_names else "FP32"
        yield time_finding(
            "fp32_gemm", Severity.WARNING,
            f"{fp32_pct:.0f} % of kernel time is {what} GEMM/conv on {o.vendor.upper()} "
            f"({ms(fp32_ns / n)} ms/step)",
            {"vendor": o.vendor, "pct_of_kernel_time": round(fp32_pct, 1),
             "fp32_gemm_ms_per_step": ms(fp32_ns / n),
             "evidence_from": "kernel names" if from_names else "input dtypes of the launching ops",
             "compute_major": majors, "device_arch": arch,
             "top_kernels": top_rows(fp32_rows.sort("steady_ns", descending=True), 5, cols)},
            fix, hint, fp32_ns / n * (1 - 1 / speed), results, confidence=0.6 if from_names else 0.4,
        )
        return
    tf32_ns = float(tf32_rows["steady_ns"].sum() or 0)
    tf32_pct = tf32_ns * 100.0 / total
    if tf32_rows.height and tf32_pct >= params.min_pct_of_kernel_time:
        yield time_finding(
            "fp32_gemm", Severity.INFO,
            f"{tf32_pct:.0f} % of kernel time is TF32 GEMM/conv (fp32 tensors): bf16 autocast "
            f"would roughly halve it ({ms(tf32_ns / n)} ms/step)",
            {"vendor": o.vendor, "pct_of_kernel_time": round(tf32_pct, 1),
             "tf32_gemm_ms_per_step": ms(tf32_ns / n),
             "top_kernels": top_rows(tf32_rows.sort("steady_ns", descending=True), 5, cols)},
            fix, hint, tf32_ns / n * (1 - 1 / speed), results, confidence=0.6,
        )
        return
    unknown_pct = float(unknown_rows["steady_ns"].sum() or 0) * 100.0 / total
    if unknown_pct >= params.min_pct_of_kernel_time:
        raise NotApplicable(
            f"{unknown_pct:.0f} % of kernel time is GEMM/conv whose precision the trace does not say "
            f"({o.vendor} kernel names carry no dtype and no op input types): profile with record_shapes=True")
