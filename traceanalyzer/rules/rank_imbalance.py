"""One rank (a straggler) does more work per step than the others: the whole job waits for it.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules rank_imbalance`` prints.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule

_FIXES = {
    "dataloader": "The straggler waits for input data: give its DataLoader more workers / pin_memory, check the "
                  "storage and CPU load of that host, and shard the dataset evenly.",
    "kernel": "The straggler does more GPU work or runs it slower: check for uneven shards or sequence lengths "
              "(bucket by length), and that GPU's clocks, temperature and ECC state (nvidia-smi -q / rocm-smi).",
    "cpu_exec": "The straggler's CPU is busier: look for host contention (other processes, NUMA placement, CPU "
                "affinity) or rank-specific Python work (logging, checkpointing on rank 0).",
    "runtime": "The straggler spends longer in CUDA/HIP runtime calls: check CPU contention and launch overhead on "
               "that host.",
    "memcpy": "The straggler copies more or slower: check its PCIe/NUMA placement and pinned memory.",
    "memset": "The straggler spends more time in memsets: check for rank-specific buffers being re-zeroed.",
}
_OTHER = "Open the straggler's timeline next to a fast rank's around the same step and compare where the time goes."


#: Thresholds (``batch`` reads them to run this rule on a run's multi-rank summary).
PARAMS = {"min_imbalance_pct": 5.0, "min_imbalance_ms": 0.05, "critical_pct": 20.0}


@rule("rank_imbalance", needs=(), severity=Severity.WARNING, params=PARAMS, uses=("multirank",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """One rank (a straggler) does more work per step than the others: the whole job waits for it.

    Signal
        The multi-rank summary that ``traceanalyzer batch`` builds for the ranks of one run
        (:func:`traceanalyzer.batch.multirank.multirank`, under ``results["multirank"]``): per
        rank the work per step (mean step window − exposed communication: in a synchronous
        job the fast ranks spend the difference waiting inside collectives, so step times
        alone do not show the straggler), the straggler (most work), and its excess over the
        median of the other ranks per step-breakdown category and per GPU idle cause. A
        single trace cannot show imbalance: ``analyze`` lists this check as not run.
    Threshold
        imbalance (straggler's work − median work of the others) ≥ ``min_imbalance_pct`` (5)
        % of the median step and ≥ ``min_imbalance_ms`` (0.05) ms (SageMaker's LoadBalancing
        uses 0.2 of the step on system metrics; we fire earlier because the cost is priced).
        WARNING, CRITICAL from ``critical_pct`` (20) %.
    Cost
        The imbalance per step: every other rank waits that long inside collectives.
    Fix
        Depends on where the straggler spends its extra time (data loading, kernels, CPU,
        runtime, copies): the largest category is named with a fix for it.
    """
    # Not an analysis: the summary ``batch`` builds (a dict) and runs this rule on.
    mr = results.typed("multirank", dict)
    if not mr or (mr.get("n_ranks") or 0) < 2:
        raise NotApplicable("needs the traces of several ranks of one run: use `traceanalyzer batch`")
    ranks = [r for r in mr.get("ranks", []) if r.get("work_ms") is not None]
    slow = mr.get("straggler")
    imb, pct = mr.get("imbalance_ms"), mr.get("imbalance_pct")
    if slow is None or imb is None or pct is None:
        raise NotApplicable("fewer than 2 ranks with step and communication numbers")
    if pct < params.min_imbalance_pct or imb < params.min_imbalance_ms:
        return
    spent = mr.get("straggler_spent_on")
    excess = mr.get("straggler_excess_ms") or {}
    idle_excess = mr.get("straggler_idle_excess_ms") or {}
    spent_ms = excess.get(spent) if spent in excess and (excess.get(spent) or 0) > 0 else None
    if spent_ms is None and spent:  # named from the idle causes (see multirank)
        spent_ms = max((v for v in idle_excess.values() if v > 0), default=None)
    extra = f"; it spent the extra time in {spent} (+{spent_ms:.2f} ms/step)" if spent and spent_ms else ""
    waits = [r["wait_ms"] for r in ranks if r.get("rank") != slow and r.get("wait_ms") is not None]
    sev = Severity.CRITICAL if pct >= params.critical_pct else Severity.WARNING
    yield Finding(
        rule_id="rank_imbalance", severity=sev,
        title=f"Rank {slow} is a straggler: {imb:.2f} ms/step more work than the other ranks ({pct:.1f} % of the "
              f"step){extra}",
        evidence={"straggler_rank": slow, "n_ranks": mr.get("n_ranks"),
                  "work_ms_by_rank": {str(r["rank"]): r["work_ms"] for r in ranks},
                  "excess_ms_per_step": excess, "idle_excess_ms_per_step": idle_excess,
                  "others_wait_in_collectives_ms_per_step":
                      round(float(statistics.median(waits)), 6) if waits else None,
                  "step_ms_spread_pct": mr.get("step_ms_spread_pct")},
        fix=_FIXES.get(spent or "", _OTHER),
        code_hint="traceanalyzer batch run_dir/ -o reports/  # per-rank table and straggler breakdown",
        cost_ms_per_step=round(float(imb), 3), cost_pct_of_step=round(float(pct), 2),
        confidence=0.8,
    )
