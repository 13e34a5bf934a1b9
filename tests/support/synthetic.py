"""Deterministic generator of realistic torch.profiler (Kineto) chrome traces with planted facts.

Every analysis test needs ground truth. Real traces have none: nobody knows exactly how long the
GPU idled because of the DataLoader in a trace someone else recorded. This module *simulates* a
training or inference loop on a CPU clock and per-stream GPU clocks, emits the chrome trace that
torch.profiler would have written for it, and — while emitting — counts everything it planted
(kernels, runtime calls, copies, syncs, idle gaps, step boundaries, memory growth …). Scenario
functions return ``(trace_dict, truth)``; ``truth`` is a plain JSON-able dict.

Time model
----------
* All internal times are integer **absolute epoch nanoseconds**. The emitted file encodes them the
  way the chosen layout does: ``modern`` writes µs floats with 3 decimals relative to
  ``baseTimeNanoseconds`` (so ``abs_ns = baseTimeNanoseconds + round(ts * 1000)``); the two old
  layouts write integer absolute µs (``abs_ns = ts * 1000``) and the builder quantises every
  duration to whole µs so that nothing is lost. Every ``*_ns`` value in a truth dict is in that
  absolute epoch-ns clock (durations are plain ns).
* The CPU clock belongs to the current thread (main thread, or the autograd thread inside
  :meth:`TraceBuilder.backward_thread`). Ops advance it; :meth:`TraceBuilder.idle_cpu` advances it
  without emitting anything (time spent in un-profiled Python, e.g. data loading).
* Each GPU stream has a "free" time. A kernel launched by a runtime call that ends at ``t`` starts
  at ``max(t + queue_delay, stream_free)``: while the CPU launches faster than the GPU executes,
  work queues up and the stream stays busy; when the CPU is slow the stream drains and an idle
  gap appears. The builder records every such gap as it happens (see ``gaps`` in the truth).
* Synchronising calls (``cudaStreamSynchronize`` …, blocking/pageable copies) last until the GPU
  work they wait for has finished, which is how sync-bound traces arise.

Layouts and vendors
-------------------
``layout="modern"`` (PyTorch ≥ 2.4 Kineto: ``baseTimeNanoseconds``, ``ac2g``/``fwdbwd`` flows,
``cuda_runtime``/``kernel``/``gpu_memcpy`` categories, ``python_function`` events), ``"pt_1_13"``
(the Aug 2021 – Oct 2022 era, PyTorch 1.10–1.13: integer absolute µs, ``async_cpu_to_gpu`` /
``forward_backward`` flows, ``gpu_user_Annotation`` typo, ``Trace name``/``Profiler Event Index``
op args) and ``"legacy_1_8"`` (PyTorch 1.8/1.9: ``Operator``/``Runtime``/``Kernel``/``Memcpy``/
``Memset``, ``async``/``launch`` flows, string tids such as ``"stream 7"``, ``computeProperties``,
``Call stack`` op args instead of python events). ``vendor`` is ``"nvidia"``, ``"amd"`` (HIP
calls under ``cuda_runtime`` with ``cid``, ``Memcpy HtoD (Host -> Device)``, ``kind`` args,
Tensile ``Cijk_*`` GEMMs) or ``"xpu"`` (``xpu_runtime``, ``urEnqueueKernelLaunch``, kernels with
``sycl queue``/``l0 queue`` args and no stream/grid/block).

Quirks copied on purpose from real files (``../shared/data/traces``): runtime calls that do not
launch GPU work carry a dangling ``f`` flow end on the CPU thread (modern NVIDIA, AMD, pt_1_13);
sync calls carry a dangling ``s`` flow start on modern NVIDIA; GPU thread names have a trailing
space (``"stream 7 "``); the autograd thread gets two ``thread_name`` rows; ``M`` rows declare
every device in ``deviceProperties`` even if idle; user annotations never become the
``External id`` of runtime calls (the innermost ``cpu_op`` does); a CUDA-graph launch has one
correlation id shared by all its kernels, each with its own ``f`` flow.

Determinism: the same arguments give byte-identical output (``random.Random(seed)`` only, no
wall clock, gzip with ``mtime=0``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from support import events as E

__all__ = [
    "BASE_TIME_NS", "DATALOADER_ANN", "LAYOUTS", "SCENARIOS", "VENDORS", "Collective", "GpuActivity", "OpHandle",
    "TraceBuilder", "dumps_trace", "dumps_truth", "kernel_name", "nccl_kernel_name", "scenario_comm_bound",
    "scenario_compute_bound", "scenario_copies", "scenario_idle_gaps", "scenario_inference", "scenario_input_bound",
    "scenario_launch_bound", "scenario_memory_growth", "scenario_multi_rank", "scenario_regression",
    "scenario_resnet_like", "scenario_sync_bound", "simulate_ranks", "write_bytes",
]

Layout = Literal["modern", "pt_1_13", "legacy_1_8"]
Vendor = Literal["nvidia", "amd", "xpu"]

LAYOUTS: tuple[str, ...] = ("modern", "pt_1_13", "legacy_1_8")
VENDORS: tuple[str, ...] = ("nvidia", "amd", "xpu")

# Kineto floors the epoch to a quarter of a Gregorian year (365.2425 d / 4 = 7_889_238 s); the
# real MI300X/vLLM files carry exactly this value (224 quarters since 1970).
QUARTER_YEAR_S = 7_889_238
BASE_TIME_NS = 224 * QUARTER_YEAR_S * 1_000_000_000  # 1767189312000000000

# Era-appropriate epochs (ns) for the integer-µs layouts.
_LEGACY_EPOCH_NS = {"legacy_1_8": 1_621_401_187_000_000_000, "pt_1_13": 1_669_783_687_000_000_000}

#: Default CUDA stream ids as seen in real files (compute stream 7, NCCL stream on its own id).
DEFAULT_STREAM = {"nvidia": 7, "amd": 0, "xpu": 1}
DEFAULT_COMM_STREAM = {"nvidia": 21, "amd": 4, "xpu": 2}

# ---------------------------------------------------------------------------------------------
# Device properties (copied field-for-field from real traces; XPU from the Kineto XPU catalog)
# ---------------------------------------------------------------------------------------------
_DEVICE_PROPS: dict[str, dict[str, Any]] = {
    "A100": {
        "name": "NVIDIA A100 80GB PCIe", "totalGlobalMem": 84990623744,
        "computeMajor": 8, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
        "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 167936,
        "numSms": 108, "sharedMemPerBlockOptin": 166912,
    },
    "H100": {
        "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936,
        "computeMajor": 9, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
        "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,
        "numSms": 132, "sharedMemPerBlockOptin": 232448,
    },
    "V100": {
        "name": "Tesla V100-SXM2-32GB", "totalGlobalMem": 34089730048,
        "computeMajor": 7, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
        "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 98304,
        "numSms": 80, "sharedMemPerBlockOptin": 98304,
    },
    "MI300X": {
        "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992,
        "computeMajor": 9, "computeMinor": 4,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "warpSize": 64,
        "sharedMemPerBlock": 65536, "numSms": 304,
        "maxSharedMemoryPerMultiProcessor": 65536,
    },
    "PVC": {
        "name": "Intel(R) Data Center GPU Max 1550", "totalGlobalMem": 68719476736,
        "maxComputeUnits": 448, "maxWorkGroupSize": 1024, "maxClockFrequency": 1600,
        "maxMemAllocSize": 68719476736, "localMemSize": 131072,
        "vendor": "Intel(R) Corporation", "driverVersion": "1.3.29735",
    },
}
_DEFAULT_GPU = {"nvidia": "A100", "amd": "MI300X", "xpu": "PVC"}

# Callback ids (CUPTI ``cbid``) observed in real traces, and HIP ``cid`` values observed in real
# ROCm 6.4 traces. Values marked "guess" were not observed; analyses must never rely on them.
CUDA_CBID: dict[str, int] = {
    "cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpy": 31, "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51, "cudaStreamSynchronize": 131, "cudaDeviceSynchronize": 165,
    "cudaEventSynchronize": 137, "cudaEventRecord": 135, "cudaEventQuery": 138,
    "cudaStreamWaitEvent": 147, "cudaGraphLaunch": 311, "cudaStreamIsCapturing": 317,
    "cudaFuncSetAttribute": 273, "cudaStreamGetCaptureInfo_v2": 409, "cudaPeekAtLastError": 11,
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": 251, "cuLaunchKernel": 307,
}
HIP_CID: dict[str, int] = {
    "hipLaunchKernel": 107, "hipExtModuleLaunchKernel": 65, "hipExtLaunchKernel": 62,
    "hipModuleLaunchKernel": 169, "hipMemcpyAsync": 134, "hipMemcpyWithStream": 153,
    "hipMemsetAsync": 159, "hipDeviceSynchronize": 48, "hipEventSynchronize": 60,
    "hipStreamWaitEvent": 200, "hipGraphLaunch": 215, "hipStreamIsCapturing": 290,
    "hipGetDevicePropertiesR0600": 370, "hipStreamGetCaptureInfo_v2": 289,
    "hipStreamSynchronize": 199,  # guess (not in any real file we have)
    "hipEventRecord": 59,  # guess
}

# Runtime API names per vendor for each logical call.
_API: dict[str, dict[str, str]] = {
    "nvidia": {
        "launch": "cudaLaunchKernel", "memcpy_async": "cudaMemcpyAsync", "memcpy_sync": "cudaMemcpy",
        "memset": "cudaMemsetAsync", "stream_sync": "cudaStreamSynchronize",
        "device_sync": "cudaDeviceSynchronize", "event_sync": "cudaEventSynchronize",
        "event_record": "cudaEventRecord", "stream_wait": "cudaStreamWaitEvent",
        "graph_launch": "cudaGraphLaunch", "comm_launch": "cudaLaunchKernelExC",
        "capturing": "cudaStreamIsCapturing",
    },
    "amd": {
        "launch": "hipLaunchKernel", "memcpy_async": "hipMemcpyAsync",
        "memcpy_sync": "hipMemcpyWithStream", "memset": "hipMemsetAsync",
        "stream_sync": "hipStreamSynchronize", "device_sync": "hipDeviceSynchronize",
        "event_sync": "hipEventSynchronize", "event_record": "hipEventRecord",
        "stream_wait": "hipStreamWaitEvent", "graph_launch": "hipGraphLaunch",
        "comm_launch": "hipExtLaunchKernel", "capturing": "hipStreamIsCapturing",
    },
    "xpu": {
        "launch": "urEnqueueKernelLaunch", "memcpy_async": "urEnqueueUSMMemcpy",
        "memcpy_sync": "urEnqueueUSMMemcpy", "memset": "urEnqueueUSMFill",
        "stream_sync": "urQueueFinish", "device_sync": "urQueueFinish",
        "event_sync": "urEventWait", "event_record": "urEnqueueEventsWait",
        "stream_wait": "urEnqueueEventsWaitWithBarrier", "graph_launch": "urCommandBufferEnqueueExp",
        "comm_launch": "urEnqueueKernelLaunch", "capturing": "urQueueGetInfo",
    },
}
_SYNC_KIND = {
    "cudaStreamSynchronize": "stream_sync", "cudaDeviceSynchronize": "device_sync",
    "cudaEventSynchronize": "event_sync", "stream": "stream_sync", "device": "device_sync",
    "event": "event_sync",
}
# Logical runtime calls that Kineto marks as flow *starts* even without linked GPU work (modern
# NVIDIA only: syncs and cross-stream waits get an unmatched "s" flow).
_NV_FLOW_START_NO_GPU = {"stream_sync", "device_sync", "event_sync", "stream_wait"}

# ---------------------------------------------------------------------------------------------
# Kernel-name catalogue (names copied from, or shaped like, kernels in real traces)
# ---------------------------------------------------------------------------------------------
_EW = ("void at::native::vectorized_elementwise_kernel<4, {f}, std::array<char*, {n}ul> >(int, {f}, std::array<char*, "
       "{n}ul>)")
_CLAMP = ("at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, "
          "c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
          "operator()() const::{lambda(float)#1}")
_THRESH = ("at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
           "{lambda(float, float)#1}")
_COMMON_KERNELS: dict[str, str] = {
    "relu": _EW.format(f=_CLAMP, n=2),
    "relu_bwd": _EW.format(f=_THRESH, n=3),
    "add": _EW.format(f="at::native::CUDAFunctor_add<float>", n=3),
    "mul": _EW.format(f="at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> "
                        ">", n=2),
    "fill": _EW.format(f="at::native::FillFunctor<float>", n=1),
    "copy": ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::"
             "TensorIteratorBase&)::"
             "{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::bfloat16_copy_kernel_cuda(at::"
             "TensorIteratorBase&)::"
             "{lambda(float)#1}, std::array<char*, 2ul>)"),
    "softmax": ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)"),
    "softmax_bwd": ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
                    "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*,"
                    " int)"),
    "nll": ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>"
            "(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)"),
    "nll_bwd": ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>"
                "(float*, float const*, long const*, float const*, float const*, bool, int, int, long, long)"),
    "reduce": ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
               "float, float>, "
               "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
               "unsigned int, float, 4>)"),
    "pool": ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float>(int, float const*, long, long, long,"
             " int, int, "
             "int, int, int, int, int, int, int, int, float*, long*)"),
    "avgpool": ("void at::native::(anonymous namespace)::adaptive_average_pool<float>(float const*, float*, int, int, "
                "int, int, "
                "long, long, long)"),
    "sgd": ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
            "TensorListMetadata<2>, "
            "at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>"
            "(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
            "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"),
    "adam": ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
             "TensorListMetadata<4>, "
             "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>,"
             " double*, double, "
             "double, double, double, double, bool, bool*, float*>(at::native::(anonymous namespace)::"
             "TensorListMetadata<4>, "
             "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>,"
             " double*, double, "
             "double, double, double, double, bool, bool*, float*)"),
    "embedding": ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, "
                  "2, -2, true>"
                  "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::"
                  "BFloat16 const, "
                  "unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, "
                  "unsigned int, long)"),
}
_VENDOR_KERNELS: dict[str, dict[str, str]] = {
    "A100": {
        "gemm": "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
        "gemm_bf16": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
        "gemm_small": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>("
                      "cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
        "conv_fwd": "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
                    "warpsize2x2x1_g1_tensor16x8x8_kernel",
        "conv_dgrad": "sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
                      "stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
        "conv_wgrad": "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
                      "stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
        "bn_fwd": ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float "
                   "const*, "
                   "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, "
                   "float*, float, float)"),
        "bn_bwd": ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
                   "cudnnTensorStruct, "
                   "float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float*,"
                   " float*, float const*, "
                   "float const*, float)"),
        "attention": "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, "
                     "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::"
                     "bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::"
                     "Flash_fwd_params)",
    },
    "H100": {
        "gemm": "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
                "kernel__5x_cublas",
        "gemm_bf16": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
                     "off_kernel__5x_cublas",
        "gemm_small": "nvjet_tst_64x8_64x16_4x1_v_bz_TNT",
    },
    "MI300X": {
        "gemm": ("Cijk_Alik_Bljk_SB_MT128x128x32_MI32x32x2x1_SN_1LDSB1_AFC1_AG0_AMAS3_ASE_ASGT_ASLT_ASAE01_ASCE01_"
                 "ASEM1_BL1_BS1_"
                 "DTL0_DTVA0_DTVB0_EPS1_FL0_GRPM1_GRVW4_GSU1_GLS0_ISA942_IU1_K1_KLA_LBSPP128_LPA0_LPB8_LDL1_LRVW4_"
                 "MIAV1_MO40_"
                 "NTA0_NTB0_NTC0_NTD0_NEPBS0_NLCA1_NLCB1_ONLL1_PGR2_PLR3_SIA3_SS1_SU32_SUS256_SPO0_SRVW0_SSO0_SVW4_TT4_"
                 "64_"
                 "TLDS1_USFGROn1_VAW1_VSn1_VW4_WSGRA0_WSGRB0_WS64_WG32_4_1_WGM8"),
        "gemm_bf16": ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_"
                      "ASEM1_CLR1_"
                      "CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_LBSPPB512_"
                      "LBSPPM0_"
                      "LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_MIWT4_4_MO40_NTn1_NTA0_NTB0_NTC0_NTD4_NTM0_NEPBS16_NLCA1_"
                      "NLCB1_ONLL1_"
                      "PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_"
                      "VSn1_VWA1_"
                      "VWB1_WSGRA0_WSGRB0_WS64_WG32_8_1"),
        "gemm_small": ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_"
                       "ASEM1_CLR1_"
                       "CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA2_GRVWB2_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA256_LBSPPB512_"
                       "LBSPPM0_"
                       "LPA16_LPB8_LPM0_LRVW2_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS0_NLCA1_"
                       "NLCB1_ONLL1_"
                       "PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW1_SK3_SKXCCM8_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_"
                       "VSn1_VWA1_"
                       "VWB1_WSGRA0_WSGRB0_WS64_WG16_16_1"),
        "conv_fwd": "igemm_fwd_gtcx3_nhwc_fp32_bx0_ex1_bt256x128x16_wt32x32x2_ws2x1_wl2x2_ta1x4x4x1_1x4x1x64_tb1x4x2x1_"
                    "1x4x1x64",
        "conv_dgrad": "igemm_bwd_gtcx3_nhwc_fp32_bx0_ex1_bt128x128x16_wt32x32x2_ws2x2_wl1x1_ta1x4x2x1_1x4x1x64_"
                      "tb1x4x2x1_1x4x1x64",
        "conv_wgrad": "igemm_wrw_gtcx3_nhwc_fp32_bx0_ex1_bt256x128x16_wt32x32x2_ws2x1_wl2x2_ta1x4x4x1_1x4x1x64_"
                      "tb1x4x2x1_1x4x1x64_gkgs",
        "bn_fwd": "MIOpenBatchNormFwdTrainSpatial",
        "bn_bwd": "MIOpenBatchNormBwdSpatial",
        "transpose": "batched_transpose_32x32_half",
        "attention": "_ZN5aiter24fmha_fwd_hd128_bf16_causalE",
    },
    "PVC": {
        "gemm": "gemm_kernel",
        "gemm_bf16": "gemm_kernel",
        "gemm_small": "gemm_kernel",
        "conv_fwd": "gen_conv_fwd_kernel",
        "conv_dgrad": "gen_conv_bwd_data_kernel",
        "conv_wgrad": "gen_conv_bwd_weights_kernel",
        "bn_fwd": "at::native::xpu::BatchNormTransformInputKernelFunctor<float, float, float, int, true>",
        "bn_bwd": "at::native::xpu::BatchNormBackwardReduceKernelFunctor<float, float, float, int>",
        "relu": "at::native::xpu::VectorizedElementwiseKernel<4, at::native::xpu::ReluFunctor<float>, at::detail::"
                "Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int> >",
        "add": "at::native::xpu::VectorizedElementwiseKernel<4, at::native::xpu::AddFunctor<float>, at::detail::"
               "Array<char*, 3>, TrivialOffsetCalculator<2, unsigned int> >",
        "fill": "at::native::xpu::VectorizedElementwiseKernel<4, at::native::xpu::FillFunctor<float>, at::detail::"
                "Array<char*, 1>, TrivialOffsetCalculator<0, unsigned int> >",
    },
}
_VENDOR_KERNELS["V100"] = {
    "gemm": "volta_sgemm_128x64_tn",
    "gemm_bf16": "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn",
    "gemm_small": "volta_sgemm_64x64_nt",
    "conv_fwd": "volta_scudnn_128x64_relu_interior_nn_v1",
    "conv_dgrad": "volta_scudnn_128x128_stridedB_splitK_small_nn_v1",
    "conv_wgrad": "volta_scudnn_128x64_stridedB_splitK_xregs_large_nn_v1",
}
# H100 inherits the cuDNN conv/BN names of A100 (cuDNN ships sm80 kernels to Hopper too).
for _k in ("conv_fwd", "conv_dgrad", "conv_wgrad", "bn_fwd", "bn_bwd", "attention"):
    _VENDOR_KERNELS["H100"].setdefault(_k, _VENDOR_KERNELS["A100"][_k])
    _VENDOR_KERNELS["V100"].setdefault(_k, _VENDOR_KERNELS["A100"][_k])


def kernel_name(gpu: str, op: str) -> str:
    """Realistic kernel name for a logical ``op`` (``gemm``, ``conv_fwd``, ``relu`` …) on ``gpu``."""
    table = _VENDOR_KERNELS.get(gpu, {})
    if op in table:
        return table[op]
    if op in _COMMON_KERNELS:
        return _COMMON_KERNELS[op]
    if op in _VENDOR_KERNELS["A100"]:
        return _VENDOR_KERNELS["A100"][op]
    raise KeyError(f"no kernel name for op {op!r}")


def nccl_kernel_name(vendor: str, layout: str, collective: str, dtype: str) -> str:
    """NCCL/RCCL kernel name for a collective, per vendor and era (NCCL < 2.19 vs ≥ 2.19)."""
    coll = {"allreduce": "AllReduce", "broadcast": "Broadcast", "allgather": "AllGather",
            "reduce_scatter": "ReduceScatter", "all_to_all": "SendRecv"}[collective]
    if vendor == "amd":
        return "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
    if layout == "modern":
        dt = {"Float": "f32", "BFloat16": "bf16", "Half": "f16"}.get(dtype, "f32")
        red = "_Sum" if coll in ("AllReduce", "ReduceScatter") else ""
        return f"ncclDevKernel_{coll}{red}_{dt}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    dt = {"Float": "float", "BFloat16": "bf16", "Half": "half"}.get(dtype, "float")
    red = "_Sum" if coll in ("AllReduce", "ReduceScatter") else ""
    return f"ncclKernel_{coll}_RING_LL{red}_{dt}(ncclWorkElem)"


# ---------------------------------------------------------------------------------------------
# Small records
# ---------------------------------------------------------------------------------------------
@dataclass
class OpHandle:
    """What an open/closed CPU op or annotation looks like to callers.

    ``ext_id`` is its ``External id``; ``seq`` its autograd ``Sequence number`` (when it created an
    autograd node, i.e. ``seq=True`` was passed); ``start_ns``/``end_ns`` absolute epoch ns
    (``end_ns`` is set when the context exits).
    """

    name: str
    ext_id: int
    start_ns: int
    tid: int
    seq: int | None = None
    end_ns: int | None = None


@dataclass
class GpuActivity:
    """One kernel / memcpy / memset as the builder planted it (absolute epoch ns)."""

    kind: str  # "kernel" | "memcpy" | "memset"
    name: str
    stream: int
    start_ns: int
    dur_ns: int
    correlation: int
    external_id: int | None
    runtime_name: str
    runtime_start_ns: int
    runtime_dur_ns: int
    step: int | None
    bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass
class Collective:
    """An in-flight collective (see :meth:`TraceBuilder.collective`).

    ``start_ns`` is when the comm kernel will start on its stream (known on entry); set
    ``end_ns`` (or leave the default ``start_ns + transfer``) before the context exits. In a
    multi-rank simulation the driver sets every rank's ``end_ns`` to the same instant, which is
    what makes fast ranks wait for a straggler inside NCCL.
    """

    collective: str
    start_ns: int
    transfer_ns: int
    end_ns: int
    stream: int
    nelems: int
    dtype: str


@dataclass
class _Frame:
    kind: str  # "cpu_op" | "user_annotation" | "python_function"
    name: str
    tid: int
    start: int
    handle: OpHandle | None
    args: dict[str, Any]
    min_dur: int = 0
    post: int = 0
    gpu_projection: bool = False
    gpu_act_index: int = 0
    py_id: int | None = None


@dataclass
class _Ev:
    """Internal event: logical kind + absolute-ns times; encoded per layout by ``build``."""

    kind: str
    name: str
    pid: int | str
    tid: int | str
    ts: int
    dur: int | None
    args: dict[str, Any] | None
    extra: dict[str, Any] | None = None


def _interval_union(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge [start, end) intervals into a sorted disjoint list."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _union_length(intervals: Sequence[tuple[int, int]], lo: int | None = None, hi: int | None = None) -> int:
    """Total length of the union of intervals, optionally clipped to [lo, hi)."""
    total = 0
    for s, e in _interval_union(intervals):
        if lo is not None:
            s = max(s, lo)
        if hi is not None:
            e = min(e, hi)
        if e > s:
            total += e - s
    return total


def _overlap_length(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Length of (union of a) ∩ (union of b)."""
    ua, ub = _interval_union(a), _interval_union(b)
    i = j = 0
    total = 0
    while i < len(ua) and j < len(ub):
        s, e = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if e > s:
            total += e - s
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


_DTYPE_SIZE = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4}
_DTYPE_INPUT_TYPE = {
    "Float": "float",
    "BFloat16": "c10::BFloat16",
    "Half": "c10::Half",
    "Double": "double",
    "Long": "long int",
}

# Effective copy bandwidths (GB/s == bytes/ns) used when a memcpy duration is not given.
_BW_GBPS: dict[str, dict[str, float]] = {
    "A100": {"HtoD_pinned": 22.0, "HtoD_pageable": 9.0, "DtoH_pinned": 20.0, "DtoH_pageable": 8.0, "DtoD": 1300.0},
    "H100": {"HtoD_pinned": 45.0, "HtoD_pageable": 12.0, "DtoH_pinned": 40.0, "DtoH_pageable": 11.0, "DtoD": 2400.0},
    "V100": {"HtoD_pinned": 11.0, "HtoD_pageable": 6.0, "DtoH_pinned": 11.0, "DtoH_pageable": 5.5, "DtoD": 750.0},
    "MI300X": {"HtoD_pinned": 48.0, "HtoD_pageable": 14.0, "DtoH_pinned": 48.0, "DtoH_pageable": 13.0, "DtoD": 3000.0},
    "PVC": {"HtoD_pinned": 40.0, "HtoD_pageable": 10.0, "DtoH_pinned": 40.0, "DtoH_pageable": 10.0, "DtoD": 2000.0},
}


class TraceBuilder:
    """Simulates one profiled process (one rank, one GPU) and emits its Kineto chrome trace.

    Parameters (all keyword-only):

    ``layout``/``vendor``/``gpu``
        file format era, runtime vendor and device model (``A100``, ``H100``, ``V100``,
        ``MI300X``, ``PVC``). ``legacy_1_8`` is NVIDIA-only; ``xpu`` is ``modern``-only.
    ``seed``
        seeds the builder's own RNG (pid, ids, kernel launch geometry). Scenario code should use
        its own ``random.Random`` for workload timing.
    ``rank``/``world_size``/``backend``/``distributed``
        written to ``distributedInfo`` (modern/pt_1_13) and to collective args.
    ``device``/``num_devices``
        the GPU index used for GPU events (pid of GPU rows) and how many devices
        ``deviceProperties`` and the ``M`` rows declare (real files declare all visible GPUs).
    ``record_shapes``/``with_stack``/``profile_memory``
        profiler flags: they gate ``Input Dims``/``Input type`` args, python events (or the
        legacy ``Call stack`` arg) and ``[memory]`` events, and are written as metadata.
    ``start_ns``
        absolute epoch ns of the profiler start (default: drawn from ``seed``); give every rank of
        a multi-rank simulation the same value so that their clocks agree.
    """

    def __init__(
        self,
        *,
        layout: Layout = "modern",
        vendor: Vendor = "nvidia",
        gpu: str | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        backend: str | None = None,
        distributed: bool = True,
        device: int = 0,
        num_devices: int | None = None,
        pid: int | None = None,
        record_shapes: bool = True,
        with_stack: bool = True,
        profile_memory: bool = True,
        process_name: str = "python3",
        trace_name: str | None = None,
        start_ns: int | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if vendor not in VENDORS:
            raise ValueError(f"vendor must be one of {VENDORS}, got {vendor!r}")
        if layout == "legacy_1_8" and vendor != "nvidia":
            raise ValueError("legacy_1_8 traces exist only for NVIDIA (roctracer support came in PyTorch 1.11)")
        if vendor == "xpu" and layout != "modern":
            raise ValueError("XPU traces exist only in the modern layout")
        self.layout: str = layout
        self.vendor: str = vendor
        self.gpu: str = gpu or _DEFAULT_GPU[vendor]
        if self.gpu not in _DEVICE_PROPS:
            raise ValueError(f"unknown gpu {self.gpu!r}; known: {sorted(_DEVICE_PROPS)}")
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.backend = backend or ("xccl" if vendor == "xpu" else "nccl")
        self.distributed = distributed
        self.device = device
        self.num_devices = (
            num_devices if num_devices is not None else max(device + 1, world_size if world_size > 1 else 1)
        )
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.profile_memory = profile_memory
        self.process_name = process_name
        self.trace_name = trace_name
        self.stream: int = DEFAULT_STREAM[vendor]
        self.comm_stream: int = DEFAULT_COMM_STREAM[vendor]

        self._rng = random.Random(f"TraceBuilder/{seed}/{rank}/{layout}/{vendor}")
        self._int_us = layout != "modern"
        self._quantum = 1000 if self._int_us else 1
        self.pid: int = pid if pid is not None else self._rng.randint(2000, 99000)
        self.main_tid: int = self.pid
        self.bwd_tid: int = self.pid + self._rng.randint(60, 400)
        if layout == "modern":
            # 11..45 days after the quarter-year base, like real files; keeps ts < 2**53 ns.
            offset_us = self._rng.randint(950_000_000_000, 3_900_000_000_000)
            self.base_time_ns: int | None = BASE_TIME_NS
            start = BASE_TIME_NS + offset_us * 1000 + self._rng.randint(0, 999)
        else:
            self.base_time_ns = None
            start = _LEGACY_EPOCH_NS[layout] + self._rng.randint(0, 10**9) * 1000
        if start_ns is not None:
            # Multi-rank runs share one clock (same host / synchronised clocks).
            if self._int_us and start_ns % 1000:
                raise ValueError("start_ns must be a whole µs in integer-µs layouts")
            start = start_ns
        self.trace_start_ns: int = start
        self._tid: int = self.main_tid
        self._cpu: dict[int, int] = {self.main_tid: start + self._ns(120.0)}
        self._stacks: dict[int, list[_Frame]] = {self.main_tid: [], self.bwd_tid: []}
        self._next_ext = self._rng.randint(1, 3000)
        self._next_corr = self._rng.randint(10_000, 900_000)
        self._next_seq = self._rng.randint(0, 500)
        self._next_py = 1
        self._next_fwdbwd = 1
        self._next_graph_node = 1
        self._next_xpu_kernel_id = 1
        self._stream_ready: dict[int, int] = {}
        self._stream_last_end: dict[int, int] = {}
        self._event_time: dict[int, int] = {}
        self._streams_used: list[int] = []
        self._threads_used: list[int] = [self.main_tid]

        self._cpu_evs: list[_Ev] = []
        self._mem_evs: list[_Ev] = []
        self._py_evs: list[_Ev] = []
        self._gpu_evs: list[_Ev] = []

        # ---- planted-fact accumulators (read by truth()) ----
        self.gpu_acts: list[GpuActivity] = []
        self.runtime_counts: Counter[str] = Counter()
        self.runtime_ns: Counter[str] = Counter()
        self.cpu_op_counts: Counter[str] = Counter()
        self.annotation_counts: Counter[str] = Counter()
        self.annotations: list[dict[str, Any]] = []
        self.gpu_annotation_count = 0
        self.python_count = 0
        self.flow_counts: Counter[str] = Counter()
        self.syncs: list[dict[str, Any]] = []
        self.gaps: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.collectives: list[dict[str, Any]] = []
        self.items: list[dict[str, Any]] = []
        self.memory_records: list[dict[str, Any]] = []
        self._cur_step: int | None = None
        self._allocs: dict[int, int] = {}
        self._allocated = 0
        self._reserved = 0
        self._peak_allocated = 0
        self._next_addr = 0x7F3A_0000_0000 + self._rng.randint(0, 4096) * 0x10_0000

    # ------------------------------------------------------------------ clocks & ids
    def _ns(self, us: float) -> int:
        """µs → ns, quantised to whole µs in the integer-µs layouts (so nothing is lost on write)."""
        ns = int(round(us * 1000))
        if self._quantum > 1:
            ns = int(round(ns / 1000)) * 1000
        return max(ns, 0)

    def _ns_pos(self, us: float) -> int:
        """Like :meth:`_ns` but at least one quantum (1 ns / 1 µs): used for durations of calls."""
        return max(self._ns(us), self._quantum)

    @property
    def now_ns(self) -> int:
        """Current CPU time of the current thread (absolute epoch ns)."""
        return self._cpu[self._tid]

    def _set_now(self, t: int) -> None:
        self._cpu[self._tid] = t

    def _advance(self, ns: int) -> None:
        self._cpu[self._tid] += ns

    def idle_cpu(self, us: float) -> None:
        """Advance the CPU clock by ``us`` without emitting anything (un-profiled host work)."""
        self._advance(self._ns(us))

    def gpu_free_ns(self, stream: int | None = None) -> int:
        """When the last planted activity on ``stream`` ends (0 if the stream is unused)."""
        return self._stream_last_end.get(self.stream if stream is None else stream, 0)

    def _new_ext(self) -> int:
        v = self._next_ext
        self._next_ext += 1
        return v

    def _new_corr(self) -> int:
        v = self._next_corr
        # Real correlation ids skip values (API calls outside the enabled callback domains).
        self._next_corr += 1 + (self._rng.randint(0, 3) if self._rng.random() < 0.15 else 0)
        return v

    def _stack(self) -> list[_Frame]:
        return self._stacks.setdefault(self._tid, [])

    def _current_ext(self) -> tuple[int | None, int | None]:
        """(External id, start ns) of the innermost *cpu_op* on this thread (annotations never link)."""
        for fr in reversed(self._stack()):
            if fr.kind == "cpu_op" and fr.handle is not None:
                return fr.handle.ext_id, fr.start
        return None, None

    def _python_parent(self) -> int | None:
        for fr in reversed(self._stack()):
            if fr.kind == "python_function":
                return fr.py_id
        return None

    def _call_stack(self) -> str:
        """Legacy ``Call stack`` arg: python frames innermost first, ';'-separated."""
        return ";".join(fr.name for fr in reversed(self._stack()) if fr.kind == "python_function")

    def _api(self, logical: str) -> str:
        return _API[self.vendor][logical]

    # ------------------------------------------------------------------ CPU-side contexts
    def _op_args(
        self,
        kind: str,
        ext: int,
        *,
        seq: int | None,
        fwd_thread: int | None,
        input_dims: list[Any] | None,
        input_types: list[str] | None,
        extra: dict[str, Any] | None,
    ) -> dict[str, Any]:
        a: dict[str, Any] = {}
        shapes = self.record_shapes and input_dims is not None
        types = input_types if input_types is not None else (["float"] * len(input_dims) if input_dims else [])
        if self.layout == "modern":
            a["External id"] = ext
            a["Record function id"] = 0
            if seq is not None:
                a["Sequence number"] = seq
                a["Fwd thread id"] = fwd_thread if fwd_thread is not None else 0
            if shapes and kind == "cpu_op":
                assert input_dims is not None
                a["Concrete Inputs"] = ["" for _ in input_dims]
                a["Input type"] = list(types)
                a["Input Strides"] = [_contiguous_strides(d) for d in input_dims]
                a["Input Dims"] = [list(d) for d in input_dims]
            if extra:
                a.update(extra)
            a["Ev Idx"] = None  # filled by build()
        elif self.layout == "pt_1_13":
            a["Trace name"] = "PyTorch Profiler"
            a["Trace iteration"] = 0
            a["External id"] = ext
            a["Profiler Event Index"] = None  # filled by build()
            if seq is not None:
                a["Sequence number"] = seq
                a["Fwd thread id"] = fwd_thread if fwd_thread is not None else 0
            if shapes and kind == "cpu_op":
                assert input_dims is not None
                a["Input Dims"] = [list(d) for d in input_dims]
                a["Input type"] = list(types)
            if extra:
                a.update(extra)
            a["Module Hierarchy"] = ""
            a["Call stack"] = ""
        else:  # legacy_1_8
            a["Device"] = self.pid
            a["External id"] = ext
            if shapes and kind == "cpu_op":
                assert input_dims is not None
                a["Input Dims"] = [list(d) for d in input_dims]
                a["Input type"] = list(types)
            if seq is not None:
                a["Sequence number"] = seq
            if extra:
                a.update(extra)
            if self.with_stack:
                cs = self._call_stack()
                if cs:
                    a["Call stack"] = cs
        return a

    @contextlib.contextmanager
    def cpu_op(
        self,
        name: str,
        dur_us: float | None = None,
        *,
        input_dims: list[Any] | None = None,
        input_types: list[str] | None = None,
        seq: bool | int = False,
        pre_us: float = 1.0,
        post_us: float = 1.0,
        args: dict[str, Any] | None = None,
        _bwd_seq: int | None = None,
    ) -> Iterator[OpHandle]:
        """An ATen/autograd op (``cpu_op``; ``Operator`` in legacy_1_8) on the current thread.

        The op starts now, advances the clock by ``pre_us`` (dispatcher overhead before children),
        runs its body (nested ops, launches …), then ``post_us``; if ``dur_us`` is given the op
        lasts at least that long. ``seq=True`` gives it an autograd ``Sequence number`` (the op
        created a backward node), which :meth:`backward_op` links to with ``fwdbwd`` flows.
        """
        start = self.now_ns
        ext = self._new_ext()
        seqno: int | None = None
        fwd_thread: int | None = None
        if _bwd_seq is not None:
            seqno, fwd_thread = _bwd_seq, 1
        elif seq is not False:
            if seq is True:
                seqno = self._next_seq
                self._next_seq += 1
            else:
                seqno = int(seq)
            fwd_thread = 0
        handle = OpHandle(name=name, ext_id=ext, start_ns=start, tid=self._tid, seq=seqno)
        a = self._op_args("cpu_op", ext, seq=seqno, fwd_thread=fwd_thread, input_dims=input_dims,
                          input_types=input_types, extra=args)
        fr = _Frame("cpu_op", name, self._tid, start, handle, a,
                    min_dur=self._ns(dur_us) if dur_us is not None else 0, post=self._ns(post_us))
        self._stack().append(fr)
        self._advance(self._ns(pre_us))
        yield handle
        self._close(fr)

    @contextlib.contextmanager
    def annotation(
        self,
        name: str,
        dur_us: float | None = None,
        *,
        gpu: bool = False,
        pre_us: float = 0.5,
        post_us: float = 0.5,
    ) -> Iterator[OpHandle]:
        """A ``record_function`` range (``user_annotation``; ``Operator`` in legacy_1_8).

        With ``gpu=True`` the GPU-side projection (``gpu_user_annotation``) is emitted too,
        spanning the GPU work launched inside the range (not in legacy_1_8, which had none).
        """
        start = self.now_ns
        ext = self._new_ext()
        handle = OpHandle(name=name, ext_id=ext, start_ns=start, tid=self._tid)
        a = self._op_args("user_annotation", ext, seq=None, fwd_thread=None, input_dims=None,
                          input_types=None, extra=None)
        fr = _Frame("user_annotation", name, self._tid, start, handle, a,
                    min_dur=self._ns(dur_us) if dur_us is not None else 0, post=self._ns(post_us),
                    gpu_projection=gpu and self.layout != "legacy_1_8", gpu_act_index=len(self.gpu_acts))
        self._stack().append(fr)
        self._advance(self._ns(pre_us))
        yield handle
        self._close(fr)

    @contextlib.contextmanager
    def step(self, n: int, *, pre_us: float = 2.0, post_us: float = 2.0) -> Iterator[OpHandle]:
        """``ProfilerStep#n`` (CPU user_annotation + GPU-side duplicate). Steps are numbered by
        the caller; consecutive ``step`` blocks are contiguous, as profiler.step() makes them."""
        idx = len(self.steps)
        rec: dict[str, Any] = {"name": f"ProfilerStep#{n}", "number": n, "cpu_start_ns": self.now_ns,
                               "_act_index": len(self.gpu_acts)}
        self.steps.append(rec)
        prev = self._cur_step
        self._cur_step = idx
        with self.annotation(f"ProfilerStep#{n}", gpu=True, pre_us=pre_us, post_us=post_us) as h:
            yield h
        self._cur_step = prev
        rec["cpu_end_ns"] = h.end_ns
        rec["_act_end"] = len(self.gpu_acts)
        rec["allocated_at_end_bytes"] = self._allocated

    @contextlib.contextmanager
    def python_frame(
        self, file: str, line: int, func: str, *, module: str | None = None, pre_us: float = 0.3, post_us: float = 0.3
    ) -> Iterator[None]:
        """A Python frame ``file(line): func`` (``python_function`` event, ``with_stack=True``).

        ``module="Linear_0"`` emits an ``nn.Module: Linear_0`` frame instead (with
        ``Python module id``). In legacy_1_8 nothing is emitted; the frame becomes part of the
        ``Call stack`` arg of the ops inside it. Without ``with_stack`` it is a no-op.
        """
        if not self.with_stack:
            yield
            return
        name = f"nn.Module: {module}" if module else f"{file}({line}): {func}"
        start = self.now_ns
        pyid = self._next_py
        self._next_py += 1
        args: dict[str, Any] = {"Python parent id": self._python_parent(), "Python id": pyid}
        if module:
            args["Python module id"] = 0
        if self.layout == "modern":
            args["Ev Idx"] = None
        elif self.layout == "pt_1_13":
            args["Python thread"] = 0
        fr = _Frame("python_function", name, self._tid, start, None, args, post=self._ns(post_us), py_id=pyid)
        self._stack().append(fr)
        self._advance(self._ns(pre_us))
        yield
        self._close(fr)

    def _close(self, fr: _Frame) -> None:
        stack = self._stack()
        if not stack or stack[-1] is not fr:
            raise RuntimeError(f"unbalanced close of {fr.name!r}")
        stack.pop()
        self._advance(fr.post)
        end = max(self.now_ns, fr.start + fr.min_dur)
        self._set_now(end)
        dur = end - fr.start
        if fr.handle is not None:
            fr.handle.end_ns = end
        if fr.kind == "python_function":
            if self.layout != "legacy_1_8":
                self._py_evs.append(_Ev("python_function", fr.name, self.pid, fr.tid, fr.start, dur, fr.args))
                self.python_count += 1
            return
        self._cpu_evs.append(_Ev(fr.kind, fr.name, self.pid, fr.tid, fr.start, dur, fr.args))
        if fr.kind == "cpu_op":
            self.cpu_op_counts[fr.name] += 1
        else:
            self.annotation_counts[fr.name] += 1
            if not fr.name.startswith("ProfilerStep#"):
                self.annotations.append({"name": fr.name, "tid": fr.tid, "start_ns": fr.start,
                                         "end_ns": end, "dur_ns": dur, "step": self._cur_step})
            if fr.gpu_projection:
                acts = self.gpu_acts[fr.gpu_act_index:]
                if acts:
                    s = min(a.start_ns for a in acts)
                    e = max(a.end_ns for a in acts)
                    assert fr.handle is not None
                    self._gpu_evs.append(_Ev("gpu_user_annotation", fr.name, self.device, acts[0].stream, s, e - s,
                                             {"External id": fr.handle.ext_id}))
                    self.gpu_annotation_count += 1

    # ------------------------------------------------------------------ autograd
    @contextlib.contextmanager
    def backward_thread(self, start_latency_us: float = 8.0) -> Iterator[None]:
        """Run the body on the autograd engine thread (``pt_autograd_0``).

        The backward thread starts ``start_latency_us`` after the main thread's current time;
        when the body ends the main thread resumes at the backward thread's end (``loss.backward()``
        blocks the caller until the engine finishes)."""
        main = self._tid
        t0 = self._cpu[main]
        self._cpu[self.bwd_tid] = max(self._cpu.get(self.bwd_tid, 0), t0 + self._ns(start_latency_us))
        if self.bwd_tid not in self._threads_used:
            self._threads_used.append(self.bwd_tid)
        self._tid = self.bwd_tid
        yield
        end = self._cpu[self.bwd_tid]
        self._tid = main
        self._cpu[main] = max(t0, end) + self._ns(2.0)

    @contextlib.contextmanager
    def backward_op(self, fwd: OpHandle | None, node: str, dur_us: float | None = None) -> Iterator[OpHandle]:
        """``autograd::engine::evaluate_function: <node>`` wrapping ``<node>`` (e.g.
        ``ConvolutionBackward0``), linked to the forward op ``fwd`` by a ``fwdbwd`` flow pair
        (not in legacy_1_8) and by a shared ``Sequence number``."""
        seq = fwd.seq if fwd is not None else None
        with self.cpu_op(f"autograd::engine::evaluate_function: {node}", _bwd_seq=seq, pre_us=1.5, post_us=1.0):
            with self.cpu_op(node, dur_us, _bwd_seq=seq, pre_us=1.0) as h:
                if fwd is not None and seq is not None and self.layout != "legacy_1_8":
                    fid = self._next_fwdbwd
                    self._next_fwdbwd += 1
                    self._cpu_evs.append(_Ev("flow", "fwdbwd", self.pid, fwd.tid, fwd.start_ns, None, None,
                                             {"ph": "s", "id": fid, "_after": fwd.ext_id}))
                    self._cpu_evs.append(_Ev("flow", "fwdbwd", self.pid, h.tid, h.start_ns, None, None,
                                             {"ph": "f", "id": fid, "_after": h.ext_id}))
                    self.flow_counts["fwdbwd_s"] += 1
                    self.flow_counts["fwdbwd_f"] += 1
                yield h

    # ------------------------------------------------------------------ runtime & GPU emission
    def _runtime_args(self, name: str, corr: int, ext: int | None, ext_ts: int | None,
                      extra: dict[str, Any] | None) -> dict[str, Any]:
        a: dict[str, Any] = {}
        if self.layout == "legacy_1_8":
            a["cbid"] = CUDA_CBID.get(name, 0)
            a["correlation"] = corr
            # Unlinked calls carry their own correlation as "external id" and ts 0 (real 1.8 files).
            a["external id"] = ext if ext is not None else corr
            a["external ts"] = _legacy_us(ext_ts) if ext_ts is not None else 0
            return a
        if ext is not None:
            a["External id"] = ext
        if self.vendor == "nvidia":
            a["cbid"] = CUDA_CBID.get(name, 0)
            a["correlation"] = corr
        elif self.vendor == "amd":
            if extra and "kernel" in extra:
                a["kernel"] = extra["kernel"]
            a["cid"] = HIP_CID.get(name, 0)
            a["correlation"] = corr
            for k, v in (extra or {}).items():
                if k != "kernel":
                    a[k] = v
        else:
            a["correlation"] = corr
        return a

    def _emit_runtime(self, name: str, logical: str, start: int, dur: int, corr: int, *, linked: bool,
                      extra: dict[str, Any] | None = None) -> None:
        ext, ext_ts = self._current_ext()
        cat = "runtime"
        if self.vendor == "nvidia" and name.startswith("cu") and not name.startswith("cuda"):
            cat = "driver"
        self._gpu_evs.append(_Ev(cat, name, self.pid, self._tid, start, dur,
                                 self._runtime_args(name, corr, ext, ext_ts, extra)))
        self.runtime_counts[name] += 1
        self.runtime_ns[name] += dur
        # Flow endpoints exactly as Kineto writes them (see module docstring).
        if linked:
            ph: str | None = "s"
        elif self.layout == "legacy_1_8":
            ph = None
        elif self.layout == "modern" and self.vendor == "nvidia" and logical in _NV_FLOW_START_NO_GPU:
            ph = "s"
        else:
            ph = "f"
        if ph is not None:
            self._gpu_evs.append(_Ev("flow", "ac2g", self.pid, self._tid, start, None, None, {"ph": ph, "id": corr}))
            self.flow_counts[f"ac2g_{ph}_cpu"] += 1

    def _place(self, stream: int, ready: int, dur: int) -> tuple[int, int]:
        """Schedule ``dur`` ns of GPU work on ``stream`` no earlier than ``ready``.

        Returns (start, end). Records an idle gap when the stream had drained before the work could
        start — caused by the host (``ready`` was the binding constraint) or by a cross-stream
        dependency (a ``cudaStreamWaitEvent`` pushed the start later)."""
        stream_ready = self._stream_ready.get(stream, 0)
        start = max(ready, stream_ready)
        prev_end = self._stream_last_end.get(stream)
        if prev_end is not None and start > prev_end:
            cause = "host" if ready >= stream_ready else "dependency"
            self.gaps.append({"stream": stream, "start_ns": prev_end, "end_ns": start, "dur_ns": start - prev_end,
                              "cause": cause, "step": self._cur_step})
        end = start + dur
        self._stream_last_end[stream] = max(prev_end or 0, end)
        self._stream_ready[stream] = max(stream_ready, end)
        if stream not in self._streams_used:
            self._streams_used.append(stream)
        return start, end

    def _gpu_args(self, kind: str, name: str, stream: int, corr: int, ext: int | None, start: int, dur: int,
                  nbytes: int | None, geometry: dict[str, Any] | None, extra: dict[str, Any] | None,
                  runtime_start: int) -> dict[str, Any]:
        a: dict[str, Any] = {}
        if self.vendor == "xpu":
            if ext is not None:
                a["External id"] = ext
            a["correlation"] = corr
            if kind != "kernel":
                a["l0 call"] = "zeCommandListAppendMemoryCopy" if kind == "memcpy" else "zeCommandListAppendMemoryFill"
            appended = runtime_start + self._ns(1.0)
            submitted = max(appended, start - self._ns(2.0))
            a["appended"] = self._fmt_us_str(appended)
            a["appended_rel_to_start"] = _fmt_ns_as_us(appended - start)
            a["submitted"] = self._fmt_us_str(submitted)
            a["submitted_rel_to_start"] = _fmt_ns_as_us(submitted - start)
            a["device"] = self.device
            a["context"] = "0x000055d1c3a8f2e0"
            a["sycl queue"] = stream
            a["l0 queue"] = f"0x{0x55d1c4b10000 + stream * 0x1000:016x}"
            if kind == "kernel":
                a["kernel_id"] = self._next_xpu_kernel_id
                self._next_xpu_kernel_id += 1
                a["sycl_node_id"] = 0
                a["sycl_invocation_id"] = 0
            else:
                a["memory opration id"] = corr  # sic: Kineto's typo
                a["bytes"] = nbytes
                a["memory bandwidth (GB/s)"] = (nbytes or 0) / dur if dur else "N/A"
            if extra:
                a.update(extra)
            return a
        if self.vendor == "amd":
            if ext is not None:
                a["External id"] = ext
            a["device"] = self.device
            a["stream"] = stream
            a["correlation"] = corr
            if kind == "kernel":
                a["kind"] = (extra or {}).pop("_amd_kind", "Dispatch Kernel") if extra else "Dispatch Kernel"
                if geometry:
                    a["grid"] = geometry["grid"]
                    a["block"] = geometry["block"]
            elif kind == "memcpy":
                a["kind"] = (extra or {}).pop("_amd_kind", "HtoD") if extra else "HtoD"
                a["bytes"] = nbytes
                a["memory bandwidth (GB/s)"] = (nbytes or 0) / dur
            else:  # memset: ROCm writes no bytes (real resnet_act_checkpoint file)
                a["kind"] = "Device"
            if extra:
                a.update(extra)
            return a
        # NVIDIA
        legacy = self.layout == "legacy_1_8"
        if ext is not None and not legacy:
            a["External id"] = ext
        if kind == "kernel":
            a["queued"] = 0
        a["device"] = self.device
        a["context"] = 1
        a["stream"] = stream
        a["correlation"] = corr
        if legacy:
            a["external id"] = ext if ext is not None else 0
        if kind == "kernel":
            assert geometry is not None
            a.update({k: v for k, v in geometry.items() if k not in ("grid", "block", "occupancy")})
            a["grid"] = geometry["grid"]
            a["block"] = geometry["block"]
            a["theoretical occupancy %" if legacy else "est. achieved occupancy %"] = geometry["occupancy"]
        else:
            a["bytes"] = nbytes
            a["memory bandwidth (GB/s)"] = (nbytes or 0) / dur
        if extra:
            a.update(extra)
        return a

    def _fmt_us_str(self, t: int) -> str:
        rel = t - (self.base_time_ns or 0)
        return _fmt_ns_as_us(rel)

    def _geometry(self, name: str, dur: int, grid: Sequence[int] | None, block: Sequence[int] | None,
                  registers: int | None, shared_mem: int | None) -> dict[str, Any]:
        """Launch geometry and the CUPTI occupancy-derived args (deterministic from the builder RNG)."""
        rng = self._rng
        if block is None:
            block = [rng.choice((128, 256, 256, 512)), 1, 1]
        if grid is None:
            # Longer kernels tend to have more blocks; keep it plausible, not meaningful.
            base = max(1, min(65535, int(dur / 1000 * rng.choice((4, 8, 16, 27)))))
            grid = [base, 1, 1]
        props = _DEVICE_PROPS[self.gpu]
        sms = props.get("numSms", props.get("maxComputeUnits", 100))
        nblocks = grid[0] * grid[1] * grid[2]
        threads = block[0] * block[1] * block[2]
        bps = round(nblocks / sms, 6)
        wps = round(bps * math.ceil(threads / props.get("warpSize", 32)), 6)
        occ = int(min(100, wps / 64 * 100))
        return {
            "registers per thread": registers
            if registers is not None
            else rng.choice((16, 24, 32, 40, 64, 72, 96, 128)),
            "shared memory": shared_mem
            if shared_mem is not None
            else (49152 if "gemm" in name or "xmma" in name else 0),
            "blocks per SM": bps,
            "warps per SM": wps,
            "grid": list(grid),
            "block": list(block),
            "occupancy": occ,
        }

    def _emit_gpu(self, act: GpuActivity, geometry: dict[str, Any] | None, extra: dict[str, Any] | None) -> None:
        args = self._gpu_args(act.kind, act.name, act.stream, act.correlation, act.external_id, act.start_ns,
                              act.dur_ns, act.bytes, geometry, dict(extra) if extra else None, act.runtime_start_ns)
        tid: int | str = f"stream {act.stream}" if self.layout == "legacy_1_8" else act.stream
        self._gpu_evs.append(_Ev(act.kind, act.name, self.device, tid, act.start_ns, act.dur_ns, args))
        self._gpu_evs.append(_Ev("flow", "ac2g", self.device, tid, act.start_ns, None, None,
                                 {"ph": "f", "id": act.correlation}))
        self.flow_counts["ac2g_f_gpu"] += 1
        self.gpu_acts.append(act)

    def runtime_call(self, name: str, dur_us: float = 1.0, *, logical: str = "other") -> None:
        """A runtime call that launches no GPU work (``cudaStreamIsCapturing``, ``cudaFuncSetAttribute``,
        ``cudaEventQuery`` …): counted, emitted with the era's dangling-flow quirk."""
        start = self.now_ns
        dur = self._ns_pos(dur_us)
        self._emit_runtime(name, logical, start, dur, self._new_corr(), linked=False)
        self._advance(dur)

    def launch_kernel(
        self,
        name: str,
        gpu_dur_us: float,
        *,
        stream: int | None = None,
        launch_dur_us: float = 5.0,
        queue_us: float = 2.0,
        grid: Sequence[int] | None = None,
        block: Sequence[int] | None = None,
        registers: int | None = None,
        shared_mem: int | None = None,
        runtime: str | None = None,
        extra_args: dict[str, Any] | None = None,
    ) -> GpuActivity:
        """Launch a kernel: runtime call (``cudaLaunchKernel``/``hipLaunchKernel``/
        ``urEnqueueKernelLaunch``) of ``launch_dur_us`` on the CPU, then the kernel on ``stream``
        starting at ``max(launch end + queue_us, stream free)``, linked by correlation id and an
        ``ac2g`` flow pair; ``External id`` = innermost enclosing cpu_op."""
        stream = self.stream if stream is None else stream
        if runtime is None:
            runtime = self._api("launch")
            if self.vendor == "amd" and name.startswith("Cijk_"):
                runtime = "hipExtModuleLaunchKernel"  # Tensile/hipBLASLt GEMMs, as in real MI300X files
        rt_start = self.now_ns
        rt_dur = self._ns_pos(launch_dur_us)
        dur = self._ns_pos(gpu_dur_us)
        start, _ = self._place(stream, rt_start + rt_dur + self._ns(queue_us), dur)
        corr = self._new_corr()
        ext, _ = self._current_ext()
        geometry = self._geometry(name, dur, grid, block, registers, shared_mem)
        rt_extra = None
        if self.vendor == "amd":
            rt_extra = {"kernel": name, "grid": geometry["grid"], "block": geometry["block"], "shared memory": 0}
        self._emit_runtime(runtime, "launch", rt_start, rt_dur, corr, linked=True, extra=rt_extra)
        act = GpuActivity("kernel", name, stream, start, dur, corr, ext, runtime, rt_start, rt_dur, self._cur_step)
        self._emit_gpu(act, geometry, extra_args)
        self._advance(rt_dur)
        return act

    def memcpy(
        self,
        kind: str = "HtoD",
        *,
        bytes: int,
        pinned: bool = False,
        async_: bool = True,
        stream: int | None = None,
        gpu_dur_us: float | None = None,
        launch_dur_us: float = 6.0,
        queue_us: float = 2.0,
        tail_us: float = 2.0,
    ) -> GpuActivity:
        """A device copy. ``kind`` is ``HtoD``/``DtoH``/``DtoD``; ``pinned`` says whether the host
        side is page-locked. The runtime call is ``cudaMemcpyAsync`` (``async_``) or ``cudaMemcpy``.

        A copy is *blocking* — the runtime call lasts until the copy has finished — when it is
        not async or when it touches pageable host memory (CUDA stages pageable copies through a
        pinned buffer synchronously). ``extra['blocked_ns']`` is how much longer the call lasted
        than a non-blocking one (``launch_dur_us``) would have."""
        if kind not in ("HtoD", "DtoH", "DtoD"):
            raise ValueError(f"memcpy kind must be HtoD, DtoH or DtoD, not {kind!r}")
        stream = self.stream if stream is None else stream
        name = _memcpy_name(self.vendor, kind, pinned)
        blocking = (not async_) or (kind != "DtoD" and not pinned)
        logical = "memcpy_async" if async_ else "memcpy_sync"
        rt_name = self._api(logical)
        if gpu_dur_us is None:
            bw = _BW_GBPS[self.gpu]["DtoD" if kind == "DtoD" else f"{kind}_{'pinned' if pinned else 'pageable'}"]
            dur = self._ns_pos(1.5 + bytes / bw / 1000.0)
        else:
            dur = self._ns_pos(gpu_dur_us)
        rt_start = self.now_ns
        nominal = self._ns_pos(launch_dur_us)
        setup = self._ns(3.0) if blocking else nominal
        start, end = self._place(stream, rt_start + setup + self._ns(queue_us), dur)
        rt_dur = max(nominal, end + self._ns(tail_us) - rt_start) if blocking else nominal
        corr = self._new_corr()
        ext, _ = self._current_ext()
        rt_extra = None
        if self.vendor == "amd":
            rt_extra = {"src": f"0x{self._next_addr:x}", "dst": f"0x{self._next_addr + 0x200000:x}",
                        "bytes": str(bytes), "kind": {"HtoD": "1", "DtoH": "2", "DtoD": "3"}[kind]}
        self._emit_runtime(rt_name, logical, rt_start, rt_dur, corr, linked=True, extra=rt_extra)
        act = GpuActivity("memcpy", name, stream, start, dur, corr, ext, rt_name, rt_start, rt_dur, self._cur_step,
                          bytes=bytes, extra={"kind": kind, "pinned": pinned, "async": async_, "blocking": blocking,
                                              "blocked_ns": rt_dur - nominal if blocking else 0,
                                              "call_site": self._innermost_python()})
        gpu_extra = {"_amd_kind": kind} if self.vendor == "amd" else None
        self._emit_gpu(act, None, gpu_extra)
        self._advance(rt_dur)
        return act

    def memset(self, *, bytes: int, stream: int | None = None, gpu_dur_us: float | None = None,
               launch_dur_us: float = 4.0, queue_us: float = 2.0) -> GpuActivity:
        """``cudaMemsetAsync`` + ``Memset (Device)`` on ``stream`` (async, non-blocking)."""
        stream = self.stream if stream is None else stream
        name = "Memset (0 -> Device)" if self.vendor == "xpu" else "Memset (Device)"
        rt_name = self._api("memset")
        dur = self._ns_pos(gpu_dur_us if gpu_dur_us is not None else 1.0 + bytes / _BW_GBPS[self.gpu]["DtoD"] / 1000.0)
        rt_start = self.now_ns
        rt_dur = self._ns_pos(launch_dur_us)
        start, _ = self._place(stream, rt_start + rt_dur + self._ns(queue_us), dur)
        corr = self._new_corr()
        ext, _ = self._current_ext()
        self._emit_runtime(rt_name, "memset", rt_start, rt_dur, corr, linked=True)
        act = GpuActivity("memset", name, stream, start, dur, corr, ext, rt_name, rt_start, rt_dur, self._cur_step,
                          bytes=bytes)
        self._emit_gpu(act, None, None)
        self._advance(rt_dur)
        return act

    def _innermost_python(self) -> str | None:
        for fr in reversed(self._stack()):
            if fr.kind == "python_function":
                return fr.name
        return None

    # ------------------------------------------------------------------ synchronisation
    def event_record(self, stream: int | None = None, dur_us: float = 2.0) -> int:
        """``cudaEventRecord`` on ``stream``; returns the GPU time the event completes at."""
        stream = self.stream if stream is None else stream
        self._event_time[stream] = self._stream_last_end.get(stream, 0)
        self.runtime_call(self._api("event_record"), dur_us, logical="event_record")
        return self._event_time[stream]

    def stream_wait(self, stream: int, on_stream: int, dur_us: float = 2.0) -> None:
        """Make ``stream`` wait for the work queued so far on ``on_stream``
        (``cudaEventRecord`` on ``on_stream`` + ``cudaStreamWaitEvent``)."""
        t = self.event_record(on_stream)
        self._stream_ready[stream] = max(self._stream_ready.get(stream, 0), t)
        start = self.now_ns
        dur = self._ns_pos(dur_us)
        self._emit_runtime(self._api("stream_wait"), "stream_wait", start, dur, self._new_corr(), linked=False)
        self._advance(dur)

    def sync(
        self,
        kind: str = "cudaStreamSynchronize",
        *,
        stream: int | None = None,
        min_us: float = 3.0,
        tail_us: float = 1.5,
    ) -> dict[str, Any]:
        """A blocking sync call that lasts until the GPU work it waits for is done.

        ``kind``: ``cudaStreamSynchronize`` (waits for ``stream``), ``cudaDeviceSynchronize`` (all
        streams) or ``cudaEventSynchronize`` (the last :meth:`event_record` on ``stream``); the
        vendor's own API name is emitted. Returns (and records) ``{name, start_ns, dur_ns,
        wait_ns, stream, step}`` where ``wait_ns = max(0, drain_time - start)`` is the time the CPU
        spent waiting for the GPU."""
        logical = _SYNC_KIND.get(kind)
        if logical is None:
            raise ValueError(f"unknown sync kind {kind!r}")
        stream = self.stream if stream is None else stream
        start = self.now_ns
        if logical == "stream_sync":
            target = self._stream_last_end.get(stream, 0)
        elif logical == "device_sync":
            target = max(self._stream_last_end.values(), default=0)
        else:
            target = self._event_time.get(stream, self._stream_last_end.get(stream, 0))
        end = max(start + self._ns_pos(min_us), target + self._ns(tail_us))
        name = self._api(logical)
        self._emit_runtime(name, logical, start, end - start, self._new_corr(), linked=False)
        self._set_now(end)
        rec = {"name": name, "start_ns": start, "dur_ns": end - start, "wait_ns": max(0, target - start),
               "stream": stream, "step": self._cur_step, "call_site": self._innermost_python()}
        self.syncs.append(rec)
        return rec

    def item(self, *, stream: int | None = None, bytes: int = 4, dtype: str = "float") -> dict[str, Any]:
        """``tensor.item()``: ``aten::item`` → ``aten::_local_scalar_dense`` → DtoH copy + sync.

        NVIDIA: ``cudaMemcpyAsync`` into pinned memory (pageable before 2.x) + ``cudaStreamSynchronize``;
        AMD/XPU: one blocking copy (``hipMemcpyWithStream``), as in real MI300X files. Returns
        ``{start_ns, dur_ns, wait_ns, call_site, step}``; ``wait_ns`` is the CPU time spent waiting
        for the GPU: the sync's wait plus the copy's ``blocked_ns`` (non-zero for pageable copies)."""
        start = self.now_ns
        site = self._innermost_python()
        with self.cpu_op("aten::item", input_dims=[[]], input_types=[dtype]) as h:
            with self.cpu_op("aten::_local_scalar_dense", input_dims=[[]], input_types=[dtype]):
                if self.vendor == "nvidia":
                    # Pageable before PyTorch 2.x: then the copy itself blocks and the sync finds
                    # the stream drained; the CPU wait is the sum of both.
                    m = self.memcpy("DtoH", bytes=bytes, pinned=self.layout == "modern", async_=True,
                                    stream=stream, launch_dur_us=6.0)
                    wait = m.extra["blocked_ns"] + self.sync("cudaStreamSynchronize", stream=stream)["wait_ns"]
                else:
                    m = self.memcpy("DtoH", bytes=bytes, pinned=False, async_=False, stream=stream)
                    wait = m.extra["blocked_ns"]
        assert h.end_ns is not None
        rec = {
            "start_ns": start,
            "dur_ns": h.end_ns - start,
            "wait_ns": wait,
            "call_site": site,
            "step": self._cur_step,
        }
        self.items.append(rec)
        return rec

    # ------------------------------------------------------------------ collectives & graphs
    @contextlib.contextmanager
    def collective(
        self,
        collective: str = "allreduce",
        *,
        nelems: int,
        dtype: str = "Float",
        transfer_us: float,
        stream: int | None = None,
        compute_stream: int | None = None,
        launch_dur_us: float = 12.0,
        queue_us: float = 3.0,
    ) -> Iterator[Collective]:
        """A c10d collective as DDP/FSDP issue it, with the comm kernel on its own stream.

        CPU side: ``c10d::<op>_`` → ``record_param_comms`` (collective args on modern files) →
        ``cudaStreamIsCapturing``, event record + ``cudaStreamWaitEvent`` (the comm stream waits
        for the compute stream), ``nccl:<op>`` annotation around the launch. GPU side: the NCCL
        kernel on ``stream`` with the collective args copied onto it (modern NVIDIA). The yielded
        :class:`Collective` knows the kernel start; its ``end_ns`` defaults to ``start +
        transfer``; a multi-rank driver may push it later (waiting for a straggler)."""
        if self.vendor == "xpu":
            raise ValueError("collectives are not modelled for XPU (no public XCCL trace to copy)")
        stream = self.comm_stream if stream is None else stream
        compute_stream = self.stream if compute_stream is None else compute_stream
        op_name = {"allreduce": "c10d::allreduce_", "broadcast": "c10d::broadcast_",
                   "allgather": "c10d::_allgather_base_", "reduce_scatter": "c10d::_reduce_scatter_base_",
                   "all_to_all": "c10d::alltoall_base_"}[collective]
        ann = {"allreduce": "nccl:all_reduce", "broadcast": "nccl:broadcast", "allgather": "nccl:_all_gather_base",
               "reduce_scatter": "nccl:_reduce_scatter_base", "all_to_all": "nccl:all_to_all"}[collective]
        ranks = str(list(range(self.world_size)))
        coll_args: dict[str, Any] = {}
        if self.layout == "modern":
            coll_args = {
                "Collective name": collective, "dtype": dtype, "In msg nelems": nelems, "Out msg nelems": nelems,
                "In split size": "[]", "Out split size": "[]", "Global rank start": 0, "Global rank stride": 1,
                "Group size": self.world_size, "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": ranks, "Rank": self.rank,
            }
        kname = nccl_kernel_name(self.vendor, self.layout, collective, dtype)
        itype = _DTYPE_INPUT_TYPE.get(dtype, "float")
        with self.cpu_op(op_name, input_dims=[[nelems]], input_types=[itype], pre_us=4.0, post_us=3.0):
            with self.cpu_op("record_param_comms", args=coll_args, pre_us=3.0, post_us=2.0):
                self.runtime_call(self._api("capturing"), 1.0)
                self.stream_wait(stream, compute_stream)
                with self.annotation(ann, gpu=True):
                    rt_start = self.now_ns
                    rt_dur = self._ns_pos(launch_dur_us)
                    ready = rt_start + rt_dur + self._ns(queue_us)
                    start = max(ready, self._stream_ready.get(stream, 0))
                    transfer = self._ns_pos(transfer_us)
                    c = Collective(collective, start, transfer, start + transfer, stream, nelems, dtype)
                    yield c
                    if c.end_ns < start + self._quantum:
                        raise ValueError("collective end_ns must be after its start")
                    dur = c.end_ns - start
                    self._place(stream, start, dur)
                    corr = self._new_corr()
                    ext, _ = self._current_ext()
                    runtime = self._api("comm_launch") if self.layout == "modern" else self._api("launch")
                    geometry = self._geometry(kname, dur, [2 if nelems < 10**6 else 8, 1, 1], [512, 1, 1], 96, 42024)
                    rt_extra = None
                    if self.vendor == "amd":
                        rt_extra = {
                            "kernel": kname,
                            "grid": geometry["grid"],
                            "block": geometry["block"],
                            "shared memory": 0,
                        }
                    self._emit_runtime(runtime, "launch", rt_start, rt_dur, corr, linked=True, extra=rt_extra)
                    kextra = None
                    if self.layout == "modern" and self.vendor == "nvidia":
                        kextra = {k: coll_args[k] for k in ("Collective name", "In msg nelems", "Out msg nelems",
                                                            "Group size", "dtype", "In split size", "Out split size",
                                                            "Process Group Name", "Process Group Description",
                                                            "Process Group Ranks")}
                    act = GpuActivity("kernel", kname, stream, start, dur, corr, ext, runtime, rt_start, rt_dur,
                                      self._cur_step, extra={"collective": collective})
                    self._emit_gpu(act, geometry, kextra)
                    self._advance(rt_dur)
                self.event_record(stream, 1.0)
        self.collectives.append({
            "collective": collective, "stream": stream, "kernel": kname, "start_ns": start, "end_ns": c.end_ns,
            "dur_ns": dur, "transfer_ns": transfer, "wait_ns": dur - transfer, "nelems": nelems, "dtype": dtype,
            "bytes": nelems * _DTYPE_SIZE.get(dtype, 4), "step": self._cur_step,
        })

    def nccl_kernel(self, collective: str = "allreduce", *, nelems: int, dtype: str = "Float",
                    gpu_dur_us: float, stream: int | None = None) -> Collective:
        """Single-rank shorthand for :meth:`collective` whose kernel lasts ``gpu_dur_us``."""
        with self.collective(collective, nelems=nelems, dtype=dtype, transfer_us=gpu_dur_us, stream=stream) as c:
            pass
        return c

    def cuda_graph_launch(
        self,
        kernels: Sequence[tuple[str, float]],
        *,
        stream: int | None = None,
        launch_dur_us: float = 10.0,
        queue_us: float = 3.0,
        gap_us: float = 0.8,
        graph_id: int = 1,
    ) -> list[GpuActivity]:
        """``cudaGraphLaunch`` (``hipGraphLaunch``) replaying ``kernels`` = [(name, µs), …]
        back-to-back on ``stream``: one correlation id for the launch and all its kernels, one
        ``s`` flow at the launch and one ``f`` flow per kernel (as in real vLLM graph replays)."""
        if self.vendor == "xpu":
            raise ValueError("graph replay is not modelled for XPU")
        stream = self.stream if stream is None else stream
        rt_name = self._api("graph_launch")
        rt_start = self.now_ns
        rt_dur = self._ns_pos(launch_dur_us)
        corr = self._new_corr()
        ext, _ = self._current_ext()
        self._emit_runtime(rt_name, "graph_launch", rt_start, rt_dur, corr, linked=True)
        ready = rt_start + rt_dur + self._ns(queue_us)
        out: list[GpuActivity] = []
        for node, (name, dur_us) in enumerate(kernels):
            dur = self._ns_pos(dur_us)
            start, end = self._place(stream, ready, dur)
            geometry = self._geometry(name, dur, None, None, None, None)
            extra: dict[str, Any] | None
            if self.vendor == "nvidia":
                extra = {"graph id": graph_id, "graph node id": self._next_graph_node}
                self._next_graph_node += 1
            else:
                extra = {"_amd_kind": "Dispatch Task"}
            act = GpuActivity("kernel", name, stream, start, dur, corr, ext, rt_name, rt_start, rt_dur, self._cur_step,
                              extra={"graph_node": node})
            self._emit_gpu(act, geometry, extra)
            out.append(act)
            ready = end + self._ns(gap_us)
        self._advance(rt_dur)
        return out

    # ------------------------------------------------------------------ memory
    def memory_event(self, addr: int, bytes: int, total_allocated: int, total_reserved: int, *,
                     device_type: int | None = None, device_id: int | None = None) -> None:
        """Emit one raw ``[memory]`` instant event (``profile_memory=True``). ``bytes`` < 0 is a free."""
        if device_type is None:
            device_type = {"nvidia": 1, "amd": 6, "xpu": 12}[self.vendor]
        dev = self.device if device_id is None else device_id
        if self.layout == "modern":
            args: dict[str, Any] = {"Total Reserved": total_reserved, "Total Allocated": total_allocated,
                                    "Bytes": bytes, "Addr": addr, "Device Id": dev, "Device Type": device_type,
                                    "Ev Idx": None}
        else:
            args = {"Device Type": device_type, "Device Id": dev, "Addr": addr, "Bytes": bytes,
                    "Total Allocated": total_allocated, "Total Reserved": total_reserved}
            if self.layout == "pt_1_13":
                args = {"Ev Idx": None, **args}
        self._mem_evs.append(_Ev("memory", "[memory]", self.pid, self._tid, self.now_ns, None, args))
        self.memory_records.append({"ts_ns": self.now_ns, "addr": addr, "bytes": bytes,
                                    "total_allocated": total_allocated, "total_reserved": total_reserved,
                                    "step": self._cur_step})

    def alloc(self, nbytes: int) -> int:
        """Caching-allocator malloc: returns an address, emits ``[memory]`` (if profile_memory).

        Reserved memory grows in 2 MiB-rounded segments when the request does not fit and never
        shrinks (the caching allocator keeps segments), like ``Total Reserved`` in real files."""
        size = (nbytes + 511) // 512 * 512
        addr = self._next_addr
        self._next_addr += max(size, 512) + 512
        self._allocs[addr] = size
        self._allocated += size
        if self._allocated > self._reserved:
            need = self._allocated - self._reserved
            self._reserved += (need + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        if self.profile_memory:
            self.memory_event(addr, size, self._allocated, self._reserved)
        return addr

    def free(self, addr: int) -> None:
        """Caching-allocator free of an address returned by :meth:`alloc`."""
        size = self._allocs.pop(addr)
        self._allocated -= size
        if self.profile_memory:
            self.memory_event(addr, -size, self._allocated, self._reserved)

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    # ------------------------------------------------------------------ output
    def _ts(self, t: int) -> float | int:
        if self._int_us:
            return _legacy_us(t)
        return (t - BASE_TIME_NS) / 1000

    def _dur(self, d: int) -> float | int:
        if self._int_us:
            return d // 1000
        return d / 1000

    def trace_end_ns(self) -> int:
        """End of the profiled window: everything planted so far, plus a short tail."""
        ends = [t for t in self._cpu.values()]
        ends += [a.end_ns for a in self.gpu_acts]
        return max(ends) + self._ns(25.0)

    def _device_properties(self) -> list[dict[str, Any]]:
        props = _DEVICE_PROPS[self.gpu]
        out = []
        for i in range(self.num_devices):
            d: dict[str, Any] = {"id": i}
            if self.layout == "legacy_1_8":
                # PyTorch 1.8/1.9 (Kineto May 2021) wrote "computeProperties" with CUDA runtime names.
                ren = {"computeMajor": "major", "computeMinor": "minor", "numSms": "multiProcessorCount",
                       "maxThreadsPerMultiprocessor": "maxThreadsPerMultiProcessor"}
                for k, v in props.items():
                    d[ren.get(k, k)] = v
            else:
                d.update(props)
            out.append(d)
        return out

    def _metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {}
        if self.layout == "modern":
            if self.vendor == "nvidia":
                md["cupti_version"] = 24 if self.gpu == "H100" else 22
                md["cuda_runtime_version"] = 12060
                md["cuda_driver_version"] = 12080
            elif self.vendor == "amd":
                md["roctracer_version"] = 4.1
                md["hip_runtime_version"] = 60443483
                md["hip_driver_version"] = 60443483
        if self.distributed and self.layout != "legacy_1_8":
            di: dict[str, Any] = {"backend": self.backend, "rank": self.rank, "world_size": self.world_size}
            if self.layout == "modern":
                di["pg_count"] = 1
                di["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": f"cuda:{self.backend}",
                                    "pg_size": self.world_size, "ranks": list(range(self.world_size))}]
                if self.backend == "nccl":
                    di["nccl_version"] = "2.22.3" if self.vendor == "amd" else "2.21.5"
            md["distributedInfo"] = di
        if self.layout != "legacy_1_8":
            for flag in ("record_shapes", "with_stack", "profile_memory"):
                if getattr(self, flag):
                    md[flag] = 1
        if self.layout == "modern":
            md["trace_id"] = "{:032X}".format(random.Random(f"trace_id/{self.seed}/{self.rank}").getrandbits(128))
        return md

    def _flow_ev(self, ev: _Ev) -> dict[str, Any]:
        assert ev.extra is not None
        ph = ev.extra["ph"]
        if ev.name == "ac2g":
            cat, name = {"modern": ("ac2g", "ac2g"), "pt_1_13": ("async_cpu_to_gpu", "async_gpu"),
                         "legacy_1_8": ("async", "launch")}[self.layout]
        else:
            cat, name = {"modern": ("fwdbwd", "fwdbwd"), "pt_1_13": ("forward_backward", "fwd_bwd")}[self.layout]
        bp = "e" if ph == "f" or self.layout == "pt_1_13" else None
        return E.flow(ph, ev.extra["id"], ev.pid, ev.tid, self._ts(ev.ts), cat, name, bp)

    def _cat(self, kind: str) -> str | None:
        legacy = self.layout == "legacy_1_8"
        if kind == "cpu_op":
            return "Operator" if legacy else "cpu_op"
        if kind == "user_annotation":
            return "Operator" if legacy else "user_annotation"
        if kind == "gpu_user_annotation":
            return "gpu_user_Annotation" if self.layout == "pt_1_13" else "gpu_user_annotation"
        if kind == "runtime":
            return "Runtime" if legacy else ("xpu_runtime" if self.vendor == "xpu" else "cuda_runtime")
        if kind == "driver":
            return "cuda_driver"
        if kind == "kernel":
            return "Kernel" if legacy else "kernel"
        if kind == "memcpy":
            return "Memcpy" if legacy else "gpu_memcpy"
        if kind == "memset":
            return "Memset" if legacy else "gpu_memset"
        if kind == "memory":
            return None if legacy else "cpu_instant_event"
        if kind == "python_function":
            return "python_function"
        raise KeyError(kind)

    def _x_ev(self, ev: _Ev, ev_idx: int | None) -> dict[str, Any]:
        args = dict(ev.args) if ev.args is not None else None
        if args is not None and ev_idx is not None:
            if "Ev Idx" in args:
                args["Ev Idx"] = ev_idx
            if "Profiler Event Index" in args:
                args["Profiler Event Index"] = ev_idx
        pid: int | str = ev.pid
        tid: int | str = ev.tid
        if self.layout == "legacy_1_8" and ev.kind in ("cpu_op", "user_annotation", "runtime", "driver"):
            tid = str(ev.tid)  # PyTorch 1.8 wrote CPU tids as strings
        return E.complete(self._cat(ev.kind), ev.name, self._ts(ev.ts), self._dur(ev.dur or 0), pid, tid, args)

    def build(self) -> dict[str, Any]:
        """The chrome trace as a dict (does not change the builder; may be called repeatedly)."""
        for tid, st in self._stacks.items():
            if st:
                raise RuntimeError(f"thread {tid} still has open frames: {[f.name for f in st]}")
        start = self.trace_start_ns
        end = self.trace_end_ns()
        events: list[dict[str, Any]] = []
        # CPU ops/annotations in start order (parents before children at equal ts), flows next to them.
        order = {"user_annotation": 0, "cpu_op": 1, "flow": 2}
        cpu = sorted(self._cpu_evs, key=lambda e: (e.ts, order[e.kind], -(e.dur or 0)))
        idx = 0
        for ev in cpu:
            if ev.kind == "flow":
                events.append(self._flow_ev(ev))
            else:
                events.append(self._x_ev(ev, idx))
                idx += 1
        for ev in self._mem_evs:
            args = dict(ev.args or {})
            if "Ev Idx" in args:
                args["Ev Idx"] = idx
            idx += 1
            mem_tid: int | str = str(ev.tid) if self.layout == "legacy_1_8" else ev.tid
            events.append(E.instant("[memory]", self._ts(ev.ts), ev.pid, mem_tid, args, cat=self._cat("memory")))
        for ev in sorted(self._py_evs, key=lambda e: (e.ts, -(e.dur or 0))):
            events.append(self._x_ev(ev, idx))
            idx += 1
        for ev in self._gpu_evs:
            events.append(self._flow_ev(ev) if ev.kind == "flow" else self._x_ev(ev, None))
        events.extend(self._meta_events(start))
        span_pid = "Traces" if self.layout == "legacy_1_8" else "Spans"
        events.append(E.profiler_span(self._ts(start), self._dur(end - start), span_pid))
        events.append(E.marker("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler",
                               self._ts(start)))
        events.append(E.marker("Record Window End", "", "", self._ts(end + self._ns(1500.0))))

        out: dict[str, Any] = {"schemaVersion": 1}
        if self.layout == "legacy_1_8":
            out["computeProperties"] = self._device_properties()
            out["traceEvents"] = events
            return out
        if not (self.vendor == "amd" and self.layout != "modern"):
            # Kineto wrote AMD deviceProperties only from May 2024 (#927).
            out["deviceProperties"] = self._device_properties()
        out.update(self._metadata())
        name = self.trace_name or f"/tmp/traceanalyzer_synthetic_rank{self.rank}.json"
        if self.layout == "modern":
            out["displayTimeUnit"] = "ms"
            out["baseTimeNanoseconds"] = BASE_TIME_NS
            out["traceEvents"] = events
            out["traceName"] = name
        else:
            out["traceEvents"] = events
            out["traceName"] = name
        return out

    def _meta_events(self, start: int) -> list[dict[str, Any]]:
        ts = self._ts(start + self._ns(80.0))
        legacy = self.layout == "legacy_1_8"
        ev: list[dict[str, Any]] = []

        def m(name: str, pid: int | str, tid: int | str, args: dict[str, Any]) -> None:
            ev.append(E.meta(name, pid, tid, args, ts))

        m("process_name", self.pid, 0, {"name": self.process_name})
        m("process_labels", self.pid, 0, {"labels": "CPU"})
        if not legacy:
            m("process_sort_index", self.pid, 0, {"sort_index": self.pid})
        for i in range(self.num_devices):
            m("process_name", i, 0, {"name": self.process_name})
            m("process_labels", i, 0, {"labels": f"GPU {i}"})
            if not legacy:
                m("process_sort_index", i, 0, {"sort_index": 5000000 + i})
        if not legacy:
            for s in sorted(self._streams_used):
                m("thread_name", self.device, s, {"name": f"stream {s} "})
                m("thread_sort_index", self.device, s, {"sort_index": s})
        for tid in self._threads_used:
            t: int | str = str(tid) if legacy else tid
            m("thread_name", self.pid, t, {"name": f"thread {tid} ({self.process_name})"})
            if not legacy:
                m("thread_sort_index", self.pid, t, {"sort_index": tid})
            if tid == self.bwd_tid and not legacy:
                # The autograd thread is named twice (python3, then pt_autograd_0) in real files.
                m("thread_name", self.pid, t, {"name": f"thread {tid} (pt_autograd_0)"})
                m("thread_sort_index", self.pid, t, {"sort_index": tid})
        if not legacy:
            ev.append(E.meta("process_sort_index", "Spans", 0, {"sort_index": 536870912}, self._ts(start)))
        return ev

    def dumps(self) -> bytes:
        """Serialise :meth:`build` deterministically, one event per line (like Kineto does)."""
        return dumps_trace(self.build())

    def write(self, path: str | Path) -> Path:
        """Write the trace to ``path`` (``.json`` or ``.json.gz``; gzip with mtime 0 for
        byte-identical output)."""
        return write_bytes(path, self.dumps())

    # ------------------------------------------------------------------ ground truth
    def truth(self, *, gap_threshold_ns: int = 10_000) -> dict[str, Any]:
        """Everything the builder planted, in exact ns (absolute epoch ns for instants).

        Keys (all counts are of *emitted* events):

        ``format``            layout, vendor, gpu, device, pid, main/backward tids, rank, world_size,
                              base_time_ns (modern) — how to read the file.
        ``trace_start_ns``/``trace_end_ns``  the ``Trace`` span.
        ``counts``            kernels, gpu_memcpy, gpu_memset, runtime_calls (+ ``runtime_by_name``),
                              cpu_ops (+ by name), user_annotations by name, gpu_user_annotations,
                              python_functions, memory_events, flows (ac2g s/f on CPU/GPU, fwdbwd).
        ``kernels``           total_ns (sum of kernel durations), by_name {count,total_ns},
                              by_stream {count,total_ns,busy_ns = union length},
                              shorter_than_launch (kernels whose duration < their launch call's).
        ``memcpy``/``memset`` count, bytes, total_ns; memcpy by_kind (HtoD/DtoH/DtoD) and by_name,
                              blocking_count and blocked_ns (extra CPU time in blocking copies), and
                              ``calls`` (one row per copy, with the innermost python call site).
        ``syncs``             count, total_ns (sum of sync-call durations), wait_ns (sum of
                              max(0, drain − call start)), by_name, calls.
        ``items``             one row per ``.item()`` (start, dur, wait_ns, call_site, step).
        ``gpu``               first_activity_ns, last_activity_end_ns, busy_ns (union of all
                              kernels/copies/memsets on the device), kernel_busy_ns (union of kernels),
                              idle_ns = window − busy_ns.
        ``gaps``              threshold_ns, idle_ns_by_stream (sum of all gaps between consecutive
                              activities of a stream), and ``list``: every per-stream gap ≥ threshold
                              {stream, start_ns, end_ns, dur_ns, cause host|dependency, step,
                              annotations [{name, overlap_ns}] open on the CPU during the gap};
                              ``device_idle_ns`` (all holes in the union of every stream's activity,
                              == gpu.idle_ns) and ``device_list`` (those holes ≥ threshold, with
                              annotations).
        ``steps``             per ProfilerStep: name, number, cpu_start_ns, cpu_end_ns, dur_ns,
                              gpu_busy_ns (union of GPU activity ∩ the CPU step window),
                              kernel_busy_ns (same, kernels only), kernels_launched (count launched
                              during the step), kernel_ns_launched, allocated_at_end_bytes.
        ``annotations``       non-step user annotations {name, tid, start_ns, end_ns, dur_ns, step}.
        ``collectives``       count, total_ns, wait_ns (time comm kernels spent beyond their
                              transfer: waiting for peers), exposed_ns (comm-kernel time not
                              overlapped by any non-comm GPU activity), list.
        ``memory``            events, peak_allocated_bytes, final_allocated_bytes, peak_reserved_bytes,
                              allocated_at_step_end_bytes.

        Every ``step`` field inside records is the 0-based index into ``steps`` of the
        ProfilerStep open when the activity was launched / the call was made (``None`` outside
        steps) — not the ``ProfilerStep#N`` number.
        """
        acts = self.gpu_acts
        kernels = [a for a in acts if a.kind == "kernel"]
        copies = [a for a in acts if a.kind == "memcpy"]
        sets = [a for a in acts if a.kind == "memset"]
        by_name: dict[str, dict[str, int]] = {}
        for k in kernels:
            r = by_name.setdefault(k.name, {"count": 0, "total_ns": 0})
            r["count"] += 1
            r["total_ns"] += k.dur_ns
        by_stream: dict[str, dict[str, int]] = {}
        for s in sorted({k.stream for k in kernels}):
            ks = [k for k in kernels if k.stream == s]
            by_stream[str(s)] = {"count": len(ks), "total_ns": sum(k.dur_ns for k in ks),
                                 "busy_ns": _union_length([(k.start_ns, k.end_ns) for k in ks])}
        mc_kind: dict[str, dict[str, int]] = {}
        mc_name: dict[str, dict[str, int]] = {}
        for c in copies:
            for key, table in ((c.extra["kind"], mc_kind), (c.name, mc_name)):
                r = table.setdefault(key, {"count": 0, "bytes": 0, "total_ns": 0})
                r["count"] += 1
                r["bytes"] += c.bytes or 0
                r["total_ns"] += c.dur_ns
        sync_by: dict[str, dict[str, int]] = {}
        for sy in self.syncs:
            rs = sync_by.setdefault(sy["name"], {"count": 0, "total_ns": 0, "wait_ns": 0})
            rs["count"] += 1
            rs["total_ns"] += sy["dur_ns"]
            rs["wait_ns"] += sy["wait_ns"]
        all_iv = [(a.start_ns, a.end_ns) for a in acts]
        k_iv = [(k.start_ns, k.end_ns) for k in kernels]
        first = min((a.start_ns for a in acts), default=None)
        last = max((a.end_ns for a in acts), default=None)
        busy = _union_length(all_iv)
        idle_by_stream: dict[str, int] = {}
        for g in self.gaps:
            idle_by_stream[str(g["stream"])] = idle_by_stream.get(str(g["stream"]), 0) + g["dur_ns"]
        gap_list = []
        for g in self.gaps:
            if g["dur_ns"] < gap_threshold_ns:
                continue
            anns = []
            for a in self.annotations:
                ov = min(a["end_ns"], g["end_ns"]) - max(a["start_ns"], g["start_ns"])
                if ov > 0:
                    anns.append({"name": a["name"], "overlap_ns": ov})
            gap_list.append({**g, "annotations": anns})
        # Device gaps: holes in the union of all activity of the device (streams overlapped once).
        merged = _interval_union(all_iv)
        device_gaps = []
        for (_, e0), (s1, _) in zip(merged, merged[1:]):
            if s1 - e0 >= gap_threshold_ns:
                anns = [{"name": a["name"], "overlap_ns": min(a["end_ns"], s1) - max(a["start_ns"], e0)}
                        for a in self.annotations if min(a["end_ns"], s1) > max(a["start_ns"], e0)]
                device_gaps.append({"start_ns": e0, "end_ns": s1, "dur_ns": s1 - e0, "annotations": anns})
        steps = []
        for st in self.steps:
            lo, hi = st["cpu_start_ns"], st["cpu_end_ns"]
            launched = [a for a in acts[st["_act_index"]:st["_act_end"]] if a.kind == "kernel"]
            steps.append({
                "name": st["name"], "number": st["number"], "cpu_start_ns": lo, "cpu_end_ns": hi, "dur_ns": hi - lo,
                "gpu_busy_ns": _union_length(all_iv, lo, hi), "kernel_busy_ns": _union_length(k_iv, lo, hi),
                "kernels_launched": len(launched), "kernel_ns_launched": sum(k.dur_ns for k in launched),
                "allocated_at_end_bytes": st["allocated_at_end_bytes"],
            })
        comm = [k for k in kernels if "collective" in k.extra]
        noncomm_iv = [(a.start_ns, a.end_ns) for a in acts if "collective" not in a.extra]
        comm_iv = [(k.start_ns, k.end_ns) for k in comm]
        comm_union = _union_length(comm_iv)
        flows = {k: v for k, v in sorted(self.flow_counts.items())}
        return {
            "format": {"layout": self.layout, "vendor": self.vendor, "gpu": self.gpu, "device": self.device,
                       "num_devices": self.num_devices, "pid": self.pid, "main_tid": self.main_tid,
                       "bwd_tid": self.bwd_tid, "rank": self.rank, "world_size": self.world_size,
                       "base_time_ns": self.base_time_ns, "compute_stream": self.stream,
                       "comm_stream": self.comm_stream, "units": "ns; instants are absolute epoch ns"},
            "trace_start_ns": self.trace_start_ns,
            "trace_end_ns": self.trace_end_ns(),
            "counts": {
                "kernels": len(kernels), "gpu_memcpy": len(copies), "gpu_memset": len(sets),
                "runtime_calls": sum(self.runtime_counts.values()),
                "runtime_by_name": dict(sorted(self.runtime_counts.items())),
                "cpu_ops": sum(self.cpu_op_counts.values()),
                "cpu_ops_by_name": dict(sorted(self.cpu_op_counts.items())),
                "user_annotations_by_name": dict(sorted(self.annotation_counts.items())),
                "gpu_user_annotations": self.gpu_annotation_count,
                "python_functions": self.python_count,
                "memory_events": len(self.memory_records) if self.profile_memory else 0,
                "flows": flows,
            },
            "kernels": {"total_ns": sum(k.dur_ns for k in kernels), "by_name": by_name, "by_stream": by_stream,
                        "shorter_than_launch": sum(1 for k in kernels if k.dur_ns < k.runtime_dur_ns)},
            "memcpy": {
                "count": len(copies), "bytes": sum(c.bytes or 0 for c in copies),
                "total_ns": sum(c.dur_ns for c in copies), "by_kind": mc_kind, "by_name": mc_name,
                "blocking_count": sum(1 for c in copies if c.extra["blocking"]),
                "blocked_ns": sum(c.extra["blocked_ns"] for c in copies),
                "calls": [{"name": c.name, "kind": c.extra["kind"], "pinned": c.extra["pinned"],
                           "async": c.extra["async"], "blocking": c.extra["blocking"], "bytes": c.bytes,
                           "start_ns": c.start_ns, "dur_ns": c.dur_ns, "runtime": c.runtime_name,
                           "runtime_start_ns": c.runtime_start_ns, "runtime_dur_ns": c.runtime_dur_ns,
                           "blocked_ns": c.extra["blocked_ns"], "call_site": c.extra["call_site"],
                           "step": c.step} for c in copies],
            },
            "memset": {"count": len(sets), "bytes": sum(s.bytes or 0 for s in sets),
                       "total_ns": sum(s.dur_ns for s in sets)},
            "syncs": {"count": len(self.syncs), "total_ns": sum(s["dur_ns"] for s in self.syncs),
                      "wait_ns": sum(s["wait_ns"] for s in self.syncs), "by_name": sync_by,
                      "calls": list(self.syncs)},
            "items": list(self.items),
            "gpu": {"first_activity_ns": first, "last_activity_end_ns": last, "busy_ns": busy,
                    "kernel_busy_ns": _union_length(k_iv),
                    "idle_ns": (last - first - busy) if first is not None and last is not None else 0},
            "gaps": {"threshold_ns": gap_threshold_ns, "idle_ns_by_stream": idle_by_stream, "list": gap_list,
                     "device_idle_ns": sum(s1 - e0 for (_, e0), (s1, _) in zip(merged, merged[1:])),
                     "device_list": device_gaps},
            "steps": steps,
            "annotations": list(self.annotations),
            "collectives": {"count": len(self.collectives), "total_ns": sum(c["dur_ns"] for c in self.collectives),
                            "wait_ns": sum(c["wait_ns"] for c in self.collectives),
                            "exposed_ns": comm_union - _overlap_length(comm_iv, noncomm_iv),
                            "list": list(self.collectives)},
            "memory": {"events": len(self.memory_records) if self.profile_memory else 0,
                       "peak_allocated_bytes": self._peak_allocated, "final_allocated_bytes": self._allocated,
                       "peak_reserved_bytes": self._reserved,
                       "allocated_at_step_end_bytes": [s["allocated_at_end_bytes"] for s in self.steps]},
        }


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _contiguous_strides(dims: Sequence[int]) -> list[int]:
    out: list[int] = []
    acc = 1
    for d in reversed(list(dims)):
        out.append(acc)
        acc *= max(int(d), 1)
    return list(reversed(out))


def _legacy_us(t: int) -> int:
    return t // 1000


def _fmt_ns_as_us(ns: int) -> str:
    """Kineto's "<us>.<3-digit ns>" string form (used by XPU timestamp args)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _memcpy_name(vendor: str, kind: str, pinned: bool) -> str:
    """Memcpy activity names per vendor (CUDA distinguishes pinned/pageable host memory; ROCm
    writes "Host"; XPU/PTI uses M=pageable "Memory", H=USM host)."""
    if vendor == "amd":
        return {"HtoD": "Memcpy HtoD (Host -> Device)", "DtoH": "Memcpy DtoH (Device -> Host)",
                "DtoD": "Memcpy DtoD (Device -> Device)"}[kind]
    if vendor == "xpu":
        if kind == "DtoD":
            return "Memcpy D2D (Device -> Device)"
        if kind == "HtoD":
            return "Memcpy H2D (Host -> Device)" if pinned else "Memcpy M2D (Memory -> Device)"
        return "Memcpy D2H (Device -> Host)" if pinned else "Memcpy D2M (Device -> Memory)"
    host = "Pinned" if pinned else "Pageable"
    if kind == "HtoD":
        return f"Memcpy HtoD ({host} -> Device)"
    if kind == "DtoH":
        return f"Memcpy DtoH (Device -> {host})"
    return "Memcpy DtoD (Device -> Device)"


def dumps_trace(trace: dict[str, Any]) -> bytes:
    """Deterministic JSON bytes: top-level keys in order, one trace event per line."""
    parts: list[bytes] = [b"{\n"]
    items = list(trace.items())
    for i, (k, v) in enumerate(items):
        parts.append(b"  " + orjson.dumps(k) + b": ")
        if k == "traceEvents":
            parts.append(b"[\n")
            parts.append(b",\n".join(b"  " + orjson.dumps(e) for e in v))
            parts.append(b"\n  ]")
        else:
            parts.append(orjson.dumps(v))
        parts.append(b",\n" if i < len(items) - 1 else b"\n")
    parts.append(b"}\n")
    return b"".join(parts)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, gzipped (mtime 0, no file name) when it ends with ``.gz``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.name.endswith(".gz"):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(data)
        p.write_bytes(buf.getvalue())
    else:
        p.write_bytes(data)
    return p


def dumps_truth(truth: dict[str, Any]) -> bytes:
    """Truth dict as stable, indented JSON."""
    return orjson.dumps(truth, option=orjson.OPT_INDENT_2) + b"\n"


# =============================================================================================
# Workload building blocks (a ResNet-like CNN training step, an LLM-like decode step)
# =============================================================================================
_TFLOPS = {"A100": 60.0, "H100": 150.0, "V100": 14.0, "MI300X": 120.0, "PVC": 80.0}
_HBM_GBPS = {"A100": 1500.0, "H100": 2800.0, "V100": 800.0, "MI300X": 3500.0, "PVC": 2000.0}
DATALOADER_ANN = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _j(rng: random.Random, us: float, pct: float = 0.04) -> float:
    """``us`` with ±pct uniform jitter, rounded to whole ns (deterministic given ``rng``)."""
    return round(us * (1.0 + rng.uniform(-pct, pct)), 3)


@dataclass
class _Bwd:
    """A pending backward node: forward handle, node name, (kernel op, µs) list, grads to free."""

    fwd: OpHandle | None
    node: str
    inner: str
    kernels: list[tuple[str, float]]
    free: list[int] = field(default_factory=list)
    accumulate: bool = False


class _Workload:
    """Emits the ops of a small CNN (``ResNet``-like) training step on a :class:`TraceBuilder`.

    Kernel durations come from a FLOP/byte model of the layer shapes on the builder's GPU, times
    ``gpu_scale``, with ±4 % jitter from ``rng``; CPU op overheads are fixed µs values times
    ``cpu_scale``. Every call site is wrapped in python frames so that ``with_stack`` traces point
    at ``train.py`` lines.
    """

    LAYERS: tuple[tuple[int, int], ...] = ((64, 56), (64, 56), (128, 28), (128, 28), (256, 14), (512, 7))

    def __init__(self, b: TraceBuilder, rng: random.Random, *, batch: int = 32, gpu_scale: float = 1.0,
                 cpu_scale: float = 1.0, layers: Sequence[tuple[int, int]] | None = None) -> None:
        self.b = b
        self.rng = rng
        self.batch = batch
        self.gpu_scale = gpu_scale
        self.cpu_scale = cpu_scale
        self.layers = tuple(layers) if layers is not None else self.LAYERS
        self.n_classes = 1000
        #: log_softmax kernel µs (None: derived from the shape model, ~5 µs)
        self.softmax_us: float | None = None
        #: name → factor applied to that kernel op's duration (used by scenario_regression)
        self.kernel_factor: dict[str, float] = {}
        #: every duration drawn for a logical kernel op, before any factor (µs)
        self.drawn: dict[str, list[float]] = {}

    # ---- timing model
    def k(self, op: str) -> str:
        return kernel_name(self.b.gpu, op)

    def _gpu_us(self, op: str, us: float) -> float:
        base = _j(self.rng, us * self.gpu_scale)
        self.drawn.setdefault(op, []).append(base)
        return round(base * self.kernel_factor.get(op, 1.0), 3)

    def conv_us(self, c: int, hw: int) -> float:
        flops = 2.0 * self.batch * c * c * 9 * hw * hw
        return max(8.0, flops / (_TFLOPS[self.b.gpu] * 1e6))

    def mem_us(self, c: int, hw: int, passes: float = 2.0) -> float:
        nbytes = self.batch * c * hw * hw * 4 * passes
        return max(3.0, nbytes / (_HBM_GBPS[self.b.gpu] * 1e3))

    def cpu(self, us: float) -> float:
        return us * self.cpu_scale

    # ---- generic op with kernels
    def op(self, names: Sequence[str], kernels: Sequence[tuple[str, float]], *, dims: list[Any] | None = None,
           types: list[str] | None = None, seq: bool = False, launch_us: float = 5.0) -> OpHandle:
        """Nested ops ``names[0] → names[1] → …``; the innermost launches ``kernels`` [(op, µs)]."""
        b = self.b
        with contextlib.ExitStack() as es:
            outer = es.enter_context(b.cpu_op(names[0], input_dims=dims, input_types=types, seq=seq,
                                              pre_us=self.cpu(3.0), post_us=self.cpu(1.5)))
            for n in names[1:]:
                es.enter_context(b.cpu_op(n, input_dims=dims, input_types=types, pre_us=self.cpu(2.0),
                                          post_us=self.cpu(1.0)))
            for kop, us in kernels:
                b.launch_kernel(self.k(kop), self._gpu_us(kop, us), launch_dur_us=_j(self.rng, launch_us, 0.2))
        return outer

    # ---- segments of a training step
    def dataloader(self, wait_us: float) -> OpHandle:
        """``enumerate(DataLoader)#…__next__`` that blocks the main thread ``wait_us`` (worker
        processes not keeping up); returns the annotation handle (start/end known on exit)."""
        b = self.b
        with b.annotation(DATALOADER_ANN) as h:
            with b.python_frame("torch/utils/data/dataloader.py", 708, "__next__"):
                with b.python_frame("torch/utils/data/dataloader.py", 1458, "_next_data"):
                    b.idle_cpu(wait_us)
        return h

    def to_device(self, *, pinned: bool, non_blocking: bool, nbytes: int | None = None) -> GpuActivity:
        """``batch.to('cuda')``: ``aten::to`` → ``aten::_to_copy`` → ``aten::copy_`` → HtoD copy."""
        b = self.b
        nbytes = nbytes if nbytes is not None else self.batch * 3 * 224 * 224 * 4
        dims = [[self.batch, 3, 224, 224], [], [], [], []]
        with b.cpu_op("aten::to", input_dims=dims, input_types=["float", "", "", "Scalar", "Scalar"],
                      pre_us=self.cpu(3.0)):
            with b.cpu_op("aten::_to_copy", input_dims=dims, input_types=["float", "", "", "Scalar", "Scalar"]):
                with b.cpu_op("aten::empty_strided", input_dims=[[4], [4], [], [], [], []], pre_us=2.0, post_us=1.0):
                    pass
                with b.cpu_op("aten::copy_", input_dims=[[self.batch, 3, 224, 224], [self.batch, 3, 224, 224], []],
                              input_types=["float", "float", "Scalar"]):
                    return b.memcpy("HtoD", bytes=nbytes, pinned=pinned, async_=non_blocking)

    def forward(self, *, alloc: bool = True) -> tuple[list[_Bwd], list[int]]:
        """Conv/BN/ReLU blocks, pooling, classifier, log_softmax + nll loss. Returns the backward
        plan (reverse order is applied by :meth:`backward`) and activation addresses."""
        b, N = self.b, self.batch
        plan: list[_Bwd] = []
        acts: list[int] = []
        with b.python_frame("train.py", 42, "forward"):
            with b.python_frame("", 0, "", module="ResNet_0"):
                for i, (c, hw) in enumerate(self.layers):
                    x = [N, c, hw, hw]
                    with b.python_frame("", 0, "", module=f"Conv2d_{i}"):
                        h = self.op(["aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_"
                                                                                                "convolution"],
                                    [("conv_fwd", self.conv_us(c, hw))], dims=[x, [c, c, 3, 3], []], seq=True)
                    if alloc:
                        acts.append(b.alloc(N * c * hw * hw * 4))
                    plan.append(
                        _Bwd(
                            h,
                            "ConvolutionBackward0",
                            "aten::convolution_backward",
                            [("conv_dgrad", self.conv_us(c, hw) * 1.1), ("conv_wgrad", self.conv_us(c, hw) * 1.2)],
                            accumulate=True,
                        )
                    )
                    with b.python_frame("", 0, "", module=f"BatchNorm2d_{i}"):
                        h = self.op(["aten::batch_norm", "aten::_batch_norm_impl_index", "aten::cudnn_batch_norm"],
                                    [("bn_fwd", self.mem_us(c, hw, 3.0))], dims=[x, [c], [c], [c], [c]], seq=True)
                    if alloc:
                        acts.append(b.alloc(N * c * hw * hw * 4))
                    plan.append(_Bwd(h, "CudnnBatchNormBackward0", "aten::cudnn_batch_norm_backward",
                                     [("bn_bwd", self.mem_us(c, hw, 4.0))], accumulate=True))
                    with b.python_frame("", 0, "", module=f"ReLU_{i}"):
                        h = self.op(
                            ["aten::relu_", "aten::clamp_min_"], [("relu", self.mem_us(c, hw))], dims=[x], seq=True
                        )
                    plan.append(
                        _Bwd(h, "ReluBackward0", "aten::threshold_backward", [("relu_bwd", self.mem_us(c, hw, 3.0))])
                    )
                c, hw = self.layers[-1]
                h = self.op(
                    ["aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d"],
                    [("avgpool", self.mem_us(c, hw, 1.0))],
                    dims=[[N, c, hw, hw], []],
                    seq=True,
                )
                plan.append(_Bwd(h, "MeanBackward1", "aten::mean", [("fill", 3.0)]))
                fc_us = max(6.0, 2.0 * N * c * self.n_classes / (_TFLOPS[b.gpu] * 1e6))
                with b.python_frame("", 0, "", module="Linear_0"):
                    h = self.op(["aten::linear", "aten::addmm"], [("gemm", fc_us)],
                                dims=[[N, c], [self.n_classes, c], [self.n_classes]], seq=True)
                plan.append(_Bwd(h, "AddmmBackward0", "aten::mm", [("gemm", fc_us), ("gemm", fc_us), ("reduce", 4.0)],
                                 accumulate=True))
        with b.python_frame("train.py", 44, "forward"):
            h = self.op(
                ["aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax"],
                [("softmax", self.softmax_us or max(5.0, N * self.n_classes * 8 / (_HBM_GBPS[b.gpu] * 1e3) * 6))],
                dims=[[N, self.n_classes], [N]],
                types=["float", "long int"],
                seq=True,
            )
            plan.append(_Bwd(h, "LogSoftmaxBackward0", "aten::_log_softmax_backward_data", [("softmax_bwd", 5.0)]))
            h = self.op(["aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss_forward"], [("nll", 4.0)],
                        dims=[[N, self.n_classes], [N]], types=["float", "long int"], seq=True)
            plan.append(_Bwd(h, "NllLossBackward0", "aten::nll_loss_backward", [("fill", 2.0), ("nll_bwd", 4.0)]))
        return plan, acts

    def backward_nodes(self, nodes: Sequence[_Bwd], acts: list[int] | None = None) -> None:
        """Run backward nodes (already in execution order) on the current (autograd) thread."""
        b = self.b
        for node in nodes:
            with b.backward_op(node.fwd, node.node):
                with b.cpu_op(node.inner, pre_us=self.cpu(2.0)):
                    for kop, us in node.kernels:
                        b.launch_kernel(self.k(kop), self._gpu_us(kop, us), launch_dur_us=_j(self.rng, 5.0, 0.2))
            if node.accumulate:
                with b.backward_op(None, "torch::autograd::AccumulateGrad"):
                    with b.cpu_op("aten::detach", pre_us=1.0, post_us=0.5):
                        pass
            if acts:
                b.free(acts.pop())

    def backward(self, plan: list[_Bwd], acts: list[int] | None = None, *, py: bool = True) -> None:
        """``loss.backward()``: python frames on the main thread, nodes on the autograd thread."""
        b = self.b
        with b.python_frame("train.py", 47, "train_step") if py else contextlib.nullcontext():
            with b.python_frame("torch/_tensor.py", 626, "backward"):
                with b.python_frame("torch/autograd/__init__.py", 347, "backward"):
                    with b.backward_thread():
                        self.backward_nodes(list(reversed(plan)), acts)

    def optimizer(self, *, foreach: bool = True, n_params: int | None = None, name: str = "SGD") -> None:
        """``optimizer.step()``: one multi-tensor kernel (foreach) or one tiny ``aten::add_`` per
        parameter (the "many small kernels" anti-pattern)."""
        b = self.b
        n_params = n_params if n_params is not None else 3 * len(self.layers) + 2
        with b.python_frame("train.py", 49, "train_step"):
            with b.annotation(f"Optimizer.step#{name}.step", gpu=True):
                with b.python_frame("torch/optim/optimizer.py", 487, "wrapper"):
                    if foreach:
                        self.op(["aten::_foreach_add_"], [("sgd", 25.0 + 2.0 * n_params)],
                                dims=[[], [], []], types=["TensorList", "TensorList", "Scalar"])
                    else:
                        for _ in range(n_params):
                            self.op(["aten::add_"], [("add", 2.2)], dims=[[64], [64], []],
                                    types=["float", "float", "Scalar"], launch_us=6.0)
            with b.annotation(f"Optimizer.zero_grad#{name}.zero_grad"):
                b.idle_cpu(self.cpu(15.0))  # set_to_none: python only, no kernels

    def loss_item(self, line: int = 57, func: str = "train_step") -> dict[str, Any]:
        """``loss.item()`` at ``train.py(<line>): <func>``: DtoH copy + stream sync."""
        with self.b.python_frame("train.py", line, func):
            return self.b.item()

    def train_step(self, n: int, *, dl_us: float, pinned: bool = True, non_blocking: bool = True,
                   foreach: bool = True, item: bool = False, leak_bytes: int = 0) -> dict[str, Any]:
        """One full ``ProfilerStep#n``; returns {dataloader: handle, copy: activity, item: rec}."""
        b = self.b
        out: dict[str, Any] = {}
        with b.step(n):
            with b.python_frame("train.py", 31, "train_step"):
                out["dataloader"] = self.dataloader(dl_us)
                with b.python_frame("train.py", 36, "to_device"):
                    out["copy"] = self.to_device(pinned=pinned, non_blocking=non_blocking)
            plan, acts = self.forward(alloc=b.profile_memory)
            if leak_bytes:
                with b.python_frame("train.py", 64, "train_step"):
                    with b.cpu_op("aten::detach", pre_us=1.0):
                        out["leak_addr"] = b.alloc(leak_bytes)
            self.backward(plan, acts)
            self.optimizer(foreach=foreach)
            if item:
                out["item"] = self.loss_item()
        return out


# =============================================================================================
# Scenarios: (trace_dict, truth) with planted, exactly known facts
# =============================================================================================
Scenario = tuple[dict[str, Any], dict[str, Any]]


def _finish(b: TraceBuilder, name: str, params: dict[str, Any], planted: dict[str, Any],
            gap_threshold_ns: int = 10_000) -> Scenario:
    truth = b.truth(gap_threshold_ns=gap_threshold_ns)
    truth = {"scenario": name, "params": params, "planted": planted, **truth}
    return b.build(), truth


def _bkw(layout: str, vendor: str, gpu: str | None, seed: int, **kw: Any) -> dict[str, Any]:
    return {"layout": layout, "vendor": vendor, "gpu": gpu, "seed": seed, **kw}


def scenario_idle_gaps(seed: int = 0, *, steps: int = 5, layout: Layout = "modern", vendor: Vendor = "nvidia",
                       gpu: str | None = None, with_stack: bool = True) -> Scenario:
    """Host-bound GPU idle gaps of known length inside the DataLoader ``__next__`` annotation,
    plus one inside an un-annotated python function.

    Each step ends with ``loss.item()`` (so the GPU is drained at step end) and begins with the
    DataLoader blocking for ``dataloader_us[i]`` (µs, planted, varies per step). Kernels are long
    enough that the stream never idles otherwise, so the only gaps ≥ 10 µs are the planted ones.
    In step index 2 a ``train.py(77): log_metrics`` python frame idles the CPU ``log_metrics_us``
    between backward and the optimizer, draining the queue.

    ``planted``:
      ``dataloader_us``        per-step DataLoader wait requested (µs).
      ``dataloader``           per step {step, start_ns, end_ns, dur_ns} of the annotation.
      ``gaps``                 the planted compute-stream gaps {stream, start_ns, end_ns, dur_ns,
                               step (index), cause, annotation (name or None), python_frame (or None)}.
      ``max_unplanted_gap_ns`` the longest other gap on any stream (tiny by construction).
      ``gap_total_ns``         sum of planted gap lengths.
    Step 0's DataLoader wait precedes any GPU work, so it is not a gap *between* activities.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, with_stack=with_stack))
    w = _Workload(b, rng)
    dl_us = [round(300.0 + rng.uniform(0, 200), 3)] + [round(rng.uniform(2500, 12000), 3) for _ in range(steps - 1)]
    log_step = 2 if steps > 2 else None
    log_us = round(rng.uniform(8000, 12000), 3)  # longer than any GPU backlog, so the queue drains
    planted_gaps: list[dict[str, Any]] = []
    dls: list[dict[str, Any]] = []
    for i in range(steps):
        with b.step(i + 1):
            n0 = len(b.gaps)
            with b.python_frame("train.py", 31, "train_step"):
                h = w.dataloader(dl_us[i])
                with b.python_frame("train.py", 36, "to_device"):
                    w.to_device(pinned=True, non_blocking=True)
            assert h.end_ns is not None
            dls.append({"step": i, "start_ns": h.start_ns, "end_ns": h.end_ns, "dur_ns": h.end_ns - h.start_ns})
            plan, acts = w.forward(alloc=b.profile_memory)
            for g in b.gaps[n0:]:
                if g["start_ns"] < h.end_ns and g["end_ns"] > h.start_ns:
                    planted_gaps.append({**g, "annotation": DATALOADER_ANN, "python_frame": None})
            w.backward(plan, acts)
            if i == log_step:
                # Host-side logging between backward and the optimizer: the queue drains.
                n1 = len(b.gaps)
                with b.python_frame("train.py", 77, "log_metrics"):
                    t0 = b.now_ns
                    b.idle_cpu(log_us)
                    t1 = b.now_ns
                w.optimizer(foreach=True)
                for g in b.gaps[n1:]:
                    if g["start_ns"] < t1 and g["end_ns"] > t0:
                        planted_gaps.append({**g, "annotation": None, "python_frame": "train.py(77): log_metrics"})
            else:
                w.optimizer(foreach=True)
            w.loss_item()
    planted_ids = {(g["stream"], g["start_ns"]) for g in planted_gaps}
    others = [g["dur_ns"] for g in b.gaps if (g["stream"], g["start_ns"]) not in planted_ids]
    planted = {"dataloader_us": dl_us, "dataloader": dls, "log_metrics_us": log_us, "log_metrics_step": log_step,
               "gaps": planted_gaps, "gap_total_ns": sum(g["dur_ns"] for g in planted_gaps),
               "max_unplanted_gap_ns": max(others, default=0)}
    params = {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor, "gpu": b.gpu}
    return _finish(b, "idle_gaps", params, planted)


def scenario_launch_bound(seed: int = 0, *, steps: int = 3, ops_per_step: int = 300, layout: Layout = "modern",
                          vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """An eager decode loop of tiny kernels: every kernel (2–5 µs) is shorter than its launch
    call (7–12 µs) and the ops around them cost ~15 µs of CPU, so the GPU is mostly idle waiting
    for launches (busy ≈ 20–30 %).

    ``planted``: ``kernels`` (count), ``kernels_shorter_than_launch`` (count, == kernels),
    ``kernel_us_range`` and ``launch_us_range`` used, ``per_step_busy_fraction`` (gpu_busy_ns /
    step dur_ns), ``mean_kernel_ns``, ``mean_launch_ns`` (launch runtime calls only).
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, with_stack=False, profile_memory=False))
    small = ["add", "mul", "copy", "fill", "gemm_small", "reduce", "relu"]
    launches: list[GpuActivity] = []
    for i in range(steps):
        with b.step(i + 1):
            with b.annotation("## decode ##"):
                for j in range(ops_per_step):
                    kop = small[j % len(small)]
                    name = {"add": "aten::add", "mul": "aten::mul", "copy": "aten::copy_", "fill": "aten::fill_",
                            "gemm_small": "aten::mm", "reduce": "aten::mean", "relu": "aten::relu"}[kop]
                    with b.cpu_op(name, input_dims=[[1, 1024], [1, 1024]], pre_us=_j(rng, 6.0, 0.3),
                                  post_us=_j(rng, 4.0, 0.3)):
                        launches.append(b.launch_kernel(kernel_name(b.gpu, kop), round(rng.uniform(2.0, 5.0), 3),
                                                        launch_dur_us=round(rng.uniform(7.0, 12.0), 3)))
            b.sync("cudaDeviceSynchronize")
    truth_steps = b.truth()["steps"]
    planted = {
        "kernels": len(launches),
        "kernels_shorter_than_launch": sum(1 for a in launches if a.dur_ns < a.runtime_dur_ns),
        "kernel_us_range": [2.0, 5.0], "launch_us_range": [7.0, 12.0],
        "mean_kernel_ns": sum(a.dur_ns for a in launches) / len(launches),
        "mean_launch_ns": sum(a.runtime_dur_ns for a in launches) / len(launches),
        "per_step_busy_fraction": [s["gpu_busy_ns"] / s["dur_ns"] for s in truth_steps],
    }
    return _finish(b, "launch_bound", {"seed": seed, "steps": steps, "ops_per_step": ops_per_step,
                                       "layout": layout, "vendor": vendor, "gpu": b.gpu}, planted)


def scenario_compute_bound(seed: int = 0, *, steps: int = 3, layout: Layout = "modern", vendor: Vendor = "nvidia",
                           gpu: str | None = None) -> Scenario:
    """Large GEMMs (0.4–1.5 ms) launched back-to-back: the GPU is busy > 95 % of each step and
    GEMM kernels are > 90 % of kernel time.

    ``planted``: ``gemm_kernel`` (name), ``gemm_count``, ``gemm_ns`` (sum), ``kernel_ns``
    (all kernels), ``gemm_fraction`` (= gemm_ns / kernel_ns), ``busy_fraction`` (device busy_ns /
    (last activity end − first activity start)), ``per_step_busy_fraction``.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, with_stack=False, profile_memory=False))
    gemm = kernel_name(b.gpu, "gemm_bf16")
    for i in range(steps):
        with b.step(i + 1):
            for _layer in range(12):
                with b.cpu_op("aten::linear", input_dims=[[8192, 4096], [4096, 4096], [4096]],
                              input_types=["c10::BFloat16"] * 3, seq=True):
                    with b.cpu_op("aten::addmm", input_dims=[[4096], [8192, 4096], [4096, 4096]],
                                  input_types=["c10::BFloat16"] * 3):
                        b.launch_kernel(gemm, round(rng.uniform(400.0, 1500.0), 3), launch_dur_us=_j(rng, 6.0, 0.2))
                with b.cpu_op("aten::gelu", input_dims=[[8192, 4096]], input_types=["c10::BFloat16"]):
                    b.launch_kernel(kernel_name(b.gpu, "relu"), round(rng.uniform(20.0, 40.0), 3))
            # The next step's launches are queued while the GPU is still busy: sync only at the end.
        if i == steps - 1:
            b.sync("cudaDeviceSynchronize")
    t = b.truth()
    gk = [a for a in b.gpu_acts if a.name == gemm]
    kernel_ns = t["kernels"]["total_ns"]
    planted = {
        "gemm_kernel": gemm, "gemm_count": len(gk), "gemm_ns": sum(a.dur_ns for a in gk), "kernel_ns": kernel_ns,
        "gemm_fraction": sum(a.dur_ns for a in gk) / kernel_ns,
        "busy_fraction": t["gpu"]["busy_ns"] / (t["gpu"]["last_activity_end_ns"] - t["gpu"]["first_activity_ns"]),
        "per_step_busy_fraction": [s["gpu_busy_ns"] / s["dur_ns"] for s in t["steps"]],
    }
    return _finish(b, "compute_bound", {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor,
                                        "gpu": b.gpu}, planted)


def scenario_input_bound(seed: int = 0, *, steps: int = 4, layout: Layout = "modern", vendor: Vendor = "nvidia",
                         gpu: str | None = None) -> Scenario:
    """The DataLoader dominates: each step waits 20–30 ms in ``__next__`` for ~5 ms of GPU work.

    ``planted``: ``dataloader`` per step {step, start_ns, end_ns, dur_ns}, ``dataloader_ns``
    (total), ``step_ns`` (sum of step durations), ``dataloader_fraction`` (= dataloader_ns /
    step_ns), ``gpu_busy_fraction`` (sum of per-step gpu_busy_ns / step_ns).
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    w = _Workload(b, rng)
    dls = []
    for i in range(steps):
        out = w.train_step(i + 1, dl_us=round(rng.uniform(20000, 30000), 3), item=True)
        h = out["dataloader"]
        dls.append({"step": i, "start_ns": h.start_ns, "end_ns": h.end_ns, "dur_ns": h.end_ns - h.start_ns})
    t = b.truth()
    dl_ns = sum(d["dur_ns"] for d in dls)
    step_ns = sum(s["dur_ns"] for s in t["steps"])
    planted = {"dataloader": dls, "dataloader_ns": dl_ns, "step_ns": step_ns, "dataloader_fraction": dl_ns / step_ns,
               "gpu_busy_fraction": sum(s["gpu_busy_ns"] for s in t["steps"]) / step_ns}
    return _finish(b, "input_bound", {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor,
                                      "gpu": b.gpu}, planted)


def _ddp_step(b: TraceBuilder, w: _Workload, n: int, *, dl_us: float, bucket_transfer_us: Sequence[float],
              colls: list[Collective] | None = None) -> Iterator[list[Collective]]:
    """Generator form of one DDP step so that several ranks can be driven in lock-step.

    Yields at each gradient-bucket allreduce with the list of open :class:`Collective` objects
    (one entry) whose ``end_ns`` the driver may change; resumes to finish the step."""
    nb = len(bucket_transfer_us)
    with b.step(n):
        with b.python_frame("train_ddp.py", 52, "train_step"):
            w.dataloader(dl_us)
            w.to_device(pinned=True, non_blocking=True)
        with b.annotation("DistributedDataParallel.forward", gpu=True):
            plan, acts = w.forward(alloc=b.profile_memory)
        nodes = list(reversed(plan))
        cut = [len(nodes) * (k + 1) // nb for k in range(nb)]
        with b.python_frame("torch/_tensor.py", 626, "backward"):
            with b.backward_thread():
                lo = 0
                for k in range(nb):
                    w.backward_nodes(nodes[lo:cut[k]], acts)
                    lo = cut[k]
                    # DDP's reducer hook launches the bucket's allreduce from the autograd thread.
                    with b.collective("allreduce", nelems=int(bucket_transfer_us[k] * 2500), dtype="Float",
                                      transfer_us=bucket_transfer_us[k]) as c:
                        yield [c]
        # DDP finalize: the compute stream waits for the last allreduce before the optimizer.
        with b.cpu_op("torch.distributed.ddp.reducer::copy_bucket_to_grad", pre_us=2.0):
            b.stream_wait(b.stream, b.comm_stream)
        w.optimizer(foreach=True)
        w.loss_item()


def scenario_comm_bound(seed: int = 0, *, steps: int = 3, rank: int = 0, world_size: int = 4,
                        layout: Layout = "modern", vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """DDP where allreduce takes longer than the backward compute it could hide behind: two
    gradient buckets per step on the NCCL stream, then the compute stream waits for them.

    ``planted``: ``collectives`` (count), ``comm_ns`` (sum of NCCL kernel durations),
    ``exposed_comm_ns`` (NCCL time not overlapped by any compute kernel/copy — by construction
    most of it), ``exposed_fraction`` (= exposed / comm), ``bucket_transfer_us`` per step.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, rank=rank, world_size=world_size, num_devices=world_size,
                            device=rank))
    w = _Workload(b, rng)
    transfers = []
    for i in range(steps):
        tr = [round(rng.uniform(2500, 4000), 3), round(rng.uniform(5000, 8000), 3)]
        transfers.append(tr)
        for _ in _ddp_step(b, w, i + 1, dl_us=round(rng.uniform(200, 400), 3), bucket_transfer_us=tr):
            pass
    t = b.truth()
    c = t["collectives"]
    planted = {"collectives": c["count"], "comm_ns": c["total_ns"], "exposed_comm_ns": c["exposed_ns"],
               "exposed_fraction": c["exposed_ns"] / c["total_ns"], "bucket_transfer_us": transfers}
    return _finish(b, "comm_bound", {"seed": seed, "steps": steps, "rank": rank, "world_size": world_size,
                                     "layout": layout, "vendor": vendor, "gpu": b.gpu}, planted)


def scenario_sync_bound(seed: int = 0, *, steps: int = 3, items_per_step: int = 8, layout: Layout = "modern",
                        vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """Repeated host syncs: per step, ``items_per_step`` metric ``.item()`` calls interleaved
    with forward layers (each drains the queue) and an explicit ``cudaStreamSynchronize`` after
    backward at ``train.py(88): train_step``.

    ``planted``: ``items`` (count), ``items_wait_ns`` (sum of CPU wait inside them),
    ``explicit_syncs`` (count of the cudaStreamSynchronize at train.py:88), ``explicit_sync_wait_ns``,
    ``sync_calls_by_name`` (every sync runtime call, including those inside ``.item()``),
    ``sync_wait_ns`` (all sync waits), ``item_call_site`` (``train.py(61): compute_metrics``).
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    w = _Workload(b, rng)
    explicit: list[dict[str, Any]] = []
    for i in range(steps):
        with b.step(i + 1):
            with b.python_frame("train.py", 31, "train_step"):
                w.dataloader(round(rng.uniform(150, 300), 3))
                w.to_device(pinned=True, non_blocking=True)
            plan, acts = w.forward(alloc=False)
            for _ in range(items_per_step):
                with b.python_frame("train.py", 61, "compute_metrics"):
                    with b.cpu_op("aten::sum", input_dims=[[32, 1000]]):
                        b.launch_kernel(kernel_name(b.gpu, "reduce"), _j(rng, 6.0))
                    b.item()
                    b.idle_cpu(_j(rng, 60.0))  # python bookkeeping between metrics
            w.backward(plan, None)
            with b.python_frame("train.py", 88, "train_step"):
                explicit.append(b.sync("cudaStreamSynchronize"))
            w.optimizer(foreach=True)
    t = b.truth()
    planted = {
        "items": len(b.items), "items_wait_ns": sum(r["wait_ns"] for r in b.items),
        "explicit_syncs": len(explicit), "explicit_sync_wait_ns": sum(s["wait_ns"] for s in explicit),
        "sync_calls_by_name": {k: v["count"] for k, v in t["syncs"]["by_name"].items()},
        "sync_wait_ns": t["syncs"]["wait_ns"], "item_call_site": "train.py(61): compute_metrics",
    }
    return _finish(b, "sync_bound", {"seed": seed, "steps": steps, "items_per_step": items_per_step,
                                     "layout": layout, "vendor": vendor, "gpu": b.gpu}, planted)


def scenario_copies(seed: int = 0, *, steps: int = 2, layout: Layout = "modern", vendor: Vendor = "nvidia",
                    gpu: str | None = None) -> Scenario:
    """Problematic copies at known Python call sites (``with_stack``):

    * pageable HtoD ``cudaMemcpyAsync`` of the input batch at ``train.py(42): forward``;
    * a pinned, non-blocking HtoD of the labels at ``train.py(40): forward`` (the good pattern);
    * DtoH of the predictions via ``.cpu()`` at ``train.py(57): log_loss`` (pageable, blocking);
    * a blocking ``cudaMemcpy`` HtoD of a lookup table at ``utils.py(13): upload_table``;
    * a DtoD copy (``aten::clone``) at ``train.py(45): forward``.

    ``planted``: ``copies`` — one row per copy {call_site, kind, pinned, async, blocking, bytes,
    name, runtime, dur_ns, runtime_dur_ns, blocked_ns, step}; ``by_call_site`` {site: {count,
    bytes}}; ``pageable_htod`` / ``dtoh`` / ``blocking`` / ``sync_memcpy`` counts.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, with_stack=True))
    w = _Workload(b, rng, layers=_Workload.LAYERS[:3])
    rows: list[GpuActivity] = []
    for i in range(steps):
        with b.step(i + 1):
            with b.python_frame("train.py", 31, "train_step"):
                w.dataloader(round(rng.uniform(200, 400), 3))
            with b.python_frame("train.py", 42, "forward"):
                rows.append(w.to_device(pinned=False, non_blocking=False, nbytes=32 * 3 * 224 * 224 * 4))
            with b.python_frame("train.py", 40, "forward"):
                rows.append(w.to_device(pinned=True, non_blocking=True, nbytes=32 * 8))
            with b.python_frame("train.py", 45, "forward"):
                with b.cpu_op("aten::clone", input_dims=[[32, 3, 224, 224]]):
                    with b.cpu_op("aten::copy_", input_dims=[[32, 3, 224, 224], [32, 3, 224, 224], []]):
                        rows.append(b.memcpy("DtoD", bytes=32 * 3 * 224 * 224 * 4, pinned=False, async_=True))
            plan, acts = w.forward(alloc=False)
            w.backward(plan, None)
            w.optimizer()
            with b.python_frame("train.py", 57, "log_loss"):
                with b.cpu_op("aten::to", input_dims=[[32, 1000], [], [], [], []]):
                    with b.cpu_op("aten::_to_copy", input_dims=[[32, 1000], [], [], [], []]):
                        with b.cpu_op("aten::copy_", input_dims=[[32, 1000], [32, 1000], []]):
                            rows.append(b.memcpy("DtoH", bytes=32 * 1000 * 4, pinned=False, async_=True))
            if i == 0:
                with b.python_frame("utils.py", 13, "upload_table"):
                    with b.cpu_op("aten::copy_", input_dims=[[1 << 18], [1 << 18], []]):
                        rows.append(b.memcpy("HtoD", bytes=(1 << 18) * 4, pinned=False, async_=False))
    copies = [{"call_site": a.extra["call_site"], "kind": a.extra["kind"], "pinned": a.extra["pinned"],
               "async": a.extra["async"], "blocking": a.extra["blocking"], "bytes": a.bytes, "name": a.name,
               "runtime": a.runtime_name, "dur_ns": a.dur_ns, "runtime_dur_ns": a.runtime_dur_ns,
               "blocked_ns": a.extra["blocked_ns"], "step": a.step} for a in rows]
    by_site: dict[str, dict[str, int]] = {}
    for c in copies:
        r = by_site.setdefault(c["call_site"], {"count": 0, "bytes": 0})
        r["count"] += 1
        r["bytes"] += c["bytes"]
    planted = {
        "copies": copies, "by_call_site": by_site,
        "pageable_htod": sum(1 for c in copies if c["kind"] == "HtoD" and not c["pinned"]),
        "dtoh": sum(1 for c in copies if c["kind"] == "DtoH"),
        "blocking": sum(1 for c in copies if c["blocking"]),
        "sync_memcpy": sum(1 for c in copies if not c["async"]),
    }
    return _finish(b, "copies", {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor, "gpu": b.gpu},
                   planted)


def scenario_memory_growth(seed: int = 0, *, steps: int = 6, leak_bytes: int = 24 << 20, layout: Layout = "modern",
                           vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """``[memory]`` events whose allocated total grows by ``leak_bytes`` every step (a tensor kept
    alive at ``train.py(64): train_step``, e.g. ``losses.append(loss)`` without ``.item()``);
    activations are allocated in forward and freed in backward.

    ``planted``: ``leak_bytes_per_step`` (after 512-byte rounding), ``allocated_at_step_end_bytes``
    (list), ``growth_per_step_bytes`` (differences, all equal), ``peak_allocated_bytes``,
    ``peak_reserved_bytes``, ``memory_events``, ``leak_site``.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed, profile_memory=True))
    w = _Workload(b, rng, layers=_Workload.LAYERS[:4])
    for n in (9408 * 4, 64 * 4 * 2, 1 << 20, 2359296 * 4):
        b.alloc(n)  # weights: allocated before step 1 and alive for the whole run
    for i in range(steps):
        w.train_step(i + 1, dl_us=round(rng.uniform(200, 500), 3), leak_bytes=leak_bytes, item=True)
    t = b.truth()
    ends = t["memory"]["allocated_at_step_end_bytes"]
    planted = {"leak_bytes_per_step": (leak_bytes + 511) // 512 * 512, "allocated_at_step_end_bytes": ends,
               "growth_per_step_bytes": [ends[k + 1] - ends[k] for k in range(len(ends) - 1)],
               "peak_allocated_bytes": t["memory"]["peak_allocated_bytes"],
               "peak_reserved_bytes": t["memory"]["peak_reserved_bytes"], "memory_events": t["memory"]["events"],
               "leak_site": "train.py(64): train_step"}
    return _finish(b, "memory_growth", {"seed": seed, "steps": steps, "leak_bytes": leak_bytes, "layout": layout,
                                        "vendor": vendor, "gpu": b.gpu}, planted)


def simulate_ranks(world_size: int = 2, straggler_rank: int | None = 1, *, seed: int = 0, steps: int = 3,
                   straggler_delay_us: float = 4000.0, layout: Layout = "modern", vendor: Vendor = "nvidia",
                   gpu: str | None = None) -> list[TraceBuilder]:
    """Drive ``world_size`` DDP ranks in lock-step on one shared clock.

    Every rank runs the same workload (same kernel durations); the straggler's DataLoader takes
    ``straggler_delay_us`` longer each step. At each bucket allreduce the NCCL kernel of every rank
    ends at ``max(start over ranks) + transfer`` — fast ranks sit inside NCCL waiting."""
    rng = random.Random(seed)
    dls = [[round(rng.uniform(300, 600), 3) for _ in range(steps)] for _ in range(world_size)]
    transfers = [[round(rng.uniform(800, 1500), 3), round(rng.uniform(1500, 2500), 3)] for _ in range(steps)]
    start = BASE_TIME_NS + 2_345_678_901_234_000 if layout == "modern" else _LEGACY_EPOCH_NS[layout] + 123_456_000
    builders = [TraceBuilder(layout=layout, vendor=vendor, gpu=gpu, seed=seed, rank=r, world_size=world_size,
                             device=r, num_devices=world_size, start_ns=start) for r in range(world_size)]
    # Same workload RNG seed on every rank: identical kernel durations, so differences come only
    # from the planted straggler delay.
    works = [_Workload(bb, random.Random(f"work/{seed}")) for bb in builders]
    for s in range(steps):
        gens = []
        for r in range(world_size):
            dl = dls[r][s] + (straggler_delay_us if r == straggler_rank else 0.0)
            gens.append(_ddp_step(builders[r], works[r], s + 1, dl_us=dl, bucket_transfer_us=transfers[s]))
        pending = [next(g) for g in gens]
        while True:
            for k in range(len(pending[0])):
                end = max(p[k].start_ns for p in pending) + pending[0][k].transfer_ns
                for p in pending:
                    p[k].end_ns = end
            nxt: list[list[Collective] | None] = []
            for g in gens:
                try:
                    nxt.append(next(g))
                except StopIteration:
                    nxt.append(None)
            if all(x is None for x in nxt):
                break
            if any(x is None for x in nxt):
                raise RuntimeError("ranks disagree on the number of collectives")
            pending = [x for x in nxt if x is not None]
    return builders


def scenario_multi_rank(rank: int = 0, world_size: int = 2, straggler_rank: int | None = 1, *, seed: int = 0,
                        steps: int = 3, straggler_delay_us: float = 4000.0, layout: Layout = "modern",
                        vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """One rank of a ``world_size``-rank DDP run with a straggler (slow DataLoader on
    ``straggler_rank``). All ranks share a clock; the returned trace is ``rank``'s.

    ``planted``: ``straggler_rank``, ``is_straggler``, ``straggler_delay_us``,
    ``collective_wait_ns`` (this rank's total time inside NCCL beyond the transfer — large on fast
    ranks, ~0 on the straggler), ``collective_wait_ns_by_rank`` (all ranks),
    ``step_dur_ns_by_rank`` (per-rank list of step durations), ``dataloader_ns_by_rank``.
    """
    builders = simulate_ranks(world_size, straggler_rank, seed=seed, steps=steps,
                              straggler_delay_us=straggler_delay_us, layout=layout, vendor=vendor, gpu=gpu)
    b = builders[rank]
    waits = [sum(c["wait_ns"] for c in bb.collectives) for bb in builders]
    step_durs = [[st["cpu_end_ns"] - st["cpu_start_ns"] for st in bb.steps] for bb in builders]
    dl = [sum(a["dur_ns"] for a in bb.annotations if a["name"] == DATALOADER_ANN) for bb in builders]
    planted = {"straggler_rank": straggler_rank, "is_straggler": rank == straggler_rank,
               "straggler_delay_us": straggler_delay_us, "collective_wait_ns": waits[rank],
               "collective_wait_ns_by_rank": waits, "step_dur_ns_by_rank": step_durs, "dataloader_ns_by_rank": dl}
    return _finish(b, "multi_rank", {"seed": seed, "rank": rank, "world_size": world_size,
                                     "straggler_rank": straggler_rank, "steps": steps, "layout": layout,
                                     "vendor": vendor, "gpu": b.gpu}, planted)


def scenario_regression(baseline: bool, seed: int = 0, *, steps: int = 3, factor: float = 3.0,
                        layout: Layout = "modern", vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """A baseline/candidate pair: identical workloads (same seed, same kernel draws) except that in
    the candidate the ``log_softmax`` forward kernel (~150 µs) is ``factor``× slower.

    ``planted``: ``kernel`` (the regressed kernel name), ``factor``, ``calls``,
    ``baseline_per_call_ns`` and ``candidate_per_call_ns`` (identical lists for both sides),
    ``this_side_total_ns``, ``delta_total_ns`` (candidate − baseline), ``other_kernels_total_ns``
    (sum of every other kernel; equal on both sides).
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    w = _Workload(b, rng)
    w.softmax_us = 150.0  # big enough that a 3x regression stands out in a diff
    if not baseline:
        w.kernel_factor["softmax"] = factor
    for i in range(steps):
        w.train_step(i + 1, dl_us=round(rng.uniform(300, 600), 3), item=True)
    name = kernel_name(b.gpu, "softmax")

    def q(us: float) -> int:
        return b._ns_pos(us)

    base_calls = [q(u) for u in w.drawn["softmax"]]
    cand_calls = [q(round(u * factor, 3)) for u in w.drawn["softmax"]]
    this = [a.dur_ns for a in b.gpu_acts if a.name == name]
    assert this == (base_calls if baseline else cand_calls)
    planted = {"kernel": name, "factor": factor, "calls": len(this), "baseline_per_call_ns": base_calls,
               "candidate_per_call_ns": cand_calls, "this_side_total_ns": sum(this),
               "delta_total_ns": sum(cand_calls) - sum(base_calls),
               "other_kernels_total_ns": sum(a.dur_ns for a in b.gpu_acts if a.kind == "kernel" and a.name != name)}
    return _finish(b, "regression", {"seed": seed, "baseline": baseline, "steps": steps, "factor": factor,
                                     "layout": layout, "vendor": vendor, "gpu": b.gpu}, planted)


def scenario_resnet_like(seed: int = 0, *, steps: int = 5, layout: Layout = "modern", vendor: Vendor = "nvidia",
                         gpu: str | None = None) -> Scenario:
    """A realistic multi-step CNN training trace with several problems planted at once:

    * DataLoader waits of ``dataloader_us[i]`` µs (long on steps 2 and 4) → host-bound GPU gaps;
    * the input batch copied from pageable memory (``pin_memory=False``) → blocking
      ``Memcpy HtoD (Pageable -> Device)`` at ``train.py(36): to_device``;
    * ``loss.item()`` every step at ``train.py(57): train_step`` → DtoH + ``cudaStreamSynchronize``;
    * a non-foreach optimizer: one tiny ``aten::add_`` kernel (~2 µs, shorter than its launch) per
      parameter → many small kernels;
    * ``[memory]`` events (activations allocated in forward, freed in backward).

    ``planted``: ``dataloader_us``, ``dataloader`` (per step interval), ``dataloader_gaps`` (the
    compute-stream gaps overlapping a DataLoader annotation, ≥ 1 ms), ``pageable_htod`` (count),
    ``pageable_htod_blocked_ns``, ``items`` (count), ``item_wait_ns``, ``small_kernels`` (count of
    optimizer ``add`` kernels), ``small_kernel_name``, ``small_kernels_shorter_than_launch``.
    """
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    w = _Workload(b, rng)
    dl_us = [round(rng.uniform(200, 600), 3) for _ in range(steps)]
    for i in range(1, steps, 2):
        dl_us[i] = round(rng.uniform(6000, 15000), 3)
    dls, copies, items = [], [], []
    for i in range(steps):
        out = w.train_step(i + 1, dl_us=dl_us[i], pinned=False, non_blocking=True, foreach=False, item=True)
        h = out["dataloader"]
        dls.append({"step": i, "start_ns": h.start_ns, "end_ns": h.end_ns, "dur_ns": h.end_ns - h.start_ns})
        copies.append(out["copy"])
        items.append(out["item"])
    small = kernel_name(b.gpu, "add")
    sk = [a for a in b.gpu_acts if a.name == small]
    dl_gaps = [g for g in b.gaps if g["dur_ns"] >= 1_000_000 and any(
        g["start_ns"] < d["end_ns"] and g["end_ns"] > d["start_ns"] for d in dls)]
    planted = {
        "dataloader_us": dl_us, "dataloader": dls, "dataloader_gaps": dl_gaps,
        "pageable_htod": len(copies), "pageable_htod_blocked_ns": sum(c.extra["blocked_ns"] for c in copies),
        "pageable_htod_call_site": "train.py(36): to_device",
        "items": len(items), "item_wait_ns": sum(r["wait_ns"] for r in items), "item_call_site": "train.py(57): "
                                                                                                 "train_step",
        "small_kernels": len(sk), "small_kernel_name": small,
        "small_kernels_shorter_than_launch": sum(1 for a in sk if a.dur_ns < a.runtime_dur_ns),
    }
    return _finish(b, "resnet_like", {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor,
                                      "gpu": b.gpu}, planted)


def scenario_inference(seed: int = 0, *, steps: int = 4, layers: int = 8, vendor: Vendor = "amd",
                       gpu: str | None = None, device: int | None = None) -> Scenario:
    """LLM-style inference: step 1 is an eager prefill (per layer: RMSNorm, QKV GEMM, attention,
    output GEMM, MLP GEMMs, elementwise), later steps replay the decode graph with one
    ``hipGraphLaunch``/``cudaGraphLaunch`` each; every step samples a token with a blocking DtoH
    copy (``.item()``). No backward, no optimizer. On AMD the default GPU index is 2 while
    ``deviceProperties`` lists 8 devices (as in the real MI300X DDP file): GPU pid ≠ 0.

    ``planted``: ``prefill_kernels``, ``graph_launches``, ``kernels_per_graph``, ``graph_kernels``,
    ``gemm_kernels`` (count of GEMM kernels), ``items``, ``item_wait_ns``, ``gpu_pid``.
    """
    rng = random.Random(seed)
    dev = device if device is not None else (2 if vendor == "amd" else 0)
    b = TraceBuilder(layout="modern", vendor=vendor, gpu=gpu, seed=seed, device=dev,
                     num_devices=8 if vendor == "amd" else 1, distributed=False, profile_memory=False)
    gemm = kernel_name(b.gpu, "gemm_bf16")
    gemm_small = kernel_name(b.gpu, "gemm_small")
    attn = kernel_name(b.gpu, "attention")
    norm, act, add, emb = (kernel_name(b.gpu, k) for k in ("reduce", "mul", "add", "embedding"))
    prefill = 0
    graph_launches = 0
    decode_graph = []
    for _ in range(layers):
        decode_graph += [(norm, 3.0), (gemm_small, 9.0), (attn, 14.0), (gemm_small, 6.0), (add, 2.5),
                         (norm, 3.0), (gemm_small, 12.0), (act, 3.0), (gemm_small, 11.0), (add, 2.5)]
    for i in range(steps):
        with b.step(i + 1):
            with b.python_frame("serve.py", 88, "generate"):
                if i == 0:
                    with b.annotation("## prefill ##"):
                        with b.cpu_op("aten::embedding", input_dims=[[151936, 1024], [16, 559]],
                                      input_types=["c10::BFloat16", "long int"]):
                            b.launch_kernel(emb, _j(rng, 40.0))
                            prefill += 1
                        for _ in range(layers):
                            for op, kop, us in (("aten::rms_norm", norm, 25.0), ("aten::linear", gemm, 180.0),
                                                ("aten::_scaled_dot_product_flash_attention", attn, 240.0),
                                                ("aten::linear", gemm, 70.0), ("aten::add", add, 20.0),
                                                ("aten::rms_norm", norm, 25.0), ("aten::linear", gemm, 260.0),
                                                ("aten::silu", act, 30.0), ("aten::linear", gemm, 250.0),
                                                ("aten::add", add, 20.0)):
                                with b.cpu_op(op, input_dims=[[16, 559, 1024]], input_types=["c10::BFloat16"]):
                                    b.launch_kernel(kop, _j(rng, us), launch_dur_us=_j(rng, 7.0, 0.3))
                                    prefill += 1
                else:
                    with b.annotation("## decode ##"):
                        with b.cpu_op("aten::embedding", input_dims=[[151936, 1024], [16, 1]],
                                      input_types=["c10::BFloat16", "long int"]):
                            b.launch_kernel(emb, _j(rng, 4.0))
                        with b.python_frame("vllm/worker/model_runner.py", 1812, "replay"):
                            b.cuda_graph_launch(
                                [(n, _j(rng, us)) for n, us in decode_graph], launch_dur_us=_j(rng, 12.0)
                            )
                            graph_launches += 1
                with b.python_frame("serve.py", 97, "sample"):
                    with b.cpu_op("aten::argmax", input_dims=[[16, 151936]], input_types=["c10::BFloat16"]):
                        b.launch_kernel(kernel_name(b.gpu, "reduce"), _j(rng, 18.0))
                    b.item(bytes=8, dtype="long int")
                b.idle_cpu(_j(rng, 150.0))  # detokenize, scheduling
    n_gemm = sum(1 for a in b.gpu_acts if a.name in (gemm, gemm_small))
    planted = {"prefill_kernels": prefill, "graph_launches": graph_launches, "kernels_per_graph": len(decode_graph),
               "graph_kernels": graph_launches * len(decode_graph), "gemm_kernels": n_gemm, "items": len(b.items),
               "item_wait_ns": sum(r["wait_ns"] for r in b.items), "gpu_pid": dev}
    return _finish(b, "inference", {"seed": seed, "steps": steps, "layers": layers, "vendor": vendor,
                                    "gpu": b.gpu, "device": dev}, planted)


DEEPEP_KERNELS = {
    "layout": "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, "
              "int)",
    "notify": "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int*, int*, "
              "int, int, int)",
    "dispatch": "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 "
                "const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, "
                "int, int, void**, int, int, int)",
    "combine": "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(__nv_bfloat16*, float*, int4 const*, float "
               "const*, int const*, int const*, int const*, int*, int*, int, int, int, int, void**, int, int, int)",
}


def _comm_truth(b: TraceBuilder, names: set[str]) -> dict[str, Any]:
    """Per planted step (its CPU range: every step ends with a device sync), the union of the
    kernels named ``names`` (communication) and the part of it no other kernel covers (exposed)."""
    comm = [(a.start_ns, a.end_ns) for a in b.gpu_acts if a.kind == "kernel" and a.name in names]
    other = [(a.start_ns, a.end_ns) for a in b.gpu_acts if a.kind == "kernel" and a.name not in names]
    per = []
    for st in b.steps:
        lo, hi = st["cpu_start_ns"], st["cpu_end_ns"]
        c = [(max(s, lo), min(e, hi)) for s, e in comm if e > lo and s < hi]
        o = [(max(s, lo), min(e, hi)) for s, e in other if e > lo and s < hi]
        u = _union_length(c)
        per.append({"step": st["number"], "comm_ns": u, "exposed_ns": u - _overlap_length(c, o)})
    return {"per_step": per, "n_comm_kernels": len(comm)}


def scenario_moe_deepep(seed: int = 0, *, steps: int = 3, layout: Layout = "modern", vendor: Vendor = "nvidia",
                        gpu: str | None = None) -> Scenario:
    """An expert-parallel MoE layer whose all-to-all runs as DeepEP kernels on their own stream,
    launched from Megatron's ``FusedDispatch`` / ``FusedCombine`` autograd functions (no c10d op,
    no collective args). Per step: the router/attention GEMM (400 µs) on the compute stream;
    ``FusedDispatch`` launches the layout kernel (compute, on the compute stream) and
    ``notify_dispatch`` + ``dispatch`` on the comm stream, partly under that GEMM; the expert GEMMs
    wait for the dispatch; ``FusedCombine``'s ``combine`` waits for the experts: exposed.

    ``planted``: ``per_step`` (``step``, ``comm_ns``: union of the DeepEP communication kernels,
    ``exposed_ns``: the part no other kernel covers), ``n_comm_kernels``, ``collectives`` (2 per
    step: one dispatch, one combine)."""
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    comm = b.comm_stream
    for i in range(steps):
        with b.step(i + 1):
            with b.cpu_op("aten::mm", input_dims=[[4096, 4096], [4096, 4096]], input_types=["c10::BFloat16"] * 2):
                b.launch_kernel(kernel_name(b.gpu, "gemm"), round(rng.uniform(380, 420), 3))
            with b.cpu_op("FusedDispatch"):
                b.launch_kernel(DEEPEP_KERNELS["layout"], 15.0)
                b.launch_kernel(DEEPEP_KERNELS["notify"], round(rng.uniform(25, 35), 3), stream=comm)
                b.launch_kernel(DEEPEP_KERNELS["dispatch"], round(rng.uniform(500, 600), 3), stream=comm)
            b.stream_wait(b.stream, comm)
            with b.cpu_op("aten::mm", input_dims=[[2048, 4096], [4096, 14336]], input_types=["c10::BFloat16"] * 2):
                b.launch_kernel(kernel_name(b.gpu, "gemm"), round(rng.uniform(280, 320), 3))
            b.stream_wait(comm, b.stream)
            with b.cpu_op("FusedCombine"):
                b.launch_kernel(DEEPEP_KERNELS["combine"], round(rng.uniform(200, 250), 3), stream=comm)
            b.stream_wait(b.stream, comm)
            b.sync("cudaDeviceSynchronize")
    names = {DEEPEP_KERNELS[k] for k in ("notify", "dispatch", "combine")}
    planted = {**_comm_truth(b, names), "collectives": 2 * steps}
    return _finish(b, "moe_deepep", {"seed": seed, "steps": steps, "layout": layout, "vendor": vendor,
                                     "gpu": b.gpu}, planted)


CUSTOM_AR_KERNEL = ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
                    "vllm::Signal*, __nv_bfloat16*, int, int)")


def scenario_custom_all_reduce(seed: int = 0, *, steps: int = 3, layers: int = 4, layout: Layout = "modern",
                               vendor: Vendor = "nvidia", gpu: str | None = None) -> Scenario:
    """Tensor-parallel decode with vLLM's custom all-reduce: per layer a GEMM then
    ``vllm::all_reduce`` → ``_C_custom_ar::all_reduce`` → ``cross_device_reduce_2stage`` on the
    compute stream (serialised with the GEMMs: all of it exposed), and an RMSNorm whose
    ``reduce_kernel``-like name must stay compute.

    ``planted``: ``per_step`` (``step``, ``comm_ns``, ``exposed_ns``), ``n_comm_kernels``,
    ``collectives`` (= layers × steps)."""
    rng = random.Random(seed)
    b = TraceBuilder(**_bkw(layout, vendor, gpu, seed))
    for i in range(steps):
        with b.step(i + 1):
            for _ in range(layers):
                with b.cpu_op("aten::mm", input_dims=[[8, 4096], [4096, 4096]], input_types=["c10::BFloat16"] * 2):
                    b.launch_kernel(kernel_name(b.gpu, "gemm"), round(rng.uniform(40, 60), 3))
                with b.cpu_op("vllm::all_reduce"):
                    with b.cpu_op("_C_custom_ar::all_reduce"):
                        b.launch_kernel(CUSTOM_AR_KERNEL, round(rng.uniform(12, 20), 3))
                with b.cpu_op("aten::_fused_rms_norm"):
                    b.launch_kernel(kernel_name(b.gpu, "reduce"), round(rng.uniform(5, 8), 3))
            b.sync("cudaDeviceSynchronize")
    planted = {**_comm_truth(b, {CUSTOM_AR_KERNEL}), "collectives": layers * steps}
    return _finish(b, "custom_all_reduce", {"seed": seed, "steps": steps, "layers": layers, "layout": layout,
                                            "vendor": vendor, "gpu": b.gpu}, planted)


#: Every scenario by name (``scenario_regression``/``scenario_multi_rank`` need extra arguments).
SCENARIOS: dict[str, Any] = {
    "idle_gaps": scenario_idle_gaps,
    "launch_bound": scenario_launch_bound,
    "compute_bound": scenario_compute_bound,
    "input_bound": scenario_input_bound,
    "comm_bound": scenario_comm_bound,
    "sync_bound": scenario_sync_bound,
    "copies": scenario_copies,
    "memory_growth": scenario_memory_growth,
    "multi_rank": scenario_multi_rank,
    "regression": scenario_regression,
    "resnet_like": scenario_resnet_like,
    "inference": scenario_inference,
    "moe_deepep": scenario_moe_deepep,
    "custom_all_reduce": scenario_custom_all_reduce,
}
