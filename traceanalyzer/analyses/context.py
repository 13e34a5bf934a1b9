"""Context: what the run already does, so that advice never repeats it.

A recommendation that says "use torch.compile" to a compiled run, or "capture the step in CUDA
graphs" to a run that replays them, costs the reader's trust. Every rule and the diagnosis read
this result (``ctx.typed("context", ContextResult)`` in an analysis; when absent they behave as
without it) before they advise. ``docs/context.md`` lists each check, its signals and the advice it changes.

Checks (all vectorised over the distinct names of each table, never per event)
----------------------------------------------------------------------------
* **compiled** (torch.compile / AOTAutograd / Inductor): ``Torch-Compiled Region: F/C`` ranges
  (``F`` the compiled frame, ``C`` its compile id: ``C > 0`` is a **recompile**, more than one
  frame means the function was split by **graph breaks**), ``CompiledFunction`` /
  ``CompiledFunctionBackward`` (AOTAutograd), ``## Call CompiledFxGraph …`` (Inductor),
  ``TorchDynamo Cache Lookup`` (Dynamo guard checks), Inductor-generated kernels ``triton_*``,
  Python frames of Inductor / AOTAutograd runtime code (not ``torch/_dynamo/eval_frame.py``:
  ``torch._disable_dynamo`` puts eager code there too). ``compiled_evidence`` says which.
* **cuda_graphs**: CUDA/HIP graph replays — runtime calls ``cudaGraphLaunch`` /
  ``hipGraphLaunch`` / ``cuGraphLaunch`` — and the kernels they replay (same correlation id, or
  a ``graph id`` on the kernel).
* **graph_capture**: stream capture seen — runtime ``…StreamBeginCapture`` /
  ``…StreamEndCapture`` / ``…GraphInstantiate``, annotations ``capture_<n>…`` (vLLM) or named
  like a graph capture, Python frames of a capture routine (``_capture_cudagraphs``,
  ``capture_begin`` …). (``cudaStreamIsCapturing`` / ``GetCaptureInfo`` are queries every
  replay path makes: not evidence.) **capture_only**: capture seen and no replay — a
  capture/warm-up trace. Kernels launched under capture are recorded, not run: its idle time,
  launch counts and utilisation say nothing of the steady state.
* **inference_engine**: ``vllm`` / ``sglang`` / ``tensorrt_llm`` from CPU op namespaces
  (``vllm::``, ``sglang::``, ``trtllm``), thread names, Python frames (``vllm/``,
  ``sglang/``, ``tensorrt_llm/``) and annotations (``step[DECODE bs=…]``); kernel names
  (``vllm::`` kernels are reused by other engines) only when nothing else speaks. Engine steps
  and tokens from annotations ``execute_<tokens>_context_<n>(…)_generation_<n>(…)`` and
  ``step[DECODE|EXTEND|PREFILL bs=<n> toks=<n>]``: ``inference`` gives the phase (decode /
  prefill / mixed), tokens and sequences per engine step and tokens/s (Σ tokens / Σ their
  ranges' duration).
* **device**: ``device_name``, ``vendor``, ``compute_capability`` and ``device_arch`` of the
  busiest device from ``deviceProperties`` (``computeMajor/Minor``, ``gcnArchName``, else
  the name: V100, A100, H100, MI300X …), else from the kernel names' architecture families.
  ``kernel_families``: kernels per architecture family by name (``sm90_``/``wgmma`` hopper,
  ``sm80_``/``ampere_``/``cutlass_80_`` ampere, ``sm75_``/``turing_``/``cutlass_75_``
  turing, ``volta_``/``sm70_`` volta, ``gfx942`` cdna3 …) with their count and GPU time.
  ``supports_bf16`` / ``supports_tf32`` follow the architecture (NVIDIA: Ampere and later;
  AMD: CDNA2 and later for bf16, CDNA3 for the xf32 equivalent).
* **attention**: ``fused_attention`` when fused attention runs (kernels ``flash``/``fmha``/
  ``sdpa``/``efficient_attention``/``paged_attention``/``unified_attention``, ops
  ``aten::_scaled_dot_product_*``/``_flash_attention_*``/``_efficient_attention_*``); and
  the **unfused pattern** of the steady steps: GPU time of kernels launched inside
  ``aten::bmm``/``baddbmm``, softmax (ops ``aten::_softmax``/``softmax``/``_masked_softmax``
  or ``softmax`` kernels) and ``aten::masked_fill`` — the rule ``unfused_attention`` prices it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from polars.expr.whenthen import ChainedThen, Then

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._copysync import runtime_by_correlation
from traceanalyzer.analyses._kernels import on_distinct
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, deepest_at

COMPILED_REGION_RE = r"^Torch-Compiled Region"
COMPILED_FUNCTION_RE = r"CompiledFunction"
COMPILED_FX_RE = r"CompiledFxGraph"
DYNAMO_LOOKUP_RE = r"TorchDynamo Cache Lookup"
INDUCTOR_KERNEL_RE = r"^triton_"
#: Python frames of compiled code running: Inductor's runtime and output code, AOTAutograd's
#: runtime wrappers. Not ``torch/_dynamo/eval_frame.py``: ``torch._disable_dynamo`` wraps eager
#: code (torch.utils.checkpoint, optimizers) in it.
COMPILE_FRAME_RE = r"torch/_inductor/|torch/_functorch/_aot_autograd/runtime_wrappers"
GRAPH_LAUNCH_RE = r"GraphLaunch"
CAPTURE_API_RE = r"StreamBeginCapture|StreamEndCapture|GraphInstantiate"
CAPTURE_ANN_RE = r"(?i)^capture_\d|cuda_?graph.{0,20}captur|graph_?captur|captur.{0,20}cuda_?graph"
CAPTURE_FRAME_RE = r"_capture_cudagraphs|capture_begin|capture_end|\): capture(_one_batch_size)?$"
FUSED_ATTENTION_KERNEL_RE = (r"(?i)flash|fmha|sdpa|efficient_attention|mem_eff|paged_attention|unified_attention"
                             r"|attention_fwd|attn_fwd|fused_attn|flashinfer|cudnn.*mha")
FUSED_ATTENTION_OP_RE = r"^aten::_(scaled_dot_product|flash_attention|efficient_attention|fused_sdp|cudnn_attention)"
BMM_OP_RE = r"^aten::(bmm|baddbmm)$"
SOFTMAX_OP_RE = r"^aten::(_softmax|softmax|_masked_softmax|_safe_softmax)$"
MASK_OP_RE = r"^aten::masked_fill_?$"
SOFTMAX_KERNEL_RE = r"(?i)softmax"

#: engine → regex over CPU op / annotation / thread / Python frame names (strong evidence).
ENGINE_RE: dict[str, str] = {
    "vllm": r"(?i)^vllm::|(^|/)vllm/|VLLM::|^vllm_",
    "sglang": r"(?i)^sglang|(^|/)sglang/|^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE)\b",
    "tensorrt_llm": r"(?i)tensorrt_llm|trtllm|^trt_llm",
}
#: engine → regex over kernel names (weak: engines share kernels).
ENGINE_KERNEL_RE: dict[str, str] = {
    "vllm": r"\bvllm::", "sglang": r"\bsgl_|sglang", "tensorrt_llm": r"(?i)tensorrt_llm|trtllm",
}
EXECUTE_RE = r"^execute_(\d+)_context_(\d+)\(.*\)_generation_(\d+)\("
SGLANG_STEP_RE = r"^step\[(\w+)[^\]]*?bs=(\d+)(?:[^\]]*?toks=(\d+))?"

#: Architecture families by kernel name: (family regex, family, compute capability). First match wins.
KERNEL_FAMILIES: tuple[tuple[str, str, float], ...] = (
    (r"(?i)sm_?1[02]\d[a-z]?_|cutlass_1[02]\d_|tcgen05|umma", "blackwell", 10.0),
    (r"(?i)sm_?90a?_|cutlass_90_|wgmma|gmma_|_sm90|sm90_xmma|hopper", "hopper", 9.0),
    (r"(?i)sm_?89_|cutlass_89_|ada_", "ada", 8.9),
    (r"(?i)sm_?8[06]_|cutlass_8[06]_|ampere_|_sm80", "ampere", 8.0),
    (r"(?i)sm_?75_|cutlass_75_|turing_", "turing", 7.5),
    (r"(?i)sm_?7[02]_|cutlass_70_|volta_", "volta", 7.0),
    (r"(?i)gfx95\d", "cdna4", 9.5),
    (r"(?i)gfx94\d", "cdna3", 9.4),
    (r"(?i)gfx90a", "cdna2", 9.0),
)
_NV_ARCH_BY_CC = ((10.0, "blackwell"), (9.0, "hopper"), (8.9, "ada"), (8.0, "ampere"), (7.5, "turing"),
                  (7.0, "volta"), (6.0, "pascal"), (0.0, "older"))
_NV_ARCH_BY_NAME = ((r"B200|B100|GB200|GB300|B300|RTX 50|RTX PRO 6000|Blackwell", "blackwell"),
                    (r"H100|H200|H800|H20\b|GH200|Hopper", "hopper"),
                    (r"L40|L4\b|RTX 40|RTX 6000 Ada|Ada", "ada"),
                    (r"A100|A800|A10\b|A10G|A30|A40|A16|A2\b|RTX 30|RTX A\d", "ampere"),
                    (r"T4\b|RTX 20|Quadro RTX|TITAN RTX|Turing", "turing"),
                    (r"V100|TITAN V|Volta", "volta"))
_AMD_ARCH_BY_GFX = ((r"gfx95", "cdna4"), (r"gfx94", "cdna3"), (r"gfx90a", "cdna2"), (r"gfx908", "cdna1"),
                    (r"gfx12", "rdna4"), (r"gfx11", "rdna3"), (r"gfx103", "rdna2"))
_AMD_ARCH_BY_NAME = ((r"MI35|MI350|MI355", "cdna4"), (r"MI300|MI325", "cdna3"), (r"MI250|MI210|MI200", "cdna2"),
                     (r"MI100", "cdna1"))
#: compute capability of an architecture (NVIDIA), for the family-vs-device comparison.
ARCH_CC: dict[str, float] = {"volta": 7.0, "turing": 7.5, "ampere": 8.0, "ada": 8.9, "hopper": 9.0,
                             "blackwell": 10.0}
_BF16 = {"ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4", "rdna3", "rdna4", "xe"}
_TF32 = {"ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4"}


@dataclass(frozen=True)
class ContextResult:
    """What the run already does (see the module docstring for each field)."""

    compiled: bool
    compiled_evidence: tuple[str, ...]
    compile_markers: dict[str, int]
    compiled_frames: int
    recompiles: int
    triton_kernels: int
    triton_kernel_pct: float | None  # % of kernel time in Inductor-generated kernels
    cuda_graphs: bool
    graph_launches: int
    graph_kernels: int
    graph_capture: bool
    capture_evidence: tuple[str, ...]
    capture_only: bool
    inference_engine: str | None
    engine_evidence: tuple[str, ...]
    inference: dict[str, Any] | None
    device_name: str | None
    device_arch: str | None
    arch_source: str | None  # "device_properties" / "device_name" / "kernel_names"
    compute_capability: str | None
    vendor: str
    supports_bf16: bool | None
    supports_tf32: bool | None
    kernel_families: tuple[dict[str, Any], ...]
    fused_attention: bool
    attention_evidence: tuple[str, ...]
    attention_pattern: dict[str, Any] = field(default_factory=dict)

    @property
    def steady_kernel_ns_per_step(self) -> float:
        """Kernel time per steady step (the base of the attention and family shares)."""
        return float(self.attention_pattern.get("kernel_ns_per_step", 0.0) or 0.0)

    @property
    def graphs_name(self) -> str:
        return "HIP graphs" if self.vendor == "amd" else "CUDA graphs"

    def to_json(self) -> dict[str, Any]:
        return {
            "compiled": self.compiled,
            "compiled_evidence": list(self.compiled_evidence),
            "compile_markers": self.compile_markers,
            "compiled_frames": self.compiled_frames,
            "recompiles": self.recompiles,
            "triton_kernels": self.triton_kernels,
            "triton_kernel_pct_of_kernel_time": self.triton_kernel_pct,
            "cuda_graphs": self.cuda_graphs,
            "graph_launches": self.graph_launches,
            "graph_kernels": self.graph_kernels,
            "graph_capture": self.graph_capture,
            "capture_evidence": list(self.capture_evidence),
            "capture_only": self.capture_only,
            "inference_engine": self.inference_engine,
            "engine_evidence": list(self.engine_evidence),
            "inference": self.inference,
            "device_name": self.device_name,
            "device_arch": self.device_arch,
            "arch_source": self.arch_source,
            "compute_capability": self.compute_capability,
            "vendor": self.vendor,
            "supports_bf16": self.supports_bf16,
            "supports_tf32": self.supports_tf32,
            "kernel_families": list(self.kernel_families),
            "fused_attention": self.fused_attention,
            "attention_evidence": list(self.attention_evidence),
            "attention_pattern": self.attention_pattern,
            "steady_kernel_ns_per_step": self.steady_kernel_ns_per_step,
        }

    def summary(self) -> list[tuple[str, str]]:
        dev = self.device_name or "unknown device"
        arch = f"{self.device_arch} ({self.arch_source})" if self.device_arch else "architecture unknown"
        out = [("Device", f"{dev}, {arch}" + (f", compute capability {self.compute_capability}"
                                                if self.compute_capability else ""))]
        out.append(("Compiled", "yes: " + "; ".join(self.compiled_evidence) if self.compiled else "no"))
        g = (f"replayed: {self.graph_launches:,} launch(es), {self.graph_kernels:,} kernel(s)" if self.cuda_graphs
             else "not replayed")
        if self.graph_capture:
            g += "; capture seen" + (" (capture-only trace: no steady state)" if self.capture_only else "")
        out.append((self.graphs_name, g))
        if self.inference_engine:
            inf = self.inference or {}
            extra = (f", {inf['phase']}: {inf['tokens_per_step']:,.0f} tokens per engine step"
                     if inf.get("tokens_per_step") else "")
            out.append(("Inference engine", f"{self.inference_engine}{extra}"))
        out.append(("Attention", "fused (" + "; ".join(self.attention_evidence) + ")" if self.fused_attention
                    else "no fused attention kernels"))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        if not self.kernel_families:
            return {}
        return {"Kernels by architecture family": pl.DataFrame(list(self.kernel_families))}


def _names(df: pl.DataFrame) -> pl.DataFrame:
    """Distinct names with their count (every check reads names, never events)."""
    if df.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "n": pl.Int64})
    return df.group_by("name").agg(n=pl.len().cast(pl.Int64))


def _hits(names: pl.DataFrame, pattern: str) -> int:
    return int(names.filter(pl.col("name").str.contains(pattern))["n"].sum() or 0) if names.height else 0


def _compile(model: TraceModel, ops: pl.DataFrame, anns: pl.DataFrame, frames: pl.DataFrame,
             kn: pl.DataFrame) -> tuple[dict[str, int], list[str], int, int, int, float | None]:
    both = pl.concat([ops, anns])
    markers = {
        "compiled_regions": _hits(both, COMPILED_REGION_RE),
        "compiled_functions": _hits(both, COMPILED_FUNCTION_RE),
        "compiled_fx_graphs": _hits(both, COMPILED_FX_RE),
        "dynamo_cache_lookups": _hits(both, DYNAMO_LOOKUP_RE),
        "compile_frames": _hits(frames, COMPILE_FRAME_RE),
    }
    tri = kn.filter(pl.col("name").str.contains(INDUCTOR_KERNEL_RE)) if kn.height else kn
    markers["triton_kernels"] = int(tri["n"].sum() or 0) if tri.height else 0
    total_ns = int(kn["ns"].sum() or 0) if kn.height else 0
    tri_pct = round(int(tri["ns"].sum() or 0) * 100.0 / total_ns, 2) if tri.height and total_ns else None
    # "Torch-Compiled Region: 0/1": frame 0, compile 1 (a recompile of frame 0).
    ids = both.filter(pl.col("name").str.contains(COMPILED_REGION_RE)).select(
        pl.col("name").str.extract(r"(\d+)/\d+", 1).cast(pl.Int64, strict=False).alias("frame"),
        pl.col("name").str.extract(r"\d+/(\d+)", 1).cast(pl.Int64, strict=False).alias("compile"),
    ).drop_nulls().unique()
    frames_n = int(ids["frame"].n_unique()) if ids.height else 0
    recompiles = int(ids.filter(pl.col("compile") > 0).height) if ids.height else 0
    words = {
        "compiled_regions": "`Torch-Compiled Region` range(s)",
        "compiled_functions": "`CompiledFunction` (AOTAutograd) range(s)",
        "compiled_fx_graphs": "`CompiledFxGraph` (Inductor) call(s)",
        "dynamo_cache_lookups": "`TorchDynamo Cache Lookup` range(s)",
        "triton_kernels": "Inductor-generated `triton_*` kernel(s)",
        "compile_frames": "Python frame(s) of Inductor / AOTAutograd runtime code",
    }
    evidence = [f"{v:,} {words[k]}" for k, v in markers.items() if v]
    return markers, evidence, frames_n, recompiles, markers["triton_kernels"], tri_pct


def _engine(ops: pl.DataFrame, anns: pl.DataFrame, frames: pl.DataFrame, threads: pl.DataFrame,
            kn: pl.DataFrame) -> tuple[str | None, list[str]]:
    strong = pl.concat([ops, anns, frames, threads])
    score = {e: _hits(strong, rx) for e, rx in ENGINE_RE.items()}
    best = max(score.items(), key=lambda kv: (kv[1], kv[0]))
    if best[1] > 0:
        # Ties on the count broken by name: the example is the same on every run.
        ex = strong.filter(pl.col("name").str.contains(ENGINE_RE[best[0]])).sort(
            ["n", "name"], descending=[True, False])
        return best[0], [f"{best[1]:,} op/annotation/thread/Python-frame name(s) of {best[0]}, e.g. "
                         f"`{ex['name'][0][:80]}`"]
    if kn.height:
        ks = {e: _hits(kn, rx) for e, rx in ENGINE_KERNEL_RE.items()}
        kb = max(ks.items(), key=lambda kv: (kv[1], kv[0]))
        if kb[1] > 0:
            return kb[0], [f"{kb[1]:,} kernel(s) named like {kb[0]}'s (weak evidence: engines share kernels)"]
    return None, []


def _inference(model: TraceModel) -> dict[str, Any] | None:
    """Engine steps from TraceLens/SGLang annotations: tokens and sequences per step, tokens/s."""
    a = model.annotations.select("name", "dur_ns")
    if a.is_empty():
        return None
    ex = a.filter(pl.col("name").str.contains(EXECUTE_RE)).select(
        "dur_ns",
        pl.col("name").str.extract(EXECUTE_RE, 1).cast(pl.Int64).alias("tokens"),
        pl.col("name").str.extract(EXECUTE_RE, 2).cast(pl.Int64).alias("prefill_seqs"),
        pl.col("name").str.extract(EXECUTE_RE, 3).cast(pl.Int64).alias("decode_seqs"),
    )
    source = "execute_<tokens>_context_<n>_generation_<n> annotations"
    if ex.is_empty():
        st = a.filter(pl.col("name").str.contains(SGLANG_STEP_RE)).select(
            "dur_ns",
            pl.col("name").str.extract(SGLANG_STEP_RE, 1).str.to_uppercase().alias("mode"),
            pl.col("name").str.extract(SGLANG_STEP_RE, 2).cast(pl.Int64).alias("bs"),
            pl.col("name").str.extract(SGLANG_STEP_RE, 3).cast(pl.Int64).alias("toks"),
        )
        if st.is_empty():
            return None
        decode = pl.col("mode") == "DECODE"
        ex = st.select(
            "dur_ns",
            pl.coalesce(pl.col("toks"), pl.when(decode).then(pl.col("bs"))).alias("tokens"),
            pl.when(decode).then(0).otherwise(pl.col("bs")).alias("prefill_seqs"),
            pl.when(decode).then(pl.col("bs")).otherwise(0).alias("decode_seqs"),
        )
        source = "step[MODE bs=<n> toks=<n>] annotations"
    n = ex.height
    pre, dec = int(ex["prefill_seqs"].sum() or 0), int(ex["decode_seqs"].sum() or 0)
    phase = "decode" if pre == 0 and dec > 0 else "prefill" if dec == 0 and pre > 0 else "mixed"
    known = ex.filter(pl.col("tokens").is_not_null())
    toks, dur = int(known["tokens"].sum() or 0), int(known["dur_ns"].sum() or 0)
    return {
        "source": source,
        "engine_steps": n,
        "phase": phase,
        "tokens_per_step": round(toks / known.height, 1) if known.height else None,
        "sequences_per_step": round((pre + dec) / n, 1) if n else None,
        "engine_step_ms": round(dur / known.height / 1e6, 3) if known.height else None,
        "tokens_per_s": round(toks * 1e9 / dur, 1) if toks and dur else None,
    }


def _arch_from_props(props: dict[str, Any], vendor: str) -> tuple[str | None, str | None, str | None]:
    """(arch, source, compute capability) from one deviceProperties entry."""
    name = str(props.get("name") or "")
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    gcn = str(props.get("gcnArchName") or "")
    cc = f"{major}.{minor}" if major is not None and minor is not None else None
    if vendor == "amd" or gcn.startswith("gfx") or "AMD" in name or "Instinct" in name:
        for rx, arch in _AMD_ARCH_BY_GFX:
            if gcn and re.search(rx, gcn):
                return arch, "device_properties", gcn
        for rx, arch in _AMD_ARCH_BY_NAME:
            if re.search(rx, name):
                return arch, "device_name", cc
        if major == 9 and minor is not None:  # HIP reports gfx9xx as 9.x: 9.4 → gfx94x
            found = {4: "cdna3", 5: "cdna4"}.get(int(minor))
            if found:
                return found, "device_properties", cc
            # 9.0 covers every gfx90x (Vega 20, MI100, MI200), and ROCm builds that name the
            # device "AMD Radeon Graphics" leave only the compute-unit count to tell them apart:
            # 104/110 CUs are the MI200 series (gfx90a: MI210, one MI250/MI250X die), 120 the
            # MI100 (gfx908); Vega 20 has 60/64.
            found = {104: "cdna2", 110: "cdna2", 120: "cdna1"}.get(int(props.get("numSms") or 0))
            if int(minor) == 0 and found:
                return found, "device_properties", cc
        return None, None, cc
    if vendor == "nvidia" or "NVIDIA" in name or "Tesla" in name:
        if major is not None:
            v = float(major) + float(minor or 0) / 10.0
            for lo, arch in _NV_ARCH_BY_CC:
                if v >= lo:
                    return arch, "device_properties", cc
        for rx, arch in _NV_ARCH_BY_NAME:
            if re.search(rx, name):
                return arch, "device_name", cc
    if vendor == "xpu":
        return "xe", "device_properties", cc
    return None, None, cc


def _families(kn: pl.DataFrame) -> pl.DataFrame:
    schema = {"family": pl.String, "compute_capability": pl.Float64, "kernels": pl.Int64, "gpu_ns": pl.Int64,
              "distinct_names": pl.Int64, "example": pl.String}
    if kn.is_empty():
        return pl.DataFrame(schema={**schema, "compute_capability": pl.String})
    fam: Then | ChainedThen = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
    cc: Then | ChainedThen = pl.when(pl.lit(False)).then(pl.lit(None, pl.Float64))
    for rx, f, c in KERNEL_FAMILIES:
        fam = fam.when(pl.col("name").str.contains(rx)).then(pl.lit(f))
        cc = cc.when(pl.col("name").str.contains(rx)).then(pl.lit(c))
    t = kn.with_columns(family=fam, compute_capability=cc).filter(pl.col("family").is_not_null())
    if t.is_empty():
        return pl.DataFrame(schema={**schema, "compute_capability": pl.String})
    return (
        t.sort(["ns", "name"], descending=[True, False])
        .group_by("family", "compute_capability")
        .agg(kernels=pl.col("n").sum().cast(pl.Int64), gpu_ns=pl.col("ns").sum().cast(pl.Int64),
             distinct_names=pl.len().cast(pl.Int64), example=pl.col("name").first().str.slice(0, 120))
        .sort(["gpu_ns", "family"], descending=[True, False])
        .select(list(schema))
        .with_columns(pl.col("compute_capability").round(1).cast(pl.String))  # "8.0", as devices say it
    )


def _device(model: TraceModel, fams: pl.DataFrame) -> dict[str, Any]:
    vendor = model.meta.vendor
    props = list(model.meta.device_properties)
    k = model.kernels
    busiest = None
    if k.height:
        b = k.group_by("device").agg(s=pl.col("dur_ns").sum()).drop_nulls("device").sort(
            ["s", "device"], descending=[True, False])
        busiest = int(b["device"][0]) if b.height else None
    chosen = next((p for i, p in enumerate(props) if p.get("id", i) == busiest), props[0] if props else None)
    name, arch, source, cc = None, None, None, None
    if chosen is not None:
        name = str(chosen.get("name") or "") or None
        arch, source, cc = _arch_from_props(chosen, vendor)
    if arch is None and fams.height:
        # The newest family a kernel name shows is the device's (old-family kernels can run on
        # newer devices, never the reverse).
        top = fams.sort([pl.col("compute_capability").cast(pl.Float64), "gpu_ns"], descending=[True, True]).row(
            0, named=True)
        arch, source = str(top["family"]), "kernel_names"
    return {"device_name": name, "device_arch": arch, "arch_source": source, "compute_capability": cc,
            "vendor": vendor}


def _attention(t: TraceTables, kn: pl.DataFrame, op_names: pl.DataFrame,
               sr: StepsResult) -> tuple[bool, list[str], dict[str, Any]]:
    """``kn``, ``op_names``: the kernels' and CPU ops' distinct names with their counts."""
    model = t.model
    ops = model.cpu_ops
    ev: list[str] = []
    fk = kn.filter(pl.col("name").str.contains(FUSED_ATTENTION_KERNEL_RE)) if kn.height else kn
    if fk.height:
        example = fk.sort("ns", descending=True)["name"][0][:60]
        ev.append(f"{int(fk['n'].sum()):,} fused attention kernel(s), e.g. `{example}`")
    fo = op_names.filter(pl.col("name").str.contains(FUSED_ATTENTION_OP_RE))
    if fo.height:
        ev.append(f"{int(fo['n'].sum()):,} fused attention op call(s) ({', '.join(sorted(fo['name'].to_list())[:3])})")
    pattern: dict[str, Any] = {}
    windows = sr.windows()
    steady = sr.steady_windows()
    k = model.kernels.select("name", "ts_ns", "dur_ns", "correlation")
    if k.is_empty():
        return bool(ev), ev, pattern
    k = assign_steps(k, windows, "ts_ns").filter(pl.col("window").is_in(steady))
    total = int(k["dur_ns"].sum() or 0)
    # The innermost attention-like op around each kernel's launch call.
    att = ops.filter(contains_by_name(ops, f"{BMM_OP_RE}|{SOFTMAX_OP_RE}|{MASK_OP_RE}"))
    # Kernel names repeat: the two regexes run once per distinct name.
    k = on_distinct(k, ["name"], part=pl.when(pl.col("name").str.contains(SOFTMAX_KERNEL_RE)
                                              & ~pl.col("name").str.contains(FUSED_ATTENTION_KERNEL_RE))
                    .then(pl.lit("softmax")).otherwise(pl.lit(None, pl.String)))
    if att.height and k.height:
        iv = att.select("name", "pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(
            pl.col("id").cast(pl.Int64))
        rt = runtime_by_correlation(t).select("correlation", "pid", "tid", pl.col("api_ts_ns").alias("ts_ns"))
        rt = rt.filter(pl.col("correlation").is_in(k["correlation"].drop_nulls().implode()))
        rt = rt.with_columns(id=deepest_at(iv, rt))
        rt = rt.join(iv.select("id", pl.col("name").alias("op")), on="id", how="left").select("correlation", "op")
        op_part = (pl.when(pl.col("op").str.contains(BMM_OP_RE)).then(pl.lit("bmm"))
                   .when(pl.col("op").str.contains(SOFTMAX_OP_RE)).then(pl.lit("softmax"))
                   .when(pl.col("op").str.contains(MASK_OP_RE)).then(pl.lit("masked_fill")))
        k = k.join(rt, on="correlation", how="left").with_columns(part=pl.coalesce(op_part, pl.col("part")))
    by = k.filter(pl.col("part").is_not_null()).group_by("part").agg(ns=pl.col("dur_ns").sum(), n=pl.len())
    parts = {r["part"]: int(r["ns"]) for r in by.iter_rows(named=True)}
    counts = {r["part"]: int(r["n"]) for r in by.iter_rows(named=True)}
    n = max(len(steady), 1)
    pattern = {
        "bmm_ns_per_step": round(parts.get("bmm", 0) / n, 1),
        "softmax_ns_per_step": round(parts.get("softmax", 0) / n, 1),
        "masked_fill_ns_per_step": round(parts.get("masked_fill", 0) / n, 1),
        "kernels_per_step": round(sum(counts.values()) / n, 1),
        "kernel_ns_per_step": round(total / n, 1),
        # The pattern needs both halves: scores by bmm and a softmax over them.
        "present": parts.get("bmm", 0) > 0 and parts.get("softmax", 0) > 0,
    }
    pattern["pattern_ns_per_step"] = round(sum(parts.values()) / n, 1) if pattern["present"] else 0.0
    pattern["pct_of_kernel_time"] = (round(sum(parts.values()) * 100.0 / total, 2)
                                     if pattern["present"] and total else 0.0)
    return bool(ev), ev, pattern


@analysis("context", depends_on=("steps",), title="Run context", order=2,
          shared=("runtime_by_correlation", "gpu_activity"))
def context(ctx: AnalysisContext[TraceModel]) -> ContextResult:
    """What the run already does — compiled, CUDA/HIP graphs (replay or capture), inference engine,
    device architecture, fused attention — so that no advice repeats it."""
    model = ctx.model
    sr = ctx.need("steps", StepsResult)
    ops = _names(model.cpu_ops.select("name"))
    anns = _names(model.annotations.select("name"))
    frames = _names(model.python_frames.select("name"))
    threads = _names(model.threads.select("name"))
    kn = (model.kernels.group_by("name").agg(n=pl.len().cast(pl.Int64), ns=pl.col("dur_ns").sum().cast(pl.Int64))
          if model.kernels.height else pl.DataFrame(schema={"name": pl.String, "n": pl.Int64, "ns": pl.Int64}))
    rt = _names(model.runtime.select("name"))

    markers, cev, n_frames, recompiles, n_tri, tri_pct = _compile(model, ops, anns, frames, kn)
    compiled = bool(cev)

    # The regex runs over the distinct call names (``rt``), the calls are picked by name.
    graph_apis = rt.filter(pl.col("name").str.contains(GRAPH_LAUNCH_RE))["name"] if rt.height else rt["name"]
    launch_corr = model.runtime.filter(pl.col("name").is_in(graph_apis.implode()))["correlation"]
    n_launch = int(launch_corr.len())
    graph_k = 0
    if model.kernels.height:
        graph_k = int(model.kernels.filter(
            pl.col("correlation").is_in(launch_corr.drop_nulls().implode()) | pl.col("graph_id").is_not_null()).height)
    cap_ev = []
    for label, names, rx in (("runtime call(s)", rt, CAPTURE_API_RE), ("annotation(s)", anns, CAPTURE_ANN_RE),
                             ("Python frame(s)", frames, CAPTURE_FRAME_RE)):
        hit = names.filter(pl.col("name").str.contains(rx)) if names.height else names
        if hit.height:
            ex = ", ".join(f"`{s[:40]}`" for s in sorted(hit["name"].to_list())[:3])
            cap_ev.append(f"{int(hit['n'].sum()):,} capture {label} ({ex})")
    capture = bool(cap_ev)
    engine, eev = _engine(ops, anns, frames, threads, kn)
    inference = _inference(model) if engine else None
    fams = _families(kn)
    dev = _device(model, fams)
    arch = dev["device_arch"]
    fused, aev, pattern = _attention(ctx.tables, kn, ops, sr)
    return ContextResult(
        compiled=compiled,
        compiled_evidence=tuple(cev),
        compile_markers=markers,
        compiled_frames=n_frames,
        recompiles=recompiles,
        triton_kernels=n_tri,
        triton_kernel_pct=tri_pct,
        cuda_graphs=n_launch > 0,
        graph_launches=n_launch,
        graph_kernels=graph_k,
        graph_capture=capture,
        capture_evidence=tuple(cap_ev),
        capture_only=capture and n_launch == 0,
        inference_engine=engine,
        engine_evidence=tuple(eev),
        inference=inference,
        supports_bf16=None if arch is None else arch in _BF16,
        supports_tf32=None if arch is None else arch in _TF32,
        kernel_families=tuple(fams.to_dicts()),
        fused_attention=fused,
        attention_evidence=tuple(aev),
        attention_pattern=pattern,
        **dev,
    )
