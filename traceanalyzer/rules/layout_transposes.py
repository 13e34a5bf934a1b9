"""NCHW↔NHWC layout transposes around convolutions: use channels_last.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules layout_transposes`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, n_steady, time_finding, top_rows

CONV_KERNEL_RE = r"(?i)conv|fprop|dgrad|wgrad|igemm|implicit|winograd|scudnn"


@rule("layout_transposes", needs=("steps", "ops", "kernels"), severity=Severity.INFO,
      params={"min_pct_of_conv": 5.0, "warning_pct": 10.0})
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """NCHW↔NHWC layout transposes around convolutions: use channels_last.

    Signal
        ``ops``: kernels classed ``layout_transpose`` (cuDNN ``nchwToNhwcKernel`` /
        ``nhwcToNchwKernel``, MIOpen ``batched_transpose_*``, by name) against the time of
        convolution kernels (GEMM-class kernels whose name says conv/fprop/dgrad/wgrad/igemm/
        implicit/winograd), both over the steady steps. No convolution kernels: silent.
    Threshold
        transpose time ≥ ``min_pct_of_conv`` (5) % of convolution time → INFO, ≥
        ``warning_pct`` (10) % → WARNING (TraceLens: 10–20 % moderate, > 20 % high).
    Cost
        Transpose time per steady step (confidence 0.7: channels_last removes them if the whole
        network, input included, is converted).
    Fix
        ``model = model.to(memory_format=torch.channels_last)`` and the same for inputs,
        ideally with AMP.
    """
    kc = results.need("ops", OpsResult).kernel_classes
    tr = kc.filter((pl.col("klass") == "layout_transpose") & (pl.col("steady_ns") > 0))
    conv = kc.filter((pl.col("klass") == "gemm") & pl.col("name").str.contains(CONV_KERNEL_RE)
                     & (pl.col("steady_ns") > 0))
    if tr.is_empty() or conv.is_empty():
        return
    t_ns, c_ns = float(tr["steady_ns"].sum()), float(conv["steady_ns"].sum())
    share = t_ns * 100.0 / c_ns
    if share < params.min_pct_of_conv:
        return
    n = n_steady(results)
    sev = Severity.WARNING if share >= params.warning_pct else Severity.INFO
    yield time_finding(
        "layout_transposes", sev,
        f"Layout transposes cost {share:.0f} % of convolution time ({ms(t_ns / n)} ms/step): "
        "the network runs NCHW",
        {"transpose_ms_per_step": ms(t_ns / n), "conv_ms_per_step": ms(c_ns / n),
         "pct_of_conv_time": round(share, 1), "transposes_per_step": round(float(tr["steady_count"].sum()) / n, 2),
         "transpose_kernels": top_rows(tr.sort("steady_ns", descending=True), 5,
                                       ("name", "steady_count", "steady_ns"))},
        "Convert the model and its inputs to channels_last so cuDNN/MIOpen run NHWC convolutions without "
        "transposing around each of them (best with AMP).",
        "model = model.to(memory_format=torch.channels_last)\nx = x.to(memory_format=torch.channels_last)",
        t_ns / n, results, confidence=0.7,
    )
