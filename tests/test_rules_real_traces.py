"""Every rule on every real input of ../shared/data: no rule raises, every finding is well-formed,
every rule is accounted for (finding, silent, or "could not run" with a reason), and a few
expectations checked by hand against the files (numbers recomputed here with plain json/gzip).

Loads come from the session caches of conftest (one load and one analysis run per file for the
whole test session)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED, needs_shared, shared_params, shared_results, shared_trace_files

from traceanalyzer.errors import InputError
from traceanalyzer.rules import RuleOutcome, Severity, registry, run_rules

DATA = SHARED / "data"
REFUSED = {"hta/execution_trace/benchmark_simple_add_et.json.gz"}  # a PyTorch Execution Trace, not a trace


def _inputs() -> list[Path]:
    if not DATA.exists():
        return []
    files = [p for p in shared_trace_files() if str(p.relative_to(DATA / "traces")) not in REFUSED]
    files += sorted((DATA / "snapshots").rglob("*.pickle"))
    files += sorted(p for p in (DATA / "profiler_cpu").glob("*.json*"))
    return files


FILES = _inputs()
_OUTCOMES: dict[Path, RuleOutcome] = {}


def outcome(path: Path) -> RuleOutcome:
    """The rules on a cached analysis run, strict: a rule that raises fails the test."""
    if path not in _OUTCOMES:
        _OUTCOMES[path] = run_rules(shared_results(path), strict=True)
    return _OUTCOMES[path]


def _rel(p: Path) -> str:
    return str(p.relative_to(DATA))


def _one(out: RuleOutcome, rule_id: str) -> Any:
    found = [f for f in out.findings if f.rule_id == rule_id]
    assert len(found) == 1, f"{rule_id}: {[f.title for f in out.findings]} not_run={out.not_run.get(rule_id)}"
    return found[0]


@needs_shared
def test_inputs_present() -> None:
    assert len(FILES) >= 70


@needs_shared
@pytest.mark.parametrize("path", shared_params(FILES))
def test_rules_run_and_findings_are_well_formed(path: Path) -> None:
    try:
        out = outcome(path)
    except InputError as exc:  # pragma: no cover - every listed file loads
        pytest.fail(f"{path} does not load: {exc}")
    specs = registry()
    assert not out.failed
    for f in out.findings:
        where = f"{_rel(path)}: {f.rule_id}"
        assert f.rule_id in specs, where
        assert isinstance(f.severity, Severity), where
        assert f.title.strip() and f.fix.strip(), where
        assert 0.0 < f.confidence <= 1.0, where
        for v in (f.cost_ms_per_step, f.cost_pct_of_step):
            assert v is None or (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0), where
        assert f.cost_pct_of_step is None or f.cost_pct_of_step <= 100.0, where
        assert f.cost_bytes is None or (isinstance(f.cost_bytes, int) and f.cost_bytes >= 0), where
        # The canonical JSON is strict: no NaN/inf anywhere in a finding.
        json.dumps(f.to_json(), allow_nan=False)
    # Every rule ends up in one place; a rule that could not run says why.
    found = {f.rule_id for f in out.findings}
    assert not (found & set(out.not_run))
    assert all(why.strip() for why in out.not_run.values())


# --------------------------------------------------------------------------------------
# Specific expectations
# --------------------------------------------------------------------------------------

DF_INDEX = DATA / "traces/hta/df_index_resolver/df_index_resolver.json.gz"
MI300_DDP = DATA / "traces/tracelens/mi300/resnet_act_checkpoint.json.gz"
CPU_ONLY = DATA / "traces/hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
SNAP_OOM = DATA / "snapshots/synthetic/snap_2.13_state_oom.pickle"
YIYI_OOM = DATA / "snapshots/Yiyi__oom_snapshot.pickle"
RAW_TIMELINE = DATA / "traces/hta/memory_analysis/memory_timeline.raw.gz"
PROFILER_CPU = DATA / "profiler_cpu/trace.json"

GPU_RULES = {"low_gpu_utilization", "host_bound_gaps", "launch_bound_kernels", "kernel_count", "comm_exposed",
             "pageable_memcpy", "blocking_copies", "explicit_sync", "item_sync", "htod_in_step", "fp32_gemm",
             "layout_transposes", "unfused_elementwise"}


@needs_shared
def test_df_index_resolver_is_host_bound() -> None:
    """Our diagnosis: CPU/launch-bound (the GPU idles with nothing queued 41 % of the step); the
    host-bound rule prices the same idle."""
    out = outcome(DF_INDEX)
    diag = shared_results(DF_INDEX)["diagnosis"]
    assert diag.verdict == "cpu_bound"
    f = _one(out, "host_bound_gaps")
    assert f.severity == Severity.CRITICAL
    assert f.cost_pct_of_step == pytest.approx(diag.share_pct, abs=0.5)
    assert out.findings[0].rule_id == "host_bound_gaps"  # the most expensive finding


@needs_shared
def test_df_index_resolver_reserved_memory_never_used() -> None:
    """[memory] events of cuda:1 (recomputed here): peak Total Allocated 6,629,508,096 B, peak
    Total Reserved 12,782,141,440 B; 32 GB V100s, so no capacity pressure (19 %)."""
    with gzip.open(DF_INDEX, "rt") as fh:
        doc = json.load(fh)
    peaks = [0, 0]
    for e in doc["traceEvents"]:
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1:
            peaks = [max(peaks[0], e["args"]["Total Allocated"]), max(peaks[1], e["args"]["Total Reserved"])]
    assert peaks == [6_629_508_096, 12_782_141_440]
    out = outcome(DF_INDEX)
    f = _one(out, "fragmentation")
    assert f.cost_bytes == peaks[1] - peaks[0]
    assert f.evidence["device"] == "cuda:1" and f.evidence["unused_pct_of_reserved"] == 48.13
    assert not [x for x in out.findings if x.rule_id in ("memory_capacity", "memory_growth", "oom")]
    assert "memory_capacity" not in out.not_run  # capacity known (deviceProperties): it decided


@needs_shared
def test_mi300_ddp_is_communication_bound() -> None:
    out = outcome(MI300_DDP)
    diag = shared_results(MI300_DDP)["diagnosis"]
    assert diag.verdict == "comm_bound"
    f = _one(out, "comm_exposed")
    assert f.severity >= Severity.WARNING
    assert f.cost_pct_of_step == pytest.approx(diag.share_pct, abs=0.5)


@needs_shared
def test_cpu_only_trace_lists_gpu_rules_as_not_run() -> None:
    out = outcome(CPU_ONLY)
    assert out.findings == [] or all(f.rule_id not in GPU_RULES for f in out.findings)
    assert GPU_RULES <= set(out.not_run)


@needs_shared
def test_snapshot_oom_finding() -> None:
    """The generator's OOM (tools/make_snapshot_like.py): an 80 GiB request with 123 MiB free."""
    f = _one(outcome(SNAP_OOM), "oom")
    assert f.severity == Severity.CRITICAL
    assert f.evidence["requested_bytes"] == 80 << 30 and f.evidence["device_free_bytes"] == 123 << 20
    assert f.evidence["verdict"] == "capacity"
    assert f.cost_bytes == (80 << 30) - (123 << 20)


@needs_shared
def test_snapshot_dumped_in_oom_handler_without_history_cannot_tell() -> None:
    """Yiyi's 2.0 snapshot was dumped in an OOM handler, but with a ring buffer of one ``snapshot``
    marker: no ``oom`` entry exists, so the rule says why it cannot decide instead of guessing."""
    out = outcome(YIYI_OOM)
    assert "no allocation history" in out.not_run["oom"]
    assert not [f for f in out.findings if f.rule_id == "oom"]


@needs_shared
def test_raw_memory_timeline_activation_share() -> None:
    """The raw export recomputed here: cumulative bytes per category, taken at the highest total."""
    with gzip.open(RAW_TIMELINE, "rt") as fh:
        rows = json.load(fh)
    t_min = min(r[0] for r in rows if r[0] >= 0)
    cur = [0] * 8
    best_total, best_act = -1, 0
    for _t, _action, delta, cat in sorted(rows, key=lambda r: r[0] if r[0] >= 0 else t_min):
        cur[7 if cat is None else min(max(cat, 0), 7)] += delta
        if sum(cur) > best_total:
            best_total, best_act = sum(cur), cur[4]  # index 4: ACTIVATION
    f = _one(outcome(RAW_TIMELINE), "activation_peak")
    assert (f.cost_bytes, f.evidence["peak_bytes"]) == (best_act, best_total)
    # the finding shows the analysis' share (2 decimals), not a figure of its own
    assert f.evidence["pct_of_peak"] == round(best_act * 100 / best_total, 2)


@needs_shared
def test_cpu_profile_memory_rules_say_why() -> None:
    out = outcome(PROFILER_CPU)
    assert out.not_run["memory_capacity"].startswith("only host (cpu) [memory] events")
    assert out.not_run["memory_growth"].startswith("no ProfilerStep# windows")
