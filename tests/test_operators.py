"""Operator and module views: self/total host and device time, input shapes, backward linked to forward."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import shared_chrome_traces, shared_params, shared_results
from support.events import PID, TID, Trace, flow, ns

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses.operators import OperatorsResult

BWD_TID = 200


def _trace(with_flows: bool = False) -> Trace:
    """linear [0, 30) = t [1, 3) + addmm [5, 25) (8 µs kernel); relu [40, 50) (2 µs kernel), inside
    nn.Module Net_0 [0, 55) ⊃ Linear_0 [0, 30); backward of addmm on another thread: the node
    [60, 80) ⊃ AddmmBackward0 [61, 79) ⊃ aten::mm [62, 70) (5 µs kernel)."""
    t = Trace()
    t._x("python_function", "nn.Module: Net_0", 0, 55, **{"Python id": 1, "Python parent id": 0})
    t._x("python_function", "nn.Module: Linear_0", 0, 30, **{"Python id": 2, "Python parent id": 1})
    t._x("python_function", "model.py(12): forward", 0, 30, **{"Python id": 3, "Python parent id": 2})
    t._x("python_function", "model.py(20): act", 40, 10, **{"Python id": 4, "Python parent id": 1})
    t._x("cpu_op", "aten::linear", 0, 30, **{"Sequence number": 6, "Fwd thread id": 0})
    t._x("cpu_op", "aten::t", 1, 2, **{"Sequence number": 6, "Fwd thread id": 0, "Input Dims": [[4, 3]]})
    t._x("cpu_op", "aten::addmm", 5, 20, **{"Sequence number": 7, "Fwd thread id": 0,
                                           "Input Dims": [[4], [2, 3], [3, 4]]})
    t.launch(6, 2, 30, 8, name="gemm")
    t.op("aten::relu", 40, 10)
    t.launch(41, 2, 50, 2, name="relu_kernel")
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    t._x("cpu_op", node, 60, 20, tid=BWD_TID, **{"Sequence number": 7, "Fwd thread id": 1})
    t._x("cpu_op", "AddmmBackward0", 61, 18, tid=BWD_TID, **{"Sequence number": 7, "Fwd thread id": 1})
    t.op("aten::mm", 62, 8, tid=BWD_TID)
    t.launch(63, 2, 80, 5, name="gemm_bwd", tid=BWD_TID)
    if with_flows:  # Kineto's forward→backward flow: forward op start → backward op start
        t.events += [flow("s", 1, PID, TID, 5, "fwdbwd", "fwdbwd"), flow("f", 1, PID, BWD_TID, 61, "fwdbwd", "fwdbwd")]
        # Sequence numbers that would link elsewhere: the flows win.
        t.events = [dict(e, args={**e.get("args", {}), "Sequence number": 99}) if e.get("name") == node else e
                    for e in t.events]
    return t


def _run(t: Trace) -> OperatorsResult:
    r = run_analyses(t.model(), only=("operators",), strict=True)["operators"]
    assert isinstance(r, OperatorsResult)
    return r


def test_self_and_total_times_per_op() -> None:
    r = _run(_trace())
    rows = {x["name"]: x for x in r.by_name.iter_rows(named=True)}
    lin, addmm = rows["aten::linear"], rows["aten::addmm"]
    assert (lin["calls"], lin["host_total_ns"], lin["host_self_ns"]) == (1, ns(30), ns(30 - 2 - 20))
    assert (lin["device_total_ns"], lin["device_self_ns"], lin["kernels"]) == (ns(8), 0, 0)
    assert (addmm["host_self_ns"], addmm["device_self_ns"], addmm["device_total_ns"], addmm["kernels"]) == \
        (ns(20), ns(8), ns(8), 1)
    node = rows["autograd::engine::evaluate_function: AddmmBackward0"]
    assert node["device_total_ns"] == ns(5) and node["host_self_ns"] == ns(2)
    assert rows["AddmmBackward0"]["host_self_ns"] == ns(10)
    # Largest device total first.
    assert r.by_name["name"][0] in ("aten::linear", "aten::addmm")
    assert lin["call_site"] == "model.py:12 (forward)" and rows["aten::relu"]["call_site"] == "model.py:20 (act)"
    assert rows["AddmmBackward0"]["call_site"] is None  # the backward thread runs no Python
    shapes = r.by_shape.filter(pl.col("name") == "aten::addmm").row(0, named=True)
    assert shapes["input_dims"] == "[[4],[2,3],[3,4]]" and shapes["device_total_ns"] == ns(8)


def test_modules_from_nn_module_frames() -> None:
    r = _run(_trace())
    assert r.module_source == "module"
    mods = {x["module"]: x for x in r.modules.iter_rows(named=True)}
    net, lin = mods["Net_0"], mods["Linear_0"]
    assert (net["device_total_ns"], net["device_self_ns"], net["host_self_ns"]) == (ns(10), ns(2), ns(25))
    assert (lin["device_total_ns"], lin["parent"], lin["module_type"]) == (ns(8), "Net_0", "Linear")
    assert net["parent"] is None


@pytest.mark.parametrize("with_flows,link", [(False, "sequence_number"), (True, "flows")])
def test_backward_linked_to_forward(with_flows: bool, link: str) -> None:
    r = _run(_trace(with_flows))
    assert r.backward_link == link
    assert r.backward.to_dicts() == [{"forward": "aten::addmm", "backward": "AddmmBackward0", "calls": 1,
                                      "host_total_ns": ns(20), "device_total_ns": ns(5)}]
    addmm = r.by_name.filter(pl.col("name") == "aten::addmm").row(0, named=True)
    assert (addmm["bwd_calls"], addmm["bwd_device_total_ns"]) == (1, ns(5))


def test_record_function_ranges_stand_in_for_modules() -> None:
    t = Trace()
    t.step(1, 0, 100)
    t.ann("encoder", 0, 40)
    t.op("aten::mm", 1, 10)
    t.launch(2, 1, 20, 6)
    r = _run(t)
    assert r.module_source == "record_function"
    assert r.modules["module"].to_list() == ["encoder"]  # ProfilerStep# is not a module
    assert r.modules["device_total_ns"].to_list() == [ns(6)]


def test_not_applicable_without_cpu_ops() -> None:
    t = Trace()
    t.launch(0, 1, 2, 3)
    res = run_analyses(t.model(), only=("operators",))
    assert "no CPU ops" in res.skipped["operators"]


@pytest.mark.shared
@pytest.mark.parametrize("path", shared_params(shared_chrome_traces()))
def test_every_shared_trace(path) -> None:  # type: ignore[no-untyped-def]
    res = shared_results(path)
    r = res.values.get("operators")
    if r is None:
        assert "operators" in res.skipped
        return
    bn = r.by_name
    assert (bn["host_self_ns"] <= bn["host_total_ns"]).all()
    assert (bn["device_self_ns"] <= bn["device_total_ns"]).all()
    r.to_json()
