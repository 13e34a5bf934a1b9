"""critical_path analysis: hand-built traces with a known path, HTA's overlaid output, real traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from conftest import SHARED_TRACES, needs_shared
from support.events import PID, STREAM, TID, Trace, x

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._cpgraph import CPGraph, _open_parents, _prev_running_max, _sort_rows, longest_path
from traceanalyzer.analyses.critical_path import CriticalPathResult, graph_and_path, path_tables
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.config import Config
from traceanalyzer.load.chrome_trace import load_chrome_trace
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import trace_tables

CP_DIR = SHARED_TRACES / "hta" / "critical_path"
US = 1000


class _Run:
    """The analysis's result, plus the path in full (``path_tables``: not part of the result)."""

    def __init__(self, res: CriticalPathResult, critical_events: pl.DataFrame, path_edges: pl.DataFrame) -> None:
        self.res, self.critical_events, self.path_edges = res, critical_events, path_edges

    def __getattr__(self, name: str) -> Any:
        return getattr(self.res, name)


def _run(model: TraceModel, **settings: Any) -> Any:
    cfg = Config({f"critical_path.{k}": v for k, v in settings.items()})
    r = run_analyses(model, cfg, only=("critical_path",), strict=True)
    assert "critical_path" in r.values, r.skipped
    res = r.values["critical_path"]
    assert isinstance(res, CriticalPathResult)
    steps = r.values["steps"]
    assert isinstance(steps, StepsResult)
    g, lp = graph_and_path(trace_tables(model), steps, res.cpu_gaps)
    assert lp.window_len and sum(lp.window_len.values()) == int(res.per_step["path_ns"].sum())
    return _Run(res, *path_tables(g, lp))


def _bound(res: CriticalPathResult) -> dict[str, int]:
    row = res.per_step.row(0, named=True)
    return {k[:-3]: v for k, v in row.items() if k.endswith("_ns") and k not in ("step_ns", "path_ns") and v}


def _cpu_bound_trace() -> Trace:
    t = Trace()
    t.step(1, 0, 200)
    t.op("aten::A", 0, 100)
    t.launch(10, 5, 20, 10, name="ampere_sgemm_128x64_tn")  # the GPU idles most of the step
    t.op("aten::B", 100, 100)
    return t


def test_cpu_bound_chain() -> None:
    res = _run(_cpu_bound_trace().model())
    assert res.per_step.height == 1
    assert res.per_step["path_ns"][0] == 200 * US
    assert _bound(res) == {"cpu_bound": 200 * US}
    bd = {r["bound_by"]: r["pct_of_path"] for r in res.breakdown.iter_rows(named=True)}
    assert bd["cpu_bound"] == pytest.approx(100.0)
    # The kernel hangs off the path (its launch starts a dead end on the GPU).
    assert set(res.critical_events["name"]) == {"aten::A", "aten::B", "cudaLaunchKernel"}
    cpu = res.whatif.filter(pl.col("target") == "cpu").row(0, named=True)
    assert cpu["saved_ns"] == pytest.approx(100 * US)  # every CPU edge halves
    gemm = res.whatif.filter(pl.col("target") == "gemm").row(0, named=True)
    assert gemm["saved_ns"] == 0 and gemm["path_moved_steps"] == 0


def _gpu_bound_trace(cuda_sync: bool = False) -> Trace:
    """A launches a 500 µs GEMM, the thread waits for it in cudaStreamSynchronize, then B."""
    t = Trace()
    t.step(1, 0, 540)
    t.op("aten::A", 0, 20)
    t.launch(5, 5, 12, 500, name="ampere_sgemm_128x64_tn")
    t.runtime("cudaStreamSynchronize", 30, 485)
    if cuda_sync:  # Kineto's record of it, on the stream it waited for
        t.events.append(x("cuda_sync", "Stream Sync", 31, 483, pid=0, tid=STREAM, stream=STREAM))
    t.op("aten::B", 520, 20)
    return t


@pytest.mark.parametrize("cuda_sync", [False, True])
def test_sync_edge_puts_gpu_on_path(cuda_sync: bool) -> None:
    res = _run(_gpu_bound_trace(cuda_sync).model())
    # 5 (A until the launch) + 7 (launch delay) + 500 (GEMM) + 0 (sync) + 5 (gap) + 20 (B)
    assert res.per_step["path_ns"][0] == 537 * US
    assert _bound(res) == {"cpu_bound": 30 * US, "gpu_compute_bound": 500 * US,
                           "gpu_kernel_launch_overhead": 7 * US}
    assert res.sync_source == ("cuda_sync events" if cuda_sync else "runtime calls")
    assert "ampere_sgemm_128x64_tn" in set(res.critical_events["name"])
    # HTA gives no weight to the gaps between top-level ops: 10 + 5 µs less.
    hta = _run(_gpu_bound_trace(cuda_sync).model(), cpu_gaps=False)
    assert hta.per_step["path_ns"][0] == 532 * US


def test_whatif_keeps_then_moves_path() -> None:
    model = _gpu_bound_trace().model()
    half = _run(model, whatif_target="gemm", whatif_factor=2.0).whatif.row(0, named=True)
    assert half["target"] == "gemm" and half["requested"]
    assert half["saved_ns"] == pytest.approx(250 * US) and half["path_moved_steps"] == 0
    assert half["new_step_ns"] == pytest.approx(half["step_ns"] - 250 * US)
    # 100× faster the GEMM (5 µs) ends before the CPU reaches the sync: the path moves to the CPU,
    # A (20) + gap (10) + sync (0) + gap (5) + B (20) = 55 µs instead of 537.
    fast = _run(model, whatif_target="gemm", whatif_factor=100.0).whatif.row(0, named=True)
    assert fast["saved_ns"] == pytest.approx((537 - 55) * US)
    assert fast["path_moved_steps"] == 1
    # A CPU op by name: B twice as fast saves 10 µs.
    op = _run(model, whatif_target="op:aten::B").whatif.row(0, named=True)
    assert op["saved_ns"] == pytest.approx(10 * US)
    assert _run(model).whatif.filter(pl.col("requested")).is_empty()
    # A target that names nothing is said, the other what-ifs kept.
    for bad in ("gemmm", "kernel:("):
        res = _run(model, whatif_target=bad)
        assert res.whatif_error and bad in res.whatif_error
        assert res.whatif.filter(pl.col("requested")).is_empty() and res.whatif.height > 0
        assert any(k == "What-if not run" for k, _ in res.summary())


def test_kernel_kernel_edge() -> None:
    t = Trace()
    t.step(1, 0, 220)
    t.launch(5, 5, 12, 100, name="k1")  # K1 112
    t.launch(11, 3, 115, 100, name="k2")  # launched while K1 was queued: waits for it, 3 µs gap
    t.runtime("cudaDeviceSynchronize", 20, 196)
    res = _run(t.model())
    b = _bound(res)
    assert b["gpu_kernel_kernel_overhead"] == 3 * US
    assert b["gpu_compute_bound"] == 200 * US
    assert b["gpu_kernel_launch_overhead"] == 7 * US
    # 5 µs before the first launch call (the thread's lead from the step start), then the GPU
    assert res.per_step["path_ns"][0] == (5 + 7 + 100 + 3 + 100) * US
    assert b["cpu_bound"] == 5 * US


def test_stream_wait_event_links_streams() -> None:
    """k2 on stream 8 waits (cudaStreamWaitEvent) for k1 on stream 7: the wait edge carries the path."""
    t = Trace()
    t.step(1, 0, 400)
    t.launch(5, 3, 10, 300, name="k1", stream=7)
    t.runtime("cudaEventRecord", 9, 1)
    t.runtime("cudaStreamWaitEvent", 11, 1)
    t.launch(13, 3, 311, 50, name="k2", stream=8)
    t.runtime("cudaDeviceSynchronize", 20, 342)
    res = _run(t.model())
    names = set(res.critical_events["name"])
    assert {"k1", "k2"} <= names
    # lead 5 µs to the first launch call, launch delay 5, k1 300, wait (0), k2 50
    assert res.per_step["path_ns"][0] == (5 + 5 + 300 + 50) * US
    assert res.path_edges.filter(pl.col("type") == "sync").height == 2  # wait edge + device sync


def _event_wait_trace(args: bool) -> Trace:
    """k2 (stream 8) waits on the event recorded after k1 (stream 7, 300 µs); a second event is
    recorded later after k0 (stream 9, 5 µs). Kineto's cuda_sync record of the wait names the
    first record (``wait_on_cuda_event_record_corr_id``) and its stream (``wait_on_stream``)."""
    t = Trace()
    t.step(1, 0, 400)
    t.launch(5, 3, 10, 300, name="k1", stream=7)
    rec1 = t.runtime("cudaEventRecord", 9, 1)
    t.launch(10, 2, 14, 5, name="k0", stream=9)
    t.runtime("cudaEventRecord", 13, 1)
    wait = t.runtime("cudaStreamWaitEvent", 15, 1)
    sync_args: dict[str, Any] = {"correlation": wait, "stream": 8}
    if args:
        sync_args |= {"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": rec1}
    t.events.append(x("cuda_sync", "Stream Wait Event", 15.5, 0.5, pid=0, tid=8, **sync_args))
    t.launch(17, 3, 311, 50, name="k2", stream=8)
    dev = t.runtime("cudaDeviceSynchronize", 21, 341)
    t.events.append(x("cuda_sync", "Context Sync", 21.5, 340, pid=0, tid=-1, correlation=dev, stream=-1))
    return t


def test_stream_wait_event_follows_the_event_record_args() -> None:
    """With the cuda_sync record's wait_on_* args the wait edge comes from the kernel launched
    last on the recorded stream before the named cudaEventRecord (k1), as in HTA; without them
    the thread's last record before the wait is taken (k0's, the wrong one here)."""
    res = _run(_event_wait_trace(args=True).model())
    assert {"k1", "k2"} <= set(res.critical_events["name"])
    assert "k0" not in set(res.critical_events["name"])
    # lead 5 µs, launch delay 5, k1 300, the wait edge (0), k2 50
    assert res.per_step["path_ns"][0] == (5 + 5 + 300 + 50) * US
    assert _bound(res)["gpu_kernel_launch_overhead"] == 5 * US
    # By time, k2's wait is pinned on k0 (ended at 19 µs): k2 drops off the path, which ends
    # with k1 and the device sync, 50 µs short.
    by_time = _run(_event_wait_trace(args=False).model())
    assert "k2" not in set(by_time.critical_events["name"])
    assert by_time.per_step["path_ns"][0] == (5 + 5 + 300) * US


def test_cuda_sync_args_are_in_the_model() -> None:
    """Both decoders keep the cuda_sync record's correlation and wait_on_* arguments."""
    t = _event_wait_trace(args=True)
    m = t.model()
    row = m.other_events.filter(pl.col("cat") == "cuda_sync").row(0, named=True)
    assert row["wait_on_stream"] == 7 and row["wait_on_cuda_event_record_corr_id"] == 1002
    assert row["correlation"] == 1005


def test_unexplained_blocking_call_keeps_its_time() -> None:
    """A sync call with nothing to wait for (no launch before it): no sync edge explains its span,
    so it stays CPU time; HTA's weights zero it regardless."""
    t = Trace()
    t.step(1, 0, 100)
    t.op("aten::A", 0, 20)
    t.runtime("cudaStreamSynchronize", 30, 50)
    t.op("aten::B", 80, 20)
    res = _run(t.model())
    assert res.per_step["path_ns"][0] == 100 * US and _bound(res) == {"cpu_bound": 100 * US}
    assert _run(t.model(), cpu_gaps=False).per_step["path_ns"][0] == 40 * US


def test_gaps_count_on_the_step_thread_only() -> None:
    """A helper thread idle between two ops is not work: its gap must not outweigh the step's thread."""
    t = Trace()
    t.step(1, 0, 200)
    t.op("aten::A", 0, 50)
    t.op("aten::B", 150, 10)  # the step's thread: 50 + 100 (gap) + 10
    t.op("aten::X", 0, 5, tid=TID + 1)
    t.op("aten::Y", 190, 10, tid=TID + 1)  # 5 + 185 idle + 10 would be 200
    res = _run(t.model())
    # The step's thread (160), then Y handed off from it (zero-weight edge from B's end): 170.
    assert res.per_step["path_ns"][0] == 170 * US
    assert set(res.critical_events["name"]) == {"aten::A", "aten::B", "aten::Y"}
    assert res.path_edges.filter(pl.col("type") == "dependency")["weight_ns"].to_list().count(0) >= 1


def test_step_thread_waiting_for_another_thread_is_not_cpu_time() -> None:
    """The step's thread idles while the autograd thread runs backward (launching a 300 µs
    kernel); the idle is not CPU work: the path runs through the other thread and the GPU."""
    t = Trace()
    t.step(1, 0, 400)
    t.op("aten::forward", 0, 50)
    t.op("autograd::engine::evaluate_function: MmBackward0", 60, 30, tid=TID + 1)
    t.launch(70, 5, 80, 300, name="ampere_sgemm_128x64_tn", tid=TID + 1)
    t.runtime("cudaDeviceSynchronize", 100, 281)  # the step's thread waits at the end
    res = _run(t.model())
    b = _bound(res)
    assert b["gpu_compute_bound"] == 300 * US
    # forward 50, (hand-off), the backward op until its launch 10, launch delay 10, kernel 300, sync 0
    assert res.per_step["path_ns"][0] == 370 * US


def test_dataloader_time_is_data_loading() -> None:
    t = Trace()
    t.step(1, 0, 100)
    t.ann("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 60)
    t.op("aten::stack", 5, 50)
    t.op("aten::B", 60, 40)
    res = _run(t.model())
    b = _bound(res)
    # the op, the 5 µs before it and the 5 µs after it all lie in the DataLoader range
    assert b["data_loading"] == 60 * US
    assert b["cpu_bound"] == 40 * US


@pytest.mark.parametrize("name", ["resnet_like_a100.json.gz", "legacy_pt18.json"])
def test_planted_dataloader_stalls_are_on_the_path(name: str) -> None:
    """The generator's planted DataLoader stalls (ground truth in the .truth.json) are each step's
    data_loading on the path, to within 10 µs (the planted range vs the ops inside it)."""
    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    truth = json.loads((samples / (name.split(".json")[0] + ".truth.json")).read_text())
    res = _run(load_chrome_trace(samples / name))
    got = res.per_step["data_loading_ns"].to_list()
    planted = [d["dur_ns"] for d in truth["planted"]["dataloader"]]
    assert len(got) == len(planted)
    assert all(abs(g - p) <= 10 * US for g, p in zip(got, planted, strict=True)), (got, planted)


@pytest.mark.parametrize("scale", [1, 2**43])
def test_longest_path_dp_matches_brute_force(scale: int) -> None:
    """The chain DP against a plain topological longest path on a random chain-structured DAG
    (at ``2**43`` the segment offsets would overflow: the running maxima, over every node and
    over the cross edges' ends in the later rounds, are taken by blocks of segments)."""
    rng = np.random.default_rng(7)
    n = 400
    seg_start = rng.random(n) < 0.1
    seg_start[0] = True
    link_w = rng.integers(0, 50, n).astype(np.int64) * scale
    # Cross edges go forward in node order (a DAG); several may meet one node.
    src0 = rng.integers(0, n - 1, 300)
    dst0 = np.minimum(src0 + rng.integers(1, 40, 300), n - 1)
    order = np.argsort(dst0, kind="stable")
    src, dst = src0[order].astype(np.int32), dst0[order].astype(np.int32)
    xw = rng.integers(0, 30, 300).astype(np.int64) * scale
    z = np.zeros(n, dtype=np.int32)
    # Some chains start with a lead (the time before their first node counts on a path from there).
    lead = seg_start & (rng.random(n) < 0.5)
    g = CPGraph(node_event=np.arange(n, dtype=np.int32), node_window=z, seg_start=seg_start,
                link_w=link_w, link_type=z, link_event=z - 1, link_dl=np.zeros(n, dtype=bool), lead=lead,
                x_src=src, x_dst=dst, x_w=xw, x_type=z[:300] + 4, x_event=z[:300] - 1, events=pl.DataFrame(),
                sync_source="none", bound_code=np.zeros(n, dtype=np.int8))
    lp = longest_path(g)
    best = np.where(lead, link_w, 0).astype(np.int64)
    for i in range(n):
        if not seg_start[i]:
            best[i] = max(best[i], best[i - 1] + link_w[i])
        for k in np.flatnonzero(dst == i):
            best[i] = max(best[i], best[src[k]] + xw[k])
    assert np.array_equal(lp.dist, best)
    assert lp.window_len[0] == best.max()
    # The walked path's weights add up to its length.
    assert int(link_w[lp.path_links].sum() + xw[lp.path_x].sum()) == best.max()
    # The topological pass that takes over after too many rounds gives the same answer.
    assert lp.rounds > 1
    topo = longest_path(g, max_rounds=1)
    assert topo.converged and np.array_equal(topo.dist, best)
    assert np.array_equal(topo.on_path, lp.on_path)


def test_many_syncs_take_the_topological_pass() -> None:
    """400 launch → kernel → stream sync round trips: the path hops CPU → GPU → CPU 400 times,
    more than the rounds allow; the topological pass finishes it exactly."""
    t = Trace()
    t.step(1, 0, 400 * 30 + 10)
    for i in range(400):
        t0 = i * 30
        t.launch(t0, 2, t0 + 4, 20, name="ampere_sgemm_128x64_tn")  # 2 µs call, 20 µs kernel
        t.runtime("cudaStreamSynchronize", t0 + 3, 22)  # returns when the kernel ends (t0 + 24)
    res = _run(t.model())
    assert res.converged and res.rounds >= 48
    b = _bound(res)
    assert b["gpu_compute_bound"] == 400 * 20 * US
    assert b["gpu_kernel_launch_overhead"] == 400 * 4 * US


def test_not_applicable_without_cpu_side() -> None:
    t = Trace()
    t.gpu(None, 0, 10)
    r = run_analyses(t.model(), only=("critical_path",), strict=True)
    assert "critical_path" in r.skipped


def test_json_is_plain() -> None:
    res = _run(_gpu_bound_trace().model())
    j = json.loads(json.dumps(res.to_json()))
    assert j["path_ns_median"] == 537 * US
    assert {b["bound_by"] for b in j["breakdown"]} >= {"cpu_bound", "gpu_compute_bound"}
    assert res.summary() and res.tables()


# ---- HTA's reference answer: the overlaid trace of critical_path/end_to_end/simple_add


def _hta_critical(path: Path) -> set[tuple[str, int]]:
    with gzip.open(path) as f:
        doc = json.load(f)
    return {(e["name"], int(e["ts"])) for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1}


@needs_shared
def test_agrees_with_hta_overlaid_output() -> None:
    """With HTA's weights (``cpu_gaps = false``) the set of events on the critical path of the
    whole trace (no ProfilerStep: one window, as HTA's run over the ``[param|cuda]`` range) is
    HTA's to within the one place the definitions differ: a kernel queued more than 1.5 ms
    after its stream's previous one (HTA's KERNEL_KERNEL_DELAY_THRESHOLD_US) gets no edge from
    HTA, its launch edge from us; here that puts a memset and its two kernels on our path and
    their two launch calls on HTA's."""
    base = CP_DIR / "end_to_end" / "simple_add"
    model = load_chrome_trace(base / "input" / "trace.json.gz")
    res = _run(model, cpu_gaps=False)
    assert res.sync_source == "cuda_sync events"
    ours = {(n, (t - model.meta.base_time_ns) // US) for n, t in
            zip(res.critical_events["name"], res.critical_events["ts_ns"], strict=True)}
    hta = _hta_critical(base / "output" / "overlaid_critical_path_trace.json.gz")
    assert len(hta) == 624
    only_hta = hta - ours
    only_ours = ours - hta
    assert {n for n, _ in only_hta} == {"cudaLaunchKernel"} and len(only_hta) == 2
    assert len(only_ours) == 3 and {n for n, _ in only_ours} >= {"Memset (Device)"}
    # HTA's path draws 17 launch delays and 17 syncs; ours one more of each: the memset's launch
    # edge and the sync that brings the path back to the CPU.
    kinds = res.path_edges.group_by("type").len()
    counts = dict(zip(kinds["type"], kinds["len"], strict=True))
    assert counts["launch_delay"] == 18 and counts["sync"] == 18


@needs_shared
@pytest.mark.parametrize("rel", [
    "alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "cuda_event_sync/event_sync_trace.json.gz",
    "cuda_event_sync_multi_stream/event_sync_trace.json.gz",
])
def test_hta_critical_path_traces_smoke(rel: str) -> None:
    res = _run(load_chrome_trace(CP_DIR / rel))
    assert res.converged and res.sync_source == "cuda_sync events"
    for row in res.per_step.iter_rows(named=True):
        assert 0 < row["path_ns"] <= row["step_ns"]
        parts = sum(row[f"{c}_ns"] for c in ("cpu_bound", "data_loading", "gpu_compute_bound",
                                              "gpu_communication_bound", "gpu_kernel_kernel_overhead",
                                              "gpu_kernel_launch_overhead"))
        assert parts == row["path_ns"]
    assert res.breakdown["pct_of_path"].sum() == pytest.approx(100.0)
    assert (res.whatif["saved_ns"] >= 0).all()


def test_pid_tid_constants_used() -> None:
    """The hand-built traces run on the support module's CPU thread."""
    res = _run(_cpu_bound_trace().model())
    cpu = res.critical_events.filter(pl.col("kind") == "cpu_op")
    assert set(cpu["pid"]) == {PID} and set(cpu["tid"]) == {TID}


def test_importing_the_cli_and_the_analyses_does_not_import_numpy() -> None:
    """numpy (0.14 s to import) is imported by the critical path when it runs, not when the
    CLI starts and discovers the analyses and rules."""
    import subprocess
    import sys

    code = ("import sys, traceanalyzer.cli\n"
            "from traceanalyzer.analyses import registry\n"
            "from traceanalyzer.rules import registry as rules\n"
            "assert 'critical_path' in registry() and rules()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy')[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_chain_dist_by_blocks_equals_per_segment_maximum() -> None:
    """Where the segment offsets would overflow Int64 (a huge trace), the running maximum is
    taken over blocks of segments: the same distances as a per-segment maximum."""
    from traceanalyzer.analyses._cpgraph import _chain_dist

    rng = np.random.default_rng(7)
    seg_start = rng.random(400) < 0.1
    seg_start[0] = True
    seg = np.cumsum(seg_start).astype(np.int64) - 1
    seg_first = np.flatnonzero(seg_start).astype(np.int64)
    offer = rng.integers(0, 1_000, 400).astype(np.int64)
    prefix = rng.integers(0, 1_000, 400).astype(np.int64)
    want = np.empty(400, dtype=np.int64)
    for a, b in zip(seg_first.tolist(), [*seg_first[1:].tolist(), 400], strict=True):
        want[a:b] = prefix[a:b] + np.maximum.accumulate(offer[a:b] - prefix[a:b])
    big = np.int64(2**60)  # 3 segments per block
    assert (_chain_dist(offer, prefix, seg, seg_first, big, None) == want).all()
    small = np.int64(4_001)
    assert (_chain_dist(offer, prefix, seg, seg_first, small, prefix - seg * small) == want).all()


def _multi_step_trace() -> Trace:
    """Eight steps of different shapes: CPU-bound, GPU-bound behind a stream sync (with its
    cuda_sync record, by correlation or by time), a stream wait between streams (with the record's args), a DataLoader
    range, a kernel-kernel chain, a communication kernel in one step only, and an op that
    outlives its step."""
    t = Trace()
    for i in range(8):
        s = i * 1000
        t.step(i + 1, s, 900)
        kind = i % 4
        if kind == 0:
            t.op("aten::A", s, 100)
            t.launch(s + 10, 5, s + 20, 10, name="ampere_sgemm_128x64_tn")
            t.op("aten::B", s + 100, 100 + 10 * i)
        elif kind == 1:
            t.op("aten::A", s, 20)
            t.launch(s + 5, 5, s + 12, 500, name="ampere_sgemm_128x64_tn")
            t.launch(s + 11, 3, s + 514, 40, name="elementwise_kernel")
            corr = t.runtime("cudaStreamSynchronize", s + 30, 530)
            # (Step 6's record names no call: matched by time.)
            t.events.append(x("cuda_sync", "Stream Sync", s + 31, 528, pid=0, tid=STREAM, stream=STREAM,
                              **({"correlation": corr} if i != 5 else {})))
            t.op("aten::B", s + 570, 20)
        elif kind == 2:
            t.ann("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, 60)
            t.op("aten::stack", s + 5, 50)
            t.launch(s + 65, 3, s + 70, 300, name="k1", stream=7)
            rec = t.runtime("cudaEventRecord", s + 69, 1)
            wait = t.runtime("cudaStreamWaitEvent", s + 71, 1)
            t.events.append(x("cuda_sync", "Stream Wait Event", s + 71.5, 0.5, pid=0, tid=8, correlation=wait,
                              stream=8, wait_on_stream=7, wait_on_cuda_event_record_corr_id=rec))
            t.launch(s + 73, 3, s + 371, 50 + i, name="ncclKernel_AllReduce" if i == 2 else "k2", stream=8)
            dev = t.runtime("cudaDeviceSynchronize", s + 80, 345)
            t.events.append(x("cuda_sync", "Context Sync", s + 81, 343, pid=0, tid=-1, correlation=dev,
                              stream=-1))
        else:
            t.op("aten::long", s + 2, 1200)  # outlives the step: clipped to it
            t.launch(s + 10, 3, s + 20, 100, name="ampere_sgemm_128x64_tn")
            t.launch(s + 14, 3, s + 123, 100 + i, name="elementwise_kernel")
    return t


def _batched_equals_one_graph(model: TraceModel, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> int:
    """The analysis's JSON with one window a batch equals that of one graph of every window;
    returns the number of batches."""
    import traceanalyzer.analyses.critical_path as cp
    from traceanalyzer.analyses._cpgraph import graph_inputs

    cfg = Config({f"critical_path.{k}": v for k, v in settings.items()})
    out = []
    for max_nodes in (None, 1):
        monkeypatch.setattr(cp, "BATCH_NODES", max_nodes)
        r = run_analyses(model, cfg, only=("critical_path",), strict=True)
        assert "critical_path" in r.values, r.skipped
        out.append(json.dumps(r.values["critical_path"].to_json(), sort_keys=True, default=str))
    assert out[0] == out[1]
    steps = r.values["steps"]
    assert isinstance(steps, StepsResult)
    return len(graph_inputs(trace_tables(model), steps.windows(), steps.steady_windows(), 1).batches)


@pytest.mark.parametrize("settings", [{}, {"cpu_gaps": False, "whatif_target": "kernel:ncclKernel"},
                                      {"whatif_target": "op:aten::B"}, {"whatif_target": "kernel:("}])
def test_batches_of_windows_give_the_figures_of_one_graph(settings: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = _multi_step_trace().model()
    assert _batched_equals_one_graph(model, monkeypatch, **settings) >= 6
    res = _run(model, **settings)
    assert res.per_step.height >= 6 and res.per_step["gpu_communication_bound_ns"].sum() > 0
    assert (res.whatif_error is not None) == (settings.get("whatif_target") == "kernel:(")


@pytest.mark.parametrize("name", ["resnet_like_a100.json.gz", "legacy_pt18.json"])
def test_batches_of_windows_on_sample_traces(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    assert _batched_equals_one_graph(load_chrome_trace(samples / name), monkeypatch) > 1


@needs_shared
@pytest.mark.parametrize("rel", [
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    # Kernels clipped to their window's end tie on time: broken by event number, whatever
    # the other windows in the graph.
    "trace_diff/test/test.json.gz",
])
def test_batches_of_windows_on_hta_traces(rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n = _batched_equals_one_graph(load_chrome_trace(SHARED_TRACES / "hta" / rel), monkeypatch)
    assert n > 1 or not rel.startswith("trace_diff")


def test_sort_rows_and_running_max_match_polars() -> None:
    """The numpy sort and per-group running maximum the graph uses agree with polars' sort
    (nulls first) and ``cum_max().shift(1).over(...)`` on keys and values with nulls."""
    rng = np.random.default_rng(7)
    n = 2000
    df = pl.DataFrame({
        "device": pl.Series(rng.integers(0, 2, n)).set(pl.Series(rng.random(n) < 0.05), None),
        "stream": pl.Series(rng.integers(0, 4, n)).set(pl.Series(rng.random(n) < 0.05), None),
        "ts": rng.permutation(n).astype(np.int64),  # unique: the order is total
        "v": pl.Series(rng.integers(0, 1000, n)).set(pl.Series(rng.random(n) < 0.1), None),
    })
    by = ("device", "stream", "ts")
    got = _sort_rows(df, by)
    assert got.equals(df.sort(by))
    want = got.select(pl.col("v").cum_max().shift(1).over("device", "stream")).to_series()
    assert _prev_running_max(got, "v", ("device", "stream")).equals(want.alias("v"))
    # Ties keep their row order.
    tied = pl.DataFrame({"k": [2, 1, 2, 1], "id": [0, 1, 2, 3]})
    assert _sort_rows(tied, ("k",))["id"].to_list() == [1, 3, 0, 2]


def test_open_parents() -> None:
    """A start after an end inside an op is attributed to the op open there (the last start
    at that depth in its chain); top-level starts and starts after starts get -1."""
    # Chain 0: A( B( C() D() ) E() ) F(); chain 1: G( H() I() ). Boundary rows in nesting order.
    rows = [  # first, kind (1 start, 0 end), event
        (True, 1, 0), (False, 1, 1), (False, 1, 2), (False, 0, 2), (False, 1, 3), (False, 0, 3), (False, 0, 1),
        (False, 1, 4), (False, 0, 4), (False, 0, 0), (False, 1, 5), (False, 0, 5),
        (True, 1, 6), (False, 1, 7), (False, 0, 7), (False, 1, 8), (False, 0, 8), (False, 0, 6),
    ]
    b = pl.DataFrame(rows, schema={"first": pl.Boolean, "kind": pl.Int8, "event": pl.Int64}, orient="row")
    b = b.with_columns(depth=pl.when(pl.col("kind") == 1).then(1).otherwise(-1).cum_sum())
    want = [-1] * len(rows)
    want[4] = 1  # D, after C's end: inside B
    want[7] = 0  # E, after B's end: inside A
    want[15] = 6  # I, after H's end: inside G (chain 1), not A (chain 0, same depth)
    assert _open_parents(b).tolist() == want
