"""``prof.export_memory_timeline`` outputs → :class:`~traceanalyzer.model.memory.MemoryTimelineModel`.

Two layouts, told apart by content:

* stacked (``.json``/``.json.gz``): ``[times_us, sizes]`` where ``sizes[i]`` holds the
  bytes per category after sample ``i``: 9 ints, column 0 unused, 1–8 in
  :data:`~traceanalyzer.model.memory.TIMELINE_CATEGORIES` order;
* raw (``.raw.json.gz``): ``[[t_ns, action, delta_bytes, category_index], …]`` with
  action 1 PREEXISTING (t = −1), 2 CREATE, 3 INCREMENT_VERSION, 4 DESTROY and
  category index 0–7 (null/8 = unknown).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer.errors import InputError
from traceanalyzer.load.jsonio import parse_json, read_bytes
from traceanalyzer.model.memory import (
    TIMELINE_CATEGORIES,
    TIMELINE_SCHEMAS,
    MemoryTimelineMeta,
    MemoryTimelineModel,
)

_ACTIONS = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}


def _stacked(path: Path, doc: list[Any]) -> pl.DataFrame:
    import numpy as np  # lazy: a trace run never pays numpy's import
    times, sizes = doc[0], doc[1]
    if not isinstance(times, list) or not isinstance(sizes, list) or len(times) != len(sizes):
        raise InputError(path, "memory timeline: expected [times, sizes] of equal length")
    k = len(TIMELINE_CATEGORIES)
    try:
        arr = np.array([(list(r) + [0] * (k + 1))[: k + 1] for r in sizes], dtype=np.int64).reshape(-1, k + 1)
        ts = np.array(times, dtype=np.int64) * 1000
    except (TypeError, ValueError):
        raise InputError(path, "memory timeline: sizes/times are not integers") from None
    data = {"ts_ns": ts, **{f"{c}_bytes": arr[:, i + 1] for i, c in enumerate(TIMELINE_CATEGORIES)}}
    return pl.DataFrame(data).with_columns(
        total_bytes=pl.sum_horizontal([f"{c}_bytes" for c in TIMELINE_CATEGORIES])
    ).select(list(TIMELINE_SCHEMAS["samples"]))


def _raw(path: Path, doc: list[Any]) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    try:
        rows = [(int(r[0]), int(r[1]), int(r[2]), None if r[3] is None else int(r[3])) for r in doc]
    except (TypeError, ValueError, IndexError):
        raise InputError(path, "memory timeline: raw rows are not [t_ns, action, bytes, category]") from None
    ev = pl.DataFrame(rows, schema={"t": pl.Int64, "a": pl.Int64, "d": pl.Int64, "c": pl.Int64}, orient="row")
    n_pre = ev.filter(pl.col("t") < 0).height
    t_min = ev.filter(pl.col("t") >= 0)["t"].min()
    cats = pl.Series(list(TIMELINE_CATEGORIES))
    events = ev.select(
        # pre-existing allocations are placed at the first timestamp (as torch does)
        ts_ns=pl.when(pl.col("t") < 0).then(pl.lit(t_min)).otherwise(pl.col("t")),
        action=pl.col("a").replace_strict(_ACTIONS, default="unknown", return_dtype=pl.String),
        delta_bytes=pl.col("d"),
        category=pl.col("c").fill_null(7).clip(0, 7).map_elements(lambda i: cats[i], return_dtype=pl.String),
    )
    cols = {}
    for c in TIMELINE_CATEGORIES:
        cols[f"{c}_bytes"] = pl.when(pl.col("category") == c).then(pl.col("delta_bytes")).otherwise(0).cum_sum()
    samples = events.sort("ts_ns", maintain_order=True).with_columns(**cols).select(
        "ts_ns", *cols).with_columns(total_bytes=pl.sum_horizontal(list(cols)))
    return samples.select(list(TIMELINE_SCHEMAS["samples"])), events, n_pre


def load_memory_timeline(path: str | Path) -> MemoryTimelineModel:
    """Load an ``export_memory_timeline`` JSON (plain or gzip; stacked or raw)."""
    p = Path(path)
    data, warnings = read_bytes(p)
    parsed = parse_json(p, data)
    warnings += parsed.warnings
    doc = parsed.doc
    if not isinstance(doc, list) or not doc:
        raise InputError(p, "not a memory timeline export (expected a JSON array)")
    events = pl.DataFrame(schema=TIMELINE_SCHEMAS["events"])
    n_pre = 0
    if len(doc) == 2 and isinstance(doc[0], list) and doc[0] and not isinstance(doc[0][0], list) \
            and isinstance(doc[1], list) and (not doc[1] or isinstance(doc[1][0], list)) and len(doc[0]) != 4:
        layout = "stacked"
        samples = _stacked(p, doc)
    elif all(isinstance(r, list) and len(r) == 4 for r in doc[:100]):
        layout = "raw"
        samples, events, n_pre = _raw(p, doc)
    else:
        raise InputError(p, "a JSON array of arrays, but neither [times, sizes] nor raw [t, action, bytes, category]")
    return MemoryTimelineModel(
        meta=MemoryTimelineMeta(
            path=str(p), file_bytes=p.stat().st_size, layout=layout, n_samples=samples.height,
            n_events=events.height, n_preexisting=n_pre,
            start_ns=samples["ts_ns"].min() if samples.height else None,  # type: ignore[arg-type]
            end_ns=samples["ts_ns"].max() if samples.height else None,  # type: ignore[arg-type]
        ),
        samples=samples, events=events, warnings=tuple(warnings),
    )
