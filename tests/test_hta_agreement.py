"""Agreement with HolisticTraceAnalysis 0.5.0 on the shared real traces.

``tests/data/hta_reference.json`` holds HTA's figures (scripts/hta_reference.py). For
each trace with GPU activity we run *our* analyses twice:

* on the model restricted to HTA's scope — GPU activity whose launching runtime call
  starts before the last ``ProfilerStep`` (HTA drops the last step when there are ≥ 2) —
  where the definitions are the same: temporal breakdown (idle / compute / non-compute
  over first-to-last GPU activity), per-stream idle totals, joined launches of HTA's four
  launch APIs. HTA's µs rounding of ns timestamps is applied to our events, and the rows
  HTA wrongly counts as GPU time (``cuda_sync`` events, Triton launcher CPU ops carrying
  a stream arg) are added (:func:`hta_quirks`). They must agree within 1 % of HTA's
  window (at least 2 µs);
* on the whole trace, where we differ on purpose (we keep the last step and join every
  launch API); the difference is pinned to exactly what HTA leaves out.

Skips cleanly when ../shared or the reference file is absent. Set
``TRACEANALYZER_ALL_TRACES=1`` to include the large traces (slow).
"""

from __future__ import annotations

import dataclasses
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.launches import HTA_LAUNCH_APIS
from traceanalyzer.load.chrome_trace import load_chrome_trace
from traceanalyzer.model import TraceModel
from traceanalyzer.timeutil import union_length_ns

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "data" / "traces"
REF = Path(__file__).resolve().parent / "data" / "hta_reference.json"
# The reference trace and the ns-resolution one always run; others when small.
ALWAYS = {
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
}
MAX_BYTES = 500_000  # compressed size included by default (keeps this file around 20 s)


def _reference() -> dict[str, Any]:
    if not REF.exists() or not TRACES.exists():
        return {}
    return json.loads(REF.read_text()).get("files", {})


def _cases() -> list[tuple[str, str]]:
    out = []
    everything = os.environ.get("TRACEANALYZER_ALL_TRACES") == "1"
    for rel, v in sorted(_reference().items()):
        if v.get("status") != "ok" or not (TRACES / rel).exists():
            continue
        big = (TRACES / rel).stat().st_size > MAX_BYTES
        if big and rel not in ALWAYS and not everything:
            continue
        for rank, r in (v.get("per_rank") or {}).items():
            tb = r.get("temporal_breakdown")
            if isinstance(tb, dict) and "kernel_time_us" in tb:
                out.append((rel, rank))
    return out


CASES = _cases()
pytestmark = pytest.mark.skipif(not CASES, reason="../shared traces or tests/data/hta_reference.json absent")


@cache
def _model(rel: str) -> TraceModel:
    return load_chrome_trace(TRACES / rel)


def _hta_round(df: pl.DataFrame) -> pl.DataFrame:
    """HTA's ns → µs rounding of float timestamps: ts = ceil(ts), end = floor(ts + dur)."""
    ts = (pl.col("ts_ns") + 999) // 1000 * 1000
    end = pl.max_horizontal(pl.col("end_ns") // 1000 * 1000, ts)
    return df.with_columns(ts_ns=ts, end_ns=end).with_columns(dur_ns=pl.col("end_ns") - pl.col("ts_ns"))


def _with_mtia_markers(model: TraceModel) -> TraceModel:
    """MTIA ``event_record``/``event_wait`` rows as kernels: HTA keeps every
    ``mtia_ccp_events`` row with a stream as GPU work ("compute" by its name regex, and a
    stream's activity in its idle breakdown). Their stream is the device thread's name
    (``Stream 105``), as the MTIA profiler writes it; our model keeps them aside."""
    mk = model.other_events.filter(pl.col("cat") == "mtia_ccp_events")
    if mk.is_empty():
        return model
    th = model.threads.filter(pl.col("name").str.starts_with("Stream ")).select(
        pl.col("pid").cast(pl.String), pl.col("tid").cast(pl.String),
        stream=pl.col("name").str.extract(r"(\d+)$").cast(pl.Int64),
    ).unique(["pid", "tid"])
    rows = mk.join(th, on=["pid", "tid"], how="inner").select(
        "name", "ts_ns", "dur_ns", "end_ns", device=pl.col("pid").cast(pl.Int64, strict=False), stream="stream"
    )
    kernels = pl.concat([model.kernels, rows], how="diagonal_relaxed").select(
        [pl.col(c).cast(t) for c, t in model.kernels.schema.items()]
    )
    return dataclasses.replace(model, kernels=kernels)


def hta_scope(
    model: TraceModel, ref_rank: dict[str, Any], rounding: bool = True, markers: bool = True
) -> TraceModel:
    """The model as HTA sees it: GPU activity launched before the last step (when HTA
    drops it), MTIA's stream-event markers counted as kernels (``markers``), and, for
    ns-resolution traces, every time rounded to HTA's whole µs (``rounding``)."""
    if markers:
        model = _with_mtia_markers(model)
    if rounding:
        model = dataclasses.replace(
            model, **{t: _hta_round(model.table(t)) for t in ("kernels", "memcpy", "memset", "runtime")}
        )
    st = ref_rank.get("steps") or {}
    if not st.get("filter_applied"):
        return model
    cutoff_ns = int(st["cpu_kept_before_ts"]) * 1000 + model.meta.base_time_ns
    kept = model.runtime.filter(pl.col("ts_ns") < cutoff_ns)["correlation"].drop_nulls().unique()
    keep = pl.col("correlation").is_in(kept.implode())
    return dataclasses.replace(
        model,
        kernels=model.kernels.filter(keep),
        memcpy=model.memcpy.filter(keep),
        memset=model.memset.filter(keep),
        runtime=model.runtime.filter(pl.col("ts_ns") < cutoff_ns),
    )


def hta_quirks(model: TraceModel, ref_rank: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows HTA's temporal breakdown counts as GPU time although they are not device work.

    HTA takes every row with ``args.stream`` (``stream != -1``): ``cuda_sync`` events
    (Stream/Context Sync, Stream Wait Event: "non-compute" by its name regex) and the CPU
    ops of Triton launchers, which record the stream they launch on ("compute"). Returns
    (extra compute, extra non-compute) intervals, cut like HTA's last-step filter.
    """
    st = ref_rank.get("steps") or {}
    cut = (
        int(st["cpu_kept_before_ts"]) * 1000 + model.meta.base_time_ns if st.get("filter_applied") else None
    )
    sync = _hta_round(model.other_events.filter(pl.col("cat") == "cuda_sync").select("ts_ns", "end_ns", "dur_ns"))
    trit = _hta_round(
        model.cpu_ops.filter(pl.col("name").str.starts_with("triton_")).select("ts_ns", "end_ns", "dur_ns")
    )
    if cut is not None:
        sync, trit = sync.filter(pl.col("ts_ns") < cut), trit.filter(pl.col("ts_ns") < cut)
    return trit.select("ts_ns", "end_ns"), sync.select("ts_ns", "end_ns")


def _ours(
    model: TraceModel, quirks: tuple[pl.DataFrame, pl.DataFrame] | None = None, streams: bool = False
) -> dict[str, Any]:
    from traceanalyzer.analyses._intervals import gpu_activity_classes

    res = run_analyses(model, only=("launches", "idle_gaps") if streams else ("launches",), strict=True)
    # HTA unions all devices of a rank together; with one device this is gpu_time's gpu_span.
    cls = gpu_activity_classes(model).select("ts_ns", "end_ns", "category")
    comp = cls.filter(pl.col("category") == "compute").select("ts_ns", "end_ns")
    busy_iv = cls.select("ts_ns", "end_ns")
    if quirks is not None:
        comp = pl.concat([comp, quirks[0]])
        busy_iv = pl.concat([busy_iv, quirks[0], quirks[1]])
    busy = union_length_ns(busy_iv["ts_ns"], busy_iv["end_ns"])
    compute = union_length_ns(comp["ts_ns"], comp["end_ns"])
    window = int(busy_iv["end_ns"].max()) - int(busy_iv["ts_ns"].min())  # type: ignore[arg-type]
    idle = (
        {str(r["stream"]): r["idle_ns"] for r in res["idle_gaps"].per_stream.iter_rows(named=True)} if streams else {}
    )
    lt = res["launches"].table if "launches" in res else pl.DataFrame(schema={"api": pl.String})
    return {
        "window_ns": window,
        "idle_ns": window - busy,
        "compute_ns": compute,
        "non_compute_ns": busy - compute,
        "streams": idle,
        "joined_hta_apis": lt.filter(pl.col("api").is_in(HTA_LAUNCH_APIS)).height,
        "joined_all": lt.height,
    }


@cache
def _computed(rel: str, rank: str) -> dict[str, Any] | None:
    """Our numbers for one (trace, rank): HTA scope with and without quirks, whole trace."""
    ref = _reference()[rel]["per_rank"][rank]
    model = _model(rel)
    if not model.has_gpu:
        return None
    scope, quirks = hta_scope(model, ref), hta_quirks(model, ref)
    with_q = _ours(scope, quirks, streams=True)
    return {
        "ours": with_q,
        "plain": _ours(scope) if quirks[1].height else with_q,
        "full": _ours(model),
        # Like cuda_sync rows, MTIA markers are a difference we keep on purpose (not work).
        "scoped_unrounded": _ours(hta_scope(model, ref, rounding=False, markers=False)),
        "sync_us": union_length_ns(quirks[1]["ts_ns"], quirks[1]["end_ns"]) / 1000,
    }


@pytest.mark.parametrize(("rel", "rank"), CASES, ids=[f"{r}#{k}" for r, k in CASES])
def test_same_definitions_agree_with_hta(rel: str, rank: str) -> None:
    ref = _reference()[rel]["per_rank"][rank]
    c = _computed(rel, rank)
    if c is None:
        pytest.skip("no GPU activity in our model")
    ours, plain = c["ours"], c["plain"]
    tb = ref["temporal_breakdown"]
    window_us = tb["kernel_time_us"]
    tol_us = max(0.01 * window_us, 2.0)
    # HTA keeps only the cuda_sync rows it could correlate to a kept CPU event, which our
    # model cannot tell: where there are any, the difference may be up to their effect.
    for key, ref_key in (("window_ns", "kernel_time_us"), ("idle_ns", "idle_us"),
                         ("compute_ns", "compute_us"), ("non_compute_ns", "non_compute_us")):
        lo, hi = sorted((ours[key] / 1000, plain[key] / 1000))
        assert lo - tol_us - c["sync_us"] <= tb[ref_key] <= hi + tol_us + c["sync_us"], (key, lo, hi, tb[ref_key])
    idle = ref.get("idle_time_breakdown") or {}
    for stream, s in (idle.get("streams") or {}).items():
        if "total_idle_us" not in s:
            continue
        assert ours["streams"].get(stream, 0) / 1000 == pytest.approx(s["total_idle_us"], abs=tol_us), stream
    ls = ref.get("launch_stats") or {}
    if "joined_launches" in ls:
        n = ls["joined_launches"]
        assert ours["joined_hta_apis"] == pytest.approx(n, abs=max(0.01 * n, 1))


@pytest.mark.parametrize(("rel", "rank"), CASES, ids=[f"{r}#{k}" for r, k in CASES])
def test_deliberate_differences_are_exactly_what_hta_leaves_out(rel: str, rank: str) -> None:
    ref = _reference()[rel]["per_rank"][rank]
    c = _computed(rel, rank)
    if c is None:
        pytest.skip("no GPU activity in our model")
    full, scoped = c["full"], c["scoped_unrounded"]
    # Launches: ours = HTA's APIs in HTA's scope + the last step + the APIs HTA ignores.
    assert full["joined_all"] >= full["joined_hta_apis"] >= scoped["joined_hta_apis"]
    n_ref = (ref.get("launch_stats") or {}).get("joined_launches")
    if n_ref is not None:
        extra_last_step = full["joined_hta_apis"] - scoped["joined_hta_apis"]
        extra_apis = full["joined_all"] - full["joined_hta_apis"]
        assert full["joined_all"] - n_ref == pytest.approx(extra_last_step + extra_apis, abs=max(0.01 * n_ref, 1))
    # Window: keeping the last step can only widen it.
    assert full["window_ns"] >= scoped["window_ns"]
