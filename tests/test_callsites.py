"""analyses.callsites: the CPU chain of a point against a brute-force walk of the nesting."""

from __future__ import annotations

import random

import polars as pl
from support.events import Trace
from test_relations import _brute_nest, _random_nested

from traceanalyzer.analyses._callsites import build_cpu_tree, cpu_chain


def test_cpu_chain_matches_the_covering_intervals_outermost_first() -> None:
    """Random nestings of ops and annotations on two threads (shared instants, identical twins,
    zero-length ops): every point's chain, innermost/outermost op and op site are those of
    the intervals covering it, ordered by the brute-force nesting of the CPU tree."""
    for seed in range(6):
        rng = random.Random(seed)
        iv = _random_nested(seed)
        t = Trace()
        for r in iv.to_dicts():
            if rng.random() < 0.3 and r["end_ns"] > r["ts_ns"]:
                t.ann(f"ann{r['id']}", r["ts_ns"], r["end_ns"] - r["ts_ns"], tid=r["tid"])
            else:
                t.op(f"op{r['id']}", r["ts_ns"], r["end_ns"] - r["ts_ns"], tid=r["tid"])
        model = t.model()
        tree = build_cpu_tree(model)
        nodes = tree.filter(pl.col("end_ns") > pl.col("ts_ns"))
        depth = {k: v[0] for k, v in _brute_nest(nodes.select("id", "ts_ns", "end_ns", "pid", "tid")).items()}
        pts = pl.DataFrame({"pid": [100] * 124, "tid": [1] * 62 + [2] * 62,
                            "ts_ns": [1000 * x for x in range(-1, 61)] * 2})
        got = cpu_chain(model, pts).to_dicts()
        for p, g in zip(pts.to_dicts(), got):
            cover = sorted(
                (r for r in nodes.to_dicts() if r["tid"] == p["tid"] and r["ts_ns"] <= p["ts_ns"] < r["end_ns"]),
                key=lambda r: depth[r["id"]],
            )
            ops = [r for r in cover if r["source"] == "cpu_op"]
            anns = [r["name"] for r in cover if r["source"] == "annotation"]
            want = {
                "innermost_op": ops[-1]["name"] if ops else None,
                "outermost_op": ops[0]["name"] if ops else None,
                "outermost_op_id": ops[0]["id"] if ops else None,
                "chain": " > ".join(r["name"] for r in cover) or None,
                "op_site": " > ".join(anns + ([ops[0]["name"]] if ops else [])) or None,
            }
            assert g == want, (seed, p)


def test_containing_matches_a_brute_force_search() -> None:
    """The disjoint outer interval of the same thread holding each point (half-open; a
    zero-length one holds its own instant), random cases."""
    from traceanalyzer.analyses._copysync import containing

    rng = random.Random(9)
    for _ in range(25):
        outer = []
        for tid in (1, 2):
            t = rng.randint(-3, 3)
            while t < 60:
                length = rng.choice([0, 1, 2, 5, 9])
                outer.append((100, tid, t, t + length))
                t += length + (1 if length == 0 else rng.choice([0, 1, 4]))
        rng.shuffle(outer)
        o = pl.DataFrame(outer, schema=["pid", "tid", "ts_ns", "end_ns"], orient="row").with_row_index("copy_id")
        o = o.with_columns(pl.col("copy_id").cast(pl.Int64) + 1000)
        pts = [(100, rng.choice([1, 2, 3]), rng.randint(-5, 65)) for _ in range(60)]
        df = pl.DataFrame(pts, schema=["pid", "tid", "t"], orient="row")
        got = containing(df, o, "t").to_list()
        want = []
        for _, tid, t in pts:
            hold = [r["copy_id"] for r in o.to_dicts() if r["tid"] == tid
                    and (r["ts_ns"] <= t < r["end_ns"] or r["ts_ns"] == r["end_ns"] == t)]
            assert len(hold) <= 1
            want.append(hold[0] if hold else None)
        assert got == want


def test_pytorch_18_call_stack_names_the_user_line() -> None:
    """PyTorch 1.8-1.9 traces carry no python_function events but a ``Call stack`` on each op
    (innermost frame first): the call site comes from it, as from Python frames."""
    from pathlib import Path

    from traceanalyzer.analyses import run_analyses
    from traceanalyzer.analyses._callsites import has_stacks
    from traceanalyzer.config import Config
    from traceanalyzer.model import TraceModel
    from traceanalyzer.pipeline import load

    model = load(Path(__file__).resolve().parent.parent / "sample_traces" / "legacy_pt18.json", use_cache=False)
    assert isinstance(model, TraceModel)
    assert model.python_frames.is_empty() and has_stacks(model)
    res = run_analyses(model, Config(), only=("copies", "syncs"))
    copies = res.values["copies"].to_json()
    item = next(r for r in copies["by_site"] if r["ops"] == "aten::item")
    assert (item["site"], item["site_kind"]) == ("train.py:57 (train_step)", "python")
    assert copies["has_stacks"] is True and copies["stack_hint"] is None
    syncs = res.values["syncs"].to_json()
    assert [r["site"] for r in syncs["by_site"]] == ["train.py:57 (train_step)"]
