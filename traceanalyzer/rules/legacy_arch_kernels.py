"""Kernels built for an older GPU generation run on a newer device: an old library or a fallback path.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules legacy_arch_kernels`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, time_finding

#: compute capability of each NVIDIA device architecture (the device side of the comparison).
_DEVICE_CC = {"volta": 7.0, "turing": 7.5, "ampere": 8.0, "ada": 8.9, "hopper": 9.0, "blackwell": 10.0}


def legacy(family_cc: float, device_cc: float) -> bool:
    """An older family that a current library would not pick on this device: pre-Ampere families
    (major ≤ 7: no bf16 tensor-core shapes, no async copies) on any newer device, and any family
    two or more major generations behind (``sm80`` kernels on Blackwell). Ampere-family kernels on
    Hopper are left alone: cuBLAS/CUTLASS ship them as the portable baseline and pick them for
    small shapes on purpose."""
    if family_cc >= device_cc:
        return False
    return int(family_cc) <= 7 or int(device_cc) - int(family_cc) >= 2


@rule("legacy_arch_kernels", needs=("steps", "context"), severity=Severity.INFO,
      params={"min_pct_of_kernel_time": 1.0, "warning_pct": 10.0, "expected_savings": 0.5}, uses=("kernels",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Kernels built for an older GPU generation run on a newer device: an old library or a fallback path.

    Signal
        ``context``: the device's architecture (``deviceProperties`` compute capability or name)
        and the kernels per architecture family by name — ``volta_``/``sm70_`` (7.0),
        ``turing_``/``sm75_``/``cutlass_75_`` (7.5), ``ampere_``/``sm80_``/``cutlass_80_`` (8.0),
        ``sm90_``/``wgmma`` (9.0) … A family is *legacy* on the device when it is pre-Ampere
        (major ≤ 7) and older than the device, or two or more major generations behind it
        (Ampere kernels on Hopper are what cuBLAS/CUTLASS pick for small shapes: not flagged).
        NVIDIA only (AMD kernel names carry no comparable family). Not run when the device's
        architecture is not known from its properties or name (the kernel names alone cannot
        say which device they ran on).
    Threshold
        legacy kernels ≥ ``min_pct_of_kernel_time`` (1) % of the trace's kernel time → INFO;
        WARNING from ``warning_pct`` (10) %.
    Cost
        ``expected_savings`` (0.5) × their GPU time per steady step (their share of the trace's
        kernel time × the steady steps' kernel time per step): a kernel for the
        device's own generation runs the same math on its newer tensor-core instructions
        (``mma`` m16n8k16 instead of m16n8k8 on Ampere+, ``wgmma`` on Hopper), typically ≥ 2×
        on GEMMs. Confidence 0.3: the speed-up depends on the shape, and the library may have
        chosen the kernel for a reason.
    Fix
        Upgrade PyTorch / CUDA / cuBLAS / cuDNN (an old build may lack kernels for this
        device), check that the extension that launches them was compiled for this
        architecture (``TORCH_CUDA_ARCH_LIST`` includes it), keep GEMM dimensions multiples
        of 8/16 so the library's fast kernels apply.
    """
    ctx = results.need("context", ContextResult)
    if ctx.vendor != "nvidia":
        raise NotApplicable(f"architecture families are read from NVIDIA kernel names; this trace is {ctx.vendor}")
    if ctx.arch_source not in ("device_properties", "device_name") or ctx.device_arch not in _DEVICE_CC:
        raise NotApplicable("the device's architecture is unknown (no deviceProperties / known device name): "
                            "kernel families cannot be compared with it")
    dev_cc = _DEVICE_CC[ctx.device_arch]
    fams = list(ctx.kernel_families)
    old = [f for f in fams if legacy(float(f["compute_capability"]), dev_cc)]
    if not old:
        return
    old_ns = float(sum(f["gpu_ns"] for f in old))
    k = results.typed("kernels", KernelsResult)
    trace_ns = float((k.total_ns if k is not None else 0) or 0) or float(sum(f["gpu_ns"] for f in fams))
    pct = old_ns * 100.0 / trace_ns if trace_ns else 0.0
    if pct < params.min_pct_of_kernel_time:
        return
    # Families are counted over the whole trace: their share of it, applied to the steady
    # steps' kernel time per step.
    steady_kernel_ns = ctx.steady_kernel_ns_per_step
    per_step = pct / 100.0 * steady_kernel_ns
    names = ", ".join(f"{f['family']} ({f['kernels']:,} kernels, {ms(f['gpu_ns'])} ms)" for f in old)
    yield time_finding(
        "legacy_arch_kernels", Severity.WARNING if pct >= params.warning_pct else Severity.INFO,
        f"{pct:.1f} % of kernel time runs {'/'.join(f['family'] for f in old)}-generation kernels on a "
        f"{ctx.device_arch} device ({ctx.device_name or 'unnamed'})",
        {"device_name": ctx.device_name, "device_arch": ctx.device_arch, "compute_capability": ctx.compute_capability,
         "legacy_families": old, "legacy_ms_per_step": ms(per_step), "legacy_ms_in_trace": ms(old_ns),
         "pct_of_kernel_time": round(pct, 2),
         "all_families": fams, "expected_savings": params.expected_savings},
        f"Kernels of an older generation ({names}) run on this {ctx.device_arch} GPU: an old PyTorch/CUDA/cuBLAS/"
        "cuDNN build, an extension compiled without this architecture, or a fallback path for odd shapes or "
        "layouts. Upgrade the libraries, build extensions with this architecture in TORCH_CUDA_ARCH_LIST, keep "
        "GEMM dimensions multiples of 8/16.",
        "python -c \"import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_arch_list())\"",
        params.expected_savings * per_step, results, confidence=0.3,
    )
