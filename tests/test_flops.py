"""FLOP and byte models (analyses/_flops): each family's formula against a hand-computed case."""

from __future__ import annotations

import json

import polars as pl
import pytest

from traceanalyzer.analyses._flops import OpArgs, work, work_of_signatures
from traceanalyzer.analyses._flops.attention import causal_pairs
from traceanalyzer.analyses._peaks import device_peaks, find_row, peak_key, resolve_peak

BF16, F32 = "c10::BFloat16", "float"


def w(name: str, dims: list, types: list, conc: list | None = None):  # type: ignore[no-untyped-def]
    conc = conc if conc is not None else [""] * len(dims)
    return work(OpArgs.parse(name, json.dumps(dims), json.dumps(types), json.dumps(conc)))


def test_mm_and_addmm() -> None:
    r = w("aten::mm", [[8, 16], [16, 32]], [BF16, BF16])
    assert r is not None and r.flops == 2 * 8 * 32 * 16 and r.precision == "bf16" and r.unit == "matrix"
    assert r.bytes == (8 * 16 + 16 * 32 + 8 * 32) * 2 and r.bmnk == (1, 8, 32, 16)
    r = w("aten::addmm", [[32], [8, 16], [16, 32], [], []], [F32, F32, F32, "Scalar", "Scalar"], ["", "", "", "1", "1"])
    assert r is not None and r.flops == 2 * 8 * 32 * 16 and r.precision == "fp32"
    assert r.bytes == (32 + 8 * 16 + 16 * 32 + 8 * 32) * 4
    assert w("aten::mm", [[8, 16], [15, 32]], [BF16, BF16]) is None  # K mismatch: no model, no guess


def test_bmm_baddbmm_scaled_mm() -> None:
    r = w("aten::bmm", [[4, 8, 16], [4, 16, 32]], [BF16, BF16])
    assert r is not None and r.flops == 4 * 2 * 8 * 32 * 16 and r.bmnk == (4, 8, 32, 16)
    r = w("aten::baddbmm", [[4, 8, 32], [4, 8, 16], [4, 16, 32], [], []], [BF16] * 3 + ["Scalar"] * 2)
    assert r is not None and r.flops == 4 * 2 * 8 * 32 * 16
    assert r.bytes == (4 * 8 * 32 + 4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32) * 2
    fp8 = "c10::Float8_e4m3fn"
    r = w("aten::_scaled_mm", [[64, 128], [128, 256], [], [], [], [], [], []],
          [fp8, fp8, F32, F32, "", "", "Scalar", "Scalar"], ["", "", "", "", "", "", "15", "False"])
    assert r is not None and r.flops == 2 * 64 * 256 * 128 and r.precision == "fp8"
    assert r.bytes == 64 * 128 + 128 * 256 + 64 * 256 * 2 + 2 * 4  # fp8 inputs, bf16 (code 15) output, 2 scales


def test_convolution_plain_grouped_depthwise_transposed() -> None:
    # x [2,3,8,8], w [4,3,3,3], stride 1, pad 1 → out [2,4,8,8]: 2·N·∏out·∏w
    conc = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    types = [F32, F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]
    r = w("aten::convolution", [[2, 3, 8, 8], [4, 3, 3, 3], [4], [], [], [], [], [], []], types, conc)
    assert r is not None and r.flops == 2 * 2 * 64 * (4 * 3 * 9)
    assert r.bytes == (2 * 3 * 64 + 4 * 27 + 4 + 2 * 4 * 64) * 4
    # stride 2, no padding: out 3x3 (⌊(8 − 3)/2⌋ + 1)
    conc2 = ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]
    r = w("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []], types, conc2)
    assert r is not None and r.flops == 2 * 1 * 9 * 108
    # depthwise: groups = C_in = 8, w [8,1,3,3]
    conc3 = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "8"]
    r = w("aten::convolution", [[1, 8, 4, 4], [8, 1, 3, 3], [], [], [], [], [], [], []], types, conc3)
    assert r is not None and r.flops == 2 * 16 * 8 * 9
    # transposed: x [1,4,4,4], w [4,2,2,2] stride 2 → out [1,2,8,8]; 2·N·∏in·∏w
    conc4 = ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"]
    r = w("aten::convolution", [[1, 4, 4, 4], [4, 2, 2, 2], [], [], [], [], [], [], []], [F32, F32, "", *types[3:]],
          conc4)  # no bias: its type is "" (None)
    assert r is not None and r.flops == 2 * 16 * 32 and r.bytes == (64 + 32 + 2 * 64) * 4
    # backward with both grads: twice the forward FLOPs
    bconc = ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, True]"]
    r = w("aten::convolution_backward", [[2, 4, 8, 8], [2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], [], []],
          [F32] * 3 + ["ScalarList"] * 8, bconc)
    assert r is not None and r.flops == 2 * (2 * 2 * 64 * 108)


def test_attention_forward_causal_backward_varlen() -> None:
    q = [2, 4, 128, 64]
    types = [BF16] * 3 + ["Scalar"] * 4
    r = w("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], types,
          ["", "", "", "0.", "False", "False", ""])
    f = 4 * 2 * 4 * 128 * 128 * 64  # 4·B·H·N²·d
    assert r is not None and r.flops == f and r.bytes == 4 * (2 * 4 * 128 * 64) * 2
    r = w("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], types,
          ["", "", "", "0.", "True", "False", ""])
    assert r is not None and r.flops == f / 2
    # (B, N, H, d) layout of _flash_attention_forward, causal at 8
    qb = [2, 128, 4, 64]
    r = w("aten::_flash_attention_forward", [qb, qb, qb] + [[]] * 12, [BF16] * 3 + [""] * 12,
          ["", "", "", "", "", "128", "128", "0.", "True"] + [""] * 6)
    assert r is not None and r.flops == f / 2
    # backward: 2.5 × forward; q at index 1
    r = w("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q, q] + [[]] * 10, [BF16] * 5 + [""] * 10,
          ["", "", "", "", "", "", "", "", "128", "128", "0.", "False"] + [""] * 3)
    assert r is not None and r.flops == 2.5 * f
    # GQA: 8 query heads over 2 KV heads; FLOPs follow the query heads
    r = w("aten::scaled_dot_product_attention", [[1, 8, 16, 32], [1, 2, 16, 32], [1, 2, 16, 32]] + [[]] * 5,
          [BF16] * 3 + [""] * 5, ["", "", "", "", "0.", "False", "", "True"])
    assert r is not None and r.flops == 2 * 1 * 8 * 16 * 16 * (32 + 32)
    # varlen: 3 sequences, 96 tokens: equal lengths of 32 assumed
    r = w("flash_attn::_flash_attn_varlen_forward", [[96, 4, 64], [96, 4, 64], [96, 4, 64], [4], [4]] + [[]] * 5,
          [BF16] * 3 + ["int", "int"] + [""] * 5, [""] * 5 + ["32", "32", "0.", "", "False"])
    assert r is not None and r.flops == 4 * 3 * 4 * 32 * 32 * 64 and "varlen" in r.note


def test_causal_pairs_exact_when_lengths_differ() -> None:
    # top-left: query i sees keys 0..i → 1 + 2 + 3 = 6 of 3×5; bottom-right: sees i + 2 + 1 → 3 + 4 + 5 = 12
    assert causal_pairs(3, 5, "tl") == 6 and causal_pairs(3, 5, "br") == 12 and causal_pairs(4, 4, "tl") == 8


def test_norms_softmax_elementwise_reduction_embedding_copy() -> None:
    r = w("aten::native_layer_norm", [[4, 8, 16], [], [16], [16], []], [BF16, "ScalarList", BF16, BF16, "Scalar"],
          ["", "[16]", "", "", "1e-05"])
    e = 4 * 8 * 16
    assert r is not None and r.bytes == 2 * e * 2 + 2 * 16 * 2 and r.flops == 7 * e and r.unit == "vector"
    r = w("aten::_fused_rms_norm", [[4, 16], [], [16], []], [BF16, "ScalarList", BF16, "Scalar"])
    assert r is not None and r.bytes == 2 * 64 * 2 + 16 * 2 and r.flops == 4 * 64
    r = w("aten::_softmax", [[2, 8, 8], [], []], [F32, "Scalar", "Scalar"], ["", "-1", "False"])
    assert r is not None and r.bytes == 2 * 128 * 4 and r.flops == 5 * 128
    # broadcast add: [4,8] + [8] → read 32 + 8, write 32 (fp32)
    r = w("aten::add", [[4, 8], [8], []], [F32, F32, "Scalar"], ["", "", "1"])
    assert r is not None and r.bytes == (32 + 8 + 32) * 4 and r.flops == 32
    # a wrapped Python scalar (0-dim double) does not widen the output dtype
    r = w("aten::mul", [[4, 8], []], [BF16, "double"])
    assert r is not None and r.bytes == 32 * 2 + 8 + 32 * 2
    r = w("aten::eq", [[16], [16]], [F32, F32])
    assert r is not None and r.bytes == 16 * 4 * 2 + 16  # bool output
    r = w("aten::sum", [[4, 8], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "False", ""])
    assert r is not None and r.bytes == 32 * 4 + 4 * 4
    r = w("aten::mean", [[4, 8]], [F32])
    assert r is not None and r.bytes == 32 * 4 + 4
    r = w("aten::embedding", [[1000, 64], [2, 10], [], [], []], [BF16, "long int", "Scalar", "Scalar", "Scalar"])
    assert r is not None and r.flops == 0 and r.bytes == 2 * 20 * 64 * 2 + 20 * 8
    r = w("aten::copy_", [[4, 8], [4, 8], []], [BF16, F32, "Scalar"])
    assert r is not None and r.bytes == 32 * (2 + 4) and r.precision == "bf16"


def test_unknown_op_and_hostile_args_have_no_model() -> None:
    assert w("aten::cat", [[[2, 3], [2, 3]], []], ["TensorList", "Scalar"]) is None
    assert w("aten::my_custom_op", [[2, 3]], [F32]) is None
    assert work(OpArgs.parse("aten::mm", "not json", None, None)) is None
    assert w("aten::mm", [[-1, 4], [4, 4]], [F32, F32]) is None
    sigs = pl.DataFrame({"name": ["aten::mm", "aten::foo"], "input_dims": ["[[2,3],[3,4]]", "[[1]]"],
                         "input_types": ['["float","float"]', '["float"]'], "concrete_inputs": [None, None]})
    out = work_of_signatures(sigs)
    assert out["flops"].to_list() == [48.0, None] and out["family"].to_list() == ["gemm", None]


@pytest.mark.parametrize("name, device", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA GH200 480GB", "GH200 96GB"), ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"), ("Tesla V100-SXM2-16GB", "V100 SXM2"), ("Tesla T4", "T4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"), ("AMD Instinct MI250X / MI250", "MI250X (one GCD)"),
    ("AMD Instinct MI210", "MI210"), ("Intel(R) Data Center GPU Max 1550", "Intel Data Center GPU Max 1550"),
])
def test_device_names_match_their_row(name: str, device: str) -> None:
    row = find_row(name)
    assert row is not None and row["device"] == device and row["source"]


def test_peaks_scale_with_sms_and_take_overrides() -> None:
    p = device_peaks({"name": "NVIDIA H100 80GB HBM3", "numSms": 66}, "", {})
    assert p["matched"] == "trace" and p["scale"] == 0.5 and p["bf16_tensor"] == pytest.approx(989.5 / 2)
    p = device_peaks({"name": "NVIDIA H100 80GB HBM3", "numSms": 132}, "MI300X", {"mem_bw_tbs": 4.0})
    assert p["device"] == "MI300X" and p["matched"] == "declared" and p["mem_bw_tbs"] == 4.0
    assert p["bf16_tensor"] == 1307.4
    p = device_peaks({"name": "Mystery GPU"}, "", {"bf16_tensor": 100.0})
    assert p["bf16_tensor"] == 100.0 and p["fp32"] is None
    assert peak_key("matrix", "fp32", tf32=True) == "tf32_tensor" and peak_key("vector", "bf16") == "fp32"
    v100 = device_peaks({"name": "Tesla V100-SXM2-16GB"}, "", {})
    assert resolve_peak(v100, "bf16_tensor") == ("fp32", 15.7)  # no bf16 tensor cores on Volta
    assert resolve_peak(v100, "fp32_tensor") == ("fp32", 15.7)


def test_out_argument_is_not_read_and_generic_rocm_names_match_by_arch() -> None:
    # mul(self, other, out=): older traces list out among the inputs; it is the output, not a read
    r = w("aten::mul", [[512, 2862], [], [512, 2862]], [F32, "double", F32])
    assert r is not None and r.bytes == 2 * 512 * 2862 * 4 + 8
    r = w("aten::addcmul_", [[8], [8], [8], []], [F32, F32, F32, "Scalar"])
    assert r is not None and r.bytes == 4 * 8 * 4
    mi210 = {"name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "numSms": 104,
             "totalGlobalMem": 68702699520}
    p = device_peaks(mi210, "", {})
    assert p["device"] == "MI210" and p["matched"] == "trace_arch" and p["scale"] == 1.0
    mi325 = {"name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 4, "numSms": 304,
             "totalGlobalMem": 274877906944}
    assert device_peaks(mi325, "", {})["device"] == "MI325X"
    assert device_peaks({**mi325, "totalGlobalMem": 205571227648}, "", {})["device"] == "MI300X"


def test_expanded_inputs_are_read_once_per_stored_element() -> None:
    def ws(name: str, dims: list, types: list, strides: list):  # type: ignore[no-untyped-def]
        return work(OpArgs.parse(name, json.dumps(dims), json.dumps(types), None, json.dumps(strides)))

    # x [64, 128] + bias.expand(64, 128) (stride 0 along dim 0): the bias is read as 128 elements
    r = ws("aten::add", [[64, 128], [64, 128], []], [F32, F32, "Scalar"], [[128, 1], [0, 1], []])
    assert r is not None and r.bytes == (64 * 128 + 128 + 64 * 128) * 4
    # contiguous copy of an expanded view: 128 elements read, 64 × 128 written
    r = ws("aten::copy_", [[64, 128], [64, 128], []], [BF16, BF16, "Scalar"], [[128, 1], [0, 1], []])
    assert r is not None and r.bytes == 64 * 128 * 2 + 128 * 2
    # no strides recorded: the shape's numel
    r = ws("aten::add", [[64, 128], [64, 128], []], [F32, F32, "Scalar"], [])
    assert r is not None and r.bytes == 3 * 64 * 128 * 4
