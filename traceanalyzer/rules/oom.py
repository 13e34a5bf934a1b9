"""An out-of-memory error happened: what was requested, what filled the device, and why.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules oom`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIX = {
    "fragmentation": ("The device had room but in pieces: let the allocator grow segments instead of splitting "
                      "them (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), avoid torch.cuda.empty_cache() in "
                      "the loop, and pad variable shapes to a few bucket sizes."),
    "capacity": ("Live tensors filled the device: cut the peak with activation checkpointing, bf16 autocast, a "
                 "smaller micro-batch with gradient accumulation, or FSDP/ZeRO sharding; free what the top call "
                 "sites hold longer than needed."),
}


@rule("oom", needs=(), severity=Severity.CRITICAL)
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """An out-of-memory error happened: what was requested, what filled the device, and why.

    Signal
        Snapshot (``memory_oom``): the allocator's ``oom`` event — requested bytes, free device
        memory, allocated/reserved then, and the verdict (``fragmentation`` when cached free
        memory alone exceeded the request, else ``capacity``) with the call sites live then.
        Trace (``trace_memory``): ``[OutOfMemory]`` events. A snapshot without allocation
        history cannot tell; a trace without ``[memory]`` events neither.
    Threshold
        any OOM → CRITICAL.
    Cost
        Snapshot: the bytes that did not fit (request − device free − cached free, at least the
        request's shortfall); trace: the peak allocated.
    Fix
        fragmentation: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; capacity:
        activation checkpointing, AMP, smaller batch, sharding.
    """
    mo = results.get("memory_oom") if hasattr(results, "get") else None
    if mo is not None:
        free = mo.device_free_bytes or 0
        short = max(mo.requested_bytes - free - (mo.cached_free_bytes if mo.verdict == "fragmentation" else 0), 0)
        yield Finding(
            rule_id="oom", severity=Severity.CRITICAL,
            title=f"Out of memory on cuda:{mo.device}: {mo.requested_bytes / 2**20:,.1f} MiB requested with "
                  f"{free / 2**20:,.1f} MiB free ({mo.verdict})",
            evidence={"requested_bytes": mo.requested_bytes, "device_free_bytes": mo.device_free_bytes,
                      "allocated_bytes": mo.allocated_bytes, "reserved_bytes": mo.reserved_bytes,
                      "cached_free_bytes": mo.cached_free_bytes, "verdict": mo.verdict, "n_ooms": mo.n_ooms,
                      "failing_site": mo.failing_site, "top_sites": mo.top_sites.head(5).to_dicts(),
                      "categories": mo.categories.to_dicts()},
            fix=_FIX[mo.verdict],
            code_hint="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py"
            if mo.verdict == "fragmentation" else "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
            cost_bytes=max(short, mo.requested_bytes if short == 0 and mo.verdict == "capacity" else short),
            confidence=1.0,
        )
        return
    tm = results.get("trace_memory") if hasattr(results, "get") else None
    if tm is not None:
        if tm.n_ooms:
            peak = int(tm.per_device["peak_allocated_bytes"].max() or 0) if tm.per_device.height else 0
            yield Finding(
                rule_id="oom", severity=Severity.CRITICAL,
                title=f"{tm.n_ooms} out-of-memory event(s) during the profile",
                evidence={"n_ooms": tm.n_ooms, "per_device": tm.per_device.to_dicts()},
                fix=_FIX["capacity"] + " Record a memory snapshot to see what filled the device.",
                code_hint="torch.cuda.memory._record_memory_history(); ...; "
                          "torch.cuda.memory._dump_snapshot('oom.pickle')",
                cost_bytes=peak, confidence=0.9,
            )
        return
    if "memory_timeline" in results:
        tl = results["memory_timeline"]
        if not tl.history:
            raise NotApplicable("the snapshot has no allocation history: record it with "
                                "torch.cuda.memory._record_memory_history() to see OOM events")
        return  # history recorded and no OOM event
    skipped = getattr(results, "skipped", {})
    reason = skipped.get("trace_memory") or skipped.get("memory_timeline") or \
        "no memory data: profile with profile_memory=True or record a memory snapshot"
    raise NotApplicable(reason)
