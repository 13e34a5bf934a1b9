"""Did the change help? Statistics over per-step times, with numpy only.

* :func:`bootstrap_median_diff` — the difference of median step times (candidate −
  baseline) with a percentile-bootstrap confidence interval: both sides are resampled
  with replacement, independently, ``n_boot`` times from a fixed seed (deterministic).
* :func:`mann_whitney` — the two-sided Mann–Whitney U (Wilcoxon rank-sum) test: exact
  null distribution for small samples without ties, normal approximation with tie and
  continuity correction otherwise.
* :func:`step_time_change` — both, plus a verdict:

  - ``"slower"`` / ``"faster"``: the interval excludes zero **and** the rank test agrees
    (p < ``alpha``);
  - ``"too few steps to tell"``: not ``slower``/``faster``, and the test has little
    power — fewer than :data:`MIN_STEPS` steady steps on a side, or an interval that
    spans zero but reaches beyond ±:data:`POWER_MARGIN_PCT` % of the baseline median
    (a change that large could hide in the noise). The sentence says so and gives the
    median's move instead of claiming "no significant change";
  - ``"no significant change"``: the interval spans zero and lies within
    ±:data:`POWER_MARGIN_PCT` % of the baseline median (a change larger than that
    would have shown), with at least :data:`MIN_STEPS` steps a side;
  - ``"inconclusive"``: at least :data:`MIN_STEPS` steps a side, the interval excludes
    zero but the rank test does not confirm it;
  - ``"not enough steps"``: fewer than 2 steps on a side — only the point difference.

**Power.** ``mde_pct`` (minimum detectable effect) is the interval's half-width,
``(hi − lo) / 2``, as % of the baseline median: a move of the median smaller than about
that cannot make the interval exclude zero with these samples. With 3 steps a side the
exact rank test cannot reach p < 0.05 at all (its smallest two-sided p is 0.1), hence
the :data:`MIN_STEPS` floor.

Step times are not independent draws (consecutive steps share caches, allocator and
clocks), so the interval is a guide to the noise, not a guarantee; record ≥ 10 steps
per side for a verdict worth gating on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

N_BOOT = 10_000
SEED = 0
#: Steady steps a side below which a non-significant result is "too few steps to tell".
MIN_STEPS = 5
#: A non-significant interval reaching beyond ± this % of the baseline median has little power.
POWER_MARGIN_PCT = 5.0
_EXACT_MAX = 400  # n1·n2 up to this: exact U distribution (cheap DP)


def bootstrap_median_diff(base: Sequence[float], cand: Sequence[float], *, n_boot: int = N_BOOT,
                          conf: float = 0.95, seed: int = SEED) -> tuple[float, float, float]:
    """``(median(cand) − median(base), lo, hi)`` with a percentile-bootstrap interval."""
    a = np.asarray(base, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("both samples need at least one value")
    point = float(np.median(b) - np.median(a))
    rng = np.random.default_rng(seed)
    diffs = np.empty(n_boot, dtype=np.float64)
    chunk = max(1, 2_000_000 // max(a.size, b.size))  # bound memory for long runs
    for start in range(0, n_boot, chunk):
        n = min(chunk, n_boot - start)
        ma = np.median(a[rng.integers(0, a.size, size=(n, a.size))], axis=1)
        mb = np.median(b[rng.integers(0, b.size, size=(n, b.size))], axis=1)
        diffs[start:start + n] = mb - ma
    tail = (1.0 - conf) / 2.0 * 100.0
    lo, hi = np.percentile(diffs, [tail, 100.0 - tail])
    return point, float(lo), float(hi)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties sharing the mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=np.float64)
    sx = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _u_null_counts(n1: int, n2: int) -> np.ndarray:
    """Number of arrangements giving U = 0 … n1·n2 (no ties), by the classic recurrence."""
    # f[m][u] for the current n2 column, built up over n1.
    prev = [np.ones(1, dtype=np.float64) for _ in range(n2 + 1)]  # n1 = 0: U = 0 only
    for i in range(1, n1 + 1):
        cur = [np.ones(1, dtype=np.float64)]  # n2 = 0
        for j in range(1, n2 + 1):
            size = i * j + 1
            out = np.zeros(size, dtype=np.float64)
            a = prev[j]  # f(i-1, j, u - j)
            out[j:j + a.size] += a
            b = cur[j - 1]  # f(i, j-1, u)
            out[:b.size] += b
            cur.append(out)
        prev = cur
    return prev[n2]


def mann_whitney(base: Sequence[float], cand: Sequence[float]) -> tuple[float, float, str]:
    """``(U of the candidate, two-sided p, method)``; p is 1.0 when a side is empty."""
    a = np.asarray(base, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        return 0.0, 1.0, "none"
    x = np.concatenate([a, b])
    r = _ranks(x)
    u_b = float(r[n1:].sum() - n2 * (n2 + 1) / 2.0)
    ties = np.unique(x).size != x.size
    if not ties and n1 * n2 <= _EXACT_MAX:
        counts = _u_null_counts(n2, n1)  # distribution of U for the candidate side
        total = counts.sum()
        k = int(round(u_b))
        p_le = counts[: k + 1].sum() / total
        p_ge = counts[k:].sum() / total
        return u_b, float(min(1.0, 2.0 * min(p_le, p_ge))), "exact"
    mu = n1 * n2 / 2.0
    n = n1 + n2
    _, tcounts = np.unique(x, return_counts=True)
    tie_term = float(((tcounts ** 3) - tcounts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sigma == 0:
        return u_b, 1.0, "normal"
    z = (abs(u_b - mu) - 0.5) / sigma
    p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return u_b, float(min(1.0, p)), "normal"


@dataclass(frozen=True)
class StepTimeChange:
    """Candidate − baseline median step time, its interval and the verdict (module docstring)."""

    n_base: int
    n_cand: int
    base_median_ms: float | None
    cand_median_ms: float | None
    diff_ms: float | None
    ci_low_ms: float | None
    ci_high_ms: float | None
    diff_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    conf: float
    mann_whitney_u: float | None
    p_value: float | None
    test_method: str
    verdict: str
    mde_ms: float | None = None  # the interval's half-width (module docstring: Power)
    mde_pct: float | None = None  # mde_ms as % of the baseline median
    low_power: bool = False  # the verdict is "too few steps to tell"
    min_steps: int = MIN_STEPS
    margin_pct: float = POWER_MARGIN_PCT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def significant(self) -> bool:
        return self.verdict in ("slower", "faster")

    def sentence(self) -> str:
        """One line for terminals and report headers."""
        if self.diff_ms is None:
            return "step time: no steps on one side; nothing to compare"
        head = (f"step time {self.base_median_ms:.3f} → {self.cand_median_ms:.3f} ms "
                f"({self.diff_ms:+.3f} ms, {self.diff_pct:+.1f} %)" if self.diff_pct is not None else
                f"step time {self.diff_ms:+.3f} ms")
        if self.ci_low_ms is None:
            return f"{head}: {self.verdict} ({self.n_base} vs {self.n_cand} steps)"
        ci = f"{int(self.conf * 100)} % CI [{self.ci_low_ms:+.3f}, {self.ci_high_ms:+.3f}] ms"
        test = "" if self.p_value is None else (
            "Mann-Whitney p < 0.001" if self.p_value < 0.001 else f"Mann-Whitney p = {self.p_value:.3g}")
        if self.low_power:
            return f"{head}: {self.power_sentence()}; {ci}, {test}"
        tail = ""
        if self.verdict == "no significant change" and self.mde_pct is not None:
            tail = f" (the interval lies within ±{self.margin_pct:g} % of the baseline median)"
        return f"{head}; {ci}, {test}, {self.n_base} vs {self.n_cand} steps: {self.verdict}{tail}"

    def power_sentence(self) -> str:
        """Why the verdict is "too few steps to tell" (empty when the test had the power)."""
        if not self.low_power:
            return ""
        moved = f"{self.diff_pct:+.1f} %" if self.diff_pct is not None else f"{self.diff_ms:+.3f} ms"
        why = "the test has little power"
        if min(self.n_base, self.n_cand) >= self.min_steps and self.ci_low_pct is not None:
            why += (f": its {int(self.conf * 100)} % interval [{self.ci_low_pct:+.1f} %, {self.ci_high_pct:+.1f} %]"
                    f" reaches beyond ±{self.margin_pct:g} %")
        else:
            why += f" with fewer than {self.min_steps} steady steps a side"
        return (f"too few steps to tell ({self.n_base} and {self.n_cand} steady steps): {why}; "
                f"the median moved {moved}")


def step_time_change(base: Sequence[float], cand: Sequence[float], *, conf: float = 0.95, alpha: float = 0.05,
                     n_boot: int = N_BOOT, seed: int = SEED, min_steps: int = MIN_STEPS,
                     margin_pct: float = POWER_MARGIN_PCT) -> StepTimeChange:
    """Compare two samples of step times (ms); see the module docstring for the verdicts."""
    nb, nc = len(base), len(cand)
    if nb == 0 or nc == 0:
        return StepTimeChange(nb, nc, None, None, None, None, None, None, None, None, conf, None, None, "none",
                              "not enough steps")
    bm = float(np.median(np.asarray(base, dtype=np.float64)))
    cm = float(np.median(np.asarray(cand, dtype=np.float64)))
    diff = cm - bm

    def pct(v: float | None) -> float | None:
        return None if bm <= 0 or v is None else round(100.0 * v / bm, 4)

    if nb < 2 or nc < 2:
        return StepTimeChange(nb, nc, bm, cm, diff, None, None, pct(diff), None, None, conf, None, None, "none",
                              "not enough steps")
    point, lo, hi = bootstrap_median_diff(base, cand, n_boot=n_boot, conf=conf, seed=seed)
    u, p, method = mann_whitney(base, cand)
    spans = lo <= 0.0 <= hi
    mde = (hi - lo) / 2.0
    reach = None if bm <= 0 else 100.0 * max(abs(lo), abs(hi)) / bm
    if not spans and p < alpha:
        verdict = "slower" if point > 0 else "faster"
    elif nb < min_steps or nc < min_steps:
        verdict = "too few steps to tell"
    elif not spans:
        verdict = "inconclusive"
    elif reach is not None and reach > margin_pct:
        verdict = "too few steps to tell"
    else:
        verdict = "no significant change"
    return StepTimeChange(nb, nc, round(bm, 6), round(cm, 6), round(point, 6), round(lo, 6), round(hi, 6),
                          pct(point), pct(lo), pct(hi), conf, u, round(p, 6), method, verdict,
                          mde_ms=round(mde, 6), mde_pct=pct(mde), low_power=verdict == "too few steps to tell",
                          min_steps=min_steps, margin_pct=margin_pct)
