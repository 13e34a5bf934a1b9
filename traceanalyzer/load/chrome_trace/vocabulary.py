"""The vocabulary of chrome-trace events: which category, phase or name means which
kind of record, and so which model table an event belongs to.

Both decoders (:mod:`.exact`, :mod:`.ndjson`) and the assembly read these tables; a
category, flow name or memcpy spelling of a new profiler era or vendor is added here.
"""

from __future__ import annotations

# Category → model table, for duration ("X") events.
CAT_TABLE: dict[str, str] = {
    "cpu_op": "cpu_ops",
    "Operator": "cpu_ops",
    "user_annotation": "annotations",
    "python_function": "python_frames",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    "kernel": "kernels",
    "Kernel": "kernels",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "gpu_user_annotation": "gpu_annotations",
    "gpu_user_Annotation": "gpu_annotations",
}
LEGACY_CATS = frozenset({"Operator", "Runtime", "Kernel", "Memcpy", "Memset"})

# Categories we know and deliberately keep aside in ``other_events`` without a
# warning: they carry no information the analyses use today.
KNOWN_OTHER_CATS = frozenset(
    {
        "Trace",
        "overhead",
        "cuda_sync",
        "cuda_event",
        "xpu_sync",
        "cuda_profiler_range",
        "mtia_ccp_events",
        "hpu_op",
        "glow_runtime",
        "collective_comm",
        "critical_path",
        "cpu_instant_event",
        "traceanalyzer",  # our own annotation tracks in a Perfetto export (report/perfetto.py)
    }
)

# MTIA device events (``mtia_ccp_events``; pid = the device id, ``args.stream``): the
# category holds three kinds of record, told apart by name. ``dma_request`` is a DMA
# transfer (``args.size`` bytes, ``args.direction``) → memcpy. ``event_record`` and
# ``event_wait`` (a stream waiting on another stream's event) are markers, not work: a
# waiting stream is not busy, so they stay in ``other_events`` (the category is in
# KNOWN_OTHER_CATS: no warning). Every other name is processing-element execution
# (``pe_exe``, or the executable or op name: ``remote``, ``add-dtype_Float``,
# ``hccl::…``) → kernels.
MTIA_CCP_CAT = "mtia_ccp_events"
# CUPTI range-profiler events: one per kernel, its counters in ``args`` (kept as JSON text in
# ``other_events.args``; the columnar reader leaves regions holding them to the exact decoder).
COUNTER_CAT = "cuda_profiler_range"
MTIA_DMA = "dma_request"
MTIA_NOT_BUSY = ("event_record", "event_wait")
# ``args.direction`` → the memcpy ``kind`` vocabulary (the CUDA spelling).
MTIA_DIRECTION: dict[str, str] = {
    "HOST_TO_DEVICE": "HtoD",
    "DEVICE_TO_HOST": "DtoH",
    "DEVICE_TO_DEVICE": "DtoD",
    "HOST_TO_HOST": "HtoH",
}

# ``args.kind`` of a memcpy (ROCm, recent CUDA Kineto): read where the name does not carry the
# direction (``CopyHostToDevice``, ``hipMemcpyAsync``). Only these spellings are taken; any
# other value is ignored, so a stray non-string cannot invent a direction.
MEMCPY_ARG_KIND: dict[str, str] = {k: k for k in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")}

FLOW_KIND: dict[str, str] = {
    "ac2g": "ac2g",
    "async": "ac2g",
    "launch": "ac2g",
    "async_cpu_to_gpu": "ac2g",
    "async_gpu": "ac2g",
    "cpu_to_cuda": "ac2g",
    "fwdbwd": "fwdbwd",
    "forward_backward": "fwdbwd",
    "fwd_bwd": "fwdbwd",
}


# XPU PTI memcpy kinds: M = user ("Memory", pageable host), H = USM host (pinned),
# D = device, S = shared. Normalised to the CUDA vocabulary.
_XPU_KIND = {
    "M2D": "HtoD", "H2D": "HtoD", "S2D": "HtoD",
    "D2M": "DtoH", "D2H": "DtoH", "D2S": "DtoH",
    "D2D": "DtoD", "M2M": "HtoH", "H2H": "HtoH", "M2H": "HtoH", "H2M": "HtoH",
    "P2P": "PtoP",
}


_KNOWN_PH = ("X", "s", "f", "t", "i", "I", "M", "C")
