"""Context-aware advice wording shared by the diagnosis and the rules (private).

CUDA graphs exist on NVIDIA and, as HIP graphs behind the same PyTorch API
(``torch.cuda.CUDAGraph``, ``torch.compile(mode="reduce-overhead")``), on ROCm. Other
back-ends (Intel XPU, MTIA, CPU) get fusion advice only.

Advice never repeats what the run already does (the ``context`` analysis, ``docs/context.md``):
a compiled run is told what its compiled code still lacks (graph replay, graph breaks,
recompiles, dynamic shapes), never "use torch.compile"; a run that replays CUDA/HIP graphs is
told about the work left outside them, never "capture the step in CUDA graphs"; an inference
engine is pointed at its own settings. ``ctx`` is the ``context`` result or None (then the
advice is the plain one). Lives with the analyses (the diagnosis uses it); the rules read it
through :mod:`traceanalyzer.rules._advice`.
"""

from __future__ import annotations

from typing import Any


def has_graphs(vendor: str) -> bool:
    return vendor in ("nvidia", "amd")


def graphs_name(vendor: str) -> str:
    return "HIP graphs" if vendor == "amd" else "CUDA graphs"


def is_compiled(ctx: Any) -> bool:
    return bool(getattr(ctx, "compiled", False))


def uses_graphs(ctx: Any) -> bool:
    """Graphs replayed, or captured (a capture trace: the run uses graphs once it is warm)."""
    return bool(getattr(ctx, "cuda_graphs", False) or getattr(ctx, "graph_capture", False))


def engine_of(ctx: Any) -> str | None:
    return getattr(ctx, "inference_engine", None)


_ENGINE_KNOBS = {
    "vllm": "vLLM's compilation_config (cudagraph_mode, cudagraph_capture_sizes covering the batch sizes served)",
    "sglang": "SGLang's --cuda-graph-max-bs / --cuda-graph-bs and --enable-torch-compile",
    "tensorrt_llm": "TensorRT-LLM's CUDA-graph and kernel-fusion build options",
}


_ENGINE_SYNC_HINT = {
    "vllm": "# vllm: async scheduling overlaps the next step's scheduling with this step's GPU work\n"
            "# (e.g. `vllm serve ... --async-scheduling` where the version has it)",
    "sglang": "# sglang: keep the overlap scheduler on (do not pass --disable-overlap-schedule)",
    "tensorrt_llm": "# tensorrt_llm: overlap scheduling / in-flight batching settings of the executor",
}


def engine_sync_move(engine: str) -> str:
    """What moves host syncs that sit in an inference engine's step (one sentence, final period)."""
    return (f"The blocking syncs are in {engine}'s engine step (sampled tokens and outputs copied to the "
            "host): overlap them with the next step's scheduling (vLLM async scheduling, SGLang's overlap "
            "scheduler), larger decode batches so each sync covers more tokens, and no extra host reads in "
            "custom logits processors or sampling code.")


def engine_sync_hint(engine: str) -> str:
    return _ENGINE_SYNC_HINT.get(engine, "")


def compiled_lacks(vendor: str, ctx: Any) -> str:
    """What compiled code still lacks, for a compiled run (one clause, no final period)."""
    parts = []
    frames, recompiles = int(getattr(ctx, "compiled_frames", 0) or 0), int(getattr(ctx, "recompiles", 0) or 0)
    if frames > 1:
        parts.append(f"remove graph breaks ({frames} compiled frames: each break returns to eager Python; "
                     "find them with TORCH_LOGS=graph_breaks or torch._dynamo.explain)")
    else:
        parts.append("check for graph breaks (TORCH_LOGS=graph_breaks lists them)")
    if recompiles:
        parts.append(f"stop recompiles ({recompiles} seen: TORCH_LOGS=recompiles says which guard failed; "
                     "mark varying dims dynamic)")
    if has_graphs(vendor) and not uses_graphs(ctx):
        parts.append(f"replay the compiled code in {graphs_name(vendor)} (mode=\"reduce-overhead\" in the existing "
                     "torch.compile call)")
    parts.append("keep shapes static or bucketed so the compiled graphs are reused")
    return "the code is already compiled; what it can still gain: " + "; ".join(parts)


def fewer_launches(vendor: str, ctx: Any = None) -> str:
    """How to launch fewer, larger kernels on this vendor and in this run (one clause, no final period)."""
    engine = engine_of(ctx)
    if engine in _ENGINE_KNOBS and (uses_graphs(ctx) or is_compiled(ctx)):
        return (f"the engine already compiles/replays graphs: widen what they cover with {_ENGINE_KNOBS[engine]}, "
                "and keep the eager work between engine steps (scheduling, sampling, input preparation) small")
    if uses_graphs(ctx):
        g = getattr(ctx, "graphs_name", None) or graphs_name(vendor)
        return (f"the step already replays {g}: move the work still launched eagerly outside them into the captured "
                "region (a larger captured region)" + ("" if is_compiled(ctx) else
                                                        ", fuse the small ops left outside (torch.compile)"))
    if is_compiled(ctx):
        return compiled_lacks(vendor, ctx)
    if has_graphs(vendor):
        return (f"torch.compile (fuses small ops) or {graphs_name(vendor)} "
                "(torch.compile(mode=\"reduce-overhead\") or torch.cuda.CUDAGraph: one launch replays the step)")
    return "torch.compile (fuses small ops into fewer, larger kernels)"


def fewer_launches_hint(vendor: str, ctx: Any = None) -> str:
    engine = engine_of(ctx)
    if engine in _ENGINE_KNOBS and (uses_graphs(ctx) or is_compiled(ctx)):
        return f"# {engine}: tune {_ENGINE_KNOBS[engine].split(' (')[0]}"
    if uses_graphs(ctx):
        return "# move the eager work between graph replays inside the captured region"
    if is_compiled(ctx):
        if has_graphs(vendor):
            return ("TORCH_LOGS=graph_breaks,recompiles python train.py  # then add mode=\"reduce-overhead\" "
                    "to the existing torch.compile call")
        return "TORCH_LOGS=graph_breaks,recompiles python train.py"
    if has_graphs(vendor):
        return "step = torch.compile(step, mode=\"reduce-overhead\")  # fusion + graph replay"
    return "model = torch.compile(model)  # fewer, fused kernels"


def capture_only_note(ctx: Any) -> str | None:
    """Why a steady-state judgement is withheld on a capture-only trace (None otherwise)."""
    if not getattr(ctx, "capture_only", False):
        return None
    return (f"this is a {getattr(ctx, 'graphs_name', 'CUDA graphs')} capture/warm-up trace (stream capture seen, no "
            "graph replay): kernels launched under capture are recorded, not run, so GPU idle, launch counts and "
            "utilisation say nothing of the steady state; profile the replay (steady decode/training steps)")
