"""Across the ranks of one run: per-rank numbers, stragglers, communication overlap.

A pure function over per-rank rows (the compact metrics of
:mod:`~traceanalyzer.batch.summary`), not a per-model analysis: it needs several
traces, so ``batch`` calls it once per run after every rank has been analysed.

Definitions (per rank, averages over that rank's step windows):

* ``step_ms``: median steady step time; ``busy_pct`` / ``idle_pct``: GPU busy and idle;
  ``comm_ms``: collective-kernel time per step (including time spent inside NCCL
  waiting for other ranks); ``exposed_comm_ms``: communication not hidden under compute;
  ``overlap_pct``: share of communication hidden under compute.
* ``work_ms`` = mean step window − exposed communication: the time the rank spends on
  its own work. In a synchronous job every rank's step lasts as long as the slowest
  rank's, and the fast ranks spend the difference waiting inside collectives, so step
  times alone do not reveal the straggler; the rank with the most work does.
* ``wait_ms`` = ``comm_ms`` − the smallest ``comm_ms`` of any rank: time a rank waits
  for the others inside collectives.
* **Imbalance** = straggler ``work_ms`` − median ``work_ms`` of the other ranks. The
  ``rank_imbalance`` rule (:mod:`traceanalyzer.rules.rank_imbalance`, thresholds
  ``rank_imbalance.min_imbalance_pct`` (5) % of the median step and
  ``rank_imbalance.min_imbalance_ms`` (0.05) ms) turns it into the run's finding.
* **What the straggler spent the time on**: per category of the step breakdown
  (kernel, memcpy, memset, runtime, dataloader, cpu_exec, other — communication left
  out, it is the symptom) and per GPU idle cause, the straggler's time minus the
  median of the other ranks; the largest positive excess is named.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from traceanalyzer.batch.summary import top_finding_text

_IDLE_TO_CATEGORY = {"data_loader": "dataloader", "host_bound": "cpu_exec", "sync": "cpu_exec", "memcpy": "memcpy"}


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else None


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return round(sum(v) / len(v), 3) if v else None


def per_rank_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per rank (rows with ``status == "ok"`` and a rank), sorted by rank."""
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.get("status") != "ok" or r.get("rank") is None or r.get("kind") != "trace":
            continue
        m = r.get("metrics") or {}
        window = _f(m.get("window_ms_per_step"))
        exposed = _f(m.get("exposed_comm_ms_per_step"))
        step = _f(m.get("step_ms"))
        base = window if window is not None else step
        out.append({
            "rank": int(r["rank"]),
            "file": r.get("file"),
            "step_ms": step,
            "busy_pct": _f(m.get("gpu_busy_pct")),
            "idle_pct": _f(m.get("idle_pct")),
            "compute_ms": _f(m.get("compute_ms_per_step")),
            "comm_ms": _f(m.get("comm_ms_per_step")),
            "exposed_comm_ms": exposed,
            "overlap_pct": _f(m.get("comm_overlap_pct")),
            "work_ms": None if base is None else round(base - (exposed or 0.0), 6),
            "breakdown_ms": dict(m.get("breakdown_ms_per_step") or {}),
            "idle_causes_ms": dict(m.get("idle_causes_ms") or {}),
            "n_windows": len(m.get("steps") or []) or None,
        })
    out.sort(key=lambda e: e["rank"])
    comms = [e["comm_ms"] for e in out if e["comm_ms"] is not None]
    floor = min(comms) if comms else None
    for e in out:
        e["wait_ms"] = None if e["comm_ms"] is None or floor is None else round(e["comm_ms"] - floor, 6)
    return out


def _excess(slow: Mapping[str, Any], others: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for cat, v in (slow.get(key) or {}).items():
        if cat == "communication" or _f(v) is None:
            continue
        ref = _median([_f(o.get(key, {}).get(cat)) or 0.0 for o in others])
        out[cat] = round(float(v) - ref, 6)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class MultirankSummary(dict[str, Any]):
    """The cross-rank summary as the result the ``rank_imbalance`` rule reads (``multirank``)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self)


def _finding(summary: Mapping[str, Any], params: Mapping[str, float] | None) -> dict[str, Any] | None:
    """The ``rank_imbalance`` rule run on ``summary`` (``params``: its thresholds, unprefixed)."""
    from traceanalyzer.analyses import Results
    from traceanalyzer.config import Config
    from traceanalyzer.errors import NotApplicable
    from traceanalyzer.rules import Params
    from traceanalyzer.rules.rank_imbalance import PARAMS, check

    config = Config({f"rank_imbalance.{k}": v for k, v in (params or {}).items()})
    try:
        found = list(check(Results(values={"multirank": MultirankSummary(summary)}), config,
                           Params("rank_imbalance", PARAMS, config)))
    except NotApplicable:
        return None
    return found[0].to_json() if found else None


def multirank(rows: Sequence[Mapping[str, Any]], params: Mapping[str, float] | None = None) -> dict[str, Any] | None:
    """The multi-rank summary of one run's rows, or ``None`` with fewer than 2 ranks.

    ``params`` override the ``rank_imbalance`` rule's thresholds (``min_imbalance_pct`` …)."""
    ranks = per_rank_table(rows)
    if len(ranks) < 2:
        return None
    world = {r["world_size"] for r in rows if r.get("world_size") is not None}
    steps = [e["step_ms"] for e in ranks if e["step_ms"] is not None]
    res: dict[str, Any] = {
        "n_ranks": len(ranks),
        "world_size": max(world) if world else None,
        "ranks": [{k: v for k, v in e.items() if k not in ("breakdown_ms", "idle_causes_ms")} for e in ranks],
        "step_ms_min": min(steps) if steps else None,
        "step_ms_max": max(steps) if steps else None,
        "step_ms_spread_pct": round(100.0 * (max(steps) - min(steps)) / _median(steps), 3)
        if steps and _median(steps) > 0 else None,
        "mean_busy_pct": _mean([e["busy_pct"] for e in ranks]),
        "mean_comm_ms": _mean([e["comm_ms"] for e in ranks]),
        "mean_exposed_comm_ms": _mean([e["exposed_comm_ms"] for e in ranks]),
        "mean_overlap_pct": _mean([e["overlap_pct"] for e in ranks]),
        "straggler": None,
        "imbalance_ms": None,
        "imbalance_pct": None,
        "finding": None,
    }
    worked = [e for e in ranks if e["work_ms"] is not None]
    if len(worked) < 2:
        return res
    slow = max(worked, key=lambda e: (e["work_ms"], -e["rank"]))
    others = [e for e in worked if e is not slow]
    imbalance = slow["work_ms"] - _median([e["work_ms"] for e in others])
    step_ref = _median(steps) if steps else _median([e["work_ms"] for e in worked])
    imb_pct = 100.0 * imbalance / step_ref if step_ref > 0 else 0.0
    excess = _excess(slow, others, "breakdown_ms")
    idle_excess = _excess(slow, others, "idle_causes_ms")
    n_win = slow.get("n_windows") or 1
    idle_excess = {k: round(v / n_win, 6) for k, v in idle_excess.items()}  # whole trace → per step
    res.update(straggler=slow["rank"], imbalance_ms=round(imbalance, 6), imbalance_pct=round(imb_pct, 3),
               straggler_excess_ms=excess, straggler_idle_excess_ms=idle_excess)
    top_cat, top_ms = next(iter(excess.items()), (None, 0.0))
    if top_ms <= 0 and idle_excess:
        cause, ms = next(iter(idle_excess.items()))
        if ms > 0:
            top_cat, top_ms = _IDLE_TO_CATEGORY.get(cause, "other"), ms
    res["straggler_spent_on"] = top_cat if top_ms > 0 else None
    res["finding"] = _finding(res, params)
    return res


def summarize_runs(rows: Sequence[Mapping[str, Any]],
                   params: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """One summary per run (rows grouped by their ``run``), in first-seen order.

    The run's step time is its slowest rank's (a synchronous job runs at that pace);
    busy/idle/communication numbers are means over its ranks; its top finding is the
    straggler finding when there is one, else the costliest finding of its files.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get("run") or r.get("file")), []).append(r)
    out = []
    for name, rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        ms = [r.get("metrics") or {} for r in ok]
        steps = [_f(m.get("step_ms")) for m in ms]
        steps_v = [s for s in steps if s is not None]
        mr = multirank(rs, params) if len(rs) > 1 else None
        top = ""
        if mr and mr.get("finding"):
            f = mr["finding"]
            top = f"[{f['severity']}] {f['title']}"
        else:
            best = sorted(
                (m for m in ms if isinstance(m.get("top_finding"), Mapping)),
                key=lambda m: -(_f(m["top_finding"].get("cost_ms_per_step")) or 0.0),
            )
            top = top_finding_text(best[0]) if best else ""
        ranks = sorted(int(r["rank"]) for r in rs if r.get("rank") is not None)
        worlds = [r["world_size"] for r in rs if r.get("world_size") is not None]
        out.append({
            "run": name,
            "n_files": len(rs),
            "n_failed": len(rs) - len(ok),
            "kinds": sorted({str(r.get("kind")) for r in rs}),
            "ranks": ranks,
            "world_size": max(worlds) if worlds else None,
            "step_ms": max(steps_v) if steps_v else None,
            "gpu_busy_pct": _mean([_f(m.get("gpu_busy_pct")) for m in ms]),
            "idle_pct": _mean([_f(m.get("idle_pct")) for m in ms]),
            "comm_ms_per_step": _mean([_f(m.get("comm_ms_per_step")) for m in ms]),
            "exposed_comm_ms_per_step": _mean([_f(m.get("exposed_comm_ms_per_step")) for m in ms]),
            "comm_overlap_pct": _mean([_f(m.get("comm_overlap_pct")) for m in ms]),
            "straggler": mr.get("straggler") if mr and mr.get("finding") else None,
            "top_finding": top,
            "multirank": mr,
        })
    return out
