"""The work one op call does: what the efficiency analysis divides by its GPU time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes moved by one call.

    ``precision`` (``fp64``/``fp32``/``fp16``/``bf16``/``fp8``/``fp4``/``int8``) and ``unit``
    (``matrix``: tensor/matrix cores, held to the device's matrix peak of that precision;
    ``vector``: SIMT/vector units, held to the FP32 (FP64 for double) vector peak) pick the
    peak the call is compared with. ``bytes`` is the minimum traffic: every input read once,
    every output written once (caches and re-reads are not counted). ``note`` says where the
    figure is an approximation (``varlen: equal lengths``) or empty. ``bmnk``: (batch, M, N, K)
    of a matrix product (the GEMM family), what shape advice reads.
    """

    flops: float
    bytes: float
    precision: str
    unit: str
    note: str = ""
    bmnk: tuple[int, int, int, int] | None = None
