"""compare: statistics over steps, planted-regression ranking, outputs, the CI gate."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import orjson
import pytest

from traceanalyzer.analyses.kernels import normalize_kernel_name
from traceanalyzer.cli import main
from traceanalyzer.compare.diff import compare_paths, delta_table
from traceanalyzer.compare.render import to_html, write
from traceanalyzer.compare.stats import bootstrap_median_diff, mann_whitney, step_time_change
from traceanalyzer.testing.synthetic import dumps_trace, scenario_regression, write_bytes

from conftest import SHARED_TRACES, needs_shared


# ------------------------------------------------------------------------------ statistics


def _brute_p(a: list[float], b: list[float]) -> float:
    x = a + b

    def u(idx: tuple[int, ...]) -> float:
        bb = [x[i] for i in idx]
        aa = [x[i] for i in range(len(x)) if i not in idx]
        return sum((p > q) + 0.5 * (p == q) for p in bb for q in aa)

    u0 = u(tuple(range(len(a), len(x))))
    us = [u(c) for c in itertools.combinations(range(len(x)), len(b))]
    return min(1.0, 2 * min(sum(v <= u0 for v in us), sum(v >= u0 for v in us)) / len(us))


@pytest.mark.parametrize("seed", range(4))
def test_mann_whitney_exact_matches_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = list(rng.normal(size=4))
    b = list(rng.normal(size=5) + 0.7)
    _, p, method = mann_whitney(a, b)
    assert method == "exact" and p == pytest.approx(_brute_p(a, b))


def test_mann_whitney_normal_with_ties() -> None:
    a = [1.0] * 30 + [2.0] * 30
    _, p_same, method = mann_whitney(a, list(a))
    assert method == "normal" and p_same > 0.9
    _, p_shift, _ = mann_whitney(a, [x + 1.0 for x in a])
    assert p_shift < 1e-6


def test_bootstrap_is_deterministic_and_covers_the_shift() -> None:
    rng = np.random.default_rng(3)
    a = list(rng.normal(10.0, 0.2, 25))
    b = list(rng.normal(10.6, 0.2, 25))
    one = bootstrap_median_diff(a, b)
    assert one == bootstrap_median_diff(a, b)
    point, lo, hi = one
    assert lo < point < hi and lo < 0.6 < hi and lo > 0


def test_verdicts() -> None:
    rng = np.random.default_rng(5)
    base = list(rng.normal(10, 0.1, 20))
    assert step_time_change(base, [x + 0.5 for x in rng.normal(10, 0.1, 20)]).verdict == "slower"
    assert step_time_change(base, list(rng.normal(9.5, 0.1, 20))).verdict == "faster"
    same = step_time_change(base, list(rng.normal(10, 0.1, 20)))
    assert same.verdict == "no significant change" and same.ci_low_ms <= 0 <= same.ci_high_ms
    assert "no significant change" in same.sentence()
    # three steps a side: the interval may exclude zero, the rank test cannot confirm (p ≥ 0.1)
    assert step_time_change([1, 2, 3], [4, 5, 6]).verdict == "inconclusive"
    assert step_time_change([1.0], [2.0]).verdict == "not enough steps"


# ------------------------------------------------------------------------------ diff


@pytest.fixture(scope="module")
def regression_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    d = tmp_path_factory.mktemp("reg")
    paths = []
    planted: dict = {}
    for baseline in (True, False):
        trace, truth = scenario_regression(baseline=baseline, steps=6)
        planted = truth["planted"]
        paths.append(write_bytes(d / ("base.json.gz" if baseline else "cand.json.gz"), dumps_trace(trace)))
    return paths[0], paths[1], planted


@pytest.fixture(scope="module")
def regression_cmp(regression_pair: tuple[Path, Path, dict]):  # type: ignore[no-untyped-def]
    base, cand, _ = regression_pair
    return compare_paths(str(base), str(cand))


def test_planted_regression_ranked_first(regression_pair: tuple[Path, Path, dict], regression_cmp) -> None:  # type: ignore[no-untyped-def]
    planted = regression_pair[2]
    cmp = regression_cmp
    top = cmp.kernels.row(0, named=True)
    # the planted kernel is first, with the planted extra time per step
    assert top["name"] == normalize_kernel_name(planted["kernel"]) and top["status"] == "changed"
    n_steps = cmp.baseline.n_windows
    assert top["delta_ms"] == pytest.approx(planted["delta_total_ns"] / 1e6 / n_steps, rel=1e-3)
    # every other kernel is unchanged
    assert cmp.kernels.filter(pl_status_changed())["name"].to_list() == [top["name"]]
    assert cmp.step_time.diff_ms > 0 and cmp.step_time.ci_low_ms is not None
    assert not cmp.new_kernels().height and not cmp.vanished_kernels().height
    step = next(m for m in cmp.metrics if m["key"] == "step_ms")
    assert step["delta"] > 0


def pl_status_changed():  # type: ignore[no-untyped-def]
    import polars as pl

    return pl.col("status") == "changed"


def test_outputs_and_fail_gate(regression_pair: tuple[Path, Path, dict], tmp_path: Path) -> None:
    base, cand, planted = regression_pair
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as ex:
        main(["compare", str(base), str(cand), "-o", str(out), "--fail-if-slower", "1", "-q"])
    # the candidate is slower by ~6 % with an interval above zero → the gate trips
    assert ex.value.code == 1
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert doc["kernels"][0]["name"] == normalize_kernel_name(planted["kernel"])
    assert doc["step_time"]["ci_low_ms"] > 0 and doc["verdict"] in ("slower", "inconclusive")
    assert "cunn_SoftMaxForward" in (out / "compare.md").read_text()
    assert (out / "compare.html").read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(SystemExit) as ex:
        main(["compare", str(base), str(cand), "-o", str(out), "--fail-if-slower", "50", "-q", "-f", "json"])
    assert ex.value.code == 0
    with pytest.raises(SystemExit) as ex:  # same trace twice: nothing to gate
        main(["compare", str(base), str(base), "-o", str(out), "--fail-if-slower", "0", "-q", "-f", "json"])
    assert ex.value.code == 0
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert doc["verdict"] == "no significant change" and doc["step_time"]["diff_ms"] == 0


def test_delta_table_new_vanished_and_html_escaping(regression_cmp) -> None:  # type: ignore[no-untyped-def]
    df = delta_table({"a<b>": (2, 2_000_000), "gone": (1, 5_000_000)}, {"a<b>": (4, 3_000_000), "fresh": (1, 1)}, 1, 1)
    assert df["name"].to_list() == ["gone", "a<b>", "fresh"]
    assert dict(zip(df["name"], df["status"])) == {"gone": "vanished", "a<b>": "changed", "fresh": "new"}
    from dataclasses import replace

    evil = replace(regression_cmp, kernels=df)
    page = to_html(evil)
    assert "a&lt;b&gt;" in page and "a<b>" not in page and "<script" not in page


@needs_shared
@pytest.mark.slow
def test_hta_trace_diff(tmp_path: Path) -> None:
    root = SHARED_TRACES / "hta" / "trace_diff"
    cmp = compare_paths(str(root / "control"), str(root / "test"))
    assert cmp.baseline.n_ranks == 1 and cmp.candidate.n_ranks == 1
    st = cmp.step_time
    assert st.n_base >= 2 and st.n_cand >= 2 and st.ci_low_ms is not None and st.ci_low_ms <= st.diff_ms <= st.ci_high_ms
    # the test run changed its GEMM kernels (cutlass → volta_sgemm): both lists are non-empty
    assert cmp.new_kernels().height and cmp.vanished_kernels().height
    impact = cmp.kernels["delta_ms"].abs().to_list()
    assert impact == sorted(impact, reverse=True)
    written = write(cmp, tmp_path)
    assert {p.name for p in written} == {"compare.md", "compare.json", "compare.html"}
