"""The ``context`` analysis and the advice that respects it.

Hand-built traces with known answers for each detector (compiled, graph replay, capture,
inference engine, device architecture, attention), each rule it changes, the two new rules
(legacy_arch_kernels, unfused_attention), the capture_only verdict; negatives: a compiled
trace gets no "use torch.compile" advice anywhere, a graph trace no "capture in CUDA graphs".
Real traces from ../shared check the same on vLLM/SGLang/torch.compile/V100/H100 files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_TRACES, needs_shared, shared_results
from support.events import Trace

from traceanalyzer.analyses import Results, run_analyses
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.rules import Finding, RuleOutcome, Severity, run_rules

#: Advice to start using torch.compile (what a compiled run must never be told).
USE_COMPILE_RE = re.compile(r"torch\.compile\((model|step)\b|torch\.compile \(fuses|\(torch\.compile\)|"
                            r"torch\.compile to remove|torch\.compile or ")
#: Advice to start capturing graphs (what a run replaying graphs must never be told).
CAPTURE_RE = re.compile(r"(?i)capture the step in|torch\.cuda\.CUDAGraph")

V100 = {"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0, "totalGlobalMem": 34089730048}
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 85000000000}
MI300 = {"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "gcnArchName": "gfx942:sramecc+",
         "totalGlobalMem": 206141652992}


def _doc(t: Trace, props: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    d = t.doc()
    if props is not None:
        d["deviceProperties"] = props
    return d


def _run(t: Trace | dict[str, Any], props: list[dict[str, Any]] | None = None,
         **cfg: Any) -> tuple[Results, RuleOutcome]:
    doc = _doc(t, props) if isinstance(t, Trace) else t
    config = Config(cfg)
    results = run_analyses(build_model(Path("x.json"), doc), config, strict=True)
    return results, run_rules(results, config, strict=True)


def _found(out: RuleOutcome, rid: str) -> list[Finding]:
    return [f for f in out.findings if f.rule_id == rid]


def _advice(results: Results, out: RuleOutcome) -> list[str]:
    """Every piece of advice of a run: finding fixes and code hints, the diagnosis' moves."""
    texts = [f.fix for f in out.findings] + [f.code_hint for f in out.findings]
    if "diagnosis" in results:
        texts += list(results["diagnosis"].moves)
    return texts


def _tiny(n: int = 100, api: str = "cudaLaunchKernel", kernel: str = "k") -> Trace:
    """3 launch-bound steps of 1000 µs: ``n`` launches of 8 µs, each kernel 2 µs."""
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        for i in range(n):
            ts = t0 + i * 1000 / n
            t.launch(ts, 8, ts + 8, 2, api=api, name=kernel)
    return t


# --------------------------------------------------------------------------- detectors


def test_plain_trace_has_no_context() -> None:
    t = _tiny(10)
    # torch._disable_dynamo wraps eager code (checkpointing, optimizers) in eval_frame: not compiled
    t._x("python_function", "torch/_dynamo/eval_frame.py(838): _fn", 1, 5)
    r, _ = _run(t)
    c = r["context"].to_json()
    assert (c["compiled"], c["cuda_graphs"], c["graph_capture"], c["capture_only"]) == (False, False, False, False)
    assert (c["inference_engine"], c["inference"], c["fused_attention"]) == (None, None, False)
    assert c["compiled_evidence"] == [] and c["device_arch"] is None and c["vendor"] == "nvidia"


def test_compiled_markers_frames_and_recompiles() -> None:
    t = _tiny(10, kernel="triton_poi_fused_add_0")
    for i, name in enumerate(("Torch-Compiled Region: 0/0", "Torch-Compiled Region: 1/0",
                              "Torch-Compiled Region: 0/1", "TorchDynamo Cache Lookup")):
        t.op(name, 100 * i + 1, 5)
    r, _ = _run(t)
    c = r["context"]
    assert c.compiled and c.compiled_frames == 2 and c.recompiles == 1
    assert c.compile_markers["compiled_regions"] == 3 and c.compile_markers["dynamo_cache_lookups"] == 1
    assert c.triton_kernels == 30 and c.triton_kernel_pct == 100.0
    assert "30 Inductor-generated `triton_*` kernel(s)" in c.compiled_evidence


def test_graph_replay_and_capture() -> None:
    t = _tiny(10)
    corr = t.runtime("cudaGraphLaunch", 5, 3)
    for i in range(3):
        t.gpu(corr, 20 + i, 0.5, name="replayed")
    c = _run(t)[0]["context"]
    assert (c.cuda_graphs, c.graph_launches, c.graph_kernels, c.graph_capture) == (True, 1, 3, False)
    # capture calls and no replay: a capture-only trace
    t = _tiny(10)
    t.runtime("cudaStreamBeginCapture", 1, 1)
    t.runtime("cudaStreamEndCapture", 900, 1)
    t.runtime("cudaStreamIsCapturing", 2, 1)  # a query: not evidence
    c = _run(t)[0]["context"]
    assert (c.graph_capture, c.capture_only, c.cuda_graphs) == (True, True, False)
    assert c.capture_evidence == ("2 capture runtime call(s) (`cudaStreamBeginCapture`, `cudaStreamEndCapture`)",)
    # capture then replay: not capture-only
    t.runtime("cudaGraphLaunch", 950, 1)
    assert _run(t)[0]["context"].capture_only is False


def test_inference_engine_and_tokens() -> None:
    t = _tiny(10)
    t.op("vllm::unified_attention", 1, 2)
    t.ann("execute_64_context_0(sq0)_generation_64(sq64)", 0, 2000)
    c = _run(t)[0]["context"]
    assert c.inference_engine == "vllm"
    assert c.inference == {"source": "execute_<tokens>_context_<n>_generation_<n> annotations", "engine_steps": 1,
                           "phase": "decode", "tokens_per_step": 64.0, "sequences_per_step": 64.0,
                           "engine_step_ms": 2.0, "tokens_per_s": 32000.0}
    t = _tiny(10)
    t.ann("step[EXTEND bs=4 toks=4096]", 0, 1000)
    c = _run(t)[0]["context"]
    assert c.inference_engine == "sglang" and c.inference["phase"] == "prefill"
    assert (c.inference["tokens_per_step"], c.inference["sequences_per_step"], c.inference["tokens_per_s"]) == (
        4096.0, 4.0, 4096000.0)


@pytest.mark.parametrize(("props", "kernel", "arch", "source", "bf16"), [
    ([V100], "k", "volta", "device_properties", False),
    ([H100], "k", "hopper", "device_properties", True),
    ([MI300], "k", "cdna3", "device_properties", True),
    # ROCm's "AMD Radeon Graphics" name with 9.0: the CU count tells MI200 (104) from MI100 (120).
    ([{"id": 0, "name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "numSms": 104}], "k", "cdna2",
     "device_properties", True),
    ([{"id": 0, "name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "numSms": 60}], "k", None,
     None, None),  # Vega 20 or unknown: no claim
    ([{"id": 0, "name": "Tesla T4"}], "k", "turing", "device_name", False),
    ([], "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "hopper", "kernel_names", True),
    ([], "volta_sgemm_128x64_nn", "volta", "kernel_names", False),
])
def test_device_architecture(props: list[dict[str, Any]], kernel: str, arch: str | None, source: str | None,
                             bf16: bool | None) -> None:
    api = "hipLaunchKernel" if props and "AMD" in props[0]["name"] else "cudaLaunchKernel"
    c = _run(_tiny(10, api=api, kernel=kernel), props)[0]["context"]
    assert (c.device_arch, c.arch_source, c.supports_bf16) == (arch, source, bf16)


def test_kernel_families() -> None:
    t = Trace()
    t.step(1, 0, 1000, gpu_copy=False)
    t.launch(0, 5, 10, 300, name="void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>")
    t.launch(10, 5, 400, 100, name="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
    t.launch(20, 5, 600, 50, name="ampere_sgemm_32x32_sliced1x4_tn")
    fams = {f["family"]: (f["kernels"], f["gpu_ns"]) for f in _run(t, [H100])[0]["context"].kernel_families}
    assert fams == {"turing": (1, 300_000), "hopper": (1, 100_000), "ampere": (1, 50_000)}


# --------------------------------------------------------------------------- advice respects it


def test_compiled_run_gets_no_use_torch_compile_advice() -> None:
    plain_r, plain = _run(_tiny())
    assert any(USE_COMPILE_RE.search(a) for a in _advice(plain_r, plain))  # the generic advice exists …
    t = _tiny()
    t.op("Torch-Compiled Region: 0/0", 1, 900)
    t.op("Torch-Compiled Region: 1/0", 1001, 900)
    r, out = _run(t)
    lb = _found(out, "launch_bound_kernels")[0]
    assert "already compiled" in lb.fix and "graph breaks" in lb.fix and "2 compiled frames" in lb.fix
    assert "reduce-overhead" in lb.fix  # what compiled code without graph replay lacks
    assert "TORCH_LOGS=graph_breaks" in lb.code_hint
    bad = [a for a in _advice(r, out) if USE_COMPILE_RE.search(a)]
    assert bad == []  # … and no compiled run is told to start using torch.compile


def test_graph_run_gets_no_capture_advice() -> None:
    t = _tiny()
    corr = t.runtime("cudaGraphLaunch", 2990, 3)
    t.gpu(corr, 2995, 1, name="replayed")
    r, out = _run(t)
    lb = _found(out, "launch_bound_kernels")[0]
    assert lb.fix.startswith("The trace already replays 1 graph launches: the launch-bound part is the work launched "
                             "eagerly outside them")
    bad = [a for a in _advice(r, out) if CAPTURE_RE.search(a)]
    assert bad == []
    for rid in ("host_bound_gaps", "low_gpu_utilization"):
        for f in _found(out, rid):
            assert "already replays CUDA graphs" in f.fix


def test_capture_only_trace_withholds_steady_state() -> None:
    t = _tiny()
    t.runtime("cudaStreamBeginCapture", 0, 1)
    t.runtime("cudaStreamEndCapture", 2999, 1)
    r, out = _run(t)
    d = r["diagnosis"]
    assert d.verdict == "capture_only" and d.share_pct == 0.0
    assert d.verdict_line().startswith("capture/warm-up trace (steady-state verdict withheld)")
    assert set(d.per_step["verdict"].to_list()) == {"capture_only"}
    assert d.moves[0].startswith("Profile the steady state instead")
    assert any("capture/warm-up trace" in n for n in d.notes)
    for rid in ("launch_bound_kernels", "low_gpu_utilization", "host_bound_gaps", "kernel_count"):
        assert _found(out, rid) == []
        assert "withheld" in out.not_run.get(rid, ""), (rid, out.not_run.get(rid))
    assert d.to_json()["verdict"] == "capture_only"


def test_fp32_gemm_on_volta_advises_fp16_not_bf16_or_tf32() -> None:
    t = _tiny(10, kernel="volta_sgemm_128x64_nn")
    f = _found(_run(t, [V100])[1], "fp32_gemm")[0]
    assert "fp16 with autocast and a GradScaler" in f.fix and "bf16 and TF32 need Ampere or newer" in f.fix
    assert "set_float32_matmul_precision" not in f.fix and "bfloat16" not in f.code_hint
    assert f.evidence["device_arch"] == "volta"
    t = _tiny(10, kernel="ampere_sgemm_128x64_nn")
    f = _found(_run(t, [dict(H100, name="NVIDIA A100", computeMajor=8)])[1], "fp32_gemm")[0]
    assert "set_float32_matmul_precision" in f.fix and "bfloat16" in f.code_hint


def _memory_trace(engine_op: str | None) -> dict[str, Any]:
    t = _tiny(10)
    if engine_op:
        t.op(engine_op, 1, 2)
    d = _doc(t, [H100])
    for i, total in enumerate((40e9, 80e9, 81e9)):
        d["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 100 + 500 * i,
                                 "pid": 100, "tid": 100, "s": "t",
                                 "args": {"Addr": 1000 + i, "Bytes": int(1e9), "Total Allocated": int(total),
                                          "Total Reserved": int(total), "Device Type": 1, "Device Id": 0}})
    return d


def test_memory_capacity_is_not_a_problem_for_an_inference_engine() -> None:
    f = _found(_run(_memory_trace(None))[1], "memory_capacity")[0]
    assert f.severity == Severity.WARNING and f.cost_bytes == int(81e9 - 0.9 * 85e9)
    f = _found(_run(_memory_trace("vllm::unified_attention"))[1], "memory_capacity")[0]
    assert f.severity == Severity.INFO and f.cost_bytes is None
    assert f.title.endswith("vllm's KV-cache preallocation, by design, not a capacity problem")
    assert "gpu_memory_utilization" in f.fix and "checkpoint" not in f.code_hint


def test_inference_throughput_is_tokens_not_samples() -> None:
    t = _tiny(10)
    t.op("sglang::forward", 1, 2)
    t.ann("step[DECODE bs=16]", 0, 1000)
    r, _ = _run(t)
    assert r["baseline"].samples_per_s is None and r["baseline"].tokens_per_s == 16000.0
    line = r["diagnosis"].throughput_line
    assert line.startswith("16,000.0 tokens/s (sglang decode: 16 tokens and 16 sequences per engine step of 1.000 ms")
    assert "samples" not in line


# --------------------------------------------------------------------------- new rules


def _families_trace(old: str, old_us: float, new_us: float) -> Trace:
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        t.launch(t0, 5, t0 + 10, old_us, name=old)
        t.launch(t0 + 10, 5, t0 + 20 + old_us, new_us, name="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
    return t


def test_legacy_arch_kernels_prices_old_generation_kernels() -> None:
    # per step: 300 µs of a Turing (cutlass_75) GEMM + 100 µs of sm90 on an H100: 75 % of kernel
    # time; cost = 0.5 × 300 µs = 0.15 ms/step (15 % of the 1 ms step) → WARNING (≥ 10 %)
    t = _families_trace("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>", 300, 100)
    f = _found(_run(t, [H100])[1], "legacy_arch_kernels")[0]
    assert f.severity == Severity.WARNING
    assert f.title == "75.0 % of kernel time runs turing-generation kernels on a hopper device (NVIDIA H100 80GB HBM3)"
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.15, 15.0, 0.3)
    assert f.evidence["legacy_ms_per_step"] == 0.3
    # Ampere-family kernels on Hopper are the libraries' normal choice: silent
    t = _families_trace("ampere_sgemm_32x32_sliced1x4_tn", 300, 100)
    assert _found(_run(t, [H100])[1], "legacy_arch_kernels") == []
    # on a Volta device, Volta kernels are its own
    t = _families_trace("volta_sgemm_128x64_nn", 300, 100)
    assert _found(_run(t, [V100])[1], "legacy_arch_kernels") == []
    # no device properties: the device is unknown, the rule says so instead of guessing
    _, out = _run(_families_trace("volta_sgemm_128x64_nn", 300, 100))
    assert "architecture is unknown" in out.not_run["legacy_arch_kernels"]


def _attention_trace(fused: bool = False) -> Trace:
    """Per step: bmm (QK^T, 100 µs), masked_fill (50 µs), softmax (150 µs), bmm (100 µs), and
    a 600 µs GEMM outside attention: the pattern is 400 of 1000 µs of kernel time (40 %)."""
    t = Trace()
    for s in range(3):
        t0 = 1000 * s + 1
        t.step(s + 1, t0 - 1, 1000, gpu_copy=False)
        for i, (op, k, dur) in enumerate((
                ("aten::bmm", "gemm_bmm_kernel", 100), ("aten::masked_fill_", "elementwise_kernel_where", 50),
                ("aten::_softmax", "softmax_warp_forward", 150), ("aten::bmm", "gemm_bmm_kernel", 100),
                ("aten::mm", "sm90_xmma_gemm_bf16", 600))):
            ts = t0 + 10 * i
            t.op(op, ts, 8)
            t.launch(ts + 1, 5, t0 + 100 + sum((100, 50, 150, 100, 600)[:i]), dur, name=k)
        if fused:
            t.launch(t0 + 60, 5, t0 + 990, 1, name="flash_fwd_kernel")
    return t


def test_unfused_attention_fires_with_its_cost() -> None:
    r, out = _run(_attention_trace(), [H100])
    p = r["context"].attention_pattern
    assert (p["bmm_ns_per_step"], p["softmax_ns_per_step"], p["masked_fill_ns_per_step"]) == (200e3, 150e3, 50e3)
    assert (p["present"], p["pct_of_kernel_time"]) == (True, 40.0)
    f = _found(out, "unfused_attention")[0]
    assert f.severity == Severity.WARNING
    assert f.title == ("Unfused attention (bmm + softmax + masked_fill) is 40 % of kernel time (0.4 ms/step) and no "
                       "fused attention kernel runs")
    assert (f.cost_ms_per_step, f.cost_pct_of_step, f.confidence) == (0.2, 20.0, 0.4)
    assert "scaled_dot_product_attention" in f.code_hint


def test_unfused_attention_silent_with_fused_attention_or_below_threshold() -> None:
    r, out = _run(_attention_trace(fused=True), [H100])
    assert r["context"].fused_attention and _found(out, "unfused_attention") == []
    _, out = _run(_attention_trace(), [H100], **{"unfused_attention.min_pct_of_kernel_time": 50.0})
    assert _found(out, "unfused_attention") == []


# --------------------------------------------------------------------------- real traces


def _shared(rel: str) -> Path:
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"{rel} not in ../shared")
    return p


def _real(rel: str) -> tuple[Results, RuleOutcome]:
    r = shared_results(_shared(rel))
    return r, run_rules(r, Config(), strict=True)


@needs_shared
def test_real_vllm_capture_trace() -> None:
    r, out = _real("tracelens/inference/vllm_graph_capture_rank_0.pt.trace.json.gz")
    c = r["context"]
    assert (c.graph_capture, c.capture_only, c.cuda_graphs, c.inference_engine) == (True, True, False, "vllm")
    assert c.compiled and c.device_arch == "cdna3" and c.vendor == "amd"
    assert r["diagnosis"].verdict == "capture_only"
    mem = _found(out, "memory_capacity")[0]
    assert mem.title == ("GPU 0 peaks at 93.0 % of its 192.0 GiB: vllm's KV-cache preallocation, by design, not a "
                         "capacity problem")
    assert mem.severity == Severity.INFO and mem.cost_bytes is None
    for rid in ("launch_bound_kernels", "low_gpu_utilization", "host_bound_gaps"):
        assert _found(out, rid) == []
    assert not [a for a in _advice(r, out) if USE_COMPILE_RE.search(a) or CAPTURE_RE.search(a)]


@needs_shared
def test_real_vllm_graph_execution_trace() -> None:
    r, out = _real("tracelens/inference/vllm_graph_execution.json.gz")
    c = r["context"]
    assert (c.cuda_graphs, c.graph_launches, c.capture_only, c.compiled, c.inference_engine) == (
        True, 1, False, True, "vllm")
    assert c.graph_kernels == 421 and c.triton_kernels == 48
    assert c.inference["phase"] == "decode" and c.inference["tokens_per_step"] == 32.0
    assert r["diagnosis"].throughput_line.startswith("13,285.7 tokens/s (vllm decode")
    assert r["baseline"].samples_per_s is None
    assert not [a for a in _advice(r, out) if USE_COMPILE_RE.search(a) or CAPTURE_RE.search(a)]


@needs_shared
@pytest.mark.parametrize("name", ["sglang_Qwen3-8B_decode.json.gz", "sglang_Qwen3-8B_prefilldecode.json.gz"])
def test_real_sglang_traces(name: str) -> None:
    r, out = _real(f"tracelens/inference/{name}")
    c = r["context"]
    assert c.inference_engine == "sglang" and c.device_arch == "cdna3" and c.fused_attention
    assert c.cuda_graphs is ("decode" in name and "prefill" not in name)
    assert "tokens/s" in r["diagnosis"].throughput_line
    d = r["diagnosis"]
    if d.verdict == "sync_bound":  # the engine's own syncs: its settings, not .item() in user code
        assert d.moves[0].startswith("The blocking syncs are in sglang's engine step") and ".item()" not in d.moves[0]
    if c.cuda_graphs:
        assert not [a for a in _advice(r, out) if CAPTURE_RE.search(a)]


@needs_shared
@pytest.mark.parametrize(("rel", "arch"), [("tracelens/misc/torch_compile_triton.json.gz", "cdna3"),
                                           ("hta/triton_example/triton_example.json.gz", "ampere")])
def test_real_compiled_traces(rel: str, arch: str) -> None:
    r, out = _real(rel)
    c = r["context"]
    assert c.compiled and c.compile_markers["compiled_regions"] == 1 and c.triton_kernels >= 1
    assert c.device_arch == arch
    assert not [a for a in _advice(r, out) if USE_COMPILE_RE.search(a)]


@needs_shared
def test_real_h100_timesformer_legacy_kernels_and_unfused_attention() -> None:
    r, out = _real("tracelens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz")
    c = r["context"]
    assert c.device_arch == "hopper" and not c.fused_attention
    assert c.attention_pattern["present"] and c.attention_pattern["pct_of_kernel_time"] == 73.47
    ua = _found(out, "unfused_attention")[0]
    assert ua.severity == Severity.WARNING and ua.cost_ms_per_step == pytest.approx(56.89, abs=0.01)
    la = _found(out, "legacy_arch_kernels")[0]
    assert la.title.startswith("27.9 % of kernel time runs turing-generation kernels on a hopper device")
    assert la.evidence["legacy_families"][0]["kernels"] == 24


# --------------------------------------------------------------------------- annotated phases


def test_record_function_ranges_become_annotated_phases() -> None:
    # per step, two layers: `layer_<l>.attn` (150 µs CPU, a 100 µs kernel) and `layer_<l>.mlp`
    # (150 µs CPU, a 50 µs kernel); no CPU ops, so the six phases leave the CPU time in `other`
    t = Trace()
    for s in range(3):
        t0 = 1000 * s
        t.step(s + 1, t0, 1000, gpu_copy=False)
        for layer in range(2):
            b = t0 + 400 * layer
            t.ann(f"layer_{layer}.attn", b, 150)
            t.launch(b + 10, 5, b + 20, 100, name="gemm_attn")
            t.ann(f"layer_{layer}.mlp", b + 200, 150)
            t.launch(b + 210, 5, b + 220, 50, name="gemm_mlp")
        t.ann("ProfilerStep#x", t0, 5)  # never a phase
    r, _ = _run(t)
    ph = r["phases"]
    assert ph.annotated.rows() == [("layer_N.attn", 6, 300e3, 30.0, 200e3, 20.0),
                                   ("layer_N.mlp", 6, 300e3, 30.0, 100e3, 10.0)]
    assert ph.annotated_line("gpu") == "layer_N.attn 20.0 %, layer_N.mlp 10.0 %"
    assert ph.cpu_mean["other_ns"] == 1e6  # the six phase ids are unchanged …
    d = r["diagnosis"]
    assert d.dominant_phase == "forward"
    # … and the diagnosis names where the time goes
    assert "record_function ranges: layer_N.attn 20.0 %, layer_N.mlp 10.0 % of the step" in d.phase_line
    assert ph.to_json()["annotated_phases"][0]["phase"] == "layer_N.attn"


def test_no_annotated_phases_without_model_part_ranges() -> None:
    t = _tiny(10)
    t.ann("my_logging", 5, 10)
    t.ann("Optimizer.step#AdamW.step", 20, 10)
    r, _ = _run(t)
    assert r["phases"].annotated.is_empty() and r["phases"].annotated_line() == ""


@needs_shared
def test_real_df_index_resolver_is_compiled_on_a_v100() -> None:
    r, out = _real("hta/df_index_resolver/df_index_resolver.json.gz")
    c = r["context"]
    assert c.compiled and c.compile_markers["compiled_functions"] == 15 and c.triton_kernels == 0
    assert (c.device_arch, c.supports_bf16, c.supports_tf32) == ("volta", False, False)
    assert c.kernel_families[0]["family"] == "volta"
    fp32 = _found(out, "fp32_gemm")[0]
    assert "fp16 with autocast and a GradScaler" in fp32.fix and "set_float32_matmul_precision" not in fp32.fix
    assert _found(out, "legacy_arch_kernels") == []  # Volta kernels on a Volta device
    assert not [a for a in _advice(r, out) if USE_COMPILE_RE.search(a)]


@needs_shared
@pytest.mark.parametrize("rel", ["hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
                                 "hta/trace_diff/test/test.json.gz"])
def test_real_v100_traces_get_no_bf16_or_tf32_advice(rel: str) -> None:
    r, out = _real(rel)
    c = r["context"]
    assert (c.device_arch, c.arch_source, c.supports_bf16) == ("volta", "device_properties", False)
    for a in _advice(r, out):
        assert "set_float32_matmul_precision" not in a and "dtype=torch.bfloat16" not in a, a


def test_inference_step_is_judged_per_token() -> None:
    t = _tiny(10)
    t.op("vllm::unified_attention", 1, 2)
    t.ann("execute_64_context_0(sq0)_generation_64(sq64)", 0, 2000)
    d = _run(t)[0]["diagnosis"]
    assert "vllm decode engine step: 2.000 ms for 64 token(s) of 64 sequence(s), 31.2 µs per token." in d.evidence


def test_host_blocking_findings_inside_an_engine_point_at_its_settings() -> None:
    """item_sync / explicit_sync / blocking_copies / pageable_memcpy wrap their finding with
    for_engine: inside vLLM/SGLang the sync is the engine's step, so its settings come first."""
    import dataclasses

    from traceanalyzer.analyses.context import ContextResult
    from traceanalyzer.rules import Finding, Severity
    from traceanalyzer.rules._advice import for_engine

    f = Finding("blocking_copies", Severity.WARNING, "t", {}, "Issue copies asynchronously.",
                "x.to(d, non_blocking=True)")
    assert for_engine(Results(), f) is f  # no context: unchanged
    ctx = dataclasses.replace(_run(_tiny())[0].need("context", ContextResult), inference_engine="sglang")
    out = for_engine(Results(values={"context": ctx}), f)
    assert out.fix.startswith("The blocking syncs are in sglang's engine step")
    assert out.fix.endswith("For code of your own inside the step: Issue copies asynchronously.")
    assert "--disable-overlap-schedule" in out.code_hint
