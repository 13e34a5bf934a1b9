"""Softmax and log-softmax, forward and backward (memory-bound).

Forward: bytes = E·b read + E·b written; FLOPs = 5·E (max, subtract, exp, sum, divide).
Backward ``_softmax_backward_data(grad_out, output, dim, input_dtype)``: grad_out and output
read, grad_input written (3·E·b); FLOPs = 4·E. E = elements of the input, b its bytes per
element (``half_to_float`` outputs are counted at the input's size: a lower bound).
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "softmax"


def softmax(x: OpArgs) -> Work | None:
    s = x.shape(0)
    prec = x.precision(0)
    if s is None or prec is None:
        return None
    e = float(numel(s))
    return Work(5.0 * e, 2.0 * e * x.itemsize(0), prec, "vector")


def softmax_backward(x: OpArgs) -> Work | None:
    s = x.shape(0)
    prec = x.precision(0)
    if s is None or prec is None:
        return None
    e = float(numel(s))
    return Work(4.0 * e, 3.0 * e * x.itemsize(0), prec, "vector")


MODELS = {
    "aten::softmax": softmax, "aten::_softmax": softmax, "aten::log_softmax": softmax, "aten::_log_softmax": softmax,
    "aten::_softmax_backward_data": softmax_backward, "aten::_log_softmax_backward_data": softmax_backward,
}
