"""Optimizer step not fused: a for-loop (or foreach) implementation launches many small kernels.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules optimizer_not_fused`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.ops import OpsResult
from traceanalyzer.config import Config
from traceanalyzer.errors import NotApplicable
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._advice import context_of, is_compiled, uses_graphs
from traceanalyzer.rules._util import fmt_count, gpu_idle_per_step_ns, ms, pct_of_step, per_step_ns, time_finding


@rule("optimizer_not_fused", needs=("steps", "ops"), severity=Severity.WARNING,
      params={"min_kernels_per_step": 10.0, "warning_pct": 5.0, "foreach_min_pct": 10.0,
              "for_loop_savings": 0.7, "foreach_savings": 0.3}, uses=("context", "gpu_time"))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Optimizer step not fused: a for-loop (or foreach) implementation launches many small kernels.

    Signal
        ``ops``: ``Optimizer.step#<Class>.step`` ranges per steady step (union CPU time, kernels
        launched inside), and the implementation seen inside them: ``fused``
        (``aten::_fused_adam*`` …), ``foreach`` (``aten::_foreach_*``), ``for-loop`` (neither:
        one small kernel per parameter and operation). No ``Optimizer.step`` range: the rule
        cannot run and says so.
    Thresholds
        ``for-loop`` with ≥ ``min_kernels_per_step`` (10) kernels per optimizer step → WARNING if
        the optimizer takes ≥ ``warning_pct`` (5) % of the step, else INFO. ``foreach`` with the
        optimizer ≥ ``foreach_min_pct`` (10) % of the step → INFO (``fused=True`` is faster still).
        (Peers' suggested: optimizer > 10 % of step or > 200 kernels/step; torch.optim docs:
        fused > foreach > for-loop.)
    Cost
        GPU time: ``for_loop_savings`` (0.7) or ``foreach_savings`` (0.3) × the optimizer CPU range
        time per steady step, counted only as far as the GPU could use it (at most the
        optimizer kernels' GPU time + the GPU idle per step of the busiest device; confidence 0.5).
        When the run replays CUDA/HIP graphs (``context``) the basis is the optimizer's GPU time
        instead: replay removes the launch cost.
    Fix
        ``torch.optim.AdamW(params, fused=True)`` (Adam/AdamW/SGD/Adagrad), else ``foreach=True``.
    """
    o = results.need("ops", OpsResult)
    if o.optimizer_impl == "unknown":
        raise NotApplicable("no Optimizer.step ranges in the trace (no optimizer ran, or it was not "
                            "profiled): the optimizer implementation cannot be judged")
    if o.optimizer_impl == "fused":
        return
    opt_ns = per_step_ns(o.optimizer, "opt_ns", results)
    kernels = per_step_ns(o.optimizer, "opt_kernels", results)
    gpu = per_step_ns(o.optimizer, "opt_gpu_ns", results)
    pct = pct_of_step(opt_ns, results) or 0.0
    idle = gpu_idle_per_step_ns(results)
    name = ", ".join(o.optimizer_names) or "optimizer"
    ev = {"optimizer": list(o.optimizer_names), "implementation": o.optimizer_impl,
          "optimizer_ms_per_step": ms(opt_ns), "optimizer_pct_of_step": pct,
          "kernels_per_step": round(kernels, 1), "optimizer_gpu_ms_per_step": ms(gpu)}
    hint = f"opt = torch.optim.{(o.optimizer_names or ('AdamW',))[0]}(model.parameters(), lr=lr, fused=True)"
    fix = ("Use the fused implementation (fused=True for Adam, AdamW, SGD, Adagrad on CUDA), or at least "
           "foreach=True: one multi-tensor kernel per operation instead of one per parameter.")
    ctx = context_of(results)
    # GPU time: the optimizer's CPU range counts as far as the GPU could use it (its kernels plus
    # the GPU idle of the step); a range hidden behind a busy GPU loses nothing
    basis = opt_ns if idle is None else min(opt_ns, gpu + idle)
    if uses_graphs(ctx):
        # Replayed from a graph the per-parameter kernels cost no launch each: what fusion still
        # saves is GPU work (one multi-tensor kernel instead of many small ones), not CPU range time.
        basis = gpu
        ev["cost_basis"] = "optimizer GPU time (graph replay removes the launch cost)"
        fix += " The step replays graphs, so the gain is GPU time (fewer, larger kernels), not launch overhead."
    if is_compiled(ctx):
        ev["compiled"] = True
        fix += (" The run is compiled: if the optimizer step runs eagerly, fused=True is the simplest fix "
                "(compiling opt.step is the other).")
    if o.optimizer_impl == "for-loop" and kernels >= params.min_kernels_per_step:
        yield time_finding(
            "optimizer_not_fused", Severity.WARNING if pct >= params.warning_pct else Severity.INFO,
            f"{name} steps parameter by parameter: {fmt_count(kernels)} kernels and {ms(opt_ns)} ms per step",
            ev, fix, hint, basis * params.for_loop_savings, results, confidence=0.5)
    elif o.optimizer_impl == "foreach" and pct >= params.foreach_min_pct:
        yield time_finding(
            "optimizer_not_fused", Severity.INFO,
            f"{name} uses foreach kernels and takes {pct:.0f} % of the step: fused=True is faster",
            ev, fix, hint, basis * params.foreach_savings, results, confidence=0.5)
