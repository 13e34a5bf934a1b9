"""Embedding lookups and their backward, ``index_select`` (memory-bound, no FLOPs).

``embedding(weight[V,D], indices)``: the rows gathered are read and written once, the
indices read: bytes = 2·n·D·b + n·b_idx (n = number of indices). ``index_select(self, dim,
index)`` alike along ``dim``. ``embedding_dense_backward(grad_out, indices, num_weights, …)``:
grad_out read, the [num_weights, D] gradient zeroed and accumulated into (written once),
indices read.
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "embedding"


def _prec(x: OpArgs, i: int) -> str:
    return x.precision(i) or "fp32"


def embedding(x: OpArgs) -> Work | None:
    w, idx = x.shape(0), x.shape(1)
    if w is None or idx is None or len(w) != 2:
        return None
    n = float(numel(idx))
    return Work(0.0, 2.0 * n * w[1] * x.itemsize(0) + x.nbytes(1), _prec(x, 0), "vector")


def index_select(x: OpArgs) -> Work | None:
    s, idx, dim = x.shape(0), x.shape(2), x.int(1)
    if s is None or idx is None or dim is None or not s or not -len(s) <= dim < len(s):
        return None
    out = float(numel(s) // max(s[dim], 1) * numel(idx)) if s[dim] else 0.0
    return Work(0.0, 2.0 * out * x.itemsize(0) + x.nbytes(2), _prec(x, 0), "vector")


def embedding_backward(x: OpArgs) -> Work | None:
    g, v = x.shape(0), x.int(2)
    if g is None or v is None or not g:
        return None
    return Work(float(numel(g)), x.nbytes(0) + float(v) * g[-1] * x.itemsize(0) + x.nbytes(1), _prec(x, 0), "vector")


MODELS = {
    "aten::embedding": embedding, "aten::index_select": index_select,
    "aten::embedding_dense_backward": embedding_backward, "aten::embedding_backward": embedding_backward,
}
