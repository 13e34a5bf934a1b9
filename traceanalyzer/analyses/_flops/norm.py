"""Normalisations: layer, RMS, group, batch and instance norm, forward and backward.

Memory-bound: the bytes are the figure that matters; FLOPs are a per-element count.
E = elements of the input, C = elements of the affine parameters (``normalized_shape`` for
layer/RMS norm, channels for group/batch norm), b = the input's bytes per element.

* Forward: bytes = E·b read + E·b written + the affine parameters read (C·b each);
  FLOPs = 5·E (mean, centre, square-sum, scale) + 2·E when affine (RMS norm: 3·E + E).
* Backward: bytes = grad_out and input read (2·E·b) + grad_input written (E·b) + the
  parameters read and their grads written (2·C·b each); FLOPs = 8·E.

Statistics (mean, rstd: one fp32 per row) are left out: they are a small fraction of E.
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "norm"


def _forward(x: OpArgs, params: tuple[int, ...], rms: bool = False) -> Work | None:
    s = x.shape(0)
    prec = x.precision(0)
    if s is None or prec is None:
        return None
    e = float(numel(s))
    p = sum(x.nbytes(i) for i in params)
    affine = p > 0
    flops = (3.0 * e + e * affine) if rms else (5.0 * e + 2.0 * e * affine)
    return Work(flops, 2.0 * e * x.itemsize(0) + p, prec, "vector")


def _backward(x: OpArgs, grad: int, inp: int, params: tuple[int, ...]) -> Work | None:
    s = x.shape(inp)
    prec = x.precision(inp)
    if s is None or prec is None:
        return None
    e = float(numel(s))
    p = sum(x.nbytes(i) for i in params)
    return Work(8.0 * e, x.nbytes(grad) + 2.0 * e * x.itemsize(inp) + 2.0 * p, prec, "vector")


def layer_norm(x: OpArgs) -> Work | None:
    """``layer_norm``/``native_layer_norm(input, normalized_shape, weight, bias, eps)``."""
    return _forward(x, (2, 3))


def rms_norm(x: OpArgs) -> Work | None:
    """``rms_norm``/``_fused_rms_norm(input, normalized_shape, weight, eps)``."""
    return _forward(x, (2,), rms=True)


def group_norm(x: OpArgs) -> Work | None:
    """``group_norm(input, num_groups, weight, bias, eps, cudnn)``, ``native_group_norm(input,
    weight, bias, N, C, HxW, group, eps)``: the parameters are the two tensors after the input."""
    return _forward(x, (1, 2) if x.name == "aten::native_group_norm" else (2, 3))


def batch_norm(x: OpArgs) -> Work | None:
    """``batch_norm``/``native_batch_norm``/``cudnn_batch_norm``/``miopen_batch_norm``/
    ``instance_norm(input, weight, bias, running_mean, running_var, …)``."""
    return _forward(x, (1, 2, 3, 4))


def layer_norm_backward(x: OpArgs) -> Work | None:
    """``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask)``."""
    return _backward(x, 0, 1, (5, 6))


def group_norm_backward(x: OpArgs) -> Work | None:
    """``native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask)``."""
    return _backward(x, 0, 1, (4,))


def batch_norm_backward(x: OpArgs) -> Work | None:
    """``native_batch_norm_backward(grad_out, input, weight, …)``, cudnn/miopen alike."""
    return _backward(x, 0, 1, (2,))


def rms_norm_backward(x: OpArgs) -> Work | None:
    """``_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, mask)``."""
    return _backward(x, 0, 1, (4,))


MODELS = {
    "aten::layer_norm": layer_norm, "aten::native_layer_norm": layer_norm,
    "aten::rms_norm": rms_norm, "aten::_fused_rms_norm": rms_norm,
    "aten::group_norm": group_norm, "aten::native_group_norm": group_norm,
    "aten::batch_norm": batch_norm, "aten::native_batch_norm": batch_norm, "aten::_batch_norm_impl_index": batch_norm,
    "aten::cudnn_batch_norm": batch_norm, "aten::miopen_batch_norm": batch_norm,
    "aten::_native_batch_norm_legit": batch_norm, "aten::_native_batch_norm_legit_no_training": batch_norm,
    "aten::instance_norm": batch_norm,
    "aten::native_layer_norm_backward": layer_norm_backward,
    "aten::native_group_norm_backward": group_norm_backward,
    "aten::native_batch_norm_backward": batch_norm_backward, "aten::cudnn_batch_norm_backward": batch_norm_backward,
    "aten::miopen_batch_norm_backward": batch_norm_backward,
    "aten::_fused_rms_norm_backward": rms_norm_backward,
}
