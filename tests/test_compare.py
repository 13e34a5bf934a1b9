"""compare: statistics over steps, planted-regression ranking, outputs, the CI gate."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import SHARED_TRACES, needs_shared
from support.synthetic import dumps_trace, scenario_regression, write_bytes

from traceanalyzer.analyses._kernels import normalize_kernel_name
from traceanalyzer.cli import main
from traceanalyzer.compare.comparability import _cuda_version, _hip_version, check_comparability
from traceanalyzer.compare.diff import compare_paths, delta_table
from traceanalyzer.compare.render import to_html, to_markdown, write
from traceanalyzer.compare.stats import bootstrap_median_diff, mann_whitney, step_time_change

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
    assert not same.low_power and same.mde_pct == pytest.approx(100 * (same.ci_high_ms - same.ci_low_ms) / 2
                                                                 / same.base_median_ms, abs=1e-3)
    assert "no significant change" in same.sentence()
    # three steps a side: the interval may exclude zero, the rank test cannot confirm (p ≥ 0.1)
    assert step_time_change([1, 2, 3], [4, 5, 6]).verdict == "too few steps to tell"
    assert step_time_change([1.0], [2.0]).verdict == "not enough steps"


def test_few_steps_say_little_power_not_no_change() -> None:
    # 3 vs 3 steps, the median moved −19 %: the interval spans zero, but "no significant change"
    # would be a claim this test cannot make
    st = step_time_change([10.0, 10.6, 9.7], [8.1, 9.9, 7.6])
    assert st.diff_pct == pytest.approx(-19.0) and st.ci_low_ms < 0 < st.ci_high_ms
    assert st.verdict == "too few steps to tell" and st.low_power
    text = st.sentence()
    assert "no significant change" not in text
    assert "too few steps to tell (3 and 3 steady steps): the test has little power" in text
    assert "the median moved -19.0 %" in text
    # the same with 4 steps on one side: still under MIN_STEPS (5)
    four = step_time_change([10.0, 10.6, 9.7, 10.1], [8.1, 9.9, 7.6, 10.3, 8.2])
    assert four.ci_low_ms < 0 < four.ci_high_ms and four.verdict == "too few steps to tell"
    assert "(4 and 5 steady steps)" in four.sentence()
    # a clear separation with 4 and 5 steps is significant: power only matters for a null result
    assert step_time_change([10.0, 10.6, 9.7, 10.1], [8.1, 8.3, 7.6, 8.4, 8.0]).verdict == "faster"


def test_wide_interval_says_little_power() -> None:
    # 12 vs 12 noisy steps (cv 40 %): the interval spans zero but reaches far beyond ±5 %
    rng = np.random.default_rng(2)
    st = step_time_change(list(rng.normal(10, 4, 12)), list(rng.normal(8.1, 4, 12)))
    assert st.ci_low_ms < 0 < st.ci_high_ms and st.ci_low_pct < -5
    assert st.verdict == "too few steps to tell" and st.mde_pct > 5
    assert f"its 95 % interval [{st.ci_low_pct:+.1f} %, {st.ci_high_pct:+.1f} %] reaches beyond ±5 %" in st.sentence()


# ------------------------------------------------------------------------------ comparability


def _facts(**kw: object) -> dict:
    base = {"device_model": ["NVIDIA H100 80GB HBM3"], "device_count": 1, "vendor": "nvidia", "world_size": 8,
            "torch": None, "cuda_runtime": "12.4", "cuda_driver": "12.9", "hip_runtime": None, "nccl": "2.21.5",
            "batch_size": 32}
    return {**base, **kw}


def test_comparability_statuses() -> None:
    ok = check_comparability([_facts()], [_facts()])
    assert ok.status == "comparable" and ok.comparable and ok.headline() is None
    by = {f.key: f.status for f in ok.fields}
    assert by["device_model"] == "match" and by["torch"] == "unknown" and by["hip_runtime"] == "unknown"

    hw = check_comparability([_facts()], [_facts(device_model=["AMD Instinct MI300X"], vendor="amd",
                                                 cuda_runtime=None, hip_runtime="6.4.43483")])
    assert hw.status == "not comparable" and not hw.comparable
    assert [f.key for f in hw.hardware_mismatches] == ["device_model", "vendor"]
    assert {f.key: f.status for f in hw.fields}["cuda_runtime"] == "unknown"  # unknown never blocks
    assert hw.headline().startswith("NOT COMPARABLE: different hardware (device model NVIDIA H100 80GB HBM3 vs "
                                    "AMD Instinct MI300X; vendor nvidia vs amd)")

    sw = check_comparability([_facts()], [_facts(cuda_runtime="12.6", batch_size=64)])
    assert sw.status == "comparable with warnings" and sw.comparable
    assert [f.key for f in sw.warnings] == ["cuda_runtime", "batch_size"]
    assert sw.headline() == "warning: cuda runtime 12.4 vs 12.6; batch size 32 vs 64 differ"

    # world size and device count are hardware; a directory side that mixes is a mismatch
    assert [f.key for f in check_comparability([_facts()], [_facts(world_size=2, device_count=2)])
            .hardware_mismatches] == ["device_count", "world_size"]
    mixed = check_comparability([_facts(), _facts()], [_facts(), _facts(device_model=["Tesla V100-SXM2-16GB"])])
    dm = mixed.fields[0]
    assert dm.status == "mismatch" and dm.candidate == "mixed: NVIDIA H100 80GB HBM3, Tesla V100-SXM2-16GB"
    # nothing recorded on one side: unknown, comparable
    blank = check_comparability([_facts()], [{}])
    assert blank.status == "comparable" and {f.status for f in blank.fields} == {"unknown"}


def test_version_formats() -> None:
    assert _cuda_version("12040") == "12.4" and _cuda_version(12090) == "12.9" and _cuda_version(None) is None
    assert _hip_version("60443483") == "6.4.43483"


@pytest.fixture(scope="module")
def hardware_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A100 and H100 sides of the regression scenario, plus an A100 candidate with another CUDA runtime."""
    d = tmp_path_factory.mktemp("hw")
    out = {}
    for name, baseline, gpu in (("h100_base", True, "H100"), ("a100_base", True, "A100"), ("a100_cand", False, "A100")):
        trace, _ = scenario_regression(baseline=baseline, steps=6, gpu=gpu)
        out[name] = write_bytes(d / f"{name}.json.gz", dumps_trace(trace))
    trace, _ = scenario_regression(baseline=False, steps=6, gpu="A100")
    trace["cuda_runtime_version"] = 12080
    out["a100_cand_cuda128"] = write_bytes(d / "a100_cand_cuda128.json.gz", dumps_trace(trace))
    return out


def test_same_hardware_is_comparable(hardware_pair: dict[str, Path]) -> None:
    cmp = compare_paths(str(hardware_pair["a100_base"]), str(hardware_pair["a100_cand"]))
    c = cmp.comparability
    assert c.status == "comparable" and c.headline() is None and cmp.gate_refusal() is None
    by = {f.key: (f.baseline, f.candidate, f.status) for f in c.fields}
    assert by["device_model"] == ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", "match")
    assert by["device_count"] == ("1", "1", "match") and by["world_size"] == ("1", "1", "match")
    assert by["cuda_runtime"] == ("12.6", "12.6", "match") and by["batch_size"][2] == "match"
    assert not to_markdown(cmp).splitlines()[2].startswith("> **NOT COMPARABLE")


def test_different_devices_stated_and_gate_refuses(hardware_pair: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = str(hardware_pair["h100_base"]), str(hardware_pair["a100_cand"])
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as ex:
        main(["compare", base, cand, "-o", str(out), "--fail-if-slower", "1", "--top", "1"])
    assert ex.value.code == 2  # a usage-like refusal, not a regression verdict
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "not comparable" in err[0] and "--allow-mismatch" in err[0]
    assert "device model NVIDIA H100 80GB HBM3 vs NVIDIA A100 80GB PCIe" in err[0]
    # every output states it at the top
    assert cap.out.splitlines()[0].startswith("NOT COMPARABLE: different hardware (device model NVIDIA H100")
    md = (out / "compare.md").read_text().splitlines()
    assert md[2].startswith("> **NOT COMPARABLE: different hardware")
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert list(doc)[:2] == ["tool", "comparability"]
    assert doc["comparability"]["status"] == "not comparable"
    assert doc["comparability"]["hardware_mismatches"] == ["device_model"]
    page = (out / "compare.html").read_text()
    assert page.index("<div class=mismatch>") < page.index("Verdict:")
    # --allow-mismatch: the gate behaves as without the check (the candidate is slower → 1) …
    with pytest.raises(SystemExit) as ex:
        main(["compare", base, cand, "-o", str(out), "--fail-if-slower", "1", "--allow-mismatch", "-q", "-f", "json"])
    assert ex.value.code == 1
    cap = capsys.readouterr()
    assert cap.err.splitlines()[0].startswith("NOT COMPARABLE")  # -q still states the mismatch
    assert "regression: median step time" in cap.err and "across different hardware" in cap.err
    assert orjson.loads((out / "compare.json").read_bytes())["comparability"]["status"] == "not comparable"
    # … and without a gate nothing is refused
    with pytest.raises(SystemExit) as ex:
        main(["compare", base, cand, "-o", str(out), "-q", "-f", "json"])
    assert ex.value.code == 0


def test_software_mismatch_is_a_warning(hardware_pair: dict[str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = str(hardware_pair["a100_base"]), str(hardware_pair["a100_cand_cuda128"])
    with pytest.raises(SystemExit) as ex:
        main(["compare", base, cand, "-o", str(tmp_path), "--fail-if-slower", "1", "-f", "md"])
    assert ex.value.code == 1  # the gate judges: same hardware
    cap = capsys.readouterr()
    assert cap.out.splitlines()[0] == "warning: cuda runtime 12.6 vs 12.8 differ"
    assert (tmp_path / "compare.md").read_text().splitlines()[2] == "> **warning: cuda runtime 12.6 vs 12.8 differ**"


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
    # the planted slowdown is significant: the whole confidence interval lies above zero
    assert cmp.step_time.diff_ms == pytest.approx(0.3059, abs=1e-4) and cmp.step_time.ci_low_ms > 0
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
    assert doc["step_time"]["ci_low_ms"] > 0 and doc["verdict"] == "slower"
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
    assert st.n_base >= 2 and st.n_cand >= 2 and st.ci_low_ms <= st.diff_ms <= st.ci_high_ms
    # control ran on A100s in a world of 8, test on V100s in a world of 2: not comparable
    c = cmp.comparability
    assert c.status == "not comparable"
    assert [f.key for f in c.hardware_mismatches] == ["device_model", "world_size"]
    by = {f.key: (f.baseline, f.candidate) for f in c.fields}
    assert by["device_model"] == ("NVIDIA A100-PG509-200", "Tesla V100-SXM2-16GB") and by["world_size"] == ("8", "2")
    # the test run changed its GEMM kernels (cutlass → volta_sgemm): both lists are non-empty
    assert cmp.new_kernels().height and cmp.vanished_kernels().height
    impact = cmp.kernels["delta_ms"].abs().to_list()
    assert impact == sorted(impact, reverse=True)
    written = write(cmp, tmp_path)
    assert {p.name for p in written} == {"compare.md", "compare.json", "compare.html"}


H100_MI300 = ("tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
              "tracelens/mi300/gaunernst_bert-small-uncased__1016001.json.gz")


@needs_shared
def test_h100_vs_mi300_not_comparable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = (str(SHARED_TRACES / p) for p in H100_MI300)
    if not all(Path(p).exists() for p in (base, cand)):
        pytest.skip("tracelens h100/mi300 pair not present")
    cmp = compare_paths(base, cand)
    c = cmp.comparability
    by = {f.key: (f.baseline, f.candidate, f.status) for f in c.fields}
    assert c.status == "not comparable"
    assert by["device_model"] == ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X VF", "mismatch")
    assert by["vendor"] == ("nvidia", "amd", "mismatch") and by["device_count"] == ("1", "1", "match")
    assert by["cuda_runtime"] == ("12.4", None, "unknown") and by["hip_runtime"] == (None, "6.4.43483", "unknown")
    with pytest.raises(SystemExit) as ex:
        main(["compare", base, cand, "-o", str(tmp_path), "--fail-if-slower", "3", "-q", "-f", "json"])
    assert ex.value.code == 2
    assert "not comparable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ex:  # one step a side, and faster: the allowed gate passes
        main(["compare", base, cand, "-o", str(tmp_path), "--fail-if-slower", "3", "-q", "-f", "json",
              "--allow-mismatch"])
    assert ex.value.code == 0


@needs_shared
def test_sampled_ranks_comparable() -> None:
    root = SHARED_TRACES / "hta" / "trace_filter"
    cmp = compare_paths(str(root / "sampled_rank-0.json.gz"), str(root / "sampled_rank-1.json.gz"))
    c = cmp.comparability
    by = {f.key: (f.baseline, f.candidate, f.status) for f in c.fields}
    # two ranks of one 128-rank job; the traces carry no deviceProperties
    assert c.status == "comparable" and by["world_size"] == ("128", "128", "match")
    assert by["device_model"][2] == "unknown" and by["device_count"] == ("1", "1", "match")
    # 2 vs 2 steady steps: too few to tell, not "no significant change"
    assert cmp.step_time.n_base == 2 and cmp.step_time.verdict == "too few steps to tell"


def test_truncated_baseline_warnings_reach_every_compare_output(regression_pair: tuple[Path, Path, dict],
                                                                tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    base, cand, _ = regression_pair
    raw = gzip.decompress(base.read_bytes())
    cut = tmp_path / "base_truncated.json"
    cut.write_bytes(raw[: int(len(raw) * 0.6)])  # a job killed while writing its trace
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as ex:
        main(["compare", str(cut), str(cand), "-o", str(out)])
    assert ex.value.code == 0
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert doc["input_warnings"] and all(w.startswith(f"baseline {cut}: ") for w in doc["input_warnings"])
    assert any("truncated" in w for w in doc["input_warnings"])
    assert doc["baseline"]["load_warnings"][0]["file"] == str(cut) and doc["candidate"]["load_warnings"] == []
    md = (out / "compare.md").read_text()
    assert md.index("Input warnings") < md.index("Verdict") and "truncated" in md
    page = (out / "compare.html").read_text()
    assert page.index("Input warnings") < page.index("Verdict")
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("warning: baseline") and "truncated" in printed.splitlines()[0]


def test_a_trace_against_a_snapshot_is_refused(tmp_path: Path) -> None:
    """Sides of different kinds share no kernels or steps: every kernel of the trace side would
    read as new. compare refuses them with one line naming both kinds."""
    import pickle

    from traceanalyzer.errors import InputError

    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4))
    trace = tmp_path / "base.json"
    write_bytes(trace, dumps_trace(scenario_regression(True, seed=0)[0]))
    with pytest.raises(InputError, match=r"snap\.pickle: holds memory snapshots, the baseline profiler traces: "
                                         r"compare needs the same kind of input on both sides"):
        compare_paths(str(trace), str(snap))
