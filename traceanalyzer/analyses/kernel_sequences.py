"""Kernel sequences: the kernel n-grams that recur in every step, as fusion candidates (HTA's
frequent CUDA kernel sequences).

Definitions
-----------
* Kernels of the **steady step windows** (``steps``: a kernel belongs to the window containing
  its start; warm-up and a truncated last step left out), named by their normalised name
  (``kernels``' key: template arguments and parameter lists removed), in start order on each
  ``(device, stream)``.
* Each kernel is identified by its normalised name **and** its launching CPU op (the deepest
  ``cpu_op`` around its launch call): elementwise kernels share one normalised name
  (``vectorized_elementwise_kernel``) whatever they compute, the op that launched them says
  what (``aten::add_``, ``aten::mul``).
* An **n-gram** is ``n`` consecutive kernels of one stream inside one step window, for every
  ``n`` from ``kernel_sequences.min_n`` (3) to ``kernel_sequences.max_n`` (5). Occurrences are
  counted with a sliding window: in ``a b a b a`` the 3-gram ``a b a`` occurs twice.
  ``sequence`` lists the kernels' normalised names, ``ops`` their launching ops (``?`` for a
  kernel without one), both joined with ``→``.
* Per sequence: ``count`` (occurrences in the steady steps), ``count_per_step`` (÷ steady
  steps), ``steps`` (steady windows it occurs in), ``total_ns`` (the summed device time of its
  kernels over every occurrence), ``ns_per_step`` (÷ steady steps), ``gap_ns`` (summed idle
  time of the stream between the kernels of each occurrence: what fusing them would also
  remove), ``pct_of_kernel_time`` (``total_ns`` as % of the steady steps' kernel time; overlapping
  occurrences each count, so these do not add up to 100), ``cpu_op``: the CPU op that launched
  the first kernel, ``classes``: the kernels' classes (``kernel_class``) joined with ``+``, and
  ``fusable``: every kernel is elementwise or a reduction (memory-bound kernels that a compiler
  such as torch.compile fuses into one); ``fusion_candidates()``: those, less the ones inside a
  longer candidate that occurs at least 90 % as often.
* ``top``: per ``n``, the ``kernel_sequences.top_n`` (20) sequences with the largest count
  (ties by ``total_ns``), each occurring at least once per steady step (``count_per_step`` ≥ 1)
  unless fewer qualify, then the most frequent of the rest.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._kernels import kernel_class, kernel_norms
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.errors import NotApplicable
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import join_unique, launch_calls, op_index

SEQ_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "n": pl.Int64, "sequence": pl.String, "ops": pl.String, "classes": pl.String, "fusable": pl.Boolean,
    "count": pl.Int64, "count_per_step": pl.Float64, "steps": pl.Int64, "total_ns": pl.Int64, "ns_per_step": pl.Float64,
    "gap_ns": pl.Int64, "pct_of_kernel_time": pl.Float64, "cpu_op": pl.String,
}
_SEP = " → "
_MEMORY_BOUND = ("elementwise", "reduction")
#: A fusion candidate inside a longer one that occurs at least this share as often is dropped.
_ABOUT_AS_OFTEN = 0.9


@dataclass(frozen=True)
class KernelSequencesResult:
    """The most frequent kernel n-grams of the steady steps. See the module docstring."""

    top: pl.DataFrame  # SEQ_SCHEMA, by n then count
    n_steady_steps: int
    n_kernels: int  # kernels of the steady windows
    kernel_ns: int  # their summed device time
    params: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"n_steady_steps": self.n_steady_steps, "n_kernels": self.n_kernels, "kernel_ns": self.kernel_ns,
                "params": self.params, "top": self.top.to_dicts()}

    def fusion_candidates(self) -> pl.DataFrame:
        """The fusable sequences (every kernel memory-bound), largest device time first, less those
        inside a longer candidate that occurs about as often (≥ 90 % as many times: ``a → b`` within
        ``a → b → c``, fusing the longer one fuses it too; a run of one op repeated gives every
        length a few times less often, and only its longest is kept)."""
        return self._fusion_candidates

    @functools.cached_property
    def _fusion_candidates(self) -> pl.DataFrame:
        # Built once per result: the summary, the tables and the unfused_elementwise rule read it.
        # Lazy: two polars queries where each eager step would be one.
        fusable = self.top.lazy().filter(pl.col("fusable")).with_columns(
            _key=pl.col("ops") + " | " + pl.col("sequence")).collect()
        f = fusable.lazy()
        if fusable.height > 1:
            pairs = f.select("n", "count", "ops", "sequence").join(
                f.select(pl.col("n").alias("_n2"), pl.col("count").alias("_c2"), pl.col("ops").alias("_o2"),
                         pl.col("sequence").alias("_s2")),
                how="cross").filter(
                (pl.col("_n2") > pl.col("n")) & (pl.col("_c2") >= _ABOUT_AS_OFTEN * pl.col("count"))
                & pl.col("_o2").str.contains(pl.col("ops"), literal=True)
                & pl.col("_s2").str.contains(pl.col("sequence"), literal=True))
            inside = pairs.select((pl.col("ops") + " | " + pl.col("sequence")).alias("_key")).unique()
            f = f.join(inside, on="_key", how="anti")
        return f.drop("_key").sort(["total_ns", "sequence"], descending=[True, False]).collect()

    def summary(self) -> list[tuple[str, str]]:
        # One line: the fusion candidate with the most device time, else the most frequent sequence.
        fus = self.fusion_candidates()
        if fus.height:
            r = fus.row(0, named=True)
            return [("Largest fusion candidate",
                     f"{r['ops']} ({r['count_per_step']:.1f} per step, {r['pct_of_kernel_time']:.1f} % of kernel "
                     f"time; kernels {r['sequence']})")]
        if self.top.is_empty():
            return []
        r = self.top.row(0, named=True)
        return [(f"Most frequent {r['n']}-kernel sequence",
                 f"{r['ops']} ({r['count_per_step']:.1f} per step, {r['pct_of_kernel_time']:.1f} % of kernel time; "
                 f"kernels {r['sequence']})")]

    def tables(self) -> dict[str, pl.DataFrame]:
        out: dict[str, pl.DataFrame] = {}
        fus = self.fusion_candidates()
        if fus.height:  # first: what a compiler would fuse, by device time
            out["Fusion candidates (memory-bound sequences)"] = fus.select(
                "sequence", "ops", "count_per_step", "pct_of_kernel_time", "gap_ns", "n")
        by_n = self.top.partition_by("n", maintain_order=True, as_dict=True)  # one split, not a filter per n
        for (n,), part in sorted(by_n.items()):
            out[f"Most frequent {n}-kernel sequences"] = part.drop("n")
        return out


def _ngrams(k: pl.DataFrame, n: int) -> pl.DataFrame:
    """Every n-gram of ``k`` (sorted by stream then start; ``_g`` numbers the streams):
    ``k0 … k{n-1}`` (kernel ids), ``window``, ``dur_ns`` (summed), ``span_ns``."""
    last = n - 1
    same = (pl.col("_g").shift(-last) == pl.col("_g")) & (pl.col("window").shift(-last) == pl.col("window"))
    return k.select(
        *[pl.col("nid").shift(-i).alias(f"k{i}") for i in range(n)],
        "window",
        pl.sum_horizontal([pl.col("dur_ns").shift(-i) for i in range(n)]).alias("dur_ns"),
        (pl.col("end_ns").shift(-last) - pl.col("ts_ns")).alias("span_ns"),
        same.alias("_ok"),
    ).filter(pl.col("_ok"))


@analysis("kernel_sequences", depends_on=("steps",), title="Kernel sequences", order=42,
          shared=("op_nesting", "kernel_norms"),
          params={"min_n": 3, "max_n": 5, "top_n": 20})
def kernel_sequences(ctx: AnalysisContext[TraceModel]) -> KernelSequencesResult:
    """The most frequent kernel n-grams per steady step, their device time and launching op."""
    model = ctx.model
    min_n, max_n, top_n = int(ctx.params.min_n), int(ctx.params.max_n), int(ctx.params.top_n)
    if min_n < 2 or max_n < min_n:
        raise NotApplicable(f"kernel_sequences needs 2 <= min_n <= max_n (min_n={min_n}, max_n={max_n})")
    if model.kernels.is_empty():
        raise NotApplicable("no GPU kernels in this trace")
    sr = ctx.need("steps", StepsResult)
    steady = sr.steady_windows()
    k = assign_steps(model.kernels.select("name", "ts_ns", "dur_ns", "end_ns", "device", "stream", "correlation",
                                          norm=kernel_norms(ctx.tables)),
                     sr, "ts_ns").filter(pl.col("window").is_in(steady))
    if k.height < min_n:
        raise NotApplicable(f"fewer than {min_n} kernels in the steady steps")
    # Launching CPU op of each kernel: runtime call (by correlation) → deepest cpu_op covering its start.
    rt = launch_calls(model)
    at = join_unique(k.select("correlation"), rt.select("correlation", "pid", "tid", "ts_ns"), "correlation")
    k = k.with_columns(cpu_op=model.cpu_ops["name"].gather(op_index(ctx.tables).lookup(at.select(
        "pid", "tid", "ts_ns"))) if model.cpu_ops.height else pl.lit(None, pl.String))
    # One id per (normalised name, launching op): the n-grams group by ids, not long strings.
    names = k.select("norm", "cpu_op").unique().sort("norm", "cpu_op", nulls_last=True).with_row_index(
        "nid").with_columns(klass=kernel_class(pl.col("norm")))
    k = (k.join(names.select("norm", "cpu_op", "nid"), on=["norm", "cpu_op"], how="left", nulls_equal=True)
         .sort("device", "stream", "ts_ns", maintain_order=True))
    k = k.with_columns(_g=pl.struct("device", "stream").rle_id())
    n_steps = max(len(steady), 1)
    kernel_ns = int(k["dur_ns"].sum())
    parts = []
    for n in range(min_n, max_n + 1):  # a handful of n values; each pass is vectorised
        grams = _ngrams(k, n)
        if grams.is_empty():
            continue
        keys = [f"k{i}" for i in range(n)]
        agg = grams.group_by(keys).agg(
            count=pl.len().cast(pl.Int64),
            steps=pl.col("window").n_unique().cast(pl.Int64),
            total_ns=pl.col("dur_ns").sum().cast(pl.Int64),
            gap_ns=(pl.col("span_ns") - pl.col("dur_ns")).clip(lower_bound=0).sum().cast(pl.Int64),
        ).with_columns(count_per_step=pl.col("count") / n_steps)
        top = agg.sort(
            [pl.col("count_per_step") >= 1, "count", "total_ns", *keys], descending=[True, True, True] + [False] * n
        ).head(top_n)
        # Names and classes of the few rows kept: one small join per position.
        for i in range(n):
            top = top.join(names.select(pl.col("nid").alias(f"k{i}"), pl.col("norm").alias(f"_n{i}"),
                                        pl.col("cpu_op").alias(f"_o{i}"), pl.col("klass").alias(f"_c{i}")),
                           on=f"k{i}", how="left")
        parts.append(top.select(
            pl.lit(n, pl.Int64).alias("n"),
            pl.concat_str([pl.col(f"_n{i}") for i in range(n)], separator=_SEP).alias("sequence"),
            pl.concat_str([pl.col(f"_o{i}").fill_null("?") for i in range(n)], separator=_SEP).alias("ops"),
            pl.concat_str([pl.col(f"_c{i}") for i in range(n)], separator="+").alias("classes"),
            pl.all_horizontal([pl.col(f"_c{i}").is_in(_MEMORY_BOUND) for i in range(n)]).alias("fusable"),
            "count", pl.col("count_per_step").round(3), "steps", "total_ns",
            (pl.col("total_ns") / n_steps).round(1).alias("ns_per_step"), "gap_ns",
            (pl.col("total_ns") * 100.0 / max(kernel_ns, 1)).round(3).alias("pct_of_kernel_time"),
            pl.col("_o0").alias("cpu_op"),
        ))
    if not parts:
        raise NotApplicable(f"no stream runs {min_n} kernels in one steady step")
    return KernelSequencesResult(
        top=pl.concat(parts).select(list(SEQ_SCHEMA)).cast(SEQ_SCHEMA),  # type: ignore[arg-type]  # polars' dict typing
        n_steady_steps=len(steady), n_kernels=k.height, kernel_ns=kernel_ns,
        params={"min_n": min_n, "max_n": max_n, "top_n": top_n},
    )
