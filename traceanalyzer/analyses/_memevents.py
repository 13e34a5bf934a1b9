"""The device of a trace's ``[memory]`` events (private to the analyses package): shared by
``trace_memory`` and ``memory_per_op``."""

from __future__ import annotations

import polars as pl

# c10::DeviceType values as written in the [memory] events' "Device Type".
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 9: "xla", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia",
                20: "privateuse1"}


def device_name_expr() -> pl.Expr:
    """``cpu`` for host memory, ``<kind>:<id>`` for devices (``cuda:0``, ``hip:2``, ``type7:0``)."""
    kind = (
        pl.col("device_type")
        .replace_strict(DEVICE_TYPES, default=None, return_dtype=pl.String)
        .fill_null(pl.lit("type") + pl.col("device_type").cast(pl.String).fill_null("?"))
    )
    return pl.when(kind == "cpu").then(kind).otherwise(kind + ":" + pl.col("device_id").cast(pl.String).fill_null("?"))
