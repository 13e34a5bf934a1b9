"""Copies on the device (memory-bound, no FLOPs).

``copy_(self, src)``: src read, self written, each at its own dtype (a cast is a copy):
bytes = E·(b_self + b_src), E from ``self`` (``src`` broadcasts to it). ``cat`` has no model:
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
    return Work(0.0, e * (x.itemsize(0) + x.itemsize(1)), x.precision(0) or "fp32", "vector")


MODELS = {"aten::copy_": copy_}
