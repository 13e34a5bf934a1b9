"""FLOP and byte models of PyTorch operations, one module per family.

Each family module (:mod:`.gemm`, :mod:`.conv`, :mod:`.attention`, :mod:`.norm`,
:mod:`.softmax`, :mod:`.elementwise`, :mod:`.embedding`, :mod:`.copy`) maps exact op names
to a function ``OpArgs -> Work | None`` holding the family's formula (its docstring says
which). None means the arguments do not fit the formula (a shape missing, a TensorList where
a tensor was expected): such a call is reported as "no model", never guessed, like any op
whose name no module lists.

:func:`work_of_signatures` evaluates the models once per distinct (name, dims, types,
concrete inputs) signature, not per event: a trace has a few hundred distinct signatures for
hundreds of thousands of ops.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from traceanalyzer.analyses._flops import attention, conv, copy, elementwise, embedding, gemm, norm, softmax
from traceanalyzer.analyses._flops.args import OpArgs
from traceanalyzer.analyses._flops.work import Work

ModelFn = Callable[[OpArgs], Work | None]

#: op name → (family, model). A family module's ``MODELS`` maps its op names to models.
MODELS: dict[str, tuple[str, ModelFn]] = {
    name: (mod.FAMILY, fn)
    for mod in (gemm, conv, attention, norm, softmax, elementwise, embedding, copy)
    for name, fn in mod.MODELS.items()
}

#: The columns :func:`work_of_signatures` adds to each signature.
WORK_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "family": pl.String, "flops": pl.Float64, "bytes": pl.Float64, "precision": pl.String,
    "unit": pl.String, "note": pl.String, "gemm_b": pl.Int64, "gemm_m": pl.Int64, "gemm_n": pl.Int64,
    "gemm_k": pl.Int64,
}


def family_of(name: str) -> str | None:
    """The family of an op name with a model, else None."""
    m = MODELS.get(name)
    return m[0] if m else None


def work(args: OpArgs) -> Work | None:
    """The work of one call (None: no model for its name, or its arguments do not fit)."""
    m = MODELS.get(args.name)
    if m is None:
        return None
    try:
        return m[1](args)
    except (ArithmeticError, ValueError, IndexError):  # hostile dims (a zero stride, a huge exponent)
        return None


def work_of_signatures(sigs: pl.DataFrame) -> pl.DataFrame:
    """``sigs`` (``name, input_dims, input_types, concrete_inputs`` and, when present, ``input_strides``;
    distinct rows) with :data:`WORK_SCHEMA` columns added; null ``flops`` where no model applies."""
    rows: list[tuple[object, ...]] = []
    strides = sigs["input_strides"] if "input_strides" in sigs.columns else pl.repeat(None, sigs.height,
                                                                                        dtype=pl.String, eager=True)
    cols = sigs.select("name", "input_dims", "input_types", "concrete_inputs").with_columns(strides.alias("_st"))
    for name, dims, types, conc, st in cols.iter_rows():
        w = work(OpArgs.parse(name, dims, types, conc, st)) if name in MODELS else None
        fam = family_of(name)
        shape = (w.bmnk if w is not None else None) or (None, None, None, None)
        rows.append((fam, None, None, None, None, None, *shape) if w is None else
                    (fam, float(w.flops), float(w.bytes), w.precision, w.unit, w.note, *shape))
    extra = pl.DataFrame(rows, schema=WORK_SCHEMA, orient="row")
    return pl.concat([sigs, extra], how="horizontal")


__all__ = ["MODELS", "WORK_SCHEMA", "OpArgs", "Work", "family_of", "work", "work_of_signatures"]
