"""Elementwise operations and reductions (memory-bound: the bytes are what matters).

Elementwise (unary, binary, ternary; ``_`` in-place variants alike): the output has the
broadcast shape of the tensor inputs (E_out elements); bytes = every tensor input read once
(its own numel and dtype) + the output written once, at the widest input dtype (promotion;
comparisons write bool, in-place ops the first input's dtype); FLOPs = E_out (one operation
per output element; transcendental functions cost more on the SIMT units, but these ops sit
against the memory roof anyway). ``fill_``/``zero_`` write only.

Reductions (``sum``, ``mean``, ``amax`` …): bytes = input read + output written; the output
shape comes from ``dim``/``keepdim`` in Concrete Inputs, all dims reduced when ``dim`` is
absent (output: one element); FLOPs = E_in. ``cumsum``/``cumprod`` write E_in elements.

Only a function's own inputs are read (one for unary ops, two for binary, three for ``where``,
``addcmul``, ``addcdiv``, ``lerp``, ``masked_fill``): a further tensor is an ``out=`` argument,
which older traces list among the inputs.
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, broadcast, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "elementwise"

_UNARY = (
    "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "gelu", "silu",
    "abs", "clamp", "clamp_min", "clamp_max", "reciprocal", "sin", "cos", "erf", "hardtanh", "leaky_relu", "mish",
    "softplus", "square", "sign", "floor", "ceil", "round", "trunc", "elu", "hardswish", "hardsigmoid", "logical_not",
    "bitwise_not", "nan_to_num", "threshold", "pow", "frac", "erfinv", "sgn",
)
_BINARY = (
    "add", "sub", "rsub", "mul", "div", "maximum", "minimum", "fmod", "remainder", "where", "masked_fill",
    "addcmul", "addcdiv", "lerp", "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
    "tanh_backward", "hardtanh_backward", "leaky_relu_backward", "mish_backward", "elu_backward",
    "logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor", "atan2", "hypot", "xlogy",
    "eq", "ne", "lt", "gt", "le", "ge", "native_dropout_backward",
)
_TERNARY = {"where", "addcmul", "addcdiv", "lerp", "masked_fill"}
_COMPARE = {"eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or", "logical_not"}
_REDUCE = (
    "sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "std", "var", "logsumexp",
    "any", "all", "argmax", "argmin", "var_mean", "std_mean", "nansum",
)
_SCAN = ("cumsum", "cumprod")


def _base(name: str) -> tuple[str, bool]:
    """(function name without ``aten::`` and the in-place ``_``, in place?)."""
    short = name.removeprefix("aten::")
    return (short[:-1], True) if short.endswith("_") else (short, False)


def elementwise(x: OpArgs) -> Work | None:
    """Every tensor input read, the broadcast output written (see the module docstring)."""
    base, inplace = _base(x.name)
    # Tensors past the function's own inputs are an ``out=`` argument (older traces record it):
    # written, not read, and already the output.
    arity = 1 if base in _UNARY else 3 if base in _TERNARY else 2
    tensors = [i for i in range(min(len(x.types), arity)) if x.shape(i) is not None]
    if not tensors:
        return None
    shapes = [x.shape(i) for i in tensors]
    out = broadcast(*[s for s in shapes if s is not None])
    if out is None:
        return None
    e_out = float(numel(out))
    if base in _COMPARE:
        ob = 1.0
    elif inplace:
        ob = x.itemsize(tensors[0])
    else:  # 0-dim tensors (wrapped Python scalars) do not promote over tensors with dims
        dimmed = [i for i in tensors if x.shape(i)] or tensors
        ob = max(x.itemsize(i) for i in dimmed)
    read = sum(x.nbytes(i) for i in tensors)
    prec = next((p for p in (x.precision(i) for i in tensors) if p is not None), "fp32")
    return Work(e_out, read + e_out * ob, prec, "vector")


def native_dropout(x: OpArgs) -> Work | None:
    """``native_dropout(input, p, train)``: input read, output and a bool mask written."""
    s = x.shape(0)
    if s is None:
        return None
    e = float(numel(s))
    return Work(2.0 * e, e * (2.0 * x.itemsize(0) + 1.0), x.precision(0) or "fp32", "vector")


def fill(x: OpArgs) -> Work | None:
    """``fill_``/``zero_``: the tensor written once."""
    s = x.shape(0)
    if s is None:
        return None
    return Work(0.0, x.nbytes(0), x.precision(0) or "fp32", "vector")


def reduce(x: OpArgs) -> Work | None:
    """Input read once; the output (from ``dim``/``keepdim``) written once."""
    s = x.shape(0)
    if s is None:
        return None
    base, _ = _base(x.name)
    e_in = float(numel(s))
    if base in _SCAN:
        return Work(e_in, 2.0 * e_in * x.itemsize(0), x.precision(0) or "fp32", "vector")
    dims = x.ints(1)
    if dims is None or not dims:
        e_out = 1.0
    else:
        keep = {d % len(s) for d in dims} if s else set()
        e_out = float(numel([n for i, n in enumerate(s) if i not in keep]))
    return Work(e_in, e_in * x.itemsize(0) + e_out * x.itemsize(0), x.precision(0) or "fp32", "vector")


MODELS = {
    **{f"aten::{n}{sfx}": elementwise for n in (*_UNARY, *_BINARY) for sfx in ("", "_")},
    "aten::native_dropout": native_dropout, "aten::fill_": fill, "aten::zero_": fill,
    **{f"aten::{n}": reduce for n in (*_REDUCE, *_SCAN)},
}
