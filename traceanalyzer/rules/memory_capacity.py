"""Peak device memory close to the device's capacity: one larger batch away from OOM.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules memory_capacity`` prints.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule


@rule("memory_capacity", needs=("trace_memory", "ops"), severity=Severity.WARNING,
      params={"max_pct": 90.0, "critical_pct": 97.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """Peak device memory close to the device's capacity: one larger batch away from OOM.

    Signal
        ``trace_memory`` (``profile_memory=True``): peak ``Total Allocated`` per device, against
        ``totalGlobalMem`` from ``deviceProperties`` (``ops``). Snapshots do not record the
        device's capacity (only an OOM's ``device_free``): the ``oom`` rule covers them.
    Threshold
        peak allocated ≥ ``max_pct`` (90) % of capacity → WARNING (tb_plugin's 0.9); ≥
        ``critical_pct`` (97) % → CRITICAL. Peak reserved is shown as evidence (the caching
        allocator may hold more than is allocated).
    Cost
        Bytes above the ``max_pct`` line (what must be saved to get back under it).
    Fix
        Activation checkpointing, AMP (bf16 activations), smaller micro-batch with gradient
        accumulation, FSDP/ZeRO sharding, CPU offload.
    """
    tm, o = results["trace_memory"], results["ops"]
    known = False
    for r in tm.per_device.iter_rows(named=True):
        m = re.match(r"^[a-z0-9]+:(\d+)$", str(r["device"]))
        if not m or str(r["device"]).startswith("cpu"):
            continue
        dev = o.device(int(m.group(1)))
        cap = (dev or {}).get("total_bytes")
        if not cap:
            continue
        known = True
        peak = int(r["peak_allocated_bytes"] or 0)
        pct = peak * 100.0 / cap
        if pct < params.max_pct:
            continue
        sev = Severity.CRITICAL if pct >= params.critical_pct else Severity.WARNING
        yield Finding(
            rule_id="memory_capacity", severity=sev,
            title=f"{r['device']} peaks at {pct:.1f} % of its {cap / 2**30:.1f} GiB"
                  + (f" (in {r['peak_op']})" if r.get("peak_op") else ""),
            evidence={"device": r["device"], "device_name": (dev or {}).get("name"), "capacity_bytes": cap,
                      "peak_allocated_bytes": peak, "peak_reserved_bytes": r["peak_reserved_bytes"],
                      "peak_op": r.get("peak_op"), "pct_of_capacity": round(pct, 2),
                      "top_allocating_ops": tm.top_ops.head(5).to_dicts()},
            fix="Lower the peak: activation checkpointing (torch.utils.checkpoint), bf16 autocast, a smaller "
                "micro-batch with gradient accumulation, FSDP/ZeRO sharding of parameters and optimizer state.",
            code_hint="from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)",
            cost_bytes=max(int(peak - cap * params.max_pct / 100.0), 0),
            confidence=0.9,
        )
    if not known:
        raise NotApplicable("device memory capacity unknown (no totalGlobalMem in deviceProperties "
                            "for the devices with [memory] events)")
