"""The device of a trace's ``[memory]`` events and the op each falls in (private to the
analyses package): shared by ``trace_memory`` and ``memory_per_op``."""

from __future__ import annotations

import polars as pl

from traceanalyzer.model.relations import TraceTables, op_index

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


def with_device_by_time(ev: pl.DataFrame, code: str | None = None) -> pl.DataFrame:
    """``ev`` (``[memory]`` events) with ``device`` (:func:`device_name_expr`), in time order
    (a stable sort by ``ts_ns``). The name is built once per distinct (device type, id), a
    handful, and joined back by those integers (not formatted per event); events already in
    time order, as a trace writes them, are not sorted again. With ``code``, a column of that
    name is added too: the device's rank among the distinct device names (``UInt32``, from 0
    in name order), an integer key equal exactly where the names are."""
    if ev.is_empty():
        out = ev.with_columns(device=device_name_expr())
        if code is not None:
            out = out.with_columns(pl.lit(None, pl.UInt32).alias(code))
    else:
        keys = ["device_type", "device_id"]
        names = ev.select(keys).unique().with_columns(device=device_name_expr())
        if code is not None:
            names = names.with_columns((pl.col("device").rank("dense").cast(pl.UInt32) - 1).alias(code))
        out = ev.drop("device", strict=False).join(names, on=keys, how="left", nulls_equal=True,
                                                   maintain_order="left")
        if "device" in ev.columns:  # with_columns would have replaced it in place
            out = out.select(ev.columns if code is None else [*ev.columns, code])
    t = out["ts_ns"]
    if t.null_count() == 0 and t.is_sorted():
        return out
    return out.sort("ts_ns", maintain_order=True)


def memory_ops(t: TraceTables) -> tuple[pl.DataFrame, pl.Series]:
    """The trace's ``[memory]`` events but the OOM ones, by :func:`with_device_by_time` with the
    device code ``_dev``, and aligned with them the ``id`` (row number in ``model.cpu_ops``) of
    the deepest CPU op on the event's thread whose span covers it (null outside every op).
    Built once per run (read-only): both memory analyses read them."""

    def build() -> tuple[pl.DataFrame, pl.Series]:
        model = t.model
        mem = with_device_by_time(model.memory_events.filter(~pl.col("oom")), code="_dev")
        if model.cpu_ops.is_empty() or mem.is_empty():
            return mem, pl.Series("id", [None] * mem.height, pl.Int64)
        return mem, op_index(t).lookup(mem.select("ts_ns", "pid", "tid"))

    return t.get("memory_ops", build)
