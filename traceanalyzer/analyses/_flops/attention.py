"""Scaled dot-product attention, fused or not: the ``aten::*scaled_dot_product*`` ops, the
FlashAttention / memory-efficient kernels' ops and the ``flash_attn::`` library's.

Shapes: batch B, query heads H_q, key/value heads H_kv, lengths N_q/N_kv, head dims d/d_v.
Forward FLOPs count the two products only (QKᵀ and PV; softmax ignored, as everywhere):
``F = 2·B·H_q·N_q·N_kv·(d + d_v)`` (= 4·B·H·N²·d for self-attention). Causal masking keeps
the fraction of (query, key) pairs left unmasked: ½ when N_q = N_kv (FlashAttention's
benchmark and TraceLens use the same ½); otherwise the exact count for the op's alignment
(PyTorch's ``is_causal``: top-left; ``flash_attn``: bottom-right). Backward = 2.5 × forward
(five products: QKᵀ recomputed, dV, dP, dQ, dK; FlashAttention's convention).
Bytes: forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and writes dQ, dK,
dV: the minimum traffic of a fused kernel (the unfused path moves the N_q × N_kv scores too,
which is why it is slower: its shortfall against this model is what fusion would win back).

Variable-length ops (``cum_seq_q``/``cu_seqlens`` given): the lengths themselves are in a
tensor the trace does not record, so the FLOPs assume equal lengths T/b per sequence (T
tokens, b sequences): a lower bound (Σ sᵢ² ≥ T²/b), noted ``varlen: equal lengths assumed``.

Layouts and argument positions per op (``q`` at ``qi``; (B, H, N, d) or (B, N, H, d); the
index of ``is_causal``, or of ``custom_mask_type`` for the memory-efficient ops).
"""

from __future__ import annotations

from traceanalyzer.analyses._flops.args import OpArgs, numel
from traceanalyzer.analyses._flops.work import Work

FAMILY = "attention"

# name → (index of q, heads-before-seq layout?, causal index, causal is a mask type, backward?,
#         cu_seqlens index or None, causal alignment "tl"/"br")
_SPEC: dict[str, tuple[int, bool, int, bool, bool, int | None, str]] = {
    "aten::scaled_dot_product_attention": (0, True, 5, False, False, None, "tl"),
    "aten::_scaled_dot_product_attention_math": (0, True, 5, False, False, None, "tl"),
    "aten::_scaled_dot_product_flash_attention": (0, True, 4, False, False, None, "tl"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, True, 4, False, False, None, "tl"),
    "aten::_scaled_dot_product_efficient_attention": (0, True, 6, False, False, None, "tl"),
    "aten::_scaled_dot_product_cudnn_attention": (0, True, 6, False, False, None, "tl"),
    "aten::_scaled_dot_product_fused_attention_overrideable": (0, True, 5, False, False, None, "tl"),
    "aten::_flash_attention_forward": (0, False, 8, False, False, 3, "br"),
    "aten::_efficient_attention_forward": (0, False, 9, True, False, 4, "tl"),
    "aten::_scaled_dot_product_flash_attention_backward": (1, True, 11, False, True, None, "tl"),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, True, 6, False, True, None, "tl"),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, True, 11, False, True, None, "tl"),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, True, 14, False, True, None, "tl"),
    "aten::_flash_attention_backward": (1, False, 11, False, True, 6, "br"),
    "aten::_efficient_attention_backward": (1, False, 14, True, True, 6, "tl"),
    "flash_attn::_flash_attn_forward": (0, False, 5, False, False, None, "br"),
    "flash_attn::_flash_attn_backward": (1, False, 11, False, True, None, "br"),
    "flash_attn::_flash_attn_varlen_forward": (0, False, 9, False, False, 3, "br"),
    "flash_attn::_flash_attn_varlen_backward": (1, False, 15, False, True, 9, "br"),
}


def causal_pairs(nq: int, nk: int, align: str) -> float:
    """Unmasked (query, key) pairs of a causal mask: ½·N_q·N_kv when N_q = N_kv, else the exact
    count with the mask aligned top-left (query i sees keys ≤ i) or bottom-right (≤ i + N_kv − N_q)."""
    if nq == nk:
        return nq * nk / 2.0
    off = 0 if align == "tl" else nk - nq
    # Σ_i clamp(i + off + 1, 0, nk) for i in [0, nq)
    total = 0
    lo = max(0, -off)  # first row that sees anything
    full = max(lo, min(nq, nk - off))  # rows before this see fewer than nk keys
    for_rows = range(lo, full)
    if for_rows:
        first, last = lo + off + 1, full - 1 + off + 1
        total += (first + last) * len(for_rows) // 2
    total += (nq - full) * nk if nq > full else 0
    return float(total)


def attention(x: OpArgs) -> Work | None:
    """FLOPs and bytes of one attention call (see the module docstring)."""
    spec = _SPEC.get(x.name)
    if spec is None:
        return None
    qi, bhnd, ci, mask_type, backward, cu, align = spec
    q, k, v = x.shape(qi), x.shape(qi + 1), x.shape(qi + 2)
    prec = x.precision(qi)
    if q is None or k is None or v is None or prec is None:
        return None
    note = ""
    cu_shape = x.shape(cu) if cu is not None else None
    if cu_shape is not None and len(cu_shape) == 1 and len(q) == 3 and len(k) == 3 and len(v) == 3:
        seqs = max(cu_shape[0] - 1, 1)
        (tq, hq, d), (tk, _, _), (_, _, dv) = q, k, v
        b, nq, nk = seqs, tq / seqs, tk / seqs
        note = "varlen: equal lengths assumed (a lower bound)"
    elif len(q) == 4 and len(k) == 4 and len(v) == 4:
        if bhnd:
            b, hq, nq, d = q
            nk, dv = k[2], v[3]
        else:
            b, nq, hq, d = q
            nk, dv = k[1], v[3]
    else:
        return None
    if mask_type:
        mt = x.int(ci)
        causal = mt is not None and mt > 0
        align = "br" if mt == 2 else "tl"
    else:
        causal = bool(x.flag(ci))
    pairs = float(nq) * float(nk)
    if causal:
        pairs = causal_pairs(int(nq), int(nk), align) if nq == int(nq) and nk == int(nk) else pairs / 2.0
    fwd = 2.0 * b * hq * pairs * (d + dv)
    io = x.nbytes(qi) + x.nbytes(qi + 1) + x.nbytes(qi + 2) + numel(q) / d * dv * x.itemsize(qi)  # Q, K, V, O
    if backward:
        return Work(2.5 * fwd, 2.0 * io, prec, "matrix", note)
    return Work(fwd, io, prec, "matrix", note)


MODELS = dict.fromkeys(_SPEC, attention)
