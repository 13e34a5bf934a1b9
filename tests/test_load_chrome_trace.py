"""Loader: every layout, unit conversion, and the model's tables."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import kineto_doc, write_trace
from support.events import complete

from traceanalyzer.errors import InputError
from traceanalyzer.load import load, sniff
from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.model import SCHEMAS


def X(cat: str | None, name: str, ts: float, dur: float, pid: object = 1, tid: object = 1, **args: object) -> dict:
    return complete(cat, name, ts, dur, pid, tid, args)


MODERN = [
    X("user_annotation", "ProfilerStep#3", 100.0, 50.0),
    X("cpu_op", "aten::mm", 101.5, 10.25,
      **{"External id": 7, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"],
         "Concrete Inputs": ["", ""], "Input Strides": [[3, 1], [0, 1]]}),
    X("cuda_runtime", "cudaLaunchKernel", 102.0, 3.0, correlation=42, **{"External id": 7, "cbid": 211}),
    X("kernel", "volta_sgemm_128x64_nn", 110.001, 20.5, pid=0, tid=7, device=0, stream=7, correlation=42,
      grid=[1, 2, 1], block=[128, 1, 1]),
    X("gpu_user_annotation", "ProfilerStep#3", 100.0, 60.0, pid=0, tid=7),
    X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 131.0, 2.0, pid=0, tid=7, device=0, stream=7, correlation=43,
      bytes=4096),
    X("gpu_memset", "Memset (Device)", 134.0, 1.0, pid=0, tid=7, device=0, stream=7, correlation=44, bytes=128),
    X("python_function", "train.py(42): forward", 100.5, 30.0, **{"Python id": 5, "Python parent id": 1}),
    {"ph": "s", "cat": "ac2g", "id": 42, "ts": 102.0, "pid": 1, "tid": 1, "name": "ac2g"},
    {"ph": "f", "cat": "ac2g", "id": 42, "ts": 110.001, "pid": 0, "tid": 7, "name": "ac2g", "bp": "e"},
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 105.0, "pid": 1, "tid": 1, "s": "t",
     "args": {"Addr": 1234, "Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048, "Device Type": 1,
              "Device Id": 0}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python)"}},
]


def test_modern_layout_tables_and_units(tmp_path: Path) -> None:
    base = 1_700_000_000_000_000_000
    doc = kineto_doc(MODERN, baseTimeNanoseconds=base, distributedInfo={"rank": 3, "world_size": 8, "backend": "nccl"},
                     record_shapes=1, with_stack=1, cupti_version=22)
    m = load(write_trace(tmp_path / "t.json.gz", doc))
    assert m.kind == "trace" and m.meta.layout == "kineto"
    assert (m.meta.rank, m.meta.world_size, m.meta.vendor) == (3, 8, "nvidia")
    assert m.meta.profiler_flags == {"record_shapes": True, "with_stack": True}
    for table, schema in SCHEMAS.items():
        want = {k: pl.DataType.from_python(v) if isinstance(v, type) and not issubclass(v, pl.DataType) else v
                for k, v in schema.items()}
        assert dict(m.table(table).schema) == want, table
    k = m.kernels.row(0, named=True)
    # 110.001 µs relative to base → exact ns, dur 20.5 µs → 20500 ns.
    assert k["ts_ns"] == base + 110_001 and k["dur_ns"] == 20_500 and k["end_ns"] == base + 130_501
    assert (k["device"], k["stream"], k["correlation"], k["grid"]) == (0, 7, 42, "[1,2,1]")
    op = m.cpu_ops.row(0, named=True)
    assert op["dur_ns"] == 10_250 and op["external_id"] == 7 and op["input_dims"] == "[[2,3],[3,4]]"
    assert op["concrete_inputs"] == '["",""]' and op["input_strides"] == "[[3,1],[0,1]]"
    mc = m.memcpy.row(0, named=True)
    assert (mc["kind"], mc["src"], mc["dst"], mc["bytes"]) == ("HtoD", "Pageable", "Device", 4096)
    assert m.memset["bytes"].to_list() == [128]
    # the GPU-side ProfilerStep copy is not a step
    assert m.steps["step"].to_list() == [3] and m.gpu_annotations.height == 1
    assert m.flows["kind"].to_list() == ["ac2g", "ac2g"]
    assert m.memory_events.row(0, named=True)["total_allocated"] == 1024
    assert m.python_frames["python_parent_id"].to_list() == [1]
    assert m.threads.height == 1
    assert m.meta.span_start_ns == base + 100_000 and m.meta.span_end_ns == base + 160_000
    assert m.warnings == ()


def test_absolute_integer_microseconds_keep_ns_exact(tmp_path: Path) -> None:
    ts = 1_669_783_687_352_244  # 16-digit absolute µs (PyTorch < 2.4)
    doc = kineto_doc([X("cpu_op", "aten::add", ts, 7)])
    m = build_model(tmp_path / "a.json", doc)
    assert m.cpu_ops["ts_ns"][0] == ts * 1000 and m.cpu_ops["dur_ns"][0] == 7000


def test_legacy_pt18_layout(tmp_path: Path) -> None:
    events = [
        X("Operator", "ProfilerStep#1", 1000, 100, pid=10, tid="10"),
        X("Operator", "aten::conv2d", 1001, 20, pid=10, tid="10", **{"external id": 5}),
        X("Runtime", "cudaLaunchKernel", 1002, 4, pid=10, tid="10", correlation=9, **{"external id": 5}),
        X("Kernel", "implicit_convolve_sgemm", 1010, 30, pid=0, tid="stream 7", device=0, stream=7, correlation=9),
        X("Memcpy", "Memcpy DtoH (Device -> Pinned)", 1050, 5, pid=0, tid="stream 7", bytes=64, correlation=10),
        {"ph": "s", "cat": "async", "id": 9, "ts": 1002, "pid": 10, "tid": "10", "name": "launch"},
        {"ph": "f", "cat": "async", "id": 9, "ts": 1010, "pid": 0, "tid": "stream 7", "name": "launch"},
        X("gpu_user_Annotation", "ProfilerStep#1", 1000, 100, pid=0, tid="stream 7"),
    ]
    m = build_model(tmp_path / "legacy.json", kineto_doc(events))
    assert m.meta.layout == "kineto-legacy"
    assert m.steps["step"].to_list() == [1]
    assert m.kernels["stream"].to_list() == [7] and m.runtime["external_id"].to_list() == [5]
    assert m.cpu_ops.filter(pl.col("name") == "aten::conv2d")["tid"].to_list() == [10]
    assert m.memcpy["kind"].to_list() == ["DtoH"] and m.memcpy["dst"].to_list() == ["Pinned"]
    assert m.flows["kind"].unique().to_list() == ["ac2g"]
    assert m.gpu_annotations.height == 1


def test_autograd_bare_array(tmp_path: Path) -> None:
    doc = [
        {"name": "aten::add", "ph": "X", "ts": 1.5, "dur": 2.25, "tid": 1, "pid": "CPU functions", "args": {}},
        {"name": "add_kernel", "ph": "X", "ts": 3.0, "dur": 1.0, "tid": "stream 0", "pid": "CUDA functions",
         "args": {}},
    ]
    m = load(write_trace(tmp_path / "old.json", doc))
    assert m.meta.layout == "autograd-array"
    assert m.cpu_ops["dur_ns"].to_list() == [2250] and m.kernels["name"].to_list() == ["add_kernel"]


def test_amd_and_xpu_vendor_and_memcpy_kinds(tmp_path: Path) -> None:
    amd = build_model(tmp_path / "a.json", kineto_doc([
        X("cuda_runtime", "hipLaunchKernel", 1, 1, correlation=1),
        X("kernel", "Cijk_Alik_Bljk_SB_MT64", 3, 1, pid=2, tid=0, device=2, stream=0, correlation=1),
        X("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 5, 1, pid=2, tid=0, correlation=2),
    ], roctracer_version=4))
    assert amd.meta.vendor == "amd" and amd.memcpy["src"].to_list() == ["Host"]
    xpu = build_model(tmp_path / "x.json", kineto_doc([
        X("xpu_runtime", "urEnqueueKernelLaunch", 1, 1, correlation=1),
        X("kernel", "gemm_kernel", 3, 1, pid=0, tid=1, device=0, correlation=1),
        X("gpu_memcpy", "Memcpy M2D (Memory -> Device)", 5, 1, pid=0, tid=1, correlation=2),
    ]))
    assert xpu.meta.vendor == "xpu"
    assert xpu.kernels["stream"].to_list() == [1]  # no stream arg on XPU: the tid (queue) stands in
    assert xpu.memcpy.select("kind", "src").row(0) == ("HtoD", "Pageable")


def test_cpu_only_trace(tmp_path: Path) -> None:
    m = build_model(tmp_path / "c.json", kineto_doc([X("cpu_op", "aten::add", 1, 1)]))
    assert m.meta.vendor == "cpu" and not m.has_gpu


def test_sniff_by_content_not_extension(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "trace.pickle", kineto_doc([X("cpu_op", "aten::add", 1, 1)]))
    assert sniff(p) == "trace"
    q = tmp_path / "snap.json"
    q.write_bytes(b"\x80\x04\x95" + b"\x00" * 10)
    assert sniff(q) == "snapshot"
    r = tmp_path / "timeline.json"
    r.write_text("[[1, 2], [[3, 4]]]")
    assert sniff(r) == "memory_timeline"
    with pytest.raises(InputError, match="unrecognised content"):
        s = tmp_path / "x.txt"
        s.write_text("hello")
        sniff(s)
