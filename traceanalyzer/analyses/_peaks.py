"""Device peaks: the table shipped in ``traceanalyzer/data/device_peaks.json`` and the match of a
trace's ``deviceProperties`` against it.

Each row has dense peaks in TFLOP/s (TOP/s for int8) for the vector (SIMT) units (``fp64``,
``fp32``) and the tensor/matrix cores (``*_tensor``), the memory bandwidth in TB/s, the SM/CU
count of the full part and its source. The first row whose ``match`` (a regular expression) is
found in the device name is the device. A device reporting fewer SMs/CUs than the full part
(MIG slice, one stack of a FLAT-mode Intel card, an MI250 GCD against the MI250X row) has every
peak scaled by the ratio (bandwidth too: an approximation, MIG slices memory by its own
fractions).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

#: Peak keys of a table row, in the order docs and JSON show them.
PEAK_KEYS = ("fp64", "fp64_tensor", "fp32", "fp32_tensor", "tf32_tensor", "fp16_tensor", "bf16_tensor",
             "fp8_tensor", "int8_tensor", "mem_bw_tbs")


@lru_cache(maxsize=1)
def peak_table() -> tuple[dict[str, Any], ...]:
    """The shipped rows (read once per process)."""
    text = resources.files("traceanalyzer").joinpath("data/device_peaks.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["devices"])


def find_row(name: str) -> dict[str, Any] | None:
    """The first row whose ``match`` is found in ``name``, or whose ``device`` equals it (any case)."""
    low = name.strip().lower()
    for row in peak_table():
        if row["device"].lower() == low:
            return row
    for row in peak_table():
        if re.search(row["match"], name, flags=re.IGNORECASE):
            return row
    return None


def _by_arch(props: dict[str, Any]) -> dict[str, Any] | None:
    """A row by ``computeMajor.computeMinor`` (ROCm: the gfx version) and the exact CU count, the
    closest memory size among several: ROCm builds that name every device "AMD Radeon Graphics"."""
    major, minor, sms = props.get("computeMajor"), props.get("computeMinor"), props.get("numSms")
    if not isinstance(major, int) or not isinstance(minor, int) or not isinstance(sms, int):
        return None
    rows = [r for r in peak_table() if r.get("arch") == f"{major}.{minor}" and r.get("full_sms") == sms]
    mem = props.get("totalGlobalMem")
    if len(rows) > 1 and isinstance(mem, int):
        rows.sort(key=lambda r: abs(float(r.get("mem_gb") or 0) - mem / 1e9))
    return rows[0] if rows else None


def device_peaks(props: dict[str, Any] | None, declared: str, overrides: dict[str, float]) -> dict[str, Any]:
    """The peaks the run is held to: ``{"device", "matched", "source", "scale", "sms", <PEAK_KEYS>}``.

    ``declared`` (the ``efficiency.device`` setting) wins over the trace's name; ``overrides``
    (``efficiency.<key>`` settings, > 0) replace single peaks after scaling. ``matched`` says how the
    device was found: ``declared``, ``trace`` (by name), ``trace_arch`` (a generic ROCm name: by gfx
    version and CU count), or ``none`` (every peak null unless overridden).
    """
    props = props or {}
    trace_name = str(props.get("name") or "")
    row = find_row(declared) if declared else (find_row(trace_name) if trace_name else None)
    matched = "none" if row is None else ("declared" if declared else "trace")
    if row is None and not declared:
        row = _by_arch(props)
        matched = "none" if row is None else "trace_arch"
    sms = props.get("numSms") or props.get("maxComputeUnits")
    scale = 1.0
    full = row.get("full_sms") if row else None
    if row is not None and not declared and isinstance(sms, int) and isinstance(full, int) and 0 < sms < full:
        scale = sms / full
    out: dict[str, Any] = {
        "device": row["device"] if row else (declared or trace_name or None),
        "trace_name": trace_name or None, "matched": matched,
        "source": row["source"] if row else None, "note": (row.get("note") or None) if row else (
            f"{declared or trace_name or 'the device'!r} is not in the peak table: set its peaks "
            "(efficiency.bf16_tensor, efficiency.mem_bw_tbs …) or efficiency.device to a row's name"),
        "scale": scale, "sms": sms if isinstance(sms, int) else None,
    }
    for k in PEAK_KEYS:
        v = row.get(k) if row else None
        out[k] = float(v) * scale if isinstance(v, (int, float)) else None
    for k, v in overrides.items():
        if v > 0:
            out[k] = float(v)
            out["matched"] = out["matched"] if out["matched"] != "none" else "declared"
    return out


def peak_key(unit: str, precision: str | None, tf32: bool = False) -> str | None:
    """The row key a call of this ``unit``/``precision`` is held to (None: no peak applies).

    Matrix work: the tensor/matrix peak of its precision (fp32 inputs: the TF32 peak when the
    kernel ran TF32, else the FP32 matrix peak where the device has one, else the SIMT FP32 peak).
    Vector work: the FP64 vector peak for double, the FP32 vector peak otherwise."""
    if unit == "vector":
        return "fp64" if precision == "fp64" else "fp32"
    return {
        "fp64": "fp64_tensor", "fp32": "tf32_tensor" if tf32 else "fp32_tensor", "fp16": "fp16_tensor",
        "bf16": "bf16_tensor", "fp8": "fp8_tensor", "int8": "int8_tensor",
    }.get(precision or "")


def resolve_peak(peaks: dict[str, Any], key: str | None) -> tuple[str | None, float | None]:
    """(key used, TFLOP/s) with the fallbacks of :func:`peak_key`: a missing matrix peak falls back to
    the vector peak of the same width (``fp64_tensor`` → ``fp64``, ``fp32_tensor`` → ``fp32``; fp16/bf16
    on a device without such tensor cores → ``fp32``)."""
    if key is None:
        return None, None
    chain = {"fp64_tensor": ("fp64_tensor", "fp64"), "fp32_tensor": ("fp32_tensor", "fp32"),
             "tf32_tensor": ("tf32_tensor", "fp32_tensor", "fp32"), "fp16_tensor": ("fp16_tensor", "fp32"),
             "bf16_tensor": ("bf16_tensor", "fp32")}.get(key, (key,))
    for k in chain:
        v = peaks.get(k)
        if v:
            return k, float(v)
    return None, None
