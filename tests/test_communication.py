"""Communication: recognition signals (metadata > launching op > name), collectives per type and
process group, bytes and bandwidth, overlap with compute; hand-built traces and real ones."""

from __future__ import annotations

import gzip
import json
from typing import Any

import polars as pl
import pytest
from conftest import SHARED_TRACES, needs_shared, shared_results
from support.events import Trace, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._comm import comm_classes
from traceanalyzer.config import Config

MI300_DDP = SHARED_TRACES / "tracelens" / "mi300" / "resnet_act_checkpoint.json.gz"
HTA_NCCL = SHARED_TRACES / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
INFERENCE = sorted((SHARED_TRACES / "tracelens" / "inference").glob("*.json.gz")) if SHARED_TRACES.exists() else []


class CommTrace(Trace):
    """:class:`Trace` with External ids linking kernels to their launching CPU op, as Kineto does."""

    def __init__(self) -> None:
        super().__init__()
        self._ext = 5000

    def op(self, name: str, ts: float, dur: float, tid: int = 100, cat: str = "cpu_op", **args: Any) -> int:
        self._ext += 1
        self._x(cat, name, ts, dur, tid=tid, **{"External id": self._ext, **args})
        return self._ext

    def kernel(self, ext: int | None, ts: float, k_ts: float, k_dur: float, name: str, stream: int = 7,
               **args: Any) -> None:
        corr = self.runtime("cudaLaunchKernel", ts, 1)
        extra = {"External id": ext} if ext is not None else {}
        self.gpu(corr, k_ts, k_dur, name=name, stream=stream, **extra, **args)


def _run(t: Trace) -> Any:
    return run_analyses(t.model(), Config(), strict=True)


def _comm_of(model: Any) -> pl.DataFrame:
    return pl.concat([model.kernels.select("name"), comm_classes(model)], how="horizontal")


# --------------------------------------------------------------------------- DeepEP-style MoE step

DISPATCH = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, int, int)"
NOTIFY = "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int)"
LAYOUT = "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int)"
COMBINE = "combine<__nv_bfloat16, 8, 768>"  # a bare name: recognised only by its launching op


def deepep_moe() -> CommTrace:
    """3 steps of 1000 µs. Per step: expert GEMMs [10, 610) on stream 7; FusedDispatch launches the
    layout kernel [60, 80) (compute), notify_dispatch [100, 150) and dispatch [150, 450) on stream
    30; FusedCombine launches combine [620, 820) on stream 30. Communication 550 µs, of it
    [100, 450) under the GEMMs (350 hidden) and [620, 820) exposed (200)."""
    t = CommTrace()
    for n in range(3):
        t0 = 1000 * n
        t.step(n + 1, t0, 1000, gpu_copy=False)
        g = t.op("aten::mm", t0 + 1, 5)
        t.kernel(g, t0 + 2, t0 + 10, 600, "sm90_xmma_gemm_bf16bf16_bf16f32")
        d = t.op("FusedDispatch", t0 + 20, 30)
        t.kernel(d, t0 + 21, t0 + 60, 20, LAYOUT, stream=30)
        t.kernel(d, t0 + 25, t0 + 100, 50, NOTIFY, stream=30)
        t.kernel(d, t0 + 30, t0 + 150, 300, DISPATCH, stream=30)
        c = t.op("FusedCombine", t0 + 600, 30)
        t.kernel(c, t0 + 601, t0 + 620, 200, COMBINE, stream=30)
    return t


def test_deepep_signals_and_generic_layout_kernel() -> None:
    m = deepep_moe().model()
    c = _comm_of(m)
    by = {r["name"]: r for r in c.unique("name", keep="first").to_dicts()}
    assert by[DISPATCH]["comm_signal"] == "cpu_op" and by[DISPATCH]["comm_family"] == "deepep"
    assert not by[DISPATCH]["comm_weak"] and by[DISPATCH]["comm_op"] == "FusedDispatch"
    assert by[COMBINE]["comm_signal"] == "cpu_op" and by[COMBINE]["comm_family"] is None and by[COMBINE]["comm_weak"]
    # The layout kernel is launched by the same op but is compute (DeepEP's layout namespace).
    assert not by[LAYOUT]["is_comm"] and by[LAYOUT]["comm_signal"] is None
    assert not by["sm90_xmma_gemm_bf16bf16_bf16f32"]["is_comm"]


def test_deepep_overlap_per_step_and_agreement_with_gpu_time() -> None:
    r = _run(deepep_moe())
    cm = r["communication"]
    t = cm.totals
    assert (t["comm_ns_per_step"], t["hidden_ns_per_step"], t["exposed_ns_per_step"]) == (ns(550), ns(350), ns(200))
    assert t["hidden_pct"] == round(350 * 100 / 550, 2)
    assert (t["comm_pct_of_step"], t["exposed_pct_of_step"], t["overlap_verdict"]) == (55.0, 20.0, "exposed")
    # One collective per launching op: notify_dispatch + dispatch are one dispatch.
    assert t["n_collectives"] == 6 and t["n_kernels"] == 9 and t["collectives_per_step"] == 2.0
    assert t["kernels_by_signal"] == {"cpu_op": 9} and t["weak_kernels"] == 3 and t["weak_ns"] == 3 * ns(200)
    types = {r["type"]: r for r in cm.by_type.to_dicts()}
    assert set(types) == {"dispatch", "combine"}
    assert (types["dispatch"]["count"], types["dispatch"]["kernels"], types["dispatch"]["total_ns"]) == (
        3,
        6,
        3 * ns(350),
    )
    assert types["dispatch"]["bytes"] is None and types["dispatch"]["algbw_gbps"] is None  # no sizes recorded
    s = cm.by_stream.row(0, named=True)
    assert (s["stream"], s["exposed_ns_per_step"], s["families"]) == (30, ns(200), "deepep")
    # Every section counts the same kernels: gpu_time's exposed communication, kernels' is_comm.
    gt = r["gpu_time"].per_step
    assert gt["communication_ns"].to_list() == [ns(200)] * 3
    kn = r["kernels"]
    assert kn.per_step["comm_ns"].to_list() == [ns(550)] * 3
    assert r["diagnosis"].verdict != "compute_bound"


# --------------------------------------------------------------------------- custom all-reduce

CAR2 = ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
        "__nv_bfloat16*, int, int)")
CAR1 = ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
        "__nv_bfloat16*, int, int)")
SYMM = ("void c10d::symmetric_memory::(anonymous namespace)::one_shot_all_reduce_kernel<float, 16, 8>(float**, "
        "unsigned long, unsigned long, float*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned "
        "long)")
RED = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::"
       "native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned "
       "int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::"
       "sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, "
       "float, 4, 4>)")


def custom_all_reduce() -> CommTrace:
    """3 decode steps of 500 µs: a GEMM [10, 300) on stream 7, then vLLM's all-reduce
    (vllm::all_reduce → _C_custom_ar::all_reduce → cross_device_reduce_2stage [300, 340)), a
    symmetric-memory one-shot all-reduce [340, 360) and a graph-replayed 1-stage all-reduce
    [360, 370) with no launching op; a sum reduce_kernel [370, 400) is compute."""
    t = CommTrace()
    for n in range(3):
        t0 = 500 * n
        t.step(n + 1, t0, 500, gpu_copy=False)
        g = t.op("aten::mm", t0 + 1, 5)
        t.kernel(g, t0 + 2, t0 + 10, 290, "sm90_xmma_gemm_bf16bf16_bf16f32")
        t.op("vllm::all_reduce", t0 + 10, 20)
        a = t.op("_C_custom_ar::all_reduce", t0 + 11, 10)
        t.kernel(a, t0 + 12, t0 + 300, 40, CAR2)
        s = t.op("symm_mem::one_shot_all_reduce", t0 + 30, 10)
        t.kernel(s, t0 + 31, t0 + 340, 20, SYMM)
        t.gpu(None, t0 + 360, 10, name=CAR1, stream=7)  # CUDA-graph replay: no launch call
        rs = t.op("aten::sum", t0 + 40, 10)
        t.kernel(rs, t0 + 41, t0 + 370, 30, RED)
    return t


def test_custom_all_reduce_is_communication_not_reduction() -> None:
    r = _run(custom_all_reduce())
    c = _comm_of(custom_all_reduce().model())
    by = {x["name"]: x for x in c.unique("name", keep="first").to_dicts()}
    assert (by[CAR2]["comm_signal"], by[CAR2]["comm_family"], by[CAR2]["comm_weak"]) == (
        "cpu_op",
        "custom_all_reduce",
        False,
    )
    assert (by[SYMM]["comm_signal"], by[SYMM]["comm_family"]) == ("cpu_op", "symm_mem")
    assert (by[CAR1]["comm_signal"], by[CAR1]["comm_weak"]) == ("name", True)
    assert not by[RED]["is_comm"]
    t = r["communication"].totals
    assert t["comm_ns_per_step"] == ns(70) and t["exposed_ns_per_step"] == ns(70) and t["hidden_pct"] == 0.0
    assert r["communication"].by_type["type"].to_list() == ["all_reduce"]
    assert r["communication"].by_type["count"].to_list() == [9]
    assert r["gpu_time"].per_step["communication_ns"].to_list() == [ns(70)] * 3
    kc = {x["name"]: x["klass"] for x in r["ops"].kernel_classes.to_dicts()}
    assert kc["vllm::cross_device_reduce_2stage"] == "communication"
    assert kc["c10d::symmetric_memory::one_shot_all_reduce_kernel"] == "communication"
    assert kc["at::native::reduce_kernel"] == "reduction"


# --------------------------------------------------------------------------- NCCL with metadata

NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> "
        ">(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
PG = {"Process Group Name": "0", "Process Group Description": "default_pg"}


def nccl_with_metadata() -> CommTrace:
    """2 steps of 1000 µs. c10d::allreduce_ → record_param_comms (allreduce, bf16, 1,048,576
    elements, 8 ranks) → the NCCL all-reduce [200, 300) on stream 20; inside c10d::allreduce_ an
    aten::fill_ launches a fill and the op itself a reduce_kernel (buffer preparation: compute);
    _allgather_base of 1,000 → 8,000 fp32 elements [300, 310). Compute [0, 250) on stream 7."""
    t = CommTrace()
    for n in range(2):
        t0 = 1000 * n
        t.step(n + 1, t0, 1000, gpu_copy=False)
        g = t.op("aten::mm", t0 + 1, 5)
        t.kernel(g, t0 + 2, t0 + 0.5, 249.5, "sm90_xmma_gemm_bf16bf16_bf16f32")
        outer = t.op("c10d::allreduce_", t0 + 10, 50)
        f = t.op("aten::fill_", t0 + 11, 5)
        t.kernel(f, t0 + 12, t0 + 150, 10, FILL)
        t.kernel(outer, t0 + 17, t0 + 160, 10, RED)
        meta = {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1048576, "Group size": 8}
        rp = t.op("record_param_comms", t0 + 20, 20, **meta, **{"Out msg nelems": 1048576}, **PG)
        t.kernel(rp, t0 + 21, t0 + 200, 100, NCCL_AR, stream=20, **meta)
        t.op("c10d::_allgather_base_", t0 + 70, 30)
        ag = {"Collective name": "_allgather_base", "dtype": "Float", "In msg nelems": 1000, "Group size": 8}
        rp2 = t.op("record_param_comms", t0 + 71, 20, **ag, **{"Out msg nelems": 8000}, **PG)
        t.kernel(rp2, t0 + 72, t0 + 300, 10, NCCL_AG, stream=20, **ag)
    return t


def test_nccl_metadata_bytes_and_bus_bandwidth_by_hand() -> None:
    r = _run(nccl_with_metadata())
    cm = r["communication"]
    types = {x["type"]: x for x in cm.by_type.to_dicts()}
    ar, ag = types["all_reduce"], types["all_gather"]
    # all_reduce: 1,048,576 bf16 = 2,097,152 B in 2 × 100 µs → 20.97152 GB/s; busbw × 2·7/8.
    assert (ar["count"], ar["bytes"], ar["total_ns"]) == (2, 2 * 2_097_152, 2 * ns(100))
    assert ar["algbw_gbps"] == pytest.approx(20.972, abs=1e-3)
    assert ar["busbw_gbps"] == pytest.approx(20.97152 * 1.75, abs=1e-3)
    # all_gather: S = Out msg nelems 8,000 fp32 = 32,000 B in 10 µs → 3.2 GB/s; busbw × 7/8 = 2.8.
    assert (ag["bytes"], ag["algbw_gbps"], ag["busbw_gbps"]) == (2 * 32_000, 3.2, 2.8)
    grp = cm.by_group.row(0, named=True)
    assert (grp["pg"], grp["group_size"], grp["count"]) == ("0 (default_pg)", 8, 4)
    assert cm.totals["kernels_by_signal"] == {"metadata": 4} and cm.totals["weak_kernels"] == 0
    # Fill and reduce_kernel inside c10d::allreduce_ are buffer preparation, not collectives.
    c = _comm_of(nccl_with_metadata().model())
    assert c.filter(pl.col("name").is_in([FILL, RED]))["is_comm"].to_list() == [False] * 4
    # comm [200, 310) against compute [0.5, 250) ∪ fill/reduce [150, 170): hidden 50, exposed 60.
    t = cm.totals
    assert (t["comm_ns_per_step"], t["hidden_ns_per_step"], t["exposed_ns_per_step"]) == (ns(110), ns(50), ns(60))
    assert r["gpu_time"].per_step["communication_ns"].to_list() == [ns(60)] * 2


def test_large_but_hidden_is_said_so() -> None:
    """A 400 µs all-reduce entirely under a 900 µs GEMM: 40 % of the step, all hidden."""
    t = CommTrace()
    for n in range(3):
        t0 = 1000 * n
        t.step(n + 1, t0, 1000, gpu_copy=False)
        g = t.op("aten::mm", t0 + 1, 5)
        t.kernel(g, t0 + 2, t0 + 10, 900, "sm90_xmma_gemm_bf16bf16_bf16f32")
        rp = t.op("record_param_comms", t0 + 20, 20, **{"Collective name": "allreduce", "dtype": "Float",
                                                        "In msg nelems": 1000, "Group size": 2})
        t.kernel(rp, t0 + 21, t0 + 100, 400, NCCL_AR, stream=20)
    r = _run(t)
    tot = r["communication"].totals
    assert (tot["overlap_verdict"], tot["hidden_pct"], tot["comm_pct_of_step"]) == ("large_but_hidden", 100.0, 40.0)
    assert "large but hidden, not the bottleneck" in r["communication"].verdict_line()
    d = r["diagnosis"]
    assert d.verdict == "compute_bound"
    assert any("40.0 % of the step), 100.0 % hidden under compute: not the bottleneck" in x for x in d.notes)


def test_no_communication_is_not_applicable() -> None:
    t = CommTrace()
    t.step(1, 0, 100, gpu_copy=False)
    g = t.op("aten::mm", 1, 5)
    t.kernel(g, 2, 10, 50, "sm90_xmma_gemm_bf16bf16_bf16f32")
    r = run_analyses(t.model(), Config())
    assert "communication" not in r.values and "no communication kernels" in r.skipped["communication"]


# --------------------------------------------------------------------------- real traces


def _kernels_raw(path: Any) -> list[dict[str, Any]]:
    with gzip.open(path) as fh:
        doc = json.load(fh)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]


@needs_shared
def test_mi300_ddp_rccl_recount() -> None:
    res = shared_results(MI300_DDP)
    cm = res["communication"]
    t = cm.totals
    assert t["n_kernels"] == 17 and t["families"] == ["nccl"] and t["overlap_verdict"] == "exposed"
    assert t["kernels_by_signal"] == {"metadata": 12, "name": 5}
    # Independent recount from the raw JSON: all-reduce kernels with args, bytes = nelems × 2 (bf16).
    ks = [e for e in _kernels_raw(MI300_DDP) if (e.get("args") or {}).get("Collective name") == "allreduce"]
    nbytes = sum(e["args"]["In msg nelems"] * 2 for e in ks)
    dur_ns = sum(round(e["dur"] * 1000) for e in ks)
    ar = cm.by_type.filter(pl.col("type") == "all_reduce").row(0, named=True)
    assert ar["bytes"] == nbytes and ar["count"] == len(ks) == 6
    assert ar["algbw_gbps"] == pytest.approx(nbytes / dur_ns, abs=2e-3)
    assert ar["busbw_gbps"] == pytest.approx(nbytes / dur_ns * 2 * 7 / 8, abs=2e-3)
    assert cm.by_group.row(0, named=True)["pg"] == "0 (default_pg)"
    # Exposed communication is gpu_time's, per steady step on the device.
    steady = res["steps"].steady_windows()
    gt = res["gpu_time"].per_step.filter(pl.col("window").is_in(steady) & (pl.col("device") == t["device"]))
    assert t["exposed_ns_per_step"] == pytest.approx(gt["communication_ns"].sum() / len(steady), abs=1)
    assert t["hidden_pct"] == pytest.approx(25.33, abs=0.01)
    f = [x for x in res["diagnosis"].evidence if "recognised" in x]
    assert f and "5 (24.316 ms) rest on one weak signal only" in f[0]


@needs_shared
def test_hta_nccl_args_metadata_and_group() -> None:
    cm = shared_results(HTA_NCCL)["communication"]
    assert cm.totals["kernels_by_signal"] == {"metadata": 21}
    assert {r["type"]: r["count"] for r in cm.by_type.to_dicts()} == {"all_reduce": 15, "broadcast": 6}
    g = cm.by_group.row(0, named=True)
    assert (g["pg"], g["group_size"], g["count"]) == ("0 (default_pg)", 2, 21)
    # group of 2: all-reduce busbw = algbw × 2·1/2
    ar = cm.by_type.filter(pl.col("type") == "all_reduce").row(0, named=True)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"], abs=1e-3)


@needs_shared
@pytest.mark.parametrize("path", INFERENCE, ids=lambda p: p.name)
def test_inference_traces_have_no_communication(path: Any) -> None:
    """The shared vLLM/SGLang traces are single-GPU: no custom all-reduce kernel, nothing counted."""
    res = shared_results(path)
    assert "communication" not in res.values
    names = {e["name"] for e in _kernels_raw(path)}
    assert not [n for n in names if "cross_device_reduce" in n or "nccl" in n.lower()]


# --------------------------------------------------------------------------- synthetic generator


@pytest.mark.parametrize("scenario", ["moe_deepep", "custom_all_reduce"])
def test_synthetic_scenarios_planted_communication(scenario: str) -> None:
    from pathlib import Path

    from support import synthetic

    from traceanalyzer.load.chrome_trace import build_model

    doc, truth = synthetic.SCENARIOS[scenario]()
    res = run_analyses(build_model(Path(f"{scenario}.json"), doc), Config(), strict=True)
    cm = res["communication"]
    planted = truth["planted"]
    got = {r["step"]: (r["comm_ns"], r["exposed_ns"]) for r in cm.per_step.to_dicts()}
    assert got == {p["step"]: (p["comm_ns"], p["exposed_ns"]) for p in planted["per_step"]}
    assert cm.totals["n_kernels"] == planted["n_comm_kernels"]
    assert cm.totals["n_collectives"] == planted["collectives"]
    # gpu_time's exposed communication is the same number, step by step.
    gt = res["gpu_time"].per_step.filter(pl.col("device") == cm.totals["device"])
    assert dict(zip(gt["step"].to_list(), gt["communication_ns"].to_list())) == {s: e for s, (_, e) in got.items()}
    if scenario == "moe_deepep":
        assert {r["type"] for r in cm.by_type.to_dicts()} == {"dispatch", "combine"}
        assert 0 < cm.totals["hidden_pct"] < 100 and cm.totals["overlap_verdict"] == "exposed"
        assert res["diagnosis"].verdict != "compute_bound"
        if res["diagnosis"].verdict == "comm_bound":  # the advice is about expert parallelism, not DDP
            moves = " ".join(res["diagnosis"].moves)
            assert "Expert-parallel all-to-all" in moves and "bucket_cap_mb" not in moves
    else:
        assert cm.by_type["type"].to_list() == ["all_reduce"] and cm.totals["hidden_pct"] == 0.0


# --------------------------------------------------------------------------- HTA's overlap

HTA_OVERLAP = ["hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_filter/sampled_rank-0.json.gz",
               "hta/trace_filter/sampled_rank-1.json.gz", "hta/negative_queue_length_values_check/rank0.json.gz"]


@needs_shared
@pytest.mark.parametrize("rel", HTA_OVERLAP)
def test_overlap_equals_hta_comp_comm_overlap(rel: str) -> None:
    """On NCCL-only traces (where HTA's name-only recognition finds the same kernels), in HTA's
    scope (last step dropped, whole µs): our communication union and its part under compute are
    HTA 0.5.0's (``kernel_type_union_us``: every state with COMMUNICATION, and those with
    COMPUTATION overlapping COMMUNICATION), to the µs."""
    from test_hta_agreement import _model, _reference, hta_scope

    from traceanalyzer.analyses._intervals import gpu_activity_classes
    from traceanalyzer.timeutil import merge_intervals

    ref = _reference().get(rel)
    if not ref:
        pytest.skip("no HTA reference for this trace")

    def union(df: pl.DataFrame) -> int:
        m = merge_intervals(df.filter(pl.col("end_ns") > pl.col("ts_ns")))
        return int((m["end_ns"] - m["start_ns"]).sum())

    for rank, rr in ref["per_rank"].items():
        states = rr["kernel_breakdown"]["kernel_type_union_us"]
        hta_comm = sum(v["sum_us"] for k, v in states.items() if "COMMUNICATION" in k)
        hta_overlap = sum(v["sum_us"] for k, v in states.items() if "COMPUTATION overlapping COMMUNICATION" in k)
        cls = gpu_activity_classes(hta_scope(_model(rel), rr))
        comm = cls.filter(pl.col("category") == "communication").select("ts_ns", "end_ns")
        comp = cls.filter(pl.col("category") == "compute").select("ts_ns", "end_ns")
        overlap = union(comm) + union(comp) - union(pl.concat([comm, comp]))
        assert (union(comm), overlap) == (hta_comm * 1000, hta_overlap * 1000), rank


# --------------------------------------------------------------------------- name families and types

FAMILY_CASES = [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "send_recv"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl", "reduce_scatter"),
    ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16", "nccl", "all_reduce"),
    ("void oneRankReduce<float>(ncclWorkElem*)", "nccl", "all_reduce"),  # one-rank reduce/all-reduce
    ("void rcclGenericKernel<1>(ncclDevComm*)", "rccl", "other"),
    ("mscclpp::collective::allreduceNvls(float*, int)", "msccl", "all_reduce"),
    ("alltoall_on_stream_kernel<float>", "nvshmem", "all_to_all"),
    ("fcollect_on_stream_kernel<float>", "nvshmem", "all_gather"),
    ("void allToAllV(void*, void*, long*, int)", "nvshmem", "all_to_all"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*)", "deepep", "dispatch"),
    ("void deep_ep::legacy::intranode::combine<__nv_bfloat16, 8>(int4*)", "deepep", "combine"),
    ("deep_ep::elastic::dispatch_impl", "deepep", "dispatch"),
    ("void vllm::cross_device_reduce_1stage<float, 2>(vllm::RankData*)", "custom_all_reduce", "all_reduce"),
    (
        "void trt_llm::oneShotAllReduceKernel<__nv_bfloat16, 8>(trt_llm::AllReduceParams)",
        "custom_all_reduce",
        "all_reduce",
    ),
    ("void sglang::allreduce_1shotLL_1node<float>(float*)", "custom_all_reduce", "all_reduce"),
    ("void c10d::symmetric_memory::multimem_all_gather_kernel<16>(char*)", "symm_mem", "all_gather"),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<float, 16, 8>(float**)", "symm_mem", "all_reduce"),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop(int, int)", "userbuffers", "reduce_scatter"),
    ("userbuffers_fp16_sum_inplace_gpu_rw_ag(int, int)", "userbuffers", "all_gather"),
    ("userbuffers_fp16_sum_inplace_gpu_mc(int, int)", "userbuffers", "all_reduce"),
    ("kuserbuffers_pushsend(int*, int*)", "userbuffers", "send_recv"),
    # not communication
    ("void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)", None, None),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", None, None),
    ("void cub::DeviceReduceByKeyKernel<cub::DispatchReduceByKey<long*, long*>>(long*)", None, None),
    ("hipMemcpyDtoD_kernel", None, None),
    ("_combined_routing_compute", None, None),
]


def test_name_families_and_collective_types() -> None:
    from traceanalyzer.analyses._comm import collective_type, family_of

    names = [n for n, _, _ in FAMILY_CASES]
    got = pl.DataFrame({"n": names}).select(
        f=family_of(pl.col("n")),
        t=pl.when(family_of(pl.col("n")).is_not_null()).then(
            pl.coalesce(collective_type(pl.col("n")), pl.lit("other"))
        ),
    )
    assert list(zip(names, got["f"], got["t"])) == FAMILY_CASES


def test_collective_names_from_metadata() -> None:
    from traceanalyzer.analyses._comm import busbw_factor, collective_type

    meta = ["allreduce", "allreduce_coalesced", "_allgather_base", "allgather_into_tensor_coalesced",
            "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "all_to_all", "all_to_allv", "broadcast",
            "send", "recv", "barrier", "gather", "scatter", "reduce"]
    got = pl.DataFrame({"n": meta}).select(t=collective_type(pl.col("n")))["t"].to_list()
    assert got == ["all_reduce", "all_reduce", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter",
                   "all_to_all", "all_to_all", "broadcast", "send_recv", "send_recv", "barrier", "gather", "scatter",
                   "reduce"]
    f = pl.DataFrame({"t": ["all_reduce", "all_gather", "all_to_all", "broadcast", "all_reduce"],
                      "n": [8, 8, 4, 8, None]}).select(busbw_factor(pl.col("t"), pl.col("n")).alias("f"))["f"]
    assert f.to_list() == [1.75, 0.875, 0.75, 1.0, None]


def test_communication_only_in_warmup_is_small_and_silent() -> None:
    """A broadcast in the (long) warm-up step only: counted in the trace, 0 per steady step."""
    t = CommTrace()
    t.step(1, 0, 5000, gpu_copy=False)
    g = t.op("aten::mm", 1, 5)
    t.kernel(g, 2, 10, 4000, "sm90_xmma_gemm_bf16bf16_bf16f32")
    rp = t.op("record_param_comms", 20, 20, **{"Collective name": "broadcast", "dtype": "Float",
                                              "In msg nelems": 250, "Group size": 2})
    t.kernel(rp, 21, 4100, 100, "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", stream=20)
    for n in range(3):
        t0 = 5000 + 1000 * n
        t.step(n + 2, t0, 1000, gpu_copy=False)
        g = t.op("aten::mm", t0 + 1, 5)
        t.kernel(g, t0 + 2, t0 + 10, 900, "sm90_xmma_gemm_bf16bf16_bf16f32")
    r = _run(t)
    tot = r["communication"].totals
    assert (tot["n_collectives"], tot["comm_ns_per_step"], tot["hidden_pct"], tot["overlap_verdict"]) == (
        1,
        0.0,
        None,
        "small",
    )
    bc = r["communication"].by_type.row(0, named=True)
    assert (bc["type"], bc["bytes"], bc["algbw_gbps"], bc["busbw_gbps"], bc["count_per_step"]) == (
        "broadcast",
        1000,
        0.01,
        0.01,
        0.0,
    )
    assert "comm_exposed" not in {f.rule_id for f in _findings(r)}


def _findings(res: Any) -> list[Any]:
    from traceanalyzer.rules import run_rules

    return list(run_rules(res, Config()).findings)


def test_tensor_parallel_advice_skips_the_custom_all_reduce_the_run_already_uses() -> None:
    """Advice checks what the run does: an engine's all-reduce that already runs as a custom
    all-reduce is not told to switch to one."""
    from types import SimpleNamespace

    from traceanalyzer.analyses.diagnosis import _comm_moves

    by_type = pl.DataFrame({"type": ["all_reduce"], "total_ns": [1000]})
    ctx = SimpleNamespace(inference_engine="vllm")
    used = _comm_moves(_Res(by_type, ["custom_all_reduce"], ctx))
    plain = _comm_moves(_Res(by_type, ["nccl"], ctx))
    assert "one-shot / custom all-reduce for small messages" in plain[0]
    assert "already runs as a custom/one-shot all-reduce" in used[0] and "vLLM custom all-reduce" not in used[0]


class _Res:
    """The slice of Results _comm_moves reads."""

    def __init__(self, by_type: pl.DataFrame, families: list[str], ctx: object) -> None:
        from types import SimpleNamespace

        self.values = {"communication": SimpleNamespace(by_type=by_type, totals={"families": families}),
                       "context": ctx}

    def typed(self, name: str, kind: type) -> object:
        return self.values.get(name)
