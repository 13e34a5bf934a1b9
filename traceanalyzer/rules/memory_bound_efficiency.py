"""Memory-bound operations (elementwise, normalisation, softmax, copies, embedding) far below the
device's memory bandwidth.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules memory_bound_efficiency`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, withhold_on_capture
from traceanalyzer.rules._util import ms, pct_of_step, time_finding


@rule("memory_bound_efficiency", needs=("steps", "efficiency"), uses=("context",), severity=Severity.INFO,
      params={"max_pct_of_bandwidth": 30.0, "target_pct_of_roofline": 70.0, "min_pct_of_step": 2.0,
              "min_kernel_us": 3.0})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Memory-bound operations moving their bytes far below the device's memory bandwidth.

    Signal
        ``efficiency``: the vector-unit operations of the steady steps that sit under the memory
        roof (``bound`` = memory: elementwise, reductions, normalisation, softmax, copies,
        embedding), per op name and precision: achieved GB/s against the device's bandwidth
        (``pct_of_bandwidth``) and their roofline time. Matrix work (GEMM, convolution, attention)
        is ``gemm_efficiency``'s, even when its intensity puts it under the memory roof.
        Withheld on a capture-only trace (``context.capture_only``): kernels recorded under
        stream capture did not run.
    Threshold
        ``pct_of_bandwidth`` < ``max_pct_of_bandwidth`` (30) % for an op name, and the saving
        below ≥ ``min_pct_of_step`` (2) % of the median step.
    Cost
        The time per steady step that running those ops at ``target_pct_of_roofline`` (70) % of
        the roofline would save: Σ max(0, time − max(roof time ÷ 0.7, kernels × ``min_kernel_us``
        (3 µs))) ÷ steady steps (70 %: what PyTorch's vectorised elementwise kernels reach on
        large tensors; no kernel runs in less than a few µs, so what small tensors lose beyond
        that floor is only won back by fusing them). Confidence 0.4.
    Fix
        Fuse chains of elementwise/normalisation ops (``torch.compile``; fused LayerNorm/RMSNorm
        kernels; ``foreach``/fused optimizers), avoid dtype round trips (casts are copies), and keep
        tensors contiguous. A compiled run already fuses: look at the ops left outside its graphs.
    """
    withhold_on_capture(results, "memory-bound efficiency")  # kernels recorded under capture did not run
    e = results.need("efficiency", EfficiencyResult)
    if not e.peaks.get("mem_bw_tbs"):
        return
    rows = e.ops.filter(pl.col("steady") & (pl.col("bound") == "memory") & (pl.col("unit") == "vector"))
    if rows.is_empty():
        return
    frac = max(float(params.target_pct_of_roofline), 1.0) / 100.0
    floor = pl.col("kernels") * float(params.min_kernel_us) * 1e3  # no kernel runs in less than a few µs
    target = pl.max_horizontal(pl.col("roof_ns") / frac, floor)
    rows = rows.with_columns(saving_ns=(pl.col("kernel_ns") - target).clip(lower_bound=0))
    bw = float(e.peaks["mem_bw_tbs"])
    by = rows.group_by("op", "precision").agg(
        calls=pl.len(), kernel_ns=pl.col("kernel_ns").sum(), bytes=pl.col("bytes").sum(),
        saving_ns=pl.col("saving_ns").sum(),
    ).with_columns(pct_of_bandwidth=pl.col("bytes") / pl.col("kernel_ns") / (bw * 1e3) * 100).sort(
        "saving_ns", descending=True)
    low = by.filter(pl.col("pct_of_bandwidth") < params.max_pct_of_bandwidth)
    if low.is_empty():
        return
    n = e.n_steady
    saving = float(low["saving_ns"].sum()) / n
    pct = pct_of_step(saving, results)
    if pct is None or pct < params.min_pct_of_step:
        return
    ctx = context_of(results)
    compiled = bool(ctx is not None and ctx.compiled)
    top = low.row(0, named=True)
    fix = ("Fuse the chains of small memory-bound ops (elementwise, norms, casts) so each tensor is read and "
           "written once: " + ("the run is compiled, so look at the ops left outside the compiled graphs "
                               "(graph breaks) and at eager fallbacks." if compiled else
                               "torch.compile fuses them; use fused LayerNorm/RMSNorm and fused optimizers; "
                               "avoid dtype round trips."))
    yield time_finding(
        "memory_bound_efficiency", Severity.INFO,
        f"Memory-bound ops move data at {top['pct_of_bandwidth']:.0f} % of the memory bandwidth ({top['op']}); "
        f"reaching {frac * 100:.0f} % of the roofline would save {ms(saving)} ms/step",
        {"device": e.peaks.get("device"), "mem_bw_tbs": bw,
         "ops": [{"op": r["op"], "precision": r["precision"], "calls_per_step": round(r["calls"] / n, 2),
                  "ms_per_step": ms(r["kernel_ns"] / n), "pct_of_bandwidth": round(float(r["pct_of_bandwidth"]), 2),
                  "saving_ms_per_step": ms(r["saving_ns"] / n)} for r in low.head(6).iter_rows(named=True)],
         "target_pct_of_roofline": frac * 100, "compiled": compiled},
        fix, "model = torch.compile(model)  # fuses elementwise chains into one kernel each",
        saving, results, confidence=0.4,
    )
