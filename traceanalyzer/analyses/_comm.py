"""Communication kernels, recognised once for every analysis (private to the analyses package).

``gpu_time`` (exposed communication), ``idle_gaps``, ``phases``, ``kernels`` (``is_comm``),
``ops`` (kernel classes), ``diagnosis`` and ``communication`` all read :func:`comm_classes`,
so every section of a report counts the same kernels as communication.
``docs/communication.md`` explains the signals; in short, strongest first:

1. ``metadata``: the kernel carries Kineto's collective args (``Collective name`` …), or the
   CPU op Kineto links it to (its ``External id``) is a ``record_param_comms`` with them.
2. ``cpu_op``: the CPU op (or user annotation) the kernel is linked to (the innermost one
   around its launch: Kineto's ``External id``; the launch call's position where the kernel
   has no External id) is a communication op: ``c10d::*``, ``record_param_comms``,
   ``_c10d_functional::*``, ``symm_mem::*``, vLLM/SGLang custom all-reduce ops, DeepEP
   wrappers (``FusedDispatch`` …), ``nccl:*`` annotations … A kernel with a generic name
   (copies, fills, elementwise, ``reduce_kernel``, GEMMs, layout kernels: buffer preparation
   inside a communication op) is **not** communication on this signal alone: it is real GPU
   work a collective library would not do.
3. ``name``: the kernel name belongs to a communication library's family
   (:data:`COMM_FAMILIES`).

``comm_signal`` is the strongest signal present. A kernel recognised by ``cpu_op`` alone
(no known family name) or by ``name`` alone (no launching op: CUDA-graph replays, traces
without External ids) rests on one weak signal: ``comm_weak`` says so, and the
communication analysis and the ``comm_exposed`` rule report it.
"""

from __future__ import annotations

import polars as pl
from polars.expr.whenthen import ChainedThen, Then

from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, join_unique, launch_calls, op_index, trace_tables

#: Communication kernel families by name: (family, regex searched in the demangled name).
#: NCCL and RCCL share the ``nccl*Kernel`` names; sources in ``docs/communication.md``.
COMM_FAMILIES: tuple[tuple[str, str], ...] = (
    ("rccl", r"(?i)rccl"),  # before nccl: RCCL-only names carry nccl* argument types
    ("nccl", r"(?i)nccl|\boneRankReduce\b"),
    ("msccl", r"(?i)msccl"),  # MSCCL (mscclKernel_*) and MSCCL++ (mscclpp::…)
    ("hccl", r"(?i)^hccl"),
    ("nvshmem", r"(?i)nvshmem|_on_stream_kernel\b|\ballToAllV(_2d)?\b|\bexchangeSplitAndOffset\b"),
    # DeepEP's communication namespaces (deep_ep::layout::get_dispatch_layout is compute).
    ("deepep", r"deep_ep::(legacy::)?(intranode|internode|internode_ll|elastic)::"
               r"|\b(cached_)?notify_(dispatch|combine)\b"
               r"|\bcached_notify\b|\bclean_low_latency_buffer\b"),
    ("custom_all_reduce",
     r"cross_device_reduce|(?i:one|two)Shot\w*AllReduceKernel|allreduce_1shotLL|(?i)quick_?reduce"),
    ("symm_mem", r"\b(one|two)_shot_all_reduce|\bmultimem_(all_reduce|one_shot_reduce|all_gather)"),
    ("userbuffers", r"\bk?userbuffers_"),
    ("oneccl", r"(?i)oneccl|\bccl::"),
)
#: Any communication family (the name signal).
COMM_KERNEL_RE = "|".join(f"(?:{r})" for _, r in COMM_FAMILIES)

#: CPU ops and user annotations that launch communication (the cpu_op signal).
COMM_OP_RE = (
    r"^record_param_comms$|^(nccl|rccl|hccl|xccl|gloo|mpi|ucc):|^c10d::|^_?c10d_functional::|^symm_mem::"
    r"|^_C_custom_ar::|^vllm::(all_reduce|reduce_scatter|all_gather|all_to_all)|^sgl_kernel::(all_reduce|"
    r"all_reduce_reg|mscclpp_allreduce|qr_all_reduce)|^sglang::reg_all_gather|^aiter::(fused_allreduce|"
    r"reduce_scatter|all_gather)|(?i)deep_ep|^(Fused|MoE)(Dispatch|Combine)(Backward)?$|^MoE_comm"
)
#: Kernel names of generic work (copies, fills, casts, elementwise, reductions, GEMMs, layout):
#: launched inside a communication op they are buffer preparation, not communication.
GENERIC_KERNEL_RE = (
    r"(?i)elementwise|vectorized|unrolled|\bfill|copy|memset|memcpy|reduce_kernel|gemm|cutlass|cublas|triton_"
    r"|\bindex|\bcat_|layout|\bsort|radix|\bcub::|at::native::"
)

#: Collective type by the text that names it (metadata ``Collective name``, op or kernel
#: name), first match wins.
_TYPE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("all_to_all", r"(?i)all_?to_?all|alltoall|a2a|alltoallv"),
    ("reduce_scatter", r"(?i)reduce_?scatter|reducescatter|_rs(_|$|\b)"),
    ("all_gather", r"(?i)all_?gather|fcollect|_ag(_|$|\b)"),
    ("all_reduce", r"(?i)all_?reduce|cross_device_reduce|rdxn|one_?shot|two_?shot|onerankreduce|sum_inplace"),
    ("dispatch", r"(?i)dispatch"),
    ("combine", r"(?i)combine"),
    ("broadcast", r"(?i)broadcast|bcast"),
    ("send_recv", r"(?i)send|recv|p2p"),
    ("barrier", r"(?i)barrier|sync_on_stream|signal_wait"),
    ("reduce", r"(?i)reduce"),
    ("gather", r"(?i)gather"),
    ("scatter", r"(?i)scatter"),
)

#: Bus-bandwidth factor by collective type for a group of n ranks (nccl-tests PERFORMANCE.md).
BUSBW_FACTOR_DOC = {
    "all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n", "all_to_all": "(n-1)/n",
}

#: Bytes per element of Kineto's ``dtype`` values (ScalarType names) and their C++ spellings.
DTYPE_BYTES: dict[str, int] = {
    "Double": 8, "Long": 8, "ComplexFloat": 8, "ComplexDouble": 16, "UInt64": 8,
    "Float": 4, "Int": 4, "UInt32": 4, "ComplexHalf": 4,
    "Half": 2, "BFloat16": 2, "Short": 2, "UInt16": 2,
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "double": 8, "long": 8, "long int": 8, "float": 4, "int": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "unsigned char": 1, "signed char": 1, "bool": 1,
}


def family_of(name: pl.Expr) -> pl.Expr:
    """The communication family a kernel name belongs to, null for none."""
    e: Then | ChainedThen = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
    for fam, rx in COMM_FAMILIES:
        e = e.when(name.str.contains(rx)).then(pl.lit(fam))
    return e.otherwise(pl.lit(None, pl.String))


def collective_type(text: pl.Expr) -> pl.Expr:
    """Collective type named by ``text`` (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``all_to_all``, ``dispatch``, ``combine``, ``broadcast``, ``send_recv``, ``barrier`` …),
    null when it names none."""
    e: Then | ChainedThen = pl.when(text.is_null()).then(pl.lit(None, pl.String))
    for t, rx in _TYPE_PATTERNS:
        e = e.when(text.str.contains(rx)).then(pl.lit(t))
    return e.otherwise(pl.lit(None, pl.String))


def busbw_factor(ctype: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' bus-bandwidth factor: all_reduce 2(n−1)/n; all_gather, reduce_scatter,
    all_to_all (n−1)/n; others 1; null when the group size is unknown."""
    nf = n.cast(pl.Float64)
    return (
        pl.when(n.is_null() | (n <= 0)).then(None)
        .when(ctype == "all_reduce").then(2.0 * (nf - 1) / nf)
        .when(ctype.is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((nf - 1) / nf)
        .otherwise(1.0)
    )


def comm_classes(src: TraceModel | TraceTables) -> pl.DataFrame:
    """Row-aligned with ``model.kernels``: ``is_comm`` (bool), ``comm_signal`` (``metadata`` /
    ``cpu_op`` / ``name`` / null), ``comm_family`` (by name, null for none), ``comm_weak``
    (one weak signal only), ``comm_op`` (the linked communication CPU op or annotation),
    ``comm_op_ext`` (its External id: the kernels of one collective share it) and the
    linked op's metadata ``op_comm_name, op_dtype, op_in_nelems, op_out_nelems,
    op_group_size, op_pg_name, op_pg_desc``. Built once per run (read-only)."""
    t = trace_tables(src)
    return t.get("comm_classes", lambda: _comm_classes(t))


def _contexts(model: TraceModel) -> pl.DataFrame:
    """Communication CPU ops and annotations: ``external_id, name`` and their metadata."""
    ops = model.cpu_ops
    ann = model.annotations
    o = ops.filter(contains_by_name(ops, COMM_OP_RE)).select(
        "external_id", "name", *[pl.col(c).alias(a) for c, a in _OP_META.items()])
    a = ann.filter(pl.col("name").str.contains(COMM_OP_RE)).select(
        "external_id", "name", *[pl.lit(None, ops.schema[c]).alias(a) for c, a in _OP_META.items()])
    return pl.concat([o, a])


#: cpu_ops metadata column → its name in :func:`comm_classes`.
_OP_META = {"comm_name": "op_comm_name", "comm_dtype": "op_dtype", "comm_in_nelems": "op_in_nelems",
            "comm_out_nelems": "op_out_nelems", "comm_group_size": "op_group_size", "comm_pg_name": "op_pg_name",
            "comm_pg_desc": "op_pg_desc"}


def _linked_ops(t: TraceTables, k: pl.DataFrame, ctx: pl.DataFrame) -> pl.DataFrame:
    """For each kernel row, the communication op it is linked to (null columns where none)."""
    by_ext = ctx.filter(pl.col("external_id").is_not_null()).unique("external_id", keep="first", maintain_order=True)
    j = k.select("external_id").join(by_ext, on="external_id", how="left", maintain_order="left")
    j = j.with_columns(pl.when(pl.col("name").is_not_null()).then(pl.col("external_id")).alias("_ext")).drop(
        "external_id")
    # Kernels whose External id names no CPU op (none recorded, or older Kineto files where it
    # repeats the correlation id): the deepest CPU op around the launch call instead.
    model = t.model
    known = pl.concat([model.cpu_ops["external_id"], model.annotations["external_id"]]).drop_nulls()
    need = ~k["external_id"].is_in(known.implode()).fill_null(False) & k["correlation"].is_not_null()
    if need.any():
        ops = model.cpu_ops
        idx = need.arg_true()
        rt = launch_calls(model)
        pts = join_unique(k.select(pl.col("correlation").gather(idx)), rt, "correlation")
        op_id = op_index(t).lookup(pts.select("pid", "tid", "ts_ns"))
        # Only a communication op links (its row number stands in for its External id:
        # negative, never a real one); elsewhere the row keeps its nulls (update() takes no
        # null). Which ops are communication ops, by their distinct names, then the columns
        # of the linked ones only (a few of the kernels: not every column of every op).
        is_comm_op = ops.select(contains_by_name(ops, COMM_OP_RE).fill_null(False)).to_series()
        at = is_comm_op.gather(op_id).fill_null(False).arg_true()
        if at.len():
            linked_op = op_id.gather(at)
            # Op ids are row numbers of model.cpu_ops: the op's columns by a gather, not a join.
            got = ops.select("name", *[pl.col(c).alias(a) for c, a in _OP_META.items()]).select(
                pl.all().gather(linked_op))
            got = got.select(*[c for c in j.columns if c != "_ext"]).with_columns(
                _ext=-1 - linked_op, _i=idx.gather(at).cast(pl.UInt32))
            j = j.with_row_index("_i").update(got, on="_i", how="left").drop("_i")
    return j


def _comm_classes(t: TraceTables) -> pl.DataFrame:
    model = t.model
    k = model.kernels
    schema = {"is_comm": pl.Boolean, "comm_signal": pl.String, "comm_family": pl.String, "comm_weak": pl.Boolean,
              "comm_op": pl.String, "comm_op_ext": pl.Int64, "op_comm_name": pl.String, "op_dtype": pl.String,
              "op_in_nelems": pl.Int64, "op_out_nelems": pl.Int64, "op_group_size": pl.Int64,
              "op_pg_name": pl.String, "op_pg_desc": pl.String}
    if k.is_empty():
        return pl.DataFrame(schema=schema)
    # Here, not at the top: _kernels imports _intervals, which imports this module.
    from traceanalyzer.analyses._kernels import on_distinct

    # Names repeat (a few hundred distinct in 100k kernels): the regexes run once per name
    # (on_distinct: by the names' categorical codes, half the time of a unique and a join
    # on the strings). A null name stays unclassified (_generic null), as such a row matched
    # no name in that join.
    name = pl.col("name")
    f = on_distinct(k.select("name", "comm_name"), ["name"], comm_family=family_of(name),
                    _generic=pl.when(name.is_not_null()).then(name.str.contains(GENERIC_KERNEL_RE).fill_null(False)))
    ctx = _contexts(model)
    if ctx.height:
        linked = _linked_ops(t, k, ctx)
    else:
        linked = pl.DataFrame({c: pl.Series([None] * k.height, dtype=ctx.schema[c]) for c in ctx.columns if
                               c != "external_id"}).with_columns(_ext=pl.lit(None, pl.Int64))
    f = pl.concat([f, linked.rename({"name": "comm_op", "_ext": "comm_op_ext"})], how="horizontal")
    has_meta = pl.col("comm_name").is_not_null() | pl.col("op_comm_name").is_not_null()
    fam = pl.col("comm_family").is_not_null()
    by_op = pl.col("comm_op").is_not_null() & (fam | ~pl.col("_generic"))
    signal = (pl.when(has_meta).then(pl.lit("metadata")).when(by_op).then(pl.lit("cpu_op"))
              .when(fam).then(pl.lit("name")).otherwise(pl.lit(None, pl.String)))
    return f.with_columns(comm_signal=signal).with_columns(
        is_comm=pl.col("comm_signal").is_not_null(),
        comm_weak=(pl.col("comm_signal") == "cpu_op") & ~fam | (pl.col("comm_signal") == "name") & pl.col(
            "comm_op").is_null(),
    ).with_columns(
        # A generic kernel inside a communication op keeps no link to it (it is not part of the collective).
        *[pl.when(pl.col("is_comm")).then(pl.col(c)).alias(c) for c in
          ("comm_op", "comm_op_ext", "op_comm_name", "op_dtype", "op_in_nelems", "op_out_nelems", "op_group_size",
           "op_pg_name", "op_pg_desc")]
    ).select(list(schema))
