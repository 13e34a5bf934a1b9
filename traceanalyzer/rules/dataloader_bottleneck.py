"""The step waits for input data (DataLoader), including a single-process loader.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules dataloader_bottleneck`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._hostsync import primary_device
from traceanalyzer.rules._util import ms, pct_of_step, per_step_ns, severity_for, steady, time_finding


@rule("dataloader_bottleneck", needs=("steps", "ops"), severity=Severity.WARNING,
      params={"min_pct_of_step": 5.0, "warning_pct": 10.0, "critical_pct": 30.0}, uses=("gpu_time", "idle_gaps"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """The step waits for input data (DataLoader), including a single-process loader.

    Signal
        ``ops``: the union of ``enumerate(DataLoader)#…`` / ``enumerate(DataPipe)#…`` ranges
        inside each steady step window, averaged over the steady steps; the iterator name
        (``_SingleProcessDataLoaderIter`` means ``num_workers=0``: batches are produced on
        the training thread). A trace without any such range cannot show where input comes
        from: the check does not run (it is listed with that reason).
    Threshold
        data loading ≥ ``min_pct_of_step`` (5) % of the median steady step (tb_plugin's 0.05).
        INFO below ``warning_pct`` (10) %, WARNING from it, CRITICAL from ``critical_pct``
        (30) %; with a single-process loader at least WARNING.
    Cost
        With GPU activity: GPU time lost — the idle of the ``idle_gaps`` gaps whose cause is
        ``data_loader`` (a DataLoader range overlapped the gap more than any sync or blocking
        copy) on the primary device, capped per step by the time in the DataLoader, per steady
        step (confidence 0.9); without ``idle_gaps``,
        tb_plugin's exclusive "dataloader" time (data loading while nothing else runs). Data
        loading while the GPU is busy costs nothing. CPU-only trace: the data-loading time
        itself (the CPU is the device, confidence 0.7). The time in the DataLoader is evidence.
    Fix
        ``DataLoader(num_workers=N, persistent_workers=True, prefetch_factor=…)`` (and
        ``pin_memory=True`` when training on a GPU); cheaper decoding/augmentation or on the GPU.
    """
    o = results.need("ops", OpsResult)
    if not o.dataloader_iters:
        raise NotApplicable("no DataLoader ranges (enumerate(DataLoader)#… / enumerate(DataPipe)#…) in this trace")
    dl = per_step_ns(o.dataloader, "dataloader_ns", results)
    pct = pct_of_step(dl, results) or 0.0
    if pct < params.min_pct_of_step:
        return
    single = any("SingleProcess" in n for n in o.dataloader_iters)
    cost, conf = dl, 0.7
    gt = results.typed("gpu_time", GpuTimeResult)
    on_gpu = gt is not None
    ig = results.typed("idle_gaps", IdleGapsResult)
    dev = primary_device(results)
    if on_gpu and ig is not None and dev is not None and "data_loader_ns" in ig.per_step.columns:
        # per step, capped by the time in the DataLoader: a gap the loader overlaps can be longer
        # than the loading (the CPU idled before it too), and a faster loader gives back no more
        rows = ig.per_step.filter(pl.col("device") == dev).select("window", "data_loader_ns").join(
            o.dataloader.select("window", "dataloader_ns"), on="window", how="left").select(
            "window", pl.min_horizontal("data_loader_ns", pl.col("dataloader_ns").fill_null(0)).alias("owned_ns"))
        cost, conf = per_step_ns(rows, "owned_ns", results), 0.9
    elif gt is not None and gt.tb_breakdown.height and "dataloader_ns" in gt.tb_breakdown.columns:
        cost, conf = per_step_ns(gt.tb_breakdown, "dataloader_ns", results), 0.9
    by_step = steady(o.dataloader, results).sort("window")
    worst = by_step.sort(["dataloader_ns", "window"], descending=[True, False]).row(0, named=True)
    sev = severity_for(pct, params.warning_pct, params.critical_pct, Severity.WARNING if single else Severity.INFO)
    what = ", single-process loader (num_workers=0)" if single else ""
    peak = ""
    if worst["step"] is not None and by_step.height > 1 and worst["dataloader_ns"] >= 2 * dl:
        peak = f"; up to {ms(worst['dataloader_ns'])} ms on step #{worst['step']}"
    pin = "pin_memory=True, " if on_gpu else ""
    fix = (("Load data in worker processes: DataLoader(num_workers=N) with N about the CPU cores per GPU, "
            if single else "Give the DataLoader more or faster workers (num_workers) ")
           + f"with {pin}persistent_workers=True and prefetch_factor=2–4; make decoding/augmentation cheaper "
           + ("or move it to the GPU." if on_gpu else "or cache preprocessed data."))
    yield time_finding(
        "dataloader_bottleneck", sev,
        f"The step waits for input data: {ms(dl)} ms/step in the DataLoader ({pct:.1f} % of the median step)"
        f"{what}{peak}",
        {"dataloader_ms_per_step": ms(dl), "pct_of_step": pct, "gpu_idle_owned_ms_per_step": ms(cost),
         "dataloader_ms_by_step": {str(s): ms(v) for s, v in by_step.select("step", "dataloader_ns").iter_rows()},
         "iterators": list(o.dataloader_iters), "single_process": single},
        fix,
        f"DataLoader(ds, batch_size=B, num_workers=8, {pin}persistent_workers=True)",
        cost, results, confidence=conf,
    )
