"""An out-of-memory error happened: what was requested, what filled the device, and why.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules oom`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.memory_oom import MemoryOOMResult
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.units import device_name

_FIX = {
    "fragmentation": ("The device had room but in pieces: let the allocator grow segments instead of splitting "
                      "them (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), avoid torch.cuda.empty_cache() in "
                      "the loop, and pad variable shapes to a few bucket sizes."),
    "capacity": ("Live tensors filled the device: cut the peak with activation checkpointing, bf16 autocast, a "
                 "smaller micro-batch with gradient accumulation, or FSDP/ZeRO sharding; free what the top call "
                 "sites hold longer than needed."),
}
_HINT = {
    "fragmentation": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
    "capacity": "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)",
}


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


@rule("oom", needs_any=("memory_oom", "memory_timeline", "trace_memory"), severity=Severity.CRITICAL)
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """An out-of-memory error happened: what was requested, what filled the device, and why.

    Signal
        Snapshot (``memory_oom``): the allocator's ``oom`` history entry (the first one; all are
        counted) — the request, the device's free memory then, allocated/reserved at that event,
        cached free = reserved − allocated, and the verdict: ``fragmentation`` when the cached
        free memory alone covered the request (room, but in pieces), else ``capacity`` (live
        tensors filled the device), with the call sites live then. Trace (``trace_memory``):
        ``[OutOfMemory]`` events with the request and the allocator's totals. Cannot decide
        (not run) from a snapshot without allocation history (``_record_memory_history`` off:
        the OOM leaves no entry) nor from a trace without ``[memory]`` events; a snapshot with
        history and no ``oom`` entry, or a memory-profiled trace without ``[OutOfMemory]``,
        is silent.
    Threshold
        any OOM → CRITICAL.
    Cost
        Snapshot: the shortfall, requested − device free (bytes that did not fit); the whole
        request when the device reported at least that much free (the request failed in
        fragmented device memory) or free is unknown. Trace: the largest failed request (the
        device's free memory is not recorded, so this bounds the shortfall from above;
        confidence 0.9).
    Fix
        fragmentation: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, no
        ``torch.cuda.empty_cache()`` in the loop; capacity: activation checkpointing, AMP, a
        smaller micro-batch, sharding; record a snapshot to see what filled the device.
    """
    mo = results.typed("memory_oom", MemoryOOMResult)
    if mo is not None:
        free = mo.device_free_bytes
        short = mo.requested_bytes - free if free is not None else 0
        yield Finding(
            rule_id="oom", severity=Severity.CRITICAL,
            title=f"Out of memory on {device_name(mo.device)}: {_mib(mo.requested_bytes)} requested with {_mib(free)} "
                  f"free ({mo.verdict})",
            evidence={"device": mo.device, "requested_bytes": mo.requested_bytes, "device_free_bytes": free,
                      "shortfall_bytes": max(short, 0), "allocated_bytes": mo.allocated_bytes,
                      "reserved_bytes": mo.reserved_bytes, "cached_free_bytes": mo.cached_free_bytes,
                      "verdict": mo.verdict, "n_ooms": mo.n_ooms, "failing_site": mo.failing_site,
                      "failing_site_kind": mo.failing_site_kind, "failing_stack": mo.failing_stack,
                      "top_sites": mo.top_sites.head(5).to_dicts(), "categories": mo.categories.to_dicts()},
            fix=_FIX[mo.verdict], code_hint=_HINT[mo.verdict],
            cost_bytes=short if short > 0 else mo.requested_bytes,
            confidence=1.0,
        )
        return
    failed = results.failed
    if "memory_oom" in failed:
        raise NotApplicable(f"memory_oom failed: {failed['memory_oom']}")
    tm = results.typed("trace_memory", TraceMemoryResult)
    if tm is not None:
        if tm.n_ooms == 0:
            return
        ooms = tm.ooms.sort(["bytes", "ts_ns"], descending=[True, False])
        worst = ooms.row(0, named=True) if ooms.height else {}
        devices = sorted({device_name(str(d)) for d in ooms["device"].to_list()}) if ooms.height else []
        yield Finding(
            rule_id="oom", severity=Severity.CRITICAL,
            title=f"{tm.n_ooms} out-of-memory event(s) during the profile"
                  + (f" on {', '.join(devices)}: largest request {_mib(worst.get('bytes'))} with "
                     f"{_mib(worst.get('total_allocated'))} allocated, {_mib(worst.get('total_reserved'))} reserved"
                     if worst else ""),
            evidence={"n_ooms": tm.n_ooms, "largest_request_bytes": worst.get("bytes"),
                      "ooms": ooms.sort("ts_ns").head(10).to_dicts(),
                      "per_device": tm.per_device.filter(pl.col("device") != "cpu").to_dicts()},
            fix=_FIX["capacity"] + " Record a memory snapshot to see what filled the device.",
            code_hint="torch.cuda.memory._record_memory_history(max_entries=100_000)\n...\n"
                      "torch.cuda.memory._dump_snapshot('oom.pickle')  # in the except torch.OutOfMemoryError: branch",
            cost_bytes=int(worst.get("bytes") or 0) or None, confidence=0.9,
        )
        return
    tl = results.need("memory_timeline", MemoryTimelineResult)
    if not tl.history:
        raise NotApplicable("the snapshot has no allocation history, so an OOM would leave no trace in it: record "
                            "with torch.cuda.memory._record_memory_history() before dumping")
    # history recorded and no oom entry: no OOM happened while recording.
