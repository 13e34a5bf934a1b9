"""Communication not hidden behind compute, or dominating the step.

The documentation (signal, thresholds, cost, fix) is the docstring of :func:`check`,
which ``traceanalyzer rules comm_exposed`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from traceanalyzer.analyses import Results
from traceanalyzer.analyses.communication import CommunicationResult
from traceanalyzer.config import Config
from traceanalyzer.rules import Finding, Params, Severity, rule
from traceanalyzer.rules._util import ms, severity_for, time_finding, top_rows


@rule("comm_exposed", needs=("steps", "gpu_time"), severity=Severity.WARNING,
      params={"max_exposed_pct": 5.0, "max_comm_pct": 10.0, "critical_pct": 30.0}, uses=("communication",))
def check(results: Results, config: Config, params: Params) -> Iterator[Finding]:
    """Communication not hidden behind compute, or dominating the step.

    Signal
        ``communication``: on the device with the most communication, per steady step, the
        union of communication kernels (recognised by collective metadata, launching
        communication op or library name: NCCL/RCCL, DeepEP, custom all-reduce, symmetric
        memory, NVSHMEM, userbuffers …) and the part of it with no compute kernel running on
        the device (exposed). Hidden share = 1 − exposed / communication.
        No communication kernel (the analysis does not apply): nothing to say.
    Threshold
        exposed ≥ ``max_exposed_pct`` (5) % of the median step → "not overlapped" (TraceLens:
        exposed comm > 5 % of GPU time), WARNING, CRITICAL from ``critical_pct`` (30) %.
        Otherwise communication ≥ ``max_comm_pct`` (10) % of the step → "large but hidden"
        (tb_plugin's 10 %), INFO: not the bottleneck, said so that nobody optimises it first.
    Cost
        The exposed communication per steady step on that device: GPU time overlap could win
        back (confidence 0.6: it includes time inside the collective waiting for slower ranks;
        ``traceanalyzer batch`` on all ranks separates that out as ``rank_imbalance``). Zero
        for hidden communication. Kernels recognised by one weak signal only are named in the
        evidence.
    Fix
        Overlap: DDP ``bucket_cap_mb``, FSDP prefetch, ``no_sync()`` during gradient
        accumulation, expert-parallel dispatch/combine overlapped with expert compute (DeepEP
        async/hook mode); reduce volume: bf16 gradients / compression hooks, larger batch.
    """
    c = results.typed("communication", CommunicationResult)
    if c is None:  # no communication kernel in the trace
        return
    t = c.totals
    exposed = float(t["exposed_ns_per_step"] or 0.0)
    comm_ns = float(t["comm_ns_per_step"] or 0.0)
    if comm_ns <= 0:
        return
    exp_pct = t["exposed_pct_of_step"] or 0.0
    comm_pct = t["comm_pct_of_step"] or 0.0
    hidden = t["hidden_pct"] if t["hidden_pct"] is not None else 0.0
    ev: dict[str, Any] = {
        "device": t["device"], "exposed_ms_per_step": ms(exposed), "comm_ms_per_step": ms(comm_ns),
        "exposed_pct_of_step": exp_pct, "comm_pct_of_step": comm_pct, "hidden_pct_of_comm": hidden,
        "collectives_per_step": t["collectives_per_step"], "recognised_by": t["kernels_by_signal"],
        "by_type": top_rows(c.by_type, 5, ("type", "count", "total_ns", "algbw_gbps", "busbw_gbps")),
        "by_stream": top_rows(c.by_stream, 5, ("device", "stream", "families", "comm_ns_per_step",
                                               "exposed_ns_per_step", "hidden_pct")),
    }
    if t["weak_kernels"]:
        ev["weak_signal_kernels"] = t["weak_kernels"]
        ev["weak_signal_ms"] = ms(t["weak_ns"])
        ev["weak_signal_why"] = t["weak_reasons"]
    fix = ("Overlap communication with compute: tune DDP bucket_cap_mb, enable FSDP forward/backward "
           "prefetch, use no_sync() during gradient accumulation, overlap MoE dispatch/combine with expert "
           "compute; reduce the volume (bf16 gradients, a compression comm hook) or communicate less often "
           "(larger batch). If other ranks are slower, this rank's collectives include waiting for them: run "
           "`traceanalyzer batch` on every rank's trace.")
    hint = "model = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=True)"
    if exp_pct >= params.max_exposed_pct:
        yield time_finding(
            "comm_exposed", severity_for(exp_pct, params.max_exposed_pct, params.critical_pct, Severity.WARNING),
            f"Communication not overlapped: {ms(exposed)} ms/step of communication with no compute under it "
            f"({exp_pct:.1f} % of the step; {hidden:.1f} % of the communication is hidden)",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
    elif comm_pct >= params.max_comm_pct:
        yield time_finding(
            "comm_exposed", Severity.INFO,
            f"Communication is large but hidden: {ms(comm_ns)} ms/step ({comm_pct:.1f} % of the step), "
            f"{hidden:.1f} % of it under compute: not the bottleneck",
            ev, fix, hint, exposed, results, confidence=0.6,
        )
