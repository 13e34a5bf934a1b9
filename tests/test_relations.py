"""model.relations: nesting and deepest covering interval on hand-built intervals with known truth."""

from __future__ import annotations

import polars as pl

from traceanalyzer.model.relations import deepest_at, nest

# Thread (1, 1): A [0,100) holds B [10,50) and C [50,80) (C starts where B ends) and a
# zero-length D at 20; thread (1, 2): E [0,10). Ids are the letters' positions.
A, B, C, D, E = 0, 1, 2, 3, 4
INTERVALS = pl.DataFrame(
    {
        "id": [A, B, C, D, E],
        "ts_ns": [0, 10, 50, 20, 0],
        "end_ns": [100, 50, 80, 20, 10],
        "pid": [1, 1, 1, 1, 1],
        "tid": [1, 1, 1, 1, 2],
    },
    schema={"id": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64},
)


def test_nest_depth_and_parent() -> None:
    got = nest(INTERVALS.filter(pl.col("end_ns") > pl.col("ts_ns"))).sort("id")
    assert got["id"].to_list() == [A, B, C, E]
    assert got["depth"].to_list() == [1, 2, 2, 1]
    assert got["parent_id"].to_list() == [None, A, A, None]


def test_deepest_at_half_open_and_per_thread() -> None:
    cases = [  # (pid, tid, t) -> deepest covering id
        ((1, 1, 0), A), ((1, 1, 10), B), ((1, 1, 20), B),  # the zero-length D never covers
        ((1, 1, 49), B), ((1, 1, 50), C),  # B ends at 50 and C starts there
        ((1, 1, 80), A), ((1, 1, 99), A), ((1, 1, 100), None),
        ((1, 2, 5), E), ((1, 2, 10), None), ((2, 1, 5), None), ((1, 1, -1), None),
    ]
    # Points in shuffled order: the result must stay aligned with the input rows.
    order = [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]
    pts = pl.DataFrame(
        {
            "pid": [cases[i][0][0] for i in order],
            "tid": [cases[i][0][1] for i in order],
            "ts_ns": [cases[i][0][2] for i in order],
        }
    )
    got = deepest_at(INTERVALS, pts)
    assert got.dtype == pl.Int64
    assert got.to_list() == [cases[i][1] for i in order]


def test_deepest_at_only_zero_length_intervals() -> None:
    zero = INTERVALS.with_columns(end_ns=pl.col("ts_ns"))
    got = deepest_at(zero, pl.DataFrame({"pid": [1], "tid": [1], "ts_ns": [10]}))
    assert got.to_list() == [None]


def test_cover_index_lookups_equal_deepest_at() -> None:
    from traceanalyzer.model.relations import cover_index

    index = cover_index(INTERVALS)
    a = pl.DataFrame({"pid": [1, 1, 1, 1], "tid": [1, 1, 2, 1], "ts_ns": [15, 60, 5, 85]})
    b = pl.DataFrame({"pid": [1, 1], "tid": [1, 1], "t": [50, 100]})
    assert index.lookup(a).to_list() == [B, C, E, A]
    assert index.lookup(b, point_col="t").to_list() == [C, None]  # one index, several point sets
    assert index.lookup(a).to_list() == deepest_at(INTERVALS, a).to_list()


def test_cover_index_keyed_edges_equal_the_per_group_state() -> None:
    """The one-key index answers like the per-group as-of state it replaces: points before
    any time, after every time (a group's last state), of an unknown thread, with a null
    time, and on a thread whose intervals overlap without nesting. A span too wide for
    one Int64 key keeps the per-group state."""
    from traceanalyzer.model.relations import cover_index

    # (2, 1): F [1000,1010) and G [1005,1020) overlap; G opened inside F, so G's parent is
    # F: the state is null on [1010,1020) (F closed, "its parent") and F after 1020 (G
    # closed, its parent): what the as-of state has always said of such input.
    F, G = 5, 6
    iv = pl.concat([INTERVALS, pl.DataFrame({"id": [F, G], "ts_ns": [1000, 1005], "end_ns": [1010, 1020],
                                             "pid": [2, 2], "tid": [1, 1]})])
    index = cover_index(iv)
    assert index.groups.height == 3  # keyed
    pts = pl.DataFrame(
        {"pid": [1, 1, 1, 1, 2, 2, 2, 2, 3, 1],
         "tid": [1, 1, 1, 2, 1, 1, 1, 1, 1, 1],
         "ts_ns": [-5, 99, 5000, 9, 999, 1007, 1015, 1030, 5, None]},
        schema={"pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64},
    )
    got = index.lookup(pts).to_list()
    assert got == [None, A, None, E, None, G, None, F, None, None]
    far = pl.when(pl.col("pid") == 2).then(2**61).otherwise(0)  # thread (2, 1) moved 2^61 ns on
    wide = cover_index(iv.with_columns(pl.col("ts_ns") + far, pl.col("end_ns") + far))
    assert wide.groups is None and wide.state.columns == ["pid", "tid", "t", "current"]
    assert wide.lookup(pts.with_columns(pl.col("ts_ns") + far)).to_list() == got


def test_nest_with_index_links_equal_nest() -> None:
    from traceanalyzer.model.relations import nest_depth, nest_with_index

    positive = INTERVALS.filter(pl.col("end_ns") > pl.col("ts_ns"))
    links, index = nest_with_index(positive)
    assert links.sort("id").to_dicts() == nest(positive).sort("id").to_dicts()
    assert index.lookup(pl.DataFrame({"pid": [1], "tid": [1], "ts_ns": [20]})).to_list() == [B]
    # Ids far from row numbers take the join instead of the dense scatter/gather: same answers.
    far = 10**12
    links_far, index_far = nest_with_index(positive.with_columns(pl.col("id") + far))
    assert links_far.sort("id").to_dicts() == [
        {**r, "id": r["id"] + far, "parent_id": None if r["parent_id"] is None else r["parent_id"] + far}
        for r in links.sort("id").to_dicts()
    ]
    assert index_far.lookup(pl.DataFrame({"pid": [1], "tid": [1], "ts_ns": [20]})).to_list() == [B + far]
    depth = nest_depth(INTERVALS).sort("id")
    assert depth["depth"].to_list() == nest(INTERVALS).sort("id")["depth"].to_list()


def test_op_index_and_top_level_of_a_model_shared_and_forgotten() -> None:
    """op_index/op_top_level are built once per DerivedTables; clear() drops them; a bare
    model gets a fresh build each call."""
    from support.events import Trace, ns

    from traceanalyzer.model.derived import DerivedTables
    from traceanalyzer.model.relations import op_index, op_top_level

    t = Trace()
    t.op("aten::outer", 0, 100)
    t.op("aten::inner", 10, 20)
    t.op("aten::empty", 50, 0)  # zero length: inside outer, never covers anything
    t.op("aten::zero_at_end", 100, 0)  # starts where outer ends: top level
    model = t.model()
    tables = DerivedTables(model)
    names = model.cpu_ops["name"].to_list()
    pts = pl.DataFrame({"pid": model.cpu_ops["pid"][:1], "tid": model.cpu_ops["tid"][:1], "ts_ns": [ns(15)]})
    got = op_index(tables).lookup(pts).to_list()
    assert [names[i] for i in got] == ["aten::inner"]
    assert op_index(model).lookup(pts).to_list() == got  # a bare model: the same answer
    assert op_index(tables) is op_index(tables)  # built once
    assert op_index(model) is not op_index(model)  # not shared without tables
    top = dict(zip(names, op_top_level(tables).to_list()))
    assert top == {"aten::outer": True, "aten::inner": False, "aten::empty": False, "aten::zero_at_end": True}
    first = op_index(tables)
    tables.clear()
    assert op_index(tables) is not first  # rebuilt after clear()


def test_op_top_level_is_depth_one_of_the_nesting() -> None:
    """op_top_level equals nest_depth == 1 on random nestings (twins, shared instants,
    zero-length ops), in model row order: built alone (its own sort) and handed over by
    op_index's nesting (built first, as phases does)."""
    from support.events import Trace

    from traceanalyzer.model.derived import DerivedTables
    from traceanalyzer.model.relations import nest_depth, op_index, op_top_level

    handed_over = 0
    for seed in range(12):
        iv = _random_nested(seed // 2)
        if seed % 2:  # positive lengths only: the nesting places every op
            iv = iv.filter(pl.col("end_ns") > pl.col("ts_ns"))
        t = Trace()
        for r in iv.to_dicts():
            t.op(f"op{r['id']}", r["ts_ns"], r["end_ns"] - r["ts_ns"], tid=r["tid"])
        model = t.model()
        ops = model.cpu_ops.select("pid", "tid", "ts_ns", "end_ns").with_row_index("id").with_columns(
            pl.col("id").cast(pl.Int64))
        want = (nest_depth(ops).sort("id")["depth"] == 1).to_list()
        assert op_top_level(model).to_list() == want, seed
        tables = DerivedTables(model)
        op_index(tables)
        handed_over += "op_top_level" in tables.held()  # fresh tables: only op_index can have put it there
        assert op_top_level(tables).to_list() == want, seed
    assert handed_over == 6  # the positive-length cases took the nesting's depths


def test_derived_tables_build_once_per_key_and_per_object() -> None:
    from traceanalyzer.model.derived import DerivedTables

    calls: list[int] = []
    a, b = DerivedTables("model a"), DerivedTables("model b")
    assert a.get("k", lambda: calls.append(1) or "A") == "A"
    assert a.get("k", lambda: calls.append(2) or "X") == "A"  # built once
    assert b.get("k", lambda: calls.append(3) or "B") == "B"  # another run, its own table
    assert calls == [1, 3]
    a.clear()
    assert a.held() == frozenset()
    assert a.get("k", lambda: "A2") == "A2"


def test_release_drops_a_table_and_counts_a_rebuild() -> None:
    from traceanalyzer.model.derived import DerivedTables, rebuilds

    m = DerivedTables("model", readers={"t": 1})
    assert m.get("t", lambda: "first") == "first"
    before = rebuilds().get("t", 0)
    m.done(["t"])  # its only declared reader finished: dropped
    assert "t" not in m.held()
    assert m.get("t", lambda: "again") == "again"  # built anew, not the dropped one
    assert rebuilds().get("t", 0) == before + 1
    assert m.get("t", lambda: "third") == "again"  # and kept again


def test_run_analyses_declares_every_shared_table(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every derived table an analysis reads is named in its ``shared=``: none is built
    again after its early release, and none is left for the final clear() (an undeclared
    one would be held to the end), on traces with and without Python stacks."""
    from pathlib import Path

    import traceanalyzer.analyses as analyses
    from traceanalyzer.load import load
    from traceanalyzer.model.derived import DerivedTables, rebuilds

    left: dict[str, list[str]] = {}
    clear = DerivedTables.clear

    def spy(self: DerivedTables[object]) -> None:
        left[name] = sorted(self.held())
        clear(self)

    monkeypatch.setattr(DerivedTables, "clear", spy)
    root = Path(__file__).resolve().parent.parent / "sample_traces"
    for name, workers in [(n, w) for n in ("legacy_pt18.json", "pt113_sync_bound.json.gz",
                                           "amd_mi300_inference.json.gz") for w in (1, 2)]:
        model = load(root / name)
        before = rebuilds()
        res = analyses.run_analyses(model, strict=True, workers=workers)
        assert {"idle_gaps", "syncs", "copies", "phases", "ops"} <= set(res.values), (name, res.skipped)
        assert rebuilds() == before, name
        assert left[name] == [], name


def _random_nested(seed: int) -> pl.DataFrame:
    """Properly nested intervals on two threads, with shared starts and ends, identical
    twins and zero-length intervals (at a parent's start, end and inside)."""
    import random

    rng = random.Random(seed)
    rows: list[tuple[int, int, int]] = []  # (tid, ts, end)

    def fill(tid: int, lo: int, hi: int, level: int) -> None:
        t = lo
        while t < hi and level < 5:
            kind = rng.random()
            if kind < 0.2:  # zero-length, possibly at the parent's start or end
                rows.append((tid, t, t))
                t += rng.choice([0, 0, 1, 2])
                continue
            end = min(hi, t + rng.randint(1, 12))
            rows.append((tid, t, end))
            if rng.random() < 0.2:
                rows.append((tid, t, end))  # an identical twin: nested under the first
            fill(tid, t, end, level + 1)
            t = end + rng.choice([0, 0, 1])

    for tid in (1, 2):
        fill(tid, 0, 60, 0)
    rng.shuffle(rows)
    return pl.DataFrame(
        {"id": list(range(len(rows))), "ts_ns": [r[1] for r in rows], "end_ns": [r[2] for r in rows],
         "pid": [1] * len(rows), "tid": [r[0] for r in rows]},
        schema={"id": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64},
    )


def _brute_nest(iv: pl.DataFrame) -> dict[int, tuple[int, int | None]]:
    """id -> (depth, parent id) by definition: Y encloses X when Y has positive length,
    covers X's start (half-open) and comes first at a shared start (longer, then lower id)."""
    rows = iv.to_dicts()
    out: dict[int, tuple[int, int | None]] = {}
    for x in rows:
        enclosing = [
            y for y in rows
            if y["id"] != x["id"] and y["tid"] == x["tid"] and y["end_ns"] > y["ts_ns"]
            and y["ts_ns"] <= x["ts_ns"] < y["end_ns"]
            and (y["ts_ns"], -y["end_ns"], y["id"]) < (x["ts_ns"], -x["end_ns"], x["id"])
        ]
        parent = max(enclosing, key=lambda y: (y["ts_ns"], -y["end_ns"], y["id"]))["id"] if enclosing else None
        out[x["id"]] = (len(enclosing) + 1, parent)
    return out


def test_nest_with_zero_length_intervals_matches_the_definition(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A zero-length interval at the instant a longer one starts used to sort its end before
    its own start: every later interval on the thread came out one level too shallow."""
    from traceanalyzer.model import relations
    from traceanalyzer.model.relations import nest_depth

    for seed in range(12):
        iv = _random_nested(seed)
        want = _brute_nest(iv)
        for fast in (True, False):
            with monkeypatch.context() as m:
                if not fast:  # the multi-column sort the single-key path falls back to
                    m.setattr(relations, "_sort_by_time_key", lambda *a: None)
                got = nest(iv)
                depth = nest_depth(iv)
            assert {r["id"]: (r["depth"], r["parent_id"]) for r in got.to_dicts()} == want, (seed, fast)
            assert dict(zip(depth["id"].to_list(), depth["depth"].to_list())) == {k: v[0] for k, v in want.items()}


def test_by_id_dense_and_join_paths_agree() -> None:
    """by_id is a left join of ids on a table: absent and null ids give null, both paths."""
    from traceanalyzer.model.relations import by_id

    table_ids = pl.Series([4, 0, 2], dtype=pl.Int64)
    values = pl.Series("name", ["e", "a", "c"])
    ids = pl.Series([0, None, 2, 3, 4, 9, 0], dtype=pl.Int64)
    want = ["a", None, "c", None, "e", None, "a"]
    got = by_id(ids, table_ids, values)
    assert got.name == "name" and got.to_list() == want
    far = 10**12  # ids far from row numbers: the join
    assert by_id(ids + far, table_ids + far, values).to_list() == want
    assert by_id(ids, pl.Series([], dtype=pl.Int64), pl.Series("name", [], dtype=pl.String)).to_list() == [None] * 7
    assert by_id(ids - 1, table_ids - 1, values).to_list() == want  # a negative id: the join
    # Ids that are the table's row numbers: a plain gather; out-of-range and null ids give null.
    rows = pl.Series([0, 1, 2], dtype=pl.Int64)
    assert by_id(ids, rows, values).to_list() == ["e", None, "c", None, None, None, "e"]
    assert by_id(ids, rows.slice(0, 1), values.slice(0, 1)).to_list() == ["e", None, None, None, None, None, "e"]


def test_deepest_at_and_nest_with_index_match_the_definition(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The deepest interval covering a point (half-open, zero-length never covers), on random
    nestings with shared instants, against the brute-force nesting; both sort paths."""
    from traceanalyzer.model import relations
    from traceanalyzer.model.relations import nest_with_index

    for seed in range(8):
        iv = _random_nested(seed)
        tree = _brute_nest(iv)
        rows = {r["id"]: r for r in iv.to_dicts()}
        pts = pl.DataFrame({"pid": [1] * 2 * 62, "tid": [1] * 62 + [2] * 62, "ts_ns": list(range(-1, 61)) * 2})
        want = []
        for p in pts.to_dicts():
            cover = [i for i, r in rows.items() if r["tid"] == p["tid"] and r["ts_ns"] <= p["ts_ns"] < r["end_ns"]]
            want.append(max(cover, key=lambda i: tree[i][0]) if cover else None)
        positive = iv.filter(pl.col("end_ns") > pl.col("ts_ns"))
        for fast in (True, False):
            with monkeypatch.context() as m:
                if not fast:  # every general path: multi-column sort, as-of joins
                    m.setattr(relations, "_sort_by_time_key", lambda *a: None)
                    m.setattr(relations, "_link_parents_keyed", lambda *a: None)
                    m.setattr(relations, "_keyed_index", lambda state, by: relations.CoverIndex(state, tuple(by)))
                assert deepest_at(iv, pts).to_list() == want, (seed, fast)
                links, index = nest_with_index(positive)
                assert index.lookup(pts).to_list() == want, (seed, fast)
                # Among positive intervals alone, the nesting is the brute force of that subset.
                sub = _brute_nest(positive)
                assert {r["id"]: (r["depth"], r["parent_id"]) for r in links.to_dicts()} == sub


def test_join_unique_matches_the_left_join() -> None:
    """join_unique (binary search on a unique integer key) = the ordered left join: unmatched
    and null keys get nulls, keys in any order, a renamed key, a colliding column (the join)."""
    import random

    from traceanalyzer.model.relations import join_unique

    rng = random.Random(11)
    for _ in range(60):
        nr, nl = rng.randint(0, 30), rng.randint(0, 40)
        keys = rng.sample(range(-20, 120), nr)
        right = pl.DataFrame({"k": keys, "a": [rng.randint(0, 9) for _ in keys], "s": [f"x{i}" for i in range(nr)]},
                             schema={"k": pl.Int64, "a": pl.Int64, "s": pl.String})
        left = pl.DataFrame({"c": [None if rng.random() < 0.1 else rng.randint(-25, 125) for _ in range(nl)],
                             "v": list(range(nl))}, schema={"c": pl.Int64, "v": pl.Int64})
        want = left.join(right, left_on="c", right_on="k", how="left", maintain_order="left")
        assert join_unique(left, right, "c", "k").equals(want)
        same = right.rename({"k": "c"})
        assert join_unique(left, same, "c").equals(left.join(same, on="c", how="left", maintain_order="left"))
        clash = right.rename({"k": "c", "a": "v"})
        assert join_unique(left, clash, "c").equals(left.join(clash, on="c", how="left", maintain_order="left"))
    got = join_unique(pl.DataFrame({"c": [3, None, 7, 5]}), pl.DataFrame({"c": [5, 3], "n": ["five", "three"]}), "c")
    assert got["n"].to_list() == ["three", None, None, "five"]
