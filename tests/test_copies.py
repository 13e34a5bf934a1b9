"""copies analysis: hand-built traces, generator ground truth, every real trace in ../shared."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import REFUSED, shared_model, shared_params, shared_results
from support import synthetic
from support.events import gpu, launch
from support.events import x as _x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._callsites import is_user_frame
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.load.chrome_trace import build_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "data" / "traces"
def _copy(ts: float, corr: int, memcpy: str, nbytes: int, api: str = "cudaMemcpyAsync", gpu_dur: float = 10.0,
          ops: tuple[str, ...] = ("aten::to", "aten::_to_copy", "aten::copy_")) -> list[dict[str, Any]]:
    """A nest of copy ops (1 µs apart) with the runtime call and the GPU memcpy it issued."""
    evs = [_x("cpu_op", op, ts + i, 50 - 2 * i) for i, op in enumerate(ops)]
    evs += launch(corr, ts + len(ops), 20, ts + 30, gpu_dur, memcpy, api=api, cat="gpu_memcpy", bytes=nbytes)
    return evs


def _model(events: list[dict[str, Any]], **top: Any) -> Any:
    return build_model(Path("x.json"), {"schemaVersion": 1, "traceEvents": events, **top})


def _run(model: Any, config: Config | None = None) -> Any:
    r = run_analyses(model, config=config, only=("copies",), strict=True)
    if "copies" not in r.values:
        raise NotApplicable(r.skipped.get("copies", "?"))
    return r["copies"]


def _step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return _x("user_annotation", f"ProfilerStep#{n}", ts, dur)


# --------------------------------------------------------------------------------------------
# Hand-built traces
# --------------------------------------------------------------------------------------------


def test_directions_memory_bandwidth_and_nesting() -> None:
    # GIVEN one step with a pageable HtoD (nested to > _to_copy > copy_), a pinned HtoD,
    # a DtoH into pageable memory, a no-op aten::to and a memset
    ev = [_step(1, 0, 1000)]
    ev += _copy(100, 1, "Memcpy HtoD (Pageable -> Device)", 4_000_000, gpu_dur=400)
    ev += _copy(300, 2, "Memcpy HtoD (Pinned -> Device)", 1000, gpu_dur=1)
    ev += _copy(500, 3, "Memcpy DtoH (Device -> Pageable)", 2000, api="cudaMemcpy", gpu_dur=2)
    ev.append(_x("cpu_op", "aten::to", 700, 3))  # returns self: not a copy
    ev.append(_x("cuda_runtime", "cudaMemsetAsync", 800, 5, correlation=9))
    ev.append(gpu("gpu_memset", "Memset (Device)", 810, 1, 9, bytes=64))
    # WHEN
    c = _run(_model(ev))
    # THEN the nests count once and the no-op to is set aside
    t = c.totals
    assert t["copy_ops"] == 3 and t["noop_copy_ops"] == 1
    assert (t["memcpy_count"], t["memcpy_bytes"], t["memcpy_gpu_ns"]) == (3, 4_003_000, 403_000)
    assert (t["memset_count"], t["memset_bytes"]) == (1, 64)
    assert t["pageable_count"] == 2 and t["pinned_count"] == 1 and t["sync_api_count"] == 1
    assert t["by_direction"]["HtoD"] == {"count": 2, "bytes": 4_001_000, "gpu_ns": 401_000, "gbps": 9.978}
    # in one order whatever order the group-by produced them in (to_json is compared byte for byte)
    assert list(t["by_direction"]) == ["DtoH", "HtoD"]
    rows = {r["direction"] + "/" + (r["host_memory"] or ""): r for r in c.copies.to_dicts()}
    assert set(rows) == {"HtoD/pageable", "HtoD/pinned", "DtoH/pageable"}
    assert rows["HtoD/pageable"]["host_blocking"] and not rows["HtoD/pinned"]["host_blocking"]
    assert rows["DtoH/pageable"]["api_mode"] == "sync"
    assert rows["HtoD/pageable"]["cpu_ns"] == 50_000 and rows["HtoD/pageable"]["gpu_ns"] == 400_000
    assert rows["HtoD/pageable"]["op"] == "aten::to" and rows["HtoD/pageable"]["step"] == 1
    ev_gbps = c.transfers.filter(pl.col("bytes") == 4_000_000)["gbps"].item()
    assert ev_gbps == pytest.approx(10.0)
    # per-step totals and share of step time
    ps = c.per_step.row(0, named=True)
    assert ps["step"] == 1 and ps["copies"] == 3 and ps["memcpy"] == 3 and ps["bytes"] == 4_003_000
    assert ps["gpu_ns"] == 403_000 and ps["pct_gpu"] == pytest.approx(40.3)
    # no stacks: the site is the op chain, and the result says with_stack would name the line
    assert not c.has_stacks and c.stack_hint and "with_stack=True" in c.stack_hint
    assert set(c.by_site["site"]) == {"aten::to"}
    assert any("with_stack=True" in v for _, v in c.summary())
    assert set(c.tables()) >= {"Copy hotspots by CPU op", "Copy hotspots by call site", "Copies per step"}
    json.dumps(c.to_json())


def test_rocm_host_memory_is_unknown_and_loose_memcpy_attributed_to_annotation() -> None:
    # GIVEN a ROCm trace: memcpy names say only "Host"; one copy issued outside any copy op,
    # under a record_function range
    ev = [
        _x("user_annotation", "## load_batch ##", 0, 200),
        _x("cuda_runtime", "hipMemcpyWithStream", 10, 30, correlation=5),
        _x("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 20, 10, pid=2, tid=0, device=2, stream=0,
           correlation=5, bytes=800),
    ]
    c = _run(_model(ev, roctracer_version=4))
    row = c.copies.row(0, named=True)
    assert row["source"] == "memcpy" and row["host_memory"] == "unknown" and row["api_mode"] == "sync"
    assert row["op"] == "(no CPU op)" and row["site"] == "## load_batch ##"
    assert c.totals["unknown_memory_count"] == 1 and c.totals["pageable_count"] == 0


def test_python_call_site_and_library_frames() -> None:
    # GIVEN with_stack frames: user train.py:42 → torch/nn/modules/module.py → the copy
    ev = [
        _x("python_function", "threading.py(1000): run", 0, 500),
        _x("python_function", "train.py(42): forward", 10, 400),
        _x("python_function", "mylib/data.py(7): to_gpu", 20, 300),
        _x("python_function", "torch/nn/modules/module.py(1743): _call_impl", 30, 200),
        _x("python_function", "<built-in method to of Tensor object at 0x1>", 40, 100),
    ]
    ev += _copy(50, 1, "Memcpy HtoD (Pinned -> Device)", 100)
    c = _run(_model(ev))
    site = c.by_site.row(0, named=True)
    assert site["site"] == "mylib/data.py:7 (to_gpu)" and site["site_kind"] == "python"
    assert site["via"] == "torch/nn/modules/module.py:1743 (_call_impl)"
    # treating "mylib" as library moves the site to the caller
    c2 = _run(_model(ev), Config({"copies.library_modules": "mylib"}))
    assert c2.by_site["site"].to_list() == ["train.py:42 (forward)"]


@pytest.mark.parametrize(
    ("name", "user"),
    [
        ("train.py(184): <module>", True),
        ("/home/me/proj/model.py(3): f", True),
        ("threading.py(1032): _bootstrap", False),
        ("torch/nn/modules/module.py(1743): _call_impl", False),
        ("transformers/models/qwen2/modeling_qwen2.py(218): forward", False),
        ("/usr/lib/python3.11/contextlib.py(81): inner", False),
        ("/venv/lib/python3.12/site-packages/foo/bar.py(3): g", False),
        ("<built-in method item of Tensor object at 0x7f>", False),
        ("<frozen os>(717): __getitem__", False),
        ("nn.Module: Linear_0", False),
    ],
)
def test_user_frame_predicate(name: str, user: bool) -> None:
    assert is_user_frame(name) is user


def test_not_applicable_without_copies() -> None:
    ev = [_x("cpu_op", "aten::mm", 0, 10), _x("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1)]
    r = run_analyses(_model(ev), only=("copies",))
    assert "copies" in r.skipped and "memcpy" in r.skipped["copies"]


def test_cpu_only_copies_are_host_copies() -> None:
    ev = [_x("cpu_op", "aten::clone", 0, 10), _x("cpu_op", "aten::copy_", 1, 8)]
    c = _run(_model(ev))
    assert c.totals["copy_ops"] == 1 and c.copies["direction"].to_list() == ["host"]
    assert c.totals["memcpy_count"] == 0 and not c.has_steps


# --------------------------------------------------------------------------------------------
# Ground truth from the synthetic generator
# --------------------------------------------------------------------------------------------


def _site(call_site: str) -> str:
    path, rest = call_site.split("(", 1)
    line, func = rest.split("): ", 1)
    return f"{path}:{line} ({func})"


@pytest.mark.parametrize(
    ("layout", "vendor"), [("modern", "nvidia"), ("pt_1_13", "nvidia"), ("modern", "amd"), ("modern", "xpu")]
)
def test_scenario_copies_ground_truth(layout: synthetic.Layout, vendor: synthetic.Vendor) -> None:
    doc, truth = synthetic.scenario_copies(layout=layout, vendor=vendor)
    c = _run(build_model(Path("x.json"), doc))
    planted = truth["planted"]
    got = {r["site"]: (r["count"], r["bytes"]) for r in c.by_site.to_dicts()}
    assert got == {_site(s): (v["count"], v["bytes"]) for s, v in planted["by_call_site"].items()}
    rows = planted["copies"]
    t = c.totals
    assert t["memcpy_count"] == len(rows) == t["copies"]
    assert t["memcpy_bytes"] == sum(r["bytes"] for r in rows)
    assert t["memcpy_gpu_ns"] == sum(r["dur_ns"] for r in rows)
    assert t["memcpy_api_cpu_ns"] == sum(r["runtime_dur_ns"] for r in rows)
    if vendor == "xpu":  # urEnqueueUSMMemcpy's blocking flag is not in the trace: "unknown", not guessed
        assert t["sync_api_count"] == 0 and set(c.transfers["api_mode"]) == {"unknown"}
    else:
        assert t["sync_api_count"] == planted["sync_memcpy"]
    assert t["by_direction"]["DtoH"]["count"] == planted["dtoh"]
    htod_host = [r for r in rows if r["kind"] == "HtoD"]
    if vendor == "amd":  # ROCm names carry no pinned/pageable: never guessed
        assert t["pageable_count"] == 0 and t["pinned_count"] == 0
        assert t["unknown_memory_count"] == len(htod_host) + planted["dtoh"]
    else:
        assert t["pageable_count"] == planted["pageable_htod"] + planted["dtoh"]
        assert t["pinned_count"] == sum(1 for r in htod_host if r["pinned"])
        assert t["host_blocking_count"] == planted["blocking"]
    # per step: every copy lies in a step
    assert int(c.per_step["copies"].sum()) == len(rows)
    per_step_truth = [sum(1 for r in rows if r["step"] == i) for i in range(truth["params"]["steps"])]
    assert c.per_step["copies"].to_list() == per_step_truth


# --------------------------------------------------------------------------------------------
# Real traces: no crash, totals equal to an independent sum of the memcpy events
# --------------------------------------------------------------------------------------------


def _real_files() -> list[Path]:
    if not TRACES.exists():
        return []
    # The files the loader refuses by design are checked in test_shared_traces.
    return sorted(p for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                  and str(p.relative_to(TRACES)) not in REFUSED)


# One memcpy event object: flat except for its (flat) args object.
# MTIA device events are objects of the same shape; their DMA requests are copies.
_MEMCPY_OBJ = re.compile(rb'\{[^{}]*"cat":\s*"(?:gpu_memcpy|Memcpy|mtia_ccp_events)"[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')
_MEMCPY_CAT = re.compile(rb'"cat":\s*"(?:gpu_memcpy|Memcpy|mtia_ccp_events)"')


def _independent_memcpy(path: Path) -> tuple[int, int, int]:
    """Count, bytes and duration (ns) of the memcpy events (MTIA: ``dma_request``, bytes in
    ``args.size``), read with gzip + json only.

    Each memcpy event object is cut out of the text and decoded with ``json`` (decoding
    the whole 50–85 MB files with ``json`` would dominate the test time); every
    occurrence of the category must belong to a decoded object, so none is missed.
    """
    raw = path.read_bytes()
    text = gzip.decompress(raw) if path.name.endswith(".gz") else raw
    # Only the last "{" before each occurrence of the category can start its object (no brace
    # lies between them), so the object pattern is tried there alone instead of at every "{"
    # of the file (the same objects, several times faster on the 50–85 MB traces).
    objs = []
    for cat in _MEMCPY_CAT.finditer(text):
        m = _MEMCPY_OBJ.match(text, text.rfind(b"{", 0, cat.start()))
        assert m is not None and m.end() > cat.end(), f"memcpy object at byte {cat.start()} not cut out"
        objs.append(json.loads(m.group()))
    n = nbytes = dur = 0
    for e in objs:
        d = e.get("dur")
        if e.get("ph") != "X" or not isinstance(d, (int, float)) or d < 0 or not isinstance(e.get("ts"), (int, float)):
            continue
        mtia = e.get("cat") == "mtia_ccp_events"
        if mtia and e.get("name") != "dma_request":
            continue
        n += 1
        nbytes += int((e.get("args") or {}).get("size" if mtia else "bytes") or 0)
        dur += round(d * 1000)
    return n, nbytes, dur


@pytest.mark.skipif(not TRACES.exists(), reason="../shared reference traces not present")
@pytest.mark.parametrize("path", shared_params(_real_files()))
def test_real_trace_totals(path: Path) -> None:
    model = shared_model(path)
    r = shared_results(path)
    n, nbytes, dur = _independent_memcpy(path)
    if "copies" not in r.values:
        assert n == 0 and model.memset.height == 0
        return
    t = r["copies"].totals
    assert (t["memcpy_count"], t["memcpy_bytes"], t["memcpy_gpu_ns"]) == (n, nbytes, dur)
    json.dumps(r["copies"].to_json())
    if "syncs" in r.values:
        json.dumps(r["syncs"].to_json())


def test_containing_binary_search_matches_the_asof_join(monkeypatch: pytest.MonkeyPatch) -> None:
    """containing: the numpy route = the as-of join on disjoint outer rows per thread (zero-length
    rows hold their own instant; points outside, before, on other threads)."""
    import random

    import polars as pl

    from traceanalyzer.analyses import _copysync as C

    rng = random.Random(7)
    for _ in range(60):
        rows: list[tuple[int, int, int, int, int]] = []
        for pid in (1, 2):
            for tid in (1, 2):
                t = rng.randint(0, 4)
                for _ in range(rng.randint(0, 6)):
                    d = rng.choice([0, 1, 4, 10])
                    rows.append((pid, tid, t, t + d, 10 * len(rows)))
                    t += d + rng.randint(0 if d else 1, 5)
        if not rows:
            continue
        outer = pl.DataFrame(rows, schema={"pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64,
                                           "copy_id": pl.Int64}, orient="row")
        n = rng.randint(1, 40)
        df = pl.DataFrame({"pid": [rng.randint(1, 2) for _ in range(n)], "tid": [rng.randint(1, 3) for _ in range(n)],
                           "t": [rng.randint(-3, 70) for _ in range(n)]})
        assert C._containing_np(df, outer, "t", "copy_id") is not None
        fast = C.containing(df, outer, "t")
        with monkeypatch.context() as m:
            m.setattr(C, "_containing_np", lambda *_: None)
            assert C.containing(df, outer, "t").equals(fast)
    zero = pl.DataFrame({"pid": [1, 1], "tid": [1, 1], "ts_ns": [5, 8], "end_ns": [5, 12], "copy_id": [0, 1]})
    pts = pl.DataFrame({"pid": [1, 1, 1, 1, 2], "tid": [1, 1, 1, 1, 1], "t": [5, 6, 8, 12, 9]})
    assert C.containing(pts, zero, "t").to_list() == [0, None, 1, None, None]
