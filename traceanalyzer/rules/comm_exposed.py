"""Communication not hidden behind compute, or dominating the step.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules comm_exposed`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import polars as pl

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, pct_of_step, per_step_ns, severity_for, steady, time_finding, top_rows


@rule("comm_exposed", needs=("steps", "gpu_time", "kernels"), severity=Severity.WARNING,
      params={"max_exposed_pct": 5.0, "max_comm_pct": 10.0, "critical_pct": 30.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Communication not hidden behind compute, or dominating the step.

    Signal
        ``gpu_time``: exposed communication per steady step (collective kernels running while
        no compute kernel runs on the device; per device, the device where it is largest);
        ``kernels``: summed collective-kernel time of the steady steps (``per_step.comm_ns``,
        overlapped or not). Overlap = 1 − exposed / communication, both summed over devices.
        No collective kernel in the steady steps: nothing to say.
    Threshold
        exposed ≥ ``max_exposed_pct`` (5) % of the median step → "not overlapped" (TraceLens:
        exposed comm > 5 % of GPU time, overlap < 70 %), WARNING, CRITICAL from
        ``critical_pct`` (30) %. Otherwise communication per device ≥ ``max_comm_pct`` (10) %
        of the step → "dominant" (tb_plugin's 10 %), INFO.
    Cost
        The exposed communication per steady step on that device (confidence 0.6: it includes
        time spent inside NCCL/RCCL waiting for slower ranks; ``traceanalyzer batch`` on all
        ranks separates that out as ``rank_imbalance``).
    Fix
        Overlap: DDP ``bucket_cap_mb``, FSDP prefetch, ``no_sync()`` during gradient
        accumulation; reduce volume: bf16 gradients / compression hooks, larger batch.
    """
    k = results["kernels"]
    kper = steady(k.per_step, results)
    comm_total = per_step_ns(kper, "comm_ns", results) if "comm_ns" in kper.columns else 0.0
    if comm_total <= 0:
        return
    per = steady(results["gpu_time"].per_step, results)
    devices = per["device"].unique().sort().to_list()
    exposed, dev, exposed_all = 0.0, None, 0.0
    for d in devices:
        v = per_step_ns(per.filter(pl.col("device") == d), "communication_ns", results)
        exposed_all += v
        if v > exposed:
            exposed, dev = v, d
    # Communication per device: a multi-GPU process sums every device's collectives.
    comm_ns = comm_total / max(len(devices), 1)
    exp_pct = pct_of_step(exposed, results) or 0.0
    comm_pct = pct_of_step(comm_ns, results) or 0.0
    overlap = round(max(0.0, 100.0 * (1 - exposed_all / comm_total)), 1)
    comm = k.by_name.filter(pl.col("is_comm"))
    ev = {"device": dev, "exposed_ms_per_step": ms(exposed), "comm_ms_per_step": ms(comm_ns),
          "exposed_pct_of_step": exp_pct, "comm_pct_of_step": comm_pct, "overlap_pct": overlap,
          "top_collectives_in_trace": top_rows(comm, 5, ("name", "count", "total_ns", "mean_ns"))}
    fix = ("Overlap communication with backward compute: tune DDP bucket_cap_mb, enable FSDP "
           "forward/backward prefetch, use no_sync() during gradient accumulation; reduce the volume "
           "(bf16 gradients, a compression comm hook) or communicate less often (larger batch). If other "
           "ranks are slower, this rank's collectives include waiting for them: run `traceanalyzer batch` "
           "on every rank's trace.")
    hint = "model = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=True)"
    if exp_pct >= params.max_exposed_pct:
        yield time_finding(
            "comm_exposed", severity_for(exp_pct, params.max_exposed_pct, params.critical_pct, Severity.WARNING),
            f"Communication not overlapped: {ms(exposed)} ms/step of collectives with no compute under them "
            f"({exp_pct:.1f} % of the step; {overlap:.1f} % of the communication is overlapped)",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
    elif comm_pct >= params.max_comm_pct:
        yield time_finding(
            "comm_exposed", Severity.INFO,
            f"Communication is {comm_pct:.1f} % of the step ({ms(comm_ns)} ms/step), {overlap:.1f} % of it "
            "overlapped with compute",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
