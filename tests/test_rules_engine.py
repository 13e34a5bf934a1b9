"""The rules engine: ranking, "checks that could not run" with reasons, NotApplicable and crashing
rules, threshold overrides (--set, TOML), the ``rules`` command, ``analyze --fail-on``, and
docs/rules.md being generated from the registry."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_rules_memory import GiB, MiB, _mem, _seg, _trace, _write

import traceanalyzer.rules as rules_mod
from traceanalyzer.analyses import Results, run_analyses
from traceanalyzer.cli import cli, main
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.load import load
from traceanalyzer.rules import Finding, Params, RuleSpec, Severity, registry, run_rules

REPO = Path(__file__).resolve().parents[1]


def _finding(rid: str, sev: Severity = Severity.WARNING, ms: float | None = None, b: int | None = None) -> Finding:
    return Finding(rule_id=rid, severity=sev, title=f"{rid} title", evidence={"x": 1}, fix="do it",
                   cost_ms_per_step=ms, cost_bytes=b)


def _spec(rid: str, func: Any, needs: tuple[str, ...] = (), params: dict[str, Any] | None = None,
          needs_any: tuple[str, ...] = ()) -> RuleSpec:
    return RuleSpec(rule_id=rid, func=func, needs=needs, severity=Severity.WARNING, params=params or {},
                    doc="A test rule.", needs_any=needs_any)


@pytest.fixture
def only_rules(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Replace the registry with the given specs for one test (every real module imported first,
    so discovery cannot register into the replacement)."""
    registry()

    def install(*specs: RuleSpec) -> None:
        monkeypatch.setattr(rules_mod, "_REGISTRY", {s.rule_id: s for s in specs})

    return install


# --------------------------------------------------------------------------------------
# Ranking
# --------------------------------------------------------------------------------------

def test_ranking_ms_then_bytes_then_severity(only_rules: Any) -> None:
    made = [
        _finding("f_info_nocost", Severity.INFO),
        _finding("f_bytes_1g", Severity.CRITICAL, b=GiB),
        _finding("f_ms_2", Severity.INFO, ms=2.0),
        _finding("f_crit_nocost", Severity.CRITICAL),
        _finding("f_bytes_2g", Severity.INFO, b=2 * GiB),
        _finding("f_ms_5", Severity.INFO, ms=5.0),
        _finding("f_ms_2_crit", Severity.CRITICAL, ms=2.0),
    ]

    def emit(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        yield from made

    only_rules(_spec("emit", emit))
    out = run_rules(Results())
    assert [f.rule_id for f in out.findings] == [
        "f_ms_5", "f_ms_2_crit", "f_ms_2",       # time first, biggest first; ties by severity
        "f_bytes_2g", "f_bytes_1g",             # then bytes, whatever the severity
        "f_crit_nocost", "f_info_nocost",       # then no cost: by severity
    ]


# --------------------------------------------------------------------------------------
# Checks that could not run
# --------------------------------------------------------------------------------------

GPU_RULES = {"low_gpu_utilization", "host_bound_gaps", "launch_bound_kernels", "kernel_count", "comm_exposed",
             "pageable_memcpy", "blocking_copies", "explicit_sync", "item_sync", "htod_in_step", "fp32_gemm",
             "layout_transposes", "unfused_elementwise"}
MEMORY_RULES = {"memory_capacity", "oom", "fragmentation", "memory_growth", "activation_peak"}


def _partition(out: Any) -> dict[str, set[str]]:
    found = {f.rule_id for f in out.findings}
    parts = {"found": found, "not_run": set(out.not_run), "failed": set(out.failed)}
    parts["silent"] = set(registry()) - found - parts["not_run"] - parts["failed"]
    return parts


def test_cpu_only_trace_lists_gpu_rules_as_not_run(tmp_path: Path) -> None:
    """A trace with CPU ops and steps only: every GPU rule is listed with a reason, none silently
    dropped; the memory rules say the trace has no [memory] events."""
    results = run_analyses(load(_trace(tmp_path, [], steps=4)), strict=True)
    out = run_rules(results, strict=True)
    parts = _partition(out)
    assert not parts["failed"]
    assert GPU_RULES <= parts["not_run"], f"silent on a CPU-only trace: {sorted(GPU_RULES - parts['not_run'])}"
    assert out.not_run["low_gpu_utilization"] == "no GPU activity in this trace (no kernels, memcpy or memset)"
    for rid in GPU_RULES | MEMORY_RULES:
        assert out.not_run[rid].strip(), rid
    for rid in MEMORY_RULES - {"activation_peak"}:
        assert out.not_run[rid] == "no [memory] events: profile with profile_memory=True"
    assert "from a memory snapshot" in out.not_run["activation_peak"]
    # Every registered rule is accounted for exactly once.
    assert sum(len(p) for p in parts.values()) == len(registry())


def test_snapshot_lists_trace_rules_with_the_input_they_need(tmp_path: Path) -> None:
    snap = _write(tmp_path, [_seg(1 << 40, [(GiB, "active_allocated", GiB, []), (3 * GiB, "inactive", 0, [])])])
    out = run_rules(run_analyses(load(snap), strict=True), strict=True)
    trace_rules = {rid for rid, s in registry().items() if s.needs and "trace_memory" not in s.needs}
    assert trace_rules and trace_rules <= set(out.not_run)
    assert out.not_run["low_gpu_utilization"] == "needs steps, gpu_time (from a profiler trace)"
    assert out.not_run["memory_capacity"] == "needs trace_memory, ops (from a profiler trace)"
    assert [f.rule_id for f in out.findings] == ["fragmentation"]


def test_not_applicable_raised_by_a_rule(only_rules: Any) -> None:
    def cannot(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        raise NotApplicable("no widgets in this trace: profile with widgets=True")
        yield  # pragma: no cover - a generator, like real rules

    def half(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        yield _finding("half", ms=1.0)
        raise NotApplicable("changed its mind")

    only_rules(_spec("cannot", cannot), _spec("half", half))
    out = run_rules(Results())
    assert out.not_run == {"cannot": "no widgets in this trace: profile with widgets=True",
                           "half": "changed its mind"}
    assert out.findings == []  # a rule that cannot decide keeps none of what it yielded


def test_needs_and_needs_any_reasons(only_rules: Any) -> None:
    def never(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        raise AssertionError("must not run")

    def ok(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        yield _finding("ok", b=1)

    only_rules(_spec("a_needs", never, needs=("steps", "gpu_time")),
               _spec("b_any_skipped", never, needs_any=("trace_memory", "memory_fragmentation")),
               _spec("c_any_present", ok, needs_any=("trace_memory", "steps")),
               _spec("d_any_unknown_kind", never, needs_any=("memory_peak", "export_timeline")))
    res = Results(values={"steps": object()}, skipped={"gpu_time": "no GPU activity",
                                                       "trace_memory": "no [memory] events"})
    out = run_rules(res)
    assert out.not_run == {
        "a_needs": "no GPU activity",
        "b_any_skipped": "no [memory] events",
        "d_any_unknown_kind": "needs memory_peak (from a memory snapshot) or export_timeline "
                              "(from an export_memory_timeline file)",
    }
    assert [f.rule_id for f in out.findings] == ["ok"]


def test_crashing_rule_becomes_a_failed_check_not_a_crash(only_rules: Any) -> None:
    def boom(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        yield _finding("boom", ms=9.0)
        raise KeyError("kernels")

    def fine(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        yield _finding("fine", ms=1.0)

    only_rules(_spec("boom", boom), _spec("fine", fine))
    out = run_rules(Results())
    assert out.failed == {"boom": "KeyError: 'kernels'"}
    assert [f.rule_id for f in out.findings] == ["fine"]  # nothing of the broken rule is kept
    with pytest.raises(KeyError):
        run_rules(Results(), strict=True)


def test_crashing_rule_in_analyze_is_reported_and_exit_is_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry()

    def boom(results: Any, config: Config, params: Params) -> Iterator[Finding]:
        raise ZeroDivisionError("division by zero")
        yield  # pragma: no cover

    monkeypatch.setitem(rules_mod._REGISTRY, "zz_boom", _spec("zz_boom", boom))
    trace = _trace(tmp_path, [_mem(10, 950 * MiB, 950 * MiB, 960 * MiB)], capacities={0: 1000 * MiB})
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["analyze", str(trace), "-o", str(out), "-f", "json,md"])
    assert res.exit_code == 0, res.output
    assert "warning: check zz_boom failed (internal error, please report): ZeroDivisionError" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_checks"] == {"zz_boom": "ZeroDivisionError: division by zero"}
    assert [f["rule_id"] for f in summary["findings"]] == ["memory_capacity"]  # the others still ran
    md = (out / "report.md").read_text()
    assert "`zz_boom` failed (internal error, please report): ZeroDivisionError" in md


# --------------------------------------------------------------------------------------
# Overrides: --set and TOML
# --------------------------------------------------------------------------------------

def test_params_defaults_and_overrides() -> None:
    spec = registry()["memory_capacity"]
    assert Params("memory_capacity", spec.params, Config()).as_dict() == {"max_pct": 90.0, "critical_pct": 97.0}
    p = Params("memory_capacity", spec.params, Config({"memory_capacity.max_pct": 80}))
    assert p.max_pct == 80.0 and isinstance(p.max_pct, float) and p.critical_pct == 97.0


def _capacity_trace(tmp_path: Path) -> Path:
    """cuda:0 peaks at 95 % of 1000 MiB: a memory_capacity WARNING at the default 90 %."""
    return _trace(tmp_path, [_mem(10, 950 * MiB, 950 * MiB, 960 * MiB), _mem(20, 0, -950 * MiB, 960 * MiB)],
                  capacities={0: 1000 * MiB})


def _analyze(args: list[str]) -> tuple[int, dict[str, Any]]:
    res = CliRunner().invoke(cli, ["analyze", *args, "-f", "json"])
    out = Path(args[args.index("-o") + 1])
    return res.exit_code, json.loads((out / "summary.json").read_text())


def test_set_and_config_file_change_findings(tmp_path: Path) -> None:
    trace = _capacity_trace(tmp_path)
    code, s = _analyze([str(trace), "-o", str(tmp_path / "a")])
    assert code == 0 and [f["rule_id"] for f in s["findings"]] == ["memory_capacity"]
    assert s["findings"][0]["cost_bytes"] == 50 * MiB

    code, s = _analyze([str(trace), "-o", str(tmp_path / "b"), "--set", "memory_capacity.max_pct=96"])
    assert code == 0 and s["findings"] == []

    toml = tmp_path / "thresholds.toml"
    toml.write_text("[memory_capacity]\nmax_pct = 96\n")
    code, s = _analyze([str(trace), "-o", str(tmp_path / "c"), "--config", str(toml)])
    assert code == 0 and s["findings"] == []
    # --set wins over the file.
    code, s = _analyze([str(trace), "-o", str(tmp_path / "d"), "--config", str(toml),
                        "--set", "memory_capacity.max_pct=80"])
    assert [(f["rule_id"], f["severity"], f["cost_bytes"]) for f in s["findings"]] == [
        ("memory_capacity", "warning", 150 * MiB)]


@pytest.mark.parametrize("args, message", [
    (["--set", "nosuch_rule.x=1"],
     "error: --set nosuch_rule.x=1: unknown rule or analysis 'nosuch_rule'; `traceanalyzer rules` lists the "
     "rules and their parameters"),
    (["--set", "memory_capacity.maxpct=80"],
     "error: --set memory_capacity.maxpct=80: rule 'memory_capacity' has no parameter 'maxpct' "
     "(its parameters: critical_pct, max_pct)"),
    (["--set", "memory_capacity.max_pct=high"],
     "error: --set memory_capacity.max_pct=high: memory_capacity.max_pct: expected a float, got 'high'"),
    (["--set", "idle_gaps.long_gap=5"],
     "error: --set idle_gaps.long_gap=5: analysis 'idle_gaps' has no parameter 'long_gap' "
     "(its parameters: long_gap_us, sync_tolerance_us)"),
    (["--set", "memory_capacity"],
     "error: --set 'memory_capacity': expected OWNER.PARAM=VALUE, e.g. idle_gaps.long_gap_us=100"),
])
def test_bad_set_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                    message: str) -> None:
    trace = _capacity_trace(tmp_path)
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(trace), "-o", str(out), "-q", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == message and err.count("\n") == 1
    assert not out.exists()  # rejected before any work


def test_bad_config_file_key_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("[fragmentation]\nmin_unused_byte = 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["rules", "--config", str(toml)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {toml}: rule 'fragmentation' has no parameter 'min_unused_byte' "
        "(its parameters: min_churn, min_unused_bytes, min_unused_pct)")


def test_analysis_thresholds_are_accepted() -> None:
    from traceanalyzer.commands.options import make_config

    cfg = make_config(None, ("idle_gaps.long_gap_us=200", "baseline.batch_size=32", "steps.warmup_factor=3"))
    assert cfg.overrides == {"idle_gaps.long_gap_us": 200, "baseline.batch_size": 32, "steps.warmup_factor": 3}


# --------------------------------------------------------------------------------------
# `traceanalyzer rules`
# --------------------------------------------------------------------------------------

def test_rules_command_lists_every_rule() -> None:
    res = CliRunner().invoke(cli, ["rules"])
    assert res.exit_code == 0, res.output
    specs = registry()
    lines = res.output.splitlines()
    for rid, spec in specs.items():
        row = next(line for line in lines if line.startswith(rid + " ") or line == rid)
        assert str(spec.severity) in row and spec.summary in row
    assert "needs: one of memory_fragmentation / trace_memory" in res.output
    assert "params: min_unused_bytes=1073741824 (1024 MiB), min_unused_pct=33, min_churn=10" in res.output
    assert f"{len(specs)} rules." in lines[-1]


def test_rules_command_one_rule_with_overrides(tmp_path: Path) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("[memory_capacity]\ncritical_pct = 99\n")
    res = CliRunner().invoke(cli, ["rules", "memory_capacity", "--config", str(toml),
                                   "--set", "memory_capacity.max_pct=85"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.startswith("memory_capacity  [warning]  needs: trace_memory, ops\n")
    assert registry()["memory_capacity"].doc in out
    assert "  memory_capacity.max_pct = 90 → 85\n" in out
    assert "  memory_capacity.critical_pct = 97 → 99\n" in out


def test_rules_command_unknown_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["rules", "no_such_rule"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: unknown rule 'no_such_rule'; `traceanalyzer rules` "
                                                "lists them")


# --------------------------------------------------------------------------------------
# analyze --fail-on
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, code", [("info", 1), ("warning", 1), ("critical", 0)])
def test_fail_on_warning_finding(tmp_path: Path, level: str, code: int) -> None:
    trace = _capacity_trace(tmp_path)  # one WARNING finding (memory_capacity)
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["analyze", str(trace), "-o", str(out), "-f", "json,md", "--fail-on", level])
    assert res.exit_code == code, res.output
    assert (out / "summary.json").exists() and (out / "report.md").exists()  # written either way
    gate = f"fail-on {level}: 1 finding(s) of severity {level} or worse, e.g. [warning] memory_capacity:"
    assert (gate in res.output) == (code == 1)


def test_fail_on_without_findings_exits_0(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [], steps=3)
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["analyze", str(trace), "-o", str(out), "-f", "json", "--fail-on", "info"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["findings"] == []


def test_fail_on_critical_trips_on_critical(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [_mem(10, 990 * MiB, 990 * MiB, 1000 * MiB)], capacities={0: 1000 * MiB})
    res = CliRunner().invoke(cli, ["analyze", str(trace), "-o", str(tmp_path / "o"), "-f", "json",
                                   "--fail-on", "critical"])
    assert res.exit_code == 1 and "[critical] memory_capacity" in res.output


def test_findings_are_json_serialisable(tmp_path: Path) -> None:
    results = run_analyses(load(_capacity_trace(tmp_path)), strict=True)
    (f,) = [f for f in run_rules(results, strict=True).findings if f.rule_id == "memory_capacity"]
    assert json.loads(json.dumps(f.to_json()))["severity"] == "warning"
    assert Severity.parse(" Warning ") is Severity.WARNING and str(Severity.CRITICAL) == "critical"


# --------------------------------------------------------------------------------------
# docs/rules.md
# --------------------------------------------------------------------------------------

def _gen_module() -> Any:
    spec = importlib.util.spec_from_file_location("gen_rules_doc", REPO / "scripts" / "gen_rules_doc.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rules_doc_is_up_to_date() -> None:
    text = _gen_module().render()
    current = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    assert current == text, "docs/rules.md is out of date: run python scripts/gen_rules_doc.py"


def test_rules_doc_covers_every_rule() -> None:
    text = _gen_module().render()
    for heading in ("## Severity", "## Cost model", "## Overriding thresholds", "## Failing a CI job: `--fail-on`"):
        assert heading in text
    for rid, spec in registry().items():
        assert f"\n### {rid}\n" in text and spec.summary in text
        for p in spec.params:
            assert f"`{rid}.{p}`" in text
    # Docstring terms become bold headings, their bodies plain paragraphs (not code blocks).
    section = text[text.index("\n### oom\n"):]
    assert "\n**Signal**\n\nSnapshot (``memory_oom``)" in section


def test_reporting_floor_holds_back_cheap_warnings_and_lists_them() -> None:
    """A warning costing under rules.min_cost_pct % of the step leaves the ranked findings for
    below_floor; info findings, byte costs and findings without a time cost stay."""
    from traceanalyzer.rules import Finding, Severity, below_floor

    def f(sev: Severity, pct: float | None, nbytes: int | None = None) -> Finding:
        return Finding("x", sev, "t", {}, "fix", cost_ms_per_step=None if pct is None else pct / 10,
                       cost_pct_of_step=pct, cost_bytes=nbytes)

    assert below_floor(f(Severity.WARNING, 0.05), 1.0)
    assert below_floor(f(Severity.CRITICAL, 0.99), 1.0)
    assert not below_floor(f(Severity.WARNING, 1.0), 1.0)
    assert not below_floor(f(Severity.INFO, 0.05), 1.0)
    assert not below_floor(f(Severity.WARNING, None), 1.0)
    assert not below_floor(f(Severity.WARNING, 0.05, nbytes=10), 1.0)
    assert not below_floor(f(Severity.WARNING, 0.05), 0.0)  # --set rules.min_cost_pct=0 shows everything
