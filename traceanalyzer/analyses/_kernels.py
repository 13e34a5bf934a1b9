"""Kernel names and classes (private to the analyses package).

* :func:`normalize_kernel_names` / :func:`normalize_kernel_name`: a kernel name without
  template arguments or parameter list, the key kernels are grouped by;
* :func:`kernel_class`: communication / attention / gemm / reduction / elementwise / other,
  by name (:data:`GEMM_KERNEL_RE` and the patterns below);
* :data:`GEMM_OPS_RE`: the CPU ops that run GEMM/conv/attention work;
* :func:`on_distinct`: evaluate such per-name expressions once per distinct name.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.analyses._intervals import is_comm_kernel
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, trace_tables

#: CPU ops that run GEMM/conv/attention work (their input dtypes are the compute dtypes).
GEMM_OPS_RE = (
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv\d?d|convolution|_convolution|cudnn_convolution"
    r"|miopen_convolution|conv_transpose\dd|_scaled_mm|scaled_dot_product_\w+|_scaled_dot_product_\w+"
    r"|_flash_attention_\w+|_efficient_attention_\w+)$"
)
#: GEMM/conv kernels by name (vendor libraries, CUTLASS, Triton matmuls, Tensile, CK, MIOpen).
GEMM_KERNEL_RE = (
    r"(?i)gemm|matmul|bmm|cutlass|cublas|nvjet|xmma|^Cijk_|_ZN2ck|wgmma|convolution|convolve|conv\dd|_conv_"
    r"|^conv|fprop|dgrad|wgrad|winograd|s16816|h16816|s1688|h1688|s884|h884|tensorop"
)
ATTENTION_KERNEL_RE = r"(?i)flash|fmha|attention|attn|sdpa"
NORM_REDUCE_KERNEL_RE = (
    r"(?i)reduce|triton_red|triton_per|softmax|norm|bn_|batch_?norm|sum_|mean|argmax|topk|sort|welford|cross_entropy"
)
ELEMENTWISE_KERNEL_RE = (
    r"(?i)elementwise|vectorized|unrolled|pointwise|triton_poi|functor|fill|copy|cat_|transpose|permute|index"
    r"|scatter|gather|dropout|activation|gelu|relu|silu|tanh|sigmoid|add|mul|div|where|masked|embedding|memcpy"
)

_NEST_DEPTH = 8  # nesting levels of <…> / (…) removed; real names nest ≤ 5


def normalize_kernel_names(name: pl.Expr) -> pl.Expr:
    """Vectorised :func:`normalize_kernel_name` over a string expression."""
    e = name.str.replace_all(r"\(anonymous namespace\)::", "")
    for _ in range(_NEST_DEPTH):
        e = e.str.replace_all(r"<[^<>]*>", "")
    for _ in range(_NEST_DEPTH):
        e = e.str.replace_all(r"\([^()]*\)", "")
    e = e.str.replace(r"^\s*void\s+", "").str.replace_all(r"\s+const\b", "").str.replace_all(r"\s+", " ")
    return e.str.strip_chars()


def on_distinct(df: pl.DataFrame, keys: list[str], **exprs: pl.Expr) -> pl.DataFrame:
    """``df.with_columns(**exprs)``, the expressions (of ``keys`` only) evaluated once per
    distinct ``keys`` value and joined back in row order. Kernel names repeat (thousands of
    kernels, tens of names), and normalising or classifying them is many regex passes."""
    if df.is_empty():
        return df.with_columns(**exprs)
    # A key that is null on every row (comm_name, on most traces) distinguishes nothing:
    # joining on the others only is several times cheaper.
    live = [k for k in keys if df[k].null_count() < df.height]
    if not live:
        return df.with_columns(**exprs)
    # String keys by their categorical codes: each (long) name is hashed once, and the
    # unique and the join back run on integer keys (half the time of both on the strings).
    codes = df.select(
        (pl.col(c).cast(pl.Categorical).to_physical() if df.schema[c] == pl.String else pl.col(c)).alias(f"_od{i}")
        for i, c in enumerate(live)
    )
    on = codes.columns
    first = codes.with_row_index("_od_row").unique(on, keep="any")["_od_row"]
    table = df.select(keys).gather(first).select(**exprs).hstack(codes.gather(first))
    return df.with_columns(
        codes.join(table, on=on, how="left", nulls_equal=True, maintain_order="left").drop(on).get_columns()
    )


def kernel_norms(src: TraceModel | TraceTables) -> pl.Series:
    """Row-aligned with ``model.kernels``: each kernel's :func:`normalize_kernel_names`
    (``norm``). Built once per run (read-only): several analyses group kernels by it, and
    each normalisation is a few tens of regex passes over the distinct names."""
    t = trace_tables(src)

    def build() -> pl.Series:
        k = t.model.kernels.select("name")
        return on_distinct(k, ["name"], norm=normalize_kernel_names(pl.col("name")))["norm"]

    return t.get("kernel_norms", build)


def normalize_kernel_name(name: str) -> str:
    """Kernel name without template arguments or parameter list, for grouping.

    >>> normalize_kernel_name(
    ...     "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float> >(at::native::ReduceOp<float>)")
    'at::native::reduce_kernel'
    """
    out = pl.select(normalize_kernel_names(pl.lit(name)).alias("n"))["n"][0]
    return str(out) if out else name


def kernel_class(name: pl.Expr, comm_name: pl.Expr | None = None) -> pl.Expr:
    """``communication`` / ``attention`` / ``gemm`` (GEMM and conv) / ``reduction`` (incl. norms,
    softmax) / ``elementwise`` (incl. copies, fills) / ``other``, by kernel name."""
    return (
        pl.when(is_comm_kernel(name, comm_name))
        .then(pl.lit("communication"))
        .when(name.str.contains(ATTENTION_KERNEL_RE))
        .then(pl.lit("attention"))
        .when(name.str.contains(GEMM_KERNEL_RE))
        .then(pl.lit("gemm"))
        .when(name.str.contains(NORM_REDUCE_KERNEL_RE))
        .then(pl.lit("reduction"))
        .when(name.str.contains(ELEMENTWISE_KERNEL_RE))
        .then(pl.lit("elementwise"))
        .otherwise(pl.lit("other"))
    )


__all__ = [
    "ATTENTION_KERNEL_RE",
    "ELEMENTWISE_KERNEL_RE",
    "GEMM_KERNEL_RE",
    "GEMM_OPS_RE",
    "NORM_REDUCE_KERNEL_RE",
    "kernel_class",
    "kernel_norms",
    "normalize_kernel_name",
    "normalize_kernel_names",
    "on_distinct",
]
