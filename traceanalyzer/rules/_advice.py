"""Vendor-aware wording shared by the timeline rules (private: kept out of rule discovery).

CUDA graphs exist on NVIDIA and, as HIP graphs behind the same PyTorch API
(``torch.cuda.CUDAGraph``, ``torch.compile(mode="reduce-overhead")``), on ROCm. Other
back-ends (Intel XPU, MTIA, CPU) get fusion advice only.
"""

from __future__ import annotations

from typing import Any, Mapping


def vendor_of(results: Mapping[str, Any]) -> str:
    """The trace's GPU vendor from the ``ops`` analysis (``"unknown"`` without it)."""
    o = results.get("ops") if hasattr(results, "get") else None
    return str(getattr(o, "vendor", None) or "unknown")


def has_graphs(vendor: str) -> bool:
    return vendor in ("nvidia", "amd")


def graphs_name(vendor: str) -> str:
    return "HIP graphs" if vendor == "amd" else "CUDA graphs"


def fewer_launches(vendor: str) -> str:
    """How to launch fewer, larger kernels on this vendor (one clause, no final period)."""
    if has_graphs(vendor):
        return (f"torch.compile (fuses small ops) or {graphs_name(vendor)} "
                "(torch.compile(mode=\"reduce-overhead\") or torch.cuda.CUDAGraph: one launch replays the step)")
    return "torch.compile (fuses small ops into fewer, larger kernels)"


def fewer_launches_hint(vendor: str) -> str:
    if has_graphs(vendor):
        return "step = torch.compile(step, mode=\"reduce-overhead\")  # fusion + graph replay"
    return "model = torch.compile(model)  # fewer, fused kernels"
