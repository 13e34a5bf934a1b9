"""Matrix multiplications: ``aten::mm``/``addmm``/``bmm``/``baddbmm``/``_scaled_mm``/``_int_mm``.

FLOPs = 2·M·N·K per product (one multiply and one add per term), × B for batched products.
The bias/``beta·C`` term of ``addmm``/``baddbmm`` (M·N adds) is not counted, as PyTorch's
``torch.utils.flop_counter`` and the profiler's ``with_flops`` do not count it.
Bytes = A + B read + C read (addmm/baddbmm) + the output written once, each at its dtype
(the output at A's dtype; ``_scaled_mm`` at ``out_dtype``, bf16 when not given; ``_int_mm``
int32).

``aten::linear`` and ``aten::matmul`` have no model on purpose: they are wrappers whose
kernels come from the ``mm``/``addmm``/``bmm`` inside them (under autocast the wrapper even
records the fp32 inputs it casts before the product), so the leaf carries the work.
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import SCALAR_TYPE_BYTES, OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "gemm"


def _mnk(a: tuple[int, ...], b: tuple[int, ...], batched: bool) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of A @ B, or None when the shapes do not multiply."""
    if batched:
        if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
            return None
        return a[0], a[1], b[2], a[2]
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 1, a[0], b[1], a[1]


def _product(x: OpArgs, ia: int, ib: int, batched: bool, c: int | None = None, out_bytes: float | None = None
             ) -> Work | None:
    a, b = x.shape(ia), x.shape(ib)
    prec = x.precision(ia)
    if a is None or b is None or prec is None:
        return None
    dims = _mnk(a, b, batched)
    if dims is None:
        return None
    bt, m, n, k = dims
    ob = x.itemsize(ia) if out_bytes is None else out_bytes
    moved = x.nbytes(ia) + x.nbytes(ib) + bt * m * n * ob + (x.nbytes(c) if c is not None else 0.0)
    return Work(2.0 * bt * m * n * k, moved, prec, "matrix", bmnk=dims)


def mm(x: OpArgs) -> Work | None:
    """``mm(A[M,K], B[K,N])``: 2MNK."""
    return _product(x, 0, 1, False)


def addmm(x: OpArgs) -> Work | None:
    """``addmm(C, A[M,K], B[K,N])``: 2MNK (bias add not counted); C read."""
    return _product(x, 1, 2, False, c=0)


def bmm(x: OpArgs) -> Work | None:
    """``bmm(A[B,M,K], B[B,K,N])``: 2BMNK."""
    return _product(x, 0, 1, True)


def baddbmm(x: OpArgs) -> Work | None:
    """``baddbmm(C, A[B,M,K], B[B,K,N])``: 2BMNK; C read."""
    return _product(x, 1, 2, True, c=0)


def scaled_mm(x: OpArgs) -> Work | None:
    """``_scaled_mm(A[M,K], B[K,N], scale_a, scale_b, bias, scale_result, out_dtype, …)``: 2MNK at
    A's precision (fp8); output at ``out_dtype`` (Concrete Inputs[6], a dtype code), else bf16."""
    code = x.int(6)
    out = SCALAR_TYPE_BYTES.get(code, 2.0) if code is not None else 2.0
    w = _product(x, 0, 1, False, out_bytes=out)
    if w is None:
        return None
    extra = sum(x.nbytes(i) for i in (2, 3, 4))  # scales and bias
    return Work(w.flops, w.bytes + extra, w.precision, w.unit, bmnk=w.bmnk)


def int_mm(x: OpArgs) -> Work | None:
    """``_int_mm(A[M,K] int8, B[K,N] int8)``: 2MNK, int32 output."""
    return _product(x, 0, 1, False, out_bytes=4.0)


MODELS = {
    "aten::mm": mm, "aten::addmm": addmm, "aten::bmm": bmm, "aten::baddbmm": baddbmm,
    "aten::_scaled_mm": scaled_mm, "aten::_int_mm": int_mm,
}

__all__ = ["FAMILY", "MODELS", "numel"]
