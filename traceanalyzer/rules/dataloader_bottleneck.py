"""The step waits for input data (DataLoader), including a single-process loader.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules dataloader_bottleneck`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, pct_of_step, per_step_ns, severity_for, time_finding


@rule("dataloader_bottleneck", needs=("steps", "ops"), severity=Severity.WARNING,
      params={"min_pct_of_step": 5.0, "critical_pct": 30.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """The step waits for input data (DataLoader), including a single-process loader.

    Signal
        ``ops``: the union of ``enumerate(DataLoader)#…`` / ``enumerate(DataPipe)#…`` ranges
        inside each steady step; the iterator name (``_SingleProcessDataLoaderIter`` means
        ``num_workers=0``: batches are produced on the training thread).
    Threshold
        data loading ≥ ``min_pct_of_step`` (5) % of the median step (tb_plugin's 0.05).
        WARNING from 5 %, CRITICAL from ``critical_pct`` (30) %; a single-process loader is
        at least a WARNING.
    Cost
        With GPU activity: tb_plugin's exclusive "dataloader" time (data loading while no
        kernel, copy, runtime call or collective runs: the GPU truly waited), confidence 0.9.
        CPU-only: the data-loading time itself, confidence 0.7.
    Fix
        ``DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=…)``;
        faster decoding/augmentation; move augmentation to the GPU.
    """
    o = results["ops"]
    if not o.dataloader_iters:
        return
    dl = per_step_ns(o.dataloader, "dataloader_ns", results)
    pct = pct_of_step(dl, results) or 0.0
    if pct < params.min_pct_of_step:
        return
    single = any("SingleProcess" in n for n in o.dataloader_iters)
    cost, conf = dl, 0.7
    gt = results.get("gpu_time")
    if gt is not None and gt.tb_breakdown.height and "dataloader_ns" in gt.tb_breakdown.columns:
        cost, conf = per_step_ns(gt.tb_breakdown, "dataloader_ns", results), 0.9
    sev = severity_for(pct, params.min_pct_of_step, params.critical_pct, Severity.WARNING if single else Severity.INFO)
    what = " with a single-process loader (num_workers=0)" if single else ""
    yield time_finding(
        "dataloader_bottleneck", sev,
        f"Data loading takes {pct:.0f} % of the step ({ms(dl)} ms/step){what}",
        {"dataloader_ms_per_step": ms(dl), "pct_of_step": pct, "exposed_ms_per_step": ms(cost),
         "iterators": list(o.dataloader_iters), "single_process": single},
        ("Load data in worker processes: DataLoader(num_workers=N) with N ≈ CPU cores per GPU, "
         if single else "Give the DataLoader more or faster workers (num_workers, ") +
        ("pin_memory=True, persistent_workers=True, prefetch_factor=2–4); make decoding/augmentation "
         "cheaper or move it to the GPU."),
        "DataLoader(ds, batch_size=B, num_workers=8, pin_memory=True, persistent_workers=True)",
        cost, results, confidence=conf,
    )
