"""The chrome-trace model: one polars table per kind of event, plus metadata.

Every time is an ``Int64`` count of nanoseconds on the trace's own clock
(``baseTimeNanoseconds`` added back where the file is relative, so absolute epoch
ns for modern Kineto files); every duration is ``Int64`` ns; sizes are ``bytes``.
``end_ns`` is always ``ts_ns + dur_ns``. ``SCHEMAS`` below is the single source of
truth for column names and dtypes: loaders build to it, tests check against it.

Tables (all may be empty, never missing):

``cpu_ops``        ATen/autograd ops (``cpu_op``, legacy ``Operator``), with External id,
                   sequence number, input shapes/types (``record_shapes``), collective args.
``annotations``    ``user_annotation`` ranges (``record_function``): ProfilerStep#N,
                   ``enumerate(DataLoader)#…``, ``Optimizer.step#…``, ``nccl:*`` …
``python_frames``  ``python_function`` events (``with_stack=True``): ``file.py(line): func``.
``runtime``        CUDA/HIP runtime and driver calls, XPU/MTIA runtime (``cat`` says which).
``kernels``        device kernels.
``memcpy``         device copies with ``kind`` (HtoD/DtoH/DtoD/PtoP/HtoH), ``src``/``dst``
                   memory types (Pageable/Pinned/Device/…) parsed from the name.
``memset``         device memsets.
``gpu_annotations`` GPU-side projections of user annotations (``gpu_user_annotation``).
``flows``          flow endpoints (``ph`` s/f/t); ``kind`` normalised to ``ac2g``
                   (CPU→GPU launch) or ``fwdbwd`` (forward→backward) whatever the era.
``memory_events``  ``[memory]`` / ``[OutOfMemory]`` allocator instant events.
``steps``          one row per ``ProfilerStep#N`` on the CPU side (the GPU-side
                   duplicate is not a step), sorted by ``ts_ns``.
``other_events``   duration events of categories the model does not interpret
                   (``cuda_sync``, ``overhead``, ``mtia_ccp_events`` …), kept so nothing
                   is silently lost. ``args`` holds the JSON text of the
                   event's args for ``cuda_profiler_range`` events (CUPTI range-profiler
                   counters, one event per kernel), null for the others.
``threads``        ``thread_name`` metadata: (pid, tid) → name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

_TIME = {"ts_ns": pl.Int64, "dur_ns": pl.Int64, "end_ns": pl.Int64}
_CPU = {"name": pl.String, **_TIME, "pid": pl.Int64, "tid": pl.Int64}
_GPU = {
    "name": pl.String,
    **_TIME,
    "device": pl.Int64,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
}

SCHEMAS: dict[str, dict[str, pl.DataType | type[pl.DataType]]] = {
    "cpu_ops": {
        **_CPU,
        "cat": pl.String,
        "external_id": pl.Int64,
        "seq_num": pl.Int64,
        "fwd_thread_id": pl.Int64,
        "ev_idx": pl.Int64,
        "input_dims": pl.String,  # JSON text of args["Input Dims"], as recorded
        "input_types": pl.String,  # JSON text of args["Input type"]
        "input_strides": pl.String,  # JSON text of args["Input Strides"] (0: a broadcast/expanded dim)
        "concrete_inputs": pl.String,  # JSON text of args["Concrete Inputs"] (non-tensor args as strings)
        "comm_name": pl.String,  # args["Collective name"] on record_param_comms
        "comm_dtype": pl.String,
        "comm_in_nelems": pl.Int64,
        "comm_out_nelems": pl.Int64,
        "comm_group_size": pl.Int64,
        "comm_pg_name": pl.String,  # args["Process Group Name"] (a c10d process group id, "0" …)
        "comm_pg_desc": pl.String,  # args["Process Group Description"] ("default_pg" …)
        # args["Call stack"] of PyTorch 1.8-1.9 traces: "file(line): function;…", innermost first
        # (null when absent or empty)
        "call_stack": pl.String,
    },
    "annotations": {**_CPU, "external_id": pl.Int64},
    "python_frames": {**_CPU, "python_id": pl.Int64, "python_parent_id": pl.Int64},
    "runtime": {
        **_CPU,
        "cat": pl.String,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
        "cbid": pl.Int64,
    },
    "kernels": {
        **_GPU,
        "grid": pl.String,
        "block": pl.String,
        "registers_per_thread": pl.Int64,
        "shared_memory": pl.Int64,
        "queued_ns": pl.Int64,
        "graph_id": pl.Int64,
        "comm_name": pl.String,  # collective args Kineto copies onto NCCL kernels
        "comm_dtype": pl.String,
        "comm_in_nelems": pl.Int64,
        "comm_group_size": pl.Int64,
    },
    "memcpy": {
        **_GPU,
        "bytes": pl.Int64,
        "kind": pl.String,
        "src": pl.String,
        "dst": pl.String,
    },
    "memset": {**_GPU, "bytes": pl.Int64},
    "gpu_annotations": {"name": pl.String, **_TIME, "device": pl.Int64, "stream": pl.Int64},
    "flows": {
        "kind": pl.String,
        "ph": pl.String,
        "id": pl.Int64,
        "ts_ns": pl.Int64,
        "pid": pl.Int64,
        "tid": pl.Int64,
    },
    "memory_events": {
        "ts_ns": pl.Int64,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "device_type": pl.Int64,
        "device_id": pl.Int64,
        "addr": pl.Int64,
        "bytes": pl.Int64,
        "total_allocated": pl.Int64,
        "total_reserved": pl.Int64,
        "oom": pl.Boolean,
    },
    "steps": {
        "step": pl.Int64,
        "name": pl.String,
        **_TIME,
        "pid": pl.Int64,
        "tid": pl.Int64,
    },
    "other_events": {
        "cat": pl.String,
        "name": pl.String,
        **_TIME,
        "pid": pl.String,
        "tid": pl.String,
        "args": pl.String,  # JSON text of args, kept for cuda_profiler_range (CUPTI counters) only
        # args of Kineto's cuda_sync events (null elsewhere unless the event has them): the
        # correlation of the sync's runtime call, and for "Event Sync"/"Stream Wait Event" the
        # stream the awaited event was recorded on and the correlation of its cudaEventRecord
        "correlation": pl.Int64,
        "wait_on_stream": pl.Int64,
        "wait_on_cuda_event_record_corr_id": pl.Int64,
    },
    "threads": {"pid": pl.Int64, "tid": pl.Int64, "name": pl.String},
}


def empty_table(table: str) -> pl.DataFrame:
    """An empty frame with the schema of ``table``."""
    return pl.DataFrame(schema=SCHEMAS[table])


@dataclass(frozen=True)
class TraceMeta:
    """What the file says about the run, independent of its events.

    ``vendor`` is ``"nvidia"``, ``"amd"``, ``"xpu"``, ``"mtia"``, ``"cpu"`` (no device
    activity at all) or ``"unknown"``; it is decided from deviceProperties, version
    keys and runtime call names, and gates vendor-specific rules.
    ``layout`` names the exporter era: ``"kineto"`` (JSON object with traceEvents),
    ``"kineto-legacy"`` (capitalised 1.8/1.9 categories) or ``"autograd-array"``
    (the pre-Kineto bare-array exporter).
    ``span_start_ns``/``span_end_ns`` bound every duration event, excluding the
    ``Record Window End`` marker (which can lie hours later).
    """

    path: str
    layout: str
    schema_version: int | None
    base_time_ns: int
    display_time_unit: str | None
    device_properties: tuple[dict[str, Any], ...]
    distributed_info: dict[str, Any] | None
    rank: int | None
    world_size: int | None
    profiler_flags: dict[str, bool]
    versions: dict[str, str]
    vendor: str
    span_start_ns: int
    span_end_ns: int
    trace_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def span_ns(self) -> int:
        return max(0, self.span_end_ns - self.span_start_ns)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "layout": self.layout,
            "schema_version": self.schema_version,
            "base_time_ns": self.base_time_ns,
            "display_time_unit": self.display_time_unit,
            "device_properties": list(self.device_properties),
            "distributed_info": self.distributed_info,
            "rank": self.rank,
            "world_size": self.world_size,
            "profiler_flags": self.profiler_flags,
            "versions": self.versions,
            "vendor": self.vendor,
            "span_start_ns": self.span_start_ns,
            "span_end_ns": self.span_end_ns,
            "span_ns": self.span_ns,
            "trace_name": self.trace_name,
        }


@dataclass(frozen=True)
class TraceModel:
    """A loaded chrome trace. See the module docstring for each table's meaning.

    ``warnings`` lists what the loader had to skip or repair (truncated file,
    invalid tokens, events without ``dur``, unknown categories …), each with a count,
    and is shown in every report so nothing is dropped silently.
    """

    meta: TraceMeta
    cpu_ops: pl.DataFrame
    annotations: pl.DataFrame
    python_frames: pl.DataFrame
    runtime: pl.DataFrame
    kernels: pl.DataFrame
    memcpy: pl.DataFrame
    memset: pl.DataFrame
    gpu_annotations: pl.DataFrame
    flows: pl.DataFrame
    memory_events: pl.DataFrame
    steps: pl.DataFrame
    other_events: pl.DataFrame
    threads: pl.DataFrame
    warnings: tuple[str, ...] = ()

    kind = "trace"

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds any device activity (kernel, memcpy or memset)."""
        return self.kernels.height + self.memcpy.height + self.memset.height > 0

    def gpu_activity(self) -> pl.DataFrame:
        """Kernels, memcpy and memset in one frame with an ``activity`` column.

        ``activity`` is ``"kernel"``, ``"memcpy"`` or ``"memset"``; columns are the
        shared GPU columns (name, ts_ns, dur_ns, end_ns, device, stream, correlation,
        external_id).
        """
        cols = list(_GPU)
        return pl.concat(
            [
                self.kernels.select(cols).with_columns(activity=pl.lit("kernel")),
                self.memcpy.select(cols).with_columns(activity=pl.lit("memcpy")),
                self.memset.select(cols).with_columns(activity=pl.lit("memset")),
            ]
        )

    def table(self, name: str) -> pl.DataFrame:
        return getattr(self, name)  # type: ignore[no-any-return]
