"""One rank (a straggler) does more work per step than the others: the whole job waits for it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules rank_imbalance`` prints.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIXES = {
    "dataloader": "The straggler waits for input: give its DataLoader more workers, check its host's storage and "
                  "CPU load, shard the dataset evenly.",
    "kernel": "The straggler runs more or slower GPU work: check uneven shards / sequence lengths (bucket by "
              "length) and that GPU's clocks and health (nvidia-smi -q).",
    "cpu_exec": "The straggler's CPU is busier: look for host contention, NUMA/affinity, or rank-specific work "
                "(logging, checkpointing on rank 0).",
}


@rule("rank_imbalance", needs=(), severity=Severity.WARNING,
      params={"min_imbalance_pct": 5.0, "min_imbalance_ms": 0.05, "critical_pct": 20.0})
def check(results: Mapping[str, Any], config: Config, params: Params) -> Iterator[Finding]:
    """One rank (a straggler) does more work per step than the others: the whole job waits for it.

    Signal
        A multi-rank summary under ``results["multirank"]``, as ``traceanalyzer batch`` builds
        it for the ranks of one run (:func:`traceanalyzer.batch.multirank.multirank`): per rank
        the work per step (step window − exposed communication), the straggler, its excess per
        step-breakdown category. A single trace cannot show imbalance: the rule says so.
    Threshold
        imbalance (straggler's work − median of the others) ≥ ``min_imbalance_pct`` (5) % of
        the median step and ≥ ``min_imbalance_ms`` (0.05) ms (SageMaker's LoadBalancing uses
        0.2 of the step on system metrics; we fire earlier because the cost is priced).
        CRITICAL from ``critical_pct`` (20) %.
    Cost
        The imbalance per step: every other rank waits that long inside collectives.
    Fix
        Depends on where the straggler spends its extra time (data loading, kernels, CPU):
        see the evidence.
    """
    mr = results.get("multirank") if hasattr(results, "get") else None
    if mr is not None and not isinstance(mr, Mapping):
        mr = mr.to_json() if hasattr(mr, "to_json") else None
    if not mr or (mr.get("n_ranks") or 0) < 2:
        raise NotApplicable("needs the traces of several ranks: use `traceanalyzer batch`")
    ranks = [r for r in mr.get("ranks", []) if r.get("work_ms") is not None]
    slow = mr.get("straggler")
    imb, pct = mr.get("imbalance_ms"), mr.get("imbalance_pct")
    if slow is None or imb is None or pct is None:
        return
    if pct < params.min_imbalance_pct or imb < params.min_imbalance_ms:
        return
    spent = mr.get("straggler_spent_on")
    excess = mr.get("straggler_excess_ms") or {}
    sev = Severity.CRITICAL if pct >= params.critical_pct else Severity.WARNING
    extra = f"; its extra time is in {spent} (+{excess.get(spent, 0):.2f} ms/step)" if spent and spent in excess else ""
    yield Finding(
        rule_id="rank_imbalance", severity=sev,
        title=f"Rank {slow} is a straggler: {imb:.2f} ms/step more work than the other ranks ({pct:.1f} % of the "
              f"step){extra}",
        evidence={"straggler_rank": slow, "n_ranks": mr.get("n_ranks"),
                  "work_ms_by_rank": {str(r["rank"]): r["work_ms"] for r in ranks},
                  "excess_ms_per_step": excess, "idle_excess_ms_per_step": mr.get("straggler_idle_excess_ms"),
                  "step_ms_spread_pct": mr.get("step_ms_spread_pct")},
        fix=_FIXES.get(spent or "", "Open the straggler's timeline next to a fast rank's around the same step "
                                   "and compare where the time goes."),
        code_hint="traceanalyzer batch run_dir/ -o reports/  # per-rank table and straggler breakdown",
        cost_ms_per_step=round(float(imb), 3), cost_pct_of_step=round(float(pct), 2),
        confidence=0.8,
    )
