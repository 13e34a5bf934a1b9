"""Expert expectations on real traces (``tests/expectations/*.toml``, format in its README).

Each TOML file says, from reading one trace by hand, what the report must conclude: the verdict,
rules that must / must not fire, advice that must not be given, the ``context`` facts and the
``communication`` shares. The report is built once per input (``build_report(load(path))``) and
cached for the session. A missing analysis (``context`` or ``communication`` not computed) FAILS
with a message naming it: these expectations describe the product as it should be, so what the
tool does not yet do shows up here instead of being skipped.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, REPRESENTATIVE, SHARED_TRACES, shared_model, shared_results

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, a dependency there
    import tomli as tomllib

EXPECT_DIR = Path(__file__).resolve().parent / "expectations"
SAMPLES = REPO / "sample_traces"
KNOWN_SECTIONS = {"input", "summary", "refused", "error_contains", "verdict", "must_fire", "must_not_fire",
                  "must_not_advise", "context", "communication"}
CONTEXT_KEYS = {"compiled", "cuda_graphs", "graph_capture", "capture_only", "inference_engine", "device_arch", "vendor"}
COMM_RANGES = ("comm_pct_of_step", "hidden_pct", "exposed_pct_of_step")
# Which context fields explain a value (shown when it differs; only compiled_evidence is in the contract).
_CONTEXT_EVIDENCE = {
    "compiled": ("compiled_evidence",),
    "cuda_graphs": ("graph_launches", "graph_kernels"),
    "graph_capture": ("capture_evidence",),
    "capture_only": ("capture_evidence", "graph_launches"),
    "inference_engine": ("engine_evidence",),
    "device_arch": ("device_name", "arch_source", "compute_capability"),
    "vendor": ("device_name",),
}


def _expectation_files() -> list[Path]:
    return sorted(EXPECT_DIR.glob("*.toml"))


def _read(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _resolve(spec: str) -> Path:
    """``shared:<path under ../shared/data/traces>`` or ``sample:<path under sample_traces>``."""
    kind, _, rel = spec.partition(":")
    if kind == "shared":
        return SHARED_TRACES / rel
    if kind == "sample":
        return SAMPLES / rel
    raise ValueError(f"input must start with shared: or sample:, got {spec!r}")


def _params() -> list[Any]:
    out = []
    for f in _expectation_files():
        spec = _read(f).get("input", "")
        marks = [pytest.mark.shared] if spec.startswith("shared:") else []
        if spec.startswith("shared:") and "traces/" + spec.partition(":")[2] not in REPRESENTATIVE:
            marks.append(pytest.mark.slow)  # the default run checks the representative traces
        out.append(pytest.param(f, id=f.stem, marks=marks))
    return out


@functools.cache
def _report(path: Path) -> dict[str, Any]:
    """The JSON document of the full report on ``path`` (built once per session, on the session's
    shared model and analysis results: other real-trace tests reuse them)."""
    from traceanalyzer.pipeline import report_from_results

    return report_from_results(shared_model(path), shared_results(path), source=str(path)).to_json()


def _advice(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, text) for every piece of advice: finding fix / code_hint and the diagnosis moves."""
    out = []
    for f in doc["findings"]:
        out.append((f"finding {f['rule_id']} fix", f.get("fix") or ""))
        out.append((f"finding {f['rule_id']} code_hint", f.get("code_hint") or ""))
    diag = doc["analyses"].get("diagnosis") or {}
    for move in diag.get("what_would_move_it", []):
        out.append(("diagnosis move", move))
    return out


def _verdict_summary(doc: dict[str, Any]) -> str:
    diag = doc["analyses"].get("diagnosis")
    if diag is None:
        return (f"no diagnosis (skipped: {doc['skipped_analyses'].get('diagnosis')}, "
                f"failed: {doc['failed_analyses'].get('diagnosis')})")
    return f"verdict {diag['verdict']!r} ({diag.get('share_pct')} % share, top cause {diag.get('top_cause')})"


def _fired(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in doc["findings"]:
        out.setdefault(f["rule_id"], []).append(f)
    return out


def _finding_line(f: dict[str, Any]) -> str:
    return (f"[{f['severity']}] {f['title']} "
            f"(cost {f.get('cost_ms_per_step')} ms/step, {f.get('cost_pct_of_step')} % of step)")


def test_expectation_files_are_well_formed() -> None:
    """Every TOML parses, names its input, and uses only the documented keys."""
    files = _expectation_files()
    assert len(files) >= 10, f"expected the expectation files in {EXPECT_DIR}"
    from traceanalyzer.rules import registry as rule_registry

    rules = set(rule_registry())
    for f in files:
        exp = _read(f)
        assert set(exp) <= KNOWN_SECTIONS, f"{f.name}: unknown keys {set(exp) - KNOWN_SECTIONS}"
        assert exp.get("input", "").split(":")[0] in ("shared", "sample"), f"{f.name}: bad input"
        assert exp.get("summary"), f"{f.name}: summary missing"
        for sec in ("must_fire", "must_not_fire"):
            for item in exp.get(sec, []):
                assert item["rule"] in rules, f"{f.name}: {sec} names unknown rule {item['rule']!r}"
                assert item.get("reason"), f"{f.name}: {sec} {item['rule']} has no reason"
        for item in exp.get("must_not_advise", []):
            re.compile(item["pattern"])
            assert item.get("reason"), f"{f.name}: must_not_advise {item['pattern']!r} has no reason"
        if "verdict" in exp:
            assert exp["verdict"]["any_of"] and exp["verdict"].get("reason"), (
                f"{f.name}: verdict needs any_of and reason"
            )
        if "context" in exp:
            assert set(exp["context"]) - {"reason"} <= CONTEXT_KEYS, f"{f.name}: unknown context keys"


@pytest.mark.parametrize("exp_file", _params())
def test_expectation(exp_file: Path) -> None:
    exp = _read(exp_file)
    path = _resolve(exp["input"])
    if exp["input"].startswith("shared:") and not SHARED_TRACES.exists():
        pytest.skip("../shared reference data not present")
    assert path.exists(), f"{exp_file.name}: input {path} does not exist"

    if exp.get("refused"):
        from traceanalyzer.errors import InputError
        from traceanalyzer.pipeline import load

        with pytest.raises(InputError) as err:
            load(path)
        want = exp.get("error_contains", "")
        assert want.lower() in str(err.value).lower(), (
            f"{exp_file.name}: refusal message {str(err.value)!r} lacks {want!r}")
        return

    doc = _report(path)
    analyses = doc["analyses"]
    fired = _fired(doc)
    problems: list[str] = []

    if "verdict" in exp:
        want = exp["verdict"]["any_of"]
        got = (analyses.get("diagnosis") or {}).get("verdict")
        if got not in want:
            problems.append(f"verdict: expected one of {want} because: {exp['verdict']['reason']}\n"
                            f"    tool says: {_verdict_summary(doc)}")

    # A finding under the reporting floor (rules.min_cost_pct) was detected, only not ranked: it
    # satisfies must_fire, and must_not_fire looks at the ranked findings a reader sees.
    held = {f["rule_id"] for f in doc.get("findings_below_floor", [])}
    for item in exp.get("must_fire", []):
        if item["rule"] not in fired and item["rule"] not in held:
            not_run = doc["checks_not_run"].get(item["rule"]) or doc["failed_checks"].get(item["rule"])
            problems.append(f"must_fire {item['rule']}: {item['reason']}\n    tool: no finding"
                            + (f" (not run: {not_run})" if not_run else ""))

    for item in exp.get("must_not_fire", []):
        for f in fired.get(item["rule"], []):
            problems.append(f"must_not_fire {item['rule']}: {item['reason']}\n    tool: {_finding_line(f)}")

    advice = _advice(doc)
    for item in exp.get("must_not_advise", []):
        rx = re.compile(item["pattern"], re.IGNORECASE)
        for where, text in advice:
            m = rx.search(text)
            if m:
                problems.append(f"must_not_advise /{item['pattern']}/: {item['reason']}\n"
                                f"    tool ({where}) says: ...{text[max(0, m.start() - 60):m.end() + 60]}...")

    if "context" in exp:
        ctx_exp = {k: v for k, v in exp["context"].items() if k != "reason"}
        ctx = analyses.get("context")
        if ctx is None:
            why = doc["skipped_analyses"].get("context") or doc["failed_analyses"].get("context") or "not registered"
            problems.append(
                f"context: analysis missing ({why}); expected {ctx_exp} because: {exp['context']['reason']}"
            )
        else:
            for key, want in ctx_exp.items():
                if ctx.get(key) != want:
                    evidence = {k: ctx[k] for k in _CONTEXT_EVIDENCE.get(key, ()) if k in ctx}
                    problems.append(f"context.{key}: expected {want!r}, tool says {ctx.get(key)!r} "
                                    f"(tool evidence {evidence}); because: {exp['context']['reason']}")

    if "communication" in exp:
        c_exp = exp["communication"]
        c_want = {k: v for k, v in c_exp.items() if k != "reason"}
        comm = analyses.get("communication")
        present = c_exp.get("present", True)
        if comm is None:
            why = (
                doc["skipped_analyses"].get("communication")
                or doc["failed_analyses"].get("communication")
                or "not registered"
            )
            # Absent collectives may legitimately make the analysis not applicable; an unregistered or
            # failed analysis is always a problem.
            if present or why == "not registered" or "communication" in doc["failed_analyses"]:
                problems.append(
                    f"communication: analysis missing ({why}); expected {c_want} because: {c_exp['reason']}"
                )
        else:
            totals = comm.get("totals", {})
            if not present:
                if totals.get("n_collectives", 0):
                    problems.append(f"communication: expected no collectives because: {c_exp['reason']}\n"
                                    f"    tool: n_collectives={totals.get('n_collectives')}")
            else:
                if not totals.get("n_collectives"):
                    problems.append(f"communication: expected collectives because: {c_exp['reason']}\n"
                                    f"    tool: n_collectives={totals.get('n_collectives')}")
                for key in COMM_RANGES:
                    if key in c_exp:
                        lo, hi = c_exp[key]
                        got = totals.get(key)
                        if got is None or not lo <= got <= hi:
                            problems.append(f"communication.{key}: expected in [{lo}, {hi}], tool says {got}; "
                                            f"because: {c_exp['reason']}")

    if problems:
        # pytrace=False: the message (expectation, reason, what the tool said) is the whole story.
        pytest.fail(f"{exp_file.name} ({exp['input']}):\n  " + "\n  ".join(problems), pytrace=False)
