"""``nn.DataParallel`` on several GPUs: use DistributedDataParallel.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules data_parallel`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule


@rule("data_parallel", needs=("ops",), severity=Severity.WARNING, params={"min_devices": 2}, uses=("gpu_time",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """``nn.DataParallel`` on several GPUs: use DistributedDataParallel.

    Signal
        ``ops``: ``DataParallel.forward`` ops/annotations (the ``record_function`` DataParallel
        opens) or ``nn.Module: DataParallel_*`` frames (``DistributedDataParallel`` does not
        count), and the devices that ran kernels/copies/memsets (``ops.devices`` /
        ``gpu_time``).
    Threshold
        any DataParallel call with at least ``min_devices`` (2) devices busy (tb_plugin's
        rule). DataParallel on one device is a no-op wrapper: not reported.
    Cost
        Not estimated (DataParallel's single-process scatter/gather and GIL contention depend
        on the model); severity WARNING, confidence 0.9.
    Fix
        One process per GPU with ``DistributedDataParallel`` (``torchrun``).
    """
    o = results.need("ops", OpsResult)
    used = [d for d in o.devices if d.get("used")]
    n_used = len(used)
    gt = results.typed("gpu_time", GpuTimeResult)
    if gt is not None:
        n_used = max(n_used, gt.per_device.height)
    if not o.data_parallel or n_used < params.min_devices:
        return
    yield Finding(
        rule_id="data_parallel", severity=Severity.WARNING,
        title=f"nn.DataParallel drives {n_used} GPUs from one process: use DistributedDataParallel",
        evidence={"data_parallel_calls": o.data_parallel, "devices_used": n_used},
        fix="Run one process per GPU with DistributedDataParallel (launch with torchrun): no per-step "
            "scatter/replicate/gather and no GIL contention between GPUs.",
        code_hint="model = torch.nn.parallel.DistributedDataParallel(model.to(rank), device_ids=[rank])",
        confidence=0.9,
    )
