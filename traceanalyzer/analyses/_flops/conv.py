"""Convolutions: ``aten::convolution`` (plain, strided, dilated, grouped, depthwise, transposed)
and ``aten::convolution_backward``.

``convolution(x[N,C_in,*S], w, bias, stride, padding, dilation, transposed, output_padding,
groups)``; ``w`` is ``[C_out, C_in/g, *k]`` (``[C_in, C_out/g, *k]`` when transposed), so the
groups are already in ∏w. Output size per spatial dim:
⌊(i + 2p − d(k−1) − 1)/s⌋ + 1, transposed (i−1)s − 2p + d(k−1) + output_padding + 1.

FLOPs = 2·N·∏(out spatial)·∏w, transposed 2·N·∏(in spatial)·∏w (each input element meets
C_out/g·∏k weights); the bias add is not counted (as ``torch.utils.flop_counter``). Bytes = x
+ w + bias read, output written. Backward: dX and dW cost one forward each (counted per
``output_mask``); reads grad_out, x, w, writes the grads asked for.

Only ``aten::convolution`` carries the model: ``conv1d/2d/3d`` wrap it and the backend calls
under it (``cudnn_convolution``, ``miopen_convolution`` …) order their arguments differently.
"""

from __future__ import annotations

import math

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "conv"


def _per_dim(v: tuple[int, ...] | None, n: int, default: int) -> tuple[int, ...] | None:
    if v is None:
        return (default,) * n
    if len(v) == 1:
        return v * n
    return v if len(v) == n else None


def _geometry(x: OpArgs, ix: int, iw: int, first: int) -> tuple[float, float, tuple[int, ...], str] | None:
    """(forward FLOPs, output numel, output shape, precision) from the inputs at ``ix``/``iw`` and the
    concrete arguments from index ``first`` (stride, padding, dilation, transposed, output_padding, groups)."""
    xs, ws = x.shape(ix), x.shape(iw)
    prec = x.precision(ix)
    if xs is None or ws is None or prec is None or len(xs) < 3 or len(ws) != len(xs):
        return None
    nsp = len(xs) - 2
    stride = _per_dim(x.ints(first), nsp, 1)
    pad = _per_dim(x.ints(first + 1), nsp, 0)
    dil = _per_dim(x.ints(first + 2), nsp, 1)
    transposed = bool(x.flag(first + 3))
    opad = _per_dim(x.ints(first + 4), nsp, 0)
    groups = x.int(first + 5) or 1
    if stride is None or pad is None or dil is None or opad is None or min(stride) < 1:
        return None
    ins, ks = xs[2:], ws[2:]
    if transposed:
        out_sp = tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1
                       for i, s, p, d, k, o in zip(ins, stride, pad, dil, ks, opad, strict=True))
        c_out = ws[1] * groups
        flops = 2.0 * xs[0] * numel(ins) * numel(ws)
    else:
        out_sp = tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(ins, stride, pad, dil, ks,
                                                                                        strict=True))
        c_out = ws[0]
        flops = 2.0 * xs[0] * numel(out_sp) * numel(ws)
    if min(out_sp) < 1:
        return None
    out = (xs[0], c_out, *out_sp)
    return flops, float(math.prod(out)), out, prec


def convolution(x: OpArgs) -> Work | None:
    """Forward: 2·N·∏out·∏w (transposed: ∏in for ∏out)."""
    g = _geometry(x, 0, 1, 3)
    if g is None:
        return None
    flops, out_n, _, prec = g
    moved = x.nbytes(0) + x.nbytes(1) + x.nbytes(2) + out_n * x.itemsize(0)
    return Work(flops, moved, prec, "matrix")


def convolution_backward(x: OpArgs) -> Work | None:
    """``convolution_backward(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)``: one forward's FLOPs per grad asked (dX, dW)."""
    g = _geometry(x, 1, 2, 4)
    if g is None:
        return None
    flops, _, _, prec = g
    mask = x.text(10).lower()
    parts = [p.strip() for p in mask.strip("[]").split(",")] if mask else []
    want_dx = parts[0] == "true" if len(parts) >= 1 else True
    want_dw = parts[1] == "true" if len(parts) >= 2 else True
    moved = x.nbytes(0) + x.nbytes(1) + x.nbytes(2) + want_dx * x.nbytes(1) + want_dw * x.nbytes(2)
    return Work(flops * (int(want_dx) + int(want_dw)), moved, prec, "matrix")


MODELS = {"aten::convolution": convolution, "aten::convolution_backward": convolution_backward}
