"""Many host-to-device copies inside every step: data created on the CPU, moved each step.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules htod_in_step`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import fmt_count, ms, n_steady, pct_of_step, per_step_ns, steady, time_finding


@rule("htod_in_step", needs=("steps", "copies"), severity=Severity.INFO,
      params={"max_per_step": 10.0, "max_pct_of_step": 5.0, "min_count_for_time": 3.0}, uses=("gpu_time",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Many host-to-device copies inside every step: data created on the CPU, moved each step.

    Signal
        ``copies``: copies (copy ops and loose memcpys) whose direction includes ``HtoD``
        inside the steady steps, their count, bytes and GPU + CPU time per step.
    Threshold
        more than ``max_per_step`` (10) per step (TraceLens's > 10 transfers), or their cost
        ≥ ``max_pct_of_step`` (5) % of the median step (TraceLens's > 5 %) with at least
        ``min_count_for_time`` (3) per step. The input batch is one or two copies per step: left
        to ``pageable_memcpy`` / ``dataloader_bottleneck``. WARNING from ``max_pct_of_step``,
        else INFO.
    Cost
        GPU time that creating the data on the device would remove: the GPU time of the copies
        that do not block the host, per steady step, capped by the copy time the GPU did not
        hide under kernels (``gpu_time``'s exposed ``memcpy`` of the primary device; confidence
        0.4). Their CPU launch time is evidence, not cost (a CPU issuing copies to a busy GPU
        loses nothing). Host-blocking copies (pageable memory, synchronous APIs) are counted but
        priced by ``pageable_memcpy`` / ``blocking_copies``, not twice (the title gives the GPU
        time of all of them).
    Fix
        Create tensors directly on the device (``torch.zeros(..., device="cuda")``), cache
        constants/masks/tables on the GPU once, move the whole batch in one call.
    """
    c = results.need("copies", CopiesResult)
    cp = steady(c.copies, results, by="step").filter(pl.col("direction").str.contains("HtoD").fill_null(False))
    if cp.is_empty():
        return
    n = n_steady(results)
    count = cp.height / n
    free = cp.filter(~pl.col("host_blocking").fill_null(False))
    gpu = float(free["gpu_ns"].fill_null(0).sum()) / n
    cpu = float(free["cpu_ns"].fill_null(0).sum()) / n
    cost = gpu
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is not None and gt.per_device.height:
        dev = gt.per_device.sort(["busy_ns", "device"], descending=[True, False])["device"][0]
        cost = min(gpu, per_step_ns(gt.per_step.filter(pl.col("device") == dev), "memcpy_ns", results))
    every = float(cp["gpu_ns"].fill_null(0).sum()) / n
    pct = pct_of_step(cost, results) or 0.0
    if count <= params.max_per_step and (count < params.min_count_for_time or pct < params.max_pct_of_step):
        return
    top = (cp.group_by("site", "op").agg(count=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum(),
                                         gpu_ns=pl.col("gpu_ns").sum(), cpu_ns=pl.col("cpu_ns").sum())
           .sort(["count", "site"], descending=[True, False], nulls_last=True).head(5).to_dicts())
    sev = Severity.WARNING if pct >= params.max_pct_of_step else Severity.INFO
    yield time_finding(
        "htod_in_step", sev,
        f"{fmt_count(count)} host-to-device copies per step ({ms(every)} ms/step of GPU copy time)",
        {"copies_per_step": round(count, 2), "bytes_per_step": int(float(cp["bytes"].fill_null(0).sum()) / n),
         "host_blocking_per_step": round((cp.height - free.height) / n, 2), "copy_gpu_ms_per_step": ms(every),
         "gpu_ms_per_step": ms(gpu), "cpu_launch_ms_per_step": ms(cpu), "top_call_sites": top,
         "stack_hint": c.stack_hint},
        "Create tensors directly on the device, cache constants (masks, position ids, lookup tables) on the "
        "GPU once outside the loop, and move each batch with a single pinned, non_blocking copy.",
        "mask = torch.ones(n, device='cuda')  # not torch.ones(n).cuda() every step",
        cost, results, confidence=0.4,
    )
