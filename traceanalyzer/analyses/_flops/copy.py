"""Copies on the device (memory-bound, no FLOPs).

``copy_(self, src)``: src read, self written, each at its own dtype (a cast is a copy):
bytes = E·b_self + E_src·b_src, E from ``self``, E_src the elements ``src`` stores (it
broadcasts to ``self``; an expanded view stores fewer). ``cat`` has no model:
its inputs are a TensorList whose dtype the trace does not record. Only kernels are timed: a copy that runs
as a memcpy (host↔device) has no kernel and no efficiency figure here.
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "copy"


def copy_(x: OpArgs) -> Work | None:
    dst = x.shape(0)
    if dst is None or x.dtype(1) is None:
        return None
    e = float(numel(dst))
    src = x.distinct(1)
    read = (src if src is not None else e) * x.itemsize(1)  # an expanded src is read once per stored element
    return Work(0.0, e * x.itemsize(0) + read, x.precision(0) or "fp32", "vector")


MODELS = {"aten::copy_": copy_}
