"""The efficiency analysis: planted shapes and durations give exact TFLOP/s; real traces with
shapes agree with an independent GEMM count and stay under the device's peak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import SHARED_TRACES, needs_shared, shared_chrome_traces, shared_model, shared_params, shared_results
from support.events import Trace, x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.efficiency import EfficiencyResult
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.model import TraceModel

BF16 = "c10::BFloat16"
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "computeMajor": 9}


def _op(t: Trace, name: str, ts: float, dur: float, dims: list[Any], types: list[str],
        conc: list[str] | None = None) -> None:
    t.events.append(x("cpu_op", name, ts, dur, **{"Input Dims": dims, "Input type": types,
                                                 "Concrete Inputs": conc or [""] * len(dims)}))


def _planted(steps: int = 4, props: dict[str, Any] | None = H100, slow_add: bool = False) -> TraceModel:
    """Per step (1000 µs): an mm 1024³ bf16 whose kernel runs 10 µs; an SDPA (2×8×512×64, causal) with
    the flash op nested in it, a cast kernel (2 µs) and the attention kernel (20 µs); an op with no model."""
    t = Trace()
    q = [2, 8, 512, 64]
    for s in range(steps):
        b = 1000.0 * s
        t.step(s + 1, b, 1000)
        _op(t, "aten::mm", b + 10, 20, [[1024, 1024], [1024, 1024]], [BF16, BF16])
        t.launch(b + 12, 5, b + 100, 10, name="sm90_xmma_gemm_bf16bf16_bf16f32")
        _op(t, "aten::scaled_dot_product_attention", b + 40, 60, [q, q, q, [], [], [], [], []],
            ["float"] * 3 + [""] * 5, ["", "", "", "", "0.", "True", "", "False"])
        _op(t, "aten::_to_copy", b + 42, 6, [q], ["float"])
        t.launch(b + 43, 3, b + 120, 2, name="elementwise_cast")
        _op(t, "aten::_scaled_dot_product_flash_attention", b + 60, 30, [q, q, q, [], [], [], []],
            [BF16] * 3 + [""] * 4, ["", "", "", "0.", "True", "False", ""])
        _op(t, "aten::_flash_attention_forward", b + 62, 20, [[2, 512, 8, 64]] * 3 + [[]] * 12, [BF16] * 3 + [""] * 12,
            ["", "", "", "", "", "512", "512", "0.", "True"] + [""] * 6)
        t.launch(b + 64, 5, b + 130, 20, name="flash_fwd_kernel")
        _op(t, "aten::my_custom_op", b + 200, 10, [[4]], ["float"])
        t.launch(b + 201, 5, b + 200, 7, name="custom_kernel")
        if slow_add:  # 1024² fp32 + 1024² fp32 in 100 µs: 12.6 MB at 126 GB/s
            _op(t, "aten::add", b + 300, 10, [[1024, 1024], [1024, 1024], []], ["float", "float", "Scalar"])
            t.launch(b + 301, 5, b + 300, 100, name="vectorized_elementwise_kernel")
    doc = t.doc()
    if props is not None:
        doc["deviceProperties"] = [props]
    return build_model(Path("x.json"), doc)


def _eff(model: TraceModel, config: Config | None = None) -> EfficiencyResult:
    r = run_analyses(model, config=config, only=("steps", "efficiency"), strict=True)
    e = r["efficiency"]
    assert isinstance(e, EfficiencyResult)
    return e


def test_planted_shapes_give_exact_tflops() -> None:
    e = _eff(_planted())
    assert e.peaks["device"] == "H100 SXM" and e.peaks["matched"] == "trace"
    mm = e.by_op.filter(pl.col("op") == "aten::mm").row(0, named=True)
    flops = 2 * 1024**3
    assert mm["calls"] == 4 and mm["kernel_ns"] == 40_000 and mm["flops"] == 4 * flops
    assert mm["tflops"] == pytest.approx(flops / 10_000 / 1e3)  # 214.748 TFLOP/s
    assert mm["pct_of_peak"] == pytest.approx(100 * flops / 10_000 / 1e3 / 989.5)
    assert mm["peak_key"] == "bf16_tensor" and mm["bound"] == "compute"
    # Attention: work from the innermost flash op (bf16, causal ½), time from the outer op's two kernels.
    att = e.by_op.filter(pl.col("op") == "aten::scaled_dot_product_attention").row(0, named=True)
    f_att = 4 * 2 * 8 * 512 * 512 * 64 / 2
    assert att["precision"] == "bf16" and att["flops"] == 4 * f_att and att["kernel_ns"] == 4 * 22_000
    assert att["tflops"] == pytest.approx(f_att / 22_000 / 1e3)
    # The unmodelled op is listed, not estimated; coverage is the modelled share of kernel time.
    assert e.no_model.row(0, named=True)["op"] == "aten::my_custom_op"
    assert e.coverage["pct_of_kernel_time"] == pytest.approx(100 * 32 / 39, abs=0.01)
    # One kernel per mm: the per-kernel view carries the same figure.
    k = e.by_kernel.filter(pl.col("op") == "aten::mm").row(0, named=True)
    assert k["tflops"] == pytest.approx(mm["tflops"])
    assert e.per_step.height == 4
    assert e.per_step["kernel_ns"].to_list() == [32_000] * 4
    js = json.loads(json.dumps(e.to_json()))
    assert js["device"]["device"] == "H100 SXM" and js["by_op"][0]["op"] in ("aten::scaled_dot_product_attention",
                                                                               "aten::mm")


def test_declared_device_and_user_peaks_override_the_trace() -> None:
    e = _eff(_planted(), Config(overrides={"efficiency.device": "A100 SXM 80GB"}))
    assert e.peaks["device"] == "A100 SXM 80GB" and e.peaks["matched"] == "declared"
    mm = e.by_op.filter(pl.col("op") == "aten::mm").row(0, named=True)
    assert mm["peak_tflops"] == 312 and mm["pct_of_peak"] == pytest.approx(100 * 214.748364 / 312, rel=1e-6)
    e = _eff(_planted(props=None), Config(overrides={"efficiency.bf16_tensor": 500.0, "efficiency.mem_bw_tbs": 2.0}))
    mm = e.by_op.filter(pl.col("op") == "aten::mm").row(0, named=True)
    assert mm["peak_tflops"] == 500.0 and e.peaks["mem_bw_tbs"] == 2.0


def test_no_shapes_is_not_applicable() -> None:
    t = Trace()
    t.step(1, 0, 100)
    t.op("aten::mm", 10, 20)
    t.launch(12, 5, 30, 10)
    r = run_analyses(t.model(), only=("steps", "efficiency"))
    assert "efficiency" not in r


# ---- real traces -------------------------------------------------------------------------------

#: The default run checks one H100 trace (the small BERT one, which the every-trace test below loads
#: anyway) and one MI300X trace (an LLM: bmm and addmm on the AMD peaks); the other devices and
#: models run in the slow set (each loads and analyses a trace of its own: the default run's slowest).
DEFAULT_PAIRS = {"tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
                 "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"}
PAIRS = [pytest.param(rel, id=rel, marks=() if rel in DEFAULT_PAIRS else pytest.mark.slow)
         for d in ("h100", "mi300") for n in (
    "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "facebook_timesformer-base-finetuned-k400__1016002.json.gz",
    "gaunernst_bert-small-uncased__1016001.json.gz") for rel in [f"tracelens/{d}/{n}"]] + [
    # A100 SXM, fp32 and mm/addmm/bmm with out= args
    pytest.param("hta/negative_queue_length_values_check/rank0.json.gz", marks=pytest.mark.slow),
    pytest.param("hta/trace_diff/test/test.json.gz", marks=pytest.mark.slow),  # V100: no bf16 tensor cores
    pytest.param("hta/trace_diff/control/control.json.gz", marks=pytest.mark.slow),  # A100 PCIe 40GB
]


def _independent_gemm_flops(model: TraceModel) -> dict[str, float]:
    """2·M·N·K (× batch) from the recorded dims, written here apart from the models."""
    out: dict[str, float] = {}
    for name, dims in model.cpu_ops.filter(pl.col("name").is_in(["aten::mm", "aten::addmm", "aten::bmm"])).select(
            "name", "input_dims").iter_rows():
        d = json.loads(dims)
        a, b = (d[1], d[2]) if name == "aten::addmm" else (d[0], d[1])
        f = 2.0 * a[-2] * a[-1] * b[-1] * (a[0] if name == "aten::bmm" else 1)
        out[name] = out.get(name, 0.0) + f
    return out


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("rel", PAIRS)
def test_real_gemm_flops_match_an_independent_count_and_stay_under_peak(rel: str) -> None:
    path = SHARED_TRACES / rel
    model = shared_model(path)
    e = shared_results(path)["efficiency"]
    assert isinstance(e, EfficiencyResult) and e.peaks["matched"] == "trace"
    want = _independent_gemm_flops(model)
    # Every GEMM op of these traces launches kernels: the per-op sums agree exactly.
    got = {r["op"]: r["flops"] for r in e.by_op.group_by("op").agg(pl.col("flops").sum()).iter_rows(named=True)
           if r["op"] in want}
    calls_with_kernels = e.ops.filter(pl.col("family") == "gemm").height
    if calls_with_kernels == model.cpu_ops.filter(pl.col("name").is_in(list(want))).height:
        assert got == pytest.approx(want, rel=1e-12)
    else:
        assert all(got[k] <= want[k] * (1 + 1e-12) for k in got)
    # A figure above the device's peak means a wrong formula or a wrong device.
    assert (e.ops["pct_of_peak"].drop_nulls() <= 100.0).all()
    # Bandwidth is DRAM's: data resident in the last-level cache (MI300X: 256 MB Infinity Cache, H100: 50 MB
    # L2) can move faster, so the bound holds for operations whose traffic exceeds it.
    big = e.ops.filter(pl.col("bytes") > 256e6)
    assert (big["pct_of_bandwidth"].drop_nulls() <= 100.0).all()
    assert e.coverage["pct_of_kernel_time"] is not None
    if rel.startswith("tracelens"):  # HF models: nearly every kernel comes from a modelled op
        assert e.coverage["pct_of_kernel_time"] > 50


def test_rules_price_slow_gemms_and_name_the_shape() -> None:
    from traceanalyzer.rules import run_rules
    from traceanalyzer.rules.gemm_efficiency import shape_reason

    assert shape_reason(1, 4097, 1024, 1024, 64, 128).startswith("dimension not a multiple of 8 (M=4097)")
    assert shape_reason(1, 16, 1024, 1024, 64, 128).startswith("tiny dimension (M=16)")
    assert shape_reason(512, 96, 96, 64, 64, 128).startswith("batch of 512 skinny")
    assert shape_reason(1, 4096, 4096, 4096, 64, 128) == ""
    model = _planted(steps=6)
    results = run_analyses(model, strict=True)
    out = run_rules(results, Config(overrides={"rules.min_cost_pct": 0.0, "gemm_efficiency.min_pct_of_step": 0.0}),
                    strict=True)
    findings = {f.rule_id: f for f in [*out.findings, *out.below_floor]}
    g = findings["gemm_efficiency"]
    # mm at 21.7 % of the bf16 peak: roof time = 2·1024³ / 989.5 TFLOP/s = 2.170 µs; at 60 %: 3.617 µs; the
    # 10 µs kernel would save 6.383 µs per step.
    roof_us = 2 * 1024**3 / 989.5e12 * 1e6
    assert g.cost_ms_per_step == pytest.approx(round((10 - roof_us / 0.6) / 1000, 3))
    assert g.evidence["ops"][0]["op"] == "aten::mm"


def test_modelled_ops_without_kernels_give_empty_tables() -> None:
    t = Trace()
    t.step(1, 0, 1000)
    _op(t, "aten::mm", 10, 20, [[64, 64], [64, 64]], [BF16, BF16])  # nothing launched inside (a graph replay)
    _op(t, "aten::my_custom_op", 100, 20, [[4]], ["float"])
    t.launch(101, 5, 200, 7, name="custom_kernel")
    doc = t.doc()
    doc["deviceProperties"] = [H100]
    e = _eff(build_model(Path("x.json"), doc))
    assert e.ops.is_empty() and e.by_op.is_empty() and e.by_kernel.is_empty() and e.no_kernel_calls == 1
    assert e.coverage["pct_of_kernel_time"] == 0.0 and e.totals["tflops"] is None
    assert e.by_op.schema["op"] == pl.String and json.dumps(e.to_json())
    assert e.summary()[0][0] == "Device peaks"


def test_roofline_chart_draws_the_heaviest_ops() -> None:
    from traceanalyzer.report import discover
    from traceanalyzer.report.charts import draw, registry
    from traceanalyzer.report.roofline import roofline_points

    discover()
    results = run_analyses(_planted(), only=("steps", "efficiency"), strict=True)
    e = results["efficiency"]
    assert isinstance(e, EfficiencyResult)
    pts = roofline_points(e)
    assert pts["op"].to_list() == ["aten::scaled_dot_product_attention", "aten::mm"]  # heaviest first
    png = draw(registry()["roofline"], results)
    assert png is not None and png.startswith(b"\x89PNG")
    # No bandwidth known: no roof to draw.
    bare = run_analyses(_planted(props=None), only=("steps", "efficiency"), strict=True)
    assert draw(registry()["roofline"], bare) is None


def test_memory_bound_rule_prices_a_slow_elementwise_op_only() -> None:
    from traceanalyzer.rules import run_rules

    results = run_analyses(_planted(steps=6, slow_add=True), strict=True)
    e = results["efficiency"]
    assert isinstance(e, EfficiencyResult)
    add = e.by_op.filter(pl.col("op") == "aten::add").row(0, named=True)
    nbytes = 3 * 1024 * 1024 * 4
    assert add["bytes"] == 6 * nbytes and add["bound"] == "memory"
    assert add["pct_of_bandwidth"] == pytest.approx(100 * nbytes / 100_000 / 3.35e3)
    out = run_rules(results, Config(overrides={"rules.min_cost_pct": 0.0}), strict=True)
    f = {x.rule_id: x for x in [*out.findings, *out.below_floor]}["memory_bound_efficiency"]
    roof_ns = nbytes / 3.35e3
    assert f.cost_ms_per_step == pytest.approx(round((100_000 - roof_ns / 0.7) / 1e6, 3))
    assert [o["op"] for o in f.evidence["ops"]] == ["aten::add"]  # the GEMM and attention are not its


def test_sdpa_on_the_math_path_is_priced_and_the_fused_one_is_not() -> None:
    from traceanalyzer.rules import run_rules

    t = Trace()
    q = [4, 16, 1024, 64]
    for s in range(6):
        b = 2000.0 * s
        t.step(s + 1, b, 2000)
        # math path: bmm, softmax, bmm kernels under the SDPA call, 600 µs in all
        _op(t, "aten::scaled_dot_product_attention", b + 10, 100, [q, q, q, [], [], [], [], []],
            [BF16] * 3 + [""] * 5, ["", "", "", "", "0.", "False", "", "False"])
        _op(t, "aten::_scaled_dot_product_attention_math", b + 12, 90, [q, q, q, [], [], [], [], [], []],
            [BF16] * 3 + [""] * 6, ["", "", "", "", "0.", "False", "", "", "False"])
        _op(t, "aten::bmm", b + 14, 10, [[64, 1024, 64], [64, 64, 1024]], [BF16, BF16])
        t.launch(b + 15, 5, b + 100, 200, name="sm90_xmma_gemm_bf16bf16_bf16f32")
        _op(t, "aten::_softmax", b + 30, 10, [[4, 16, 1024, 1024], [], []], [BF16, "Scalar", "Scalar"])
        t.launch(b + 31, 5, b + 300, 200, name="softmax_warp_forward")
        _op(t, "aten::bmm", b + 50, 10, [[64, 1024, 1024], [64, 1024, 64]], [BF16, BF16])
        t.launch(b + 51, 5, b + 500, 200, name="sm90_xmma_gemm_bf16bf16_bf16f32")
    doc = t.doc()
    doc["deviceProperties"] = [H100]
    results = run_analyses(build_model(Path("x.json"), doc), strict=True)
    e = results["efficiency"]
    assert isinstance(e, EfficiencyResult)
    att = e.by_op.row(0, named=True)  # the bmm and softmax belong to the attention call: one operation
    f_att = 4 * 4 * 16 * 1024 * 1024 * 64
    assert e.by_op.height == 1 and att["op"] == "aten::scaled_dot_product_attention" and att["flops"] == 6 * f_att
    assert att["kernel_ns"] == 6 * 600_000
    out = run_rules(results, Config(overrides={"rules.min_cost_pct": 0.0}), strict=True)
    f = {x.rule_id: x for x in [*out.findings, *out.below_floor]}["attention_math_fallback"]
    roof_ns = max(f_att / 989.5e3, 4 * (4 * 16 * 1024 * 64 * 2) / 3.35e3)
    assert f.cost_ms_per_step == pytest.approx(round((600_000 - roof_ns / 0.5) / 1e6, 3))
    # The fused flash call of the planted trace is not the rule's.
    fused = run_analyses(_planted(steps=6), strict=True)
    out = run_rules(fused, Config(overrides={"rules.min_cost_pct": 0.0}), strict=True)
    assert "attention_math_fallback" not in {x.rule_id for x in [*out.findings, *out.below_floor]}


@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("path", shared_params(shared_chrome_traces() if SHARED_TRACES.exists() else ()))
def test_every_shared_trace_runs_or_says_why_and_stays_under_peak(path: Path) -> None:
    results = shared_results(path)
    e = results.get("efficiency")
    if e is None:
        assert results.skipped["efficiency"]  # a reason ("no kernels", "profile with record_shapes=True")
        return
    assert isinstance(e, EfficiencyResult)
    assert (e.ops["pct_of_peak"].drop_nulls() <= 100.0).all()
    assert (e.ops.filter(pl.col("bytes") > 256e6)["pct_of_bandwidth"].drop_nulls() <= 100.0).all()
    assert e.ops.height == 0 or (e.ops["kernel_ns"] > 0).all()


@needs_shared
@pytest.mark.shared
def test_rules_withhold_on_a_capture_only_trace() -> None:
    from traceanalyzer.rules import run_rules

    results = shared_results(SHARED_TRACES / "tracelens/inference/vllm_graph_capture_rank_0.pt.trace.json.gz")
    out = run_rules(results, Config(overrides={"rules.min_cost_pct": 0.0}), strict=True)
    for rid in ("gemm_efficiency", "memory_bound_efficiency", "attention_math_fallback"):
        assert "withheld" in out.not_run[rid]


def test_markdown_and_terminal_show_the_heaviest_ops_against_the_peaks() -> None:
    """report.md gets a compact efficiency table (the planted GEMM at 214.748 TFLOP/s against the
    H100's peaks) and the terminal summary the same top ops."""
    from traceanalyzer.pipeline import build_report
    from traceanalyzer.report.markdown import to_markdown
    from traceanalyzer.report.terminal import analyze_summary

    report = build_report(_planted(), Config(), source="planted.json")
    md = to_markdown(report)
    assert "## Kernel efficiency (against H100 SXM peaks" in md
    row = next(line for line in md.splitlines() if line.startswith("| `aten::mm`"))
    assert "| bf16 |" in row and "214.748" in row and "compute |" in row
    terminal = analyze_summary(report)
    assert "Kernel efficiency" in terminal and "aten::mm (bf16)" in terminal and "214.7 TFLOP/s" in terminal
