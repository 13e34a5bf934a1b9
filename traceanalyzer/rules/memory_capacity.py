"""Peak device memory close to the device's capacity: one larger batch away from OOM.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules memory_capacity`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of
from traceanalyzer.units import device_name

#: How each inference engine sizes its KV-cache preallocation.
_ENGINE_MEMORY = {
    "vllm": "gpu_memory_utilization (default 0.9) of the device",
    "sglang": "--mem-fraction-static of the device",
    "tensorrt_llm": "kv_cache_free_gpu_memory_fraction (default 0.9) of the free memory",
}
_ENGINE_HINT = {
    "vllm": "LLM(model, gpu_memory_utilization=0.9)  # the KV-cache budget, by design",
    "sglang": "python -m sglang.launch_server --mem-fraction-static 0.85  # the KV-cache budget",
    "tensorrt_llm": "KvCacheConfig(free_gpu_memory_fraction=0.9)  # the KV-cache budget",
}


def _device_id(device: str) -> int | None:
    """``cuda:1`` → 1; ``cpu`` (host memory, no capacity) and unnamed devices → None."""
    kind, _, idx = device.rpartition(":")
    return int(idx) if kind and kind != "cpu" and idx.isdigit() else None


@rule("memory_capacity", needs=("trace_memory", "ops"), severity=Severity.WARNING,
      params={"max_pct": 90.0, "critical_pct": 97.0}, uses=("context",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Peak device memory close to the device's capacity: one larger batch away from OOM.

    Signal
        ``trace_memory`` (a trace recorded with ``profile_memory=True``): the peak of the
        allocator's ``Total Allocated`` per device, against the device's ``totalGlobalMem`` from
        the trace's ``deviceProperties`` (``ops``). Host memory (``cpu``) has no capacity and is
        left out. Snapshots record no capacity (only an OOM's ``device_free``): the ``oom`` rule
        covers them. Cannot decide (not run) when no device with ``[memory]`` events has a known
        capacity.
    Threshold
        peak allocated ≥ ``max_pct`` (90) % of capacity → WARNING (tb_plugin's 0.9);
        ≥ ``critical_pct`` (97) % → CRITICAL. Peak reserved is evidence only (the caching
        allocator releases its cache before it gives up).
    Cost
        The bytes above the ``max_pct`` line, peak allocated − ``max_pct`` % × capacity: what must
        be saved to get back under it. Confidence 0.9: ``totalGlobalMem`` includes what the CUDA
        context and other processes hold, so the real headroom is smaller than shown.
    Inference engines
        When ``context`` names an inference engine (vLLM, SGLang, TensorRT-LLM), the peak is its
        KV-cache preallocation (a configured fraction of the device, by design): the finding is
        INFO, without a cost, and says so.
    Fix
        Lower the peak: activation checkpointing, bf16 autocast, a smaller micro-batch with
        gradient accumulation, FSDP/ZeRO sharding of parameters and optimizer state.
    """
    tm, o = results.need("trace_memory", TraceMemoryResult), results.need("ops", OpsResult)
    devices = [d for d in tm.per_device["device"].to_list() if _device_id(str(d)) is not None]
    if not devices:
        raise NotApplicable("only host (cpu) [memory] events: no device memory to compare with a capacity")
    ctx = context_of(results)
    engine = ctx.inference_engine if ctx is not None else None
    known = False
    for r in tm.per_device.filter(pl.col("device").is_in(devices)).iter_rows(named=True):
        dev = o.device(_device_id(str(r["device"])))
        cap = int((dev or {}).get("total_bytes") or 0)
        if cap <= 0:
            continue
        known = True
        peak = int(r["peak_allocated_bytes"] or 0)
        pct = peak * 100.0 / cap
        if pct < params.max_pct:
            continue
        sev = Severity.CRITICAL if pct >= params.critical_pct else Severity.WARNING
        title = (f"{device_name(str(r['device']))} peaks at {pct:.1f} % of its {cap / 2**30:.1f} GiB"
                 + (f" (in {r['peak_op']})" if r.get("peak_op") else ""))
        fix = ("Lower the peak: activation checkpointing (torch.utils.checkpoint), bf16 autocast, a smaller "
               "micro-batch with gradient accumulation, FSDP/ZeRO sharding of parameters and optimizer state.")
        hint = "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)"
        cost: int | None = max(int(peak - cap * params.max_pct / 100.0), 0)
        if engine:
            # The engine fills the device with its KV cache on purpose: not a capacity problem.
            sev, cost = Severity.INFO, None
            title += f": {engine}'s KV-cache preallocation, by design, not a capacity problem"
            fix = (f"Nothing to fix for capacity: {engine} preallocates its KV cache up to "
                   f"{_ENGINE_MEMORY.get(engine, 'its configured memory fraction')} at start-up, so the peak sits "
                   "near capacity by design. Lower that fraction only to share the device with another process; "
                   "a larger KV cache (higher fraction) serves more concurrent sequences.")
            hint = _ENGINE_HINT.get(engine, "")
        yield Finding(
            rule_id="memory_capacity", severity=sev,
            title=title,
            evidence={"inference_engine": engine, "device": r["device"], "device_name": (dev or {}).get("name"),
                      "capacity_bytes": cap,
                      "peak_allocated_bytes": peak, "peak_reserved_bytes": r["peak_reserved_bytes"],
                      "peak_op": r.get("peak_op"), "pct_of_capacity": round(pct, 2),
                      "top_allocating_ops": tm.top_ops.filter(pl.col("device") == r["device"]).head(5).to_dicts(),
                      "top_allocating_sites": tm.top_sites.filter(pl.col("device") == r["device"]).head(5).to_dicts()},
            fix=fix,
            code_hint=hint,
            cost_bytes=cost,
            confidence=0.9,
        )
    if not known:
        raise NotApplicable(f"device memory capacity unknown: no totalGlobalMem in deviceProperties for "
                            f"{', '.join(device_name(str(d)) for d in devices)}")
