"""Baseline: step-time statistics and the measurement conditions of the run.

The first thing a performance engineer writes down before judging a trace: how long a
step takes (and how stable that is), how many samples per second that is, and under
which conditions it was measured. ``docs/diagnosis.md`` has the long form.

Definitions
-----------
* **Steps** are the ``steps`` analysis' windows (CPU ``ProfilerStep#N`` extended to their
  GPU tail). Statistics are over **steady** steps: warm-up steps (the ``steps`` analysis'
  leading outliers) and a truncated last step are listed apart, never mixed in. A trace
  without steps has one whole-trace window and no statistics worth the name (count 1).
* **Stats**: count, mean, median, std (sample, ddof 1; 0 for one step), p95 and p99
  (linear interpolation, numpy's default), min, max, coefficient of variation (std/mean).
* **Batch size**: read from the input shapes (``record_shapes``) of the first
  model-entry op of each steady step — the first ``aten::conv*``/``aten::convolution``,
  ``aten::linear`` or ``aten::embedding`` (its index tensor) on any thread — as the
  leading dimension; the most common value over the steps wins. It is a heuristic and
  says where it came from; ``baseline.batch_size`` (default 0 = infer) overrides it.
  **Samples/s** = batch size / mean steady step time. Not for an inference engine (``context``):
  its throughput is tokens/s, from the engine-step annotations when the trace records them.
* **Conditions**: devices (``deviceProperties`` names and memory; devices that ran
  activity are marked), vendor, versions the trace records, world size and rank,
  profiler flags, **dtypes** seen in GEMM/conv/attention op inputs (``Input type``) and in
  GEMM/conv kernel names (``tf32`` when the name says so, else the first dtype token:
  ``bf16``, ``fp16``, ``fp32``/``sgemm``, ``fp8`` …), the number of steps, and the
  **schedule**: the first recorded ``ProfilerStep#N`` number ``N`` is the number of
  steps the profiler's schedule skipped before recording (``wait + warmup``); ``N = 0``
  means no warm-up in the schedule (the first step carries one-time costs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.analyses import AnalysisContext, analysis
from traceanalyzer.analyses._intervals import ms
from traceanalyzer.analyses._kernels import GEMM_KERNEL_RE, GEMM_OPS_RE, on_distinct
from traceanalyzer.analyses._names import contains_by_name
from traceanalyzer.analyses._steps import assign_steps
from traceanalyzer.analyses.context import ContextResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import TraceTables, gpu_activity

#: Ops whose first input carries the batch dimension (``embedding``: its second input).
BATCH_OPS_RE = r"^aten::(conv\d?d|convolution|conv_transpose\dd|linear|embedding)$"
_TYPE_MAP = {
    "float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "long int": "int64", "int": "int32", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
}
_KERNEL_DTYPE_RE = r"(?i)bf16|fp16|f16|half|hgemm|fp32|f32|sgemm|fp8|e4m3|e5m2|int8"
_KERNEL_DTYPE_MAP = {
    "bf16": "bf16", "fp16": "fp16", "f16": "fp16", "half": "fp16", "hgemm": "fp16", "fp32": "fp32",
    "f32": "fp32", "sgemm": "fp32", "fp8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "int8": "int8",
}


def step_stats(durations: pl.Series) -> dict[str, Any]:
    """count, mean, median, std (ddof 1), p95, p99 (linear), min, max, cv of ns durations."""
    s = durations.drop_nulls().cast(pl.Float64)
    n = s.len()
    if n == 0:
        keys = ("mean", "median", "std", "p95", "p99", "min", "max", "cv")
        return {"count": 0, **{k: None for k in keys}}
    mean = float(s.mean())  # type: ignore[arg-type]
    std = float(s.std(ddof=1)) if n > 1 else 0.0  # type: ignore[arg-type]
    return {
        "count": int(n),
        "mean": round(mean, 1),
        "median": round(float(s.median()), 1),  # type: ignore[arg-type]
        "std": round(std, 1),
        "p95": round(float(s.quantile(0.95, "linear")), 1),  # type: ignore[arg-type]
        "p99": round(float(s.quantile(0.99, "linear")), 1),  # type: ignore[arg-type]
        "min": int(s.min()),  # type: ignore[arg-type]
        "max": int(s.max()),  # type: ignore[arg-type]
        "cv": round(std / mean, 4) if mean else None,
    }


@dataclass(frozen=True)
class BaselineResult:
    """Step-time distribution, throughput and measurement conditions. See the module docstring."""

    has_steps: bool
    stats: dict[str, Any]  # steady steps, ns
    steady_steps: tuple[int, ...]
    warmup: pl.DataFrame  # step, dur_ns (excluded from stats)
    truncated: pl.DataFrame  # step, dur_ns (excluded from stats)
    batch_size: int | None
    batch_source: str | None
    samples_per_s: float | None
    conditions: dict[str, Any]
    inference_engine: str | None = None  # from ``context``: throughput is then tokens, not samples
    tokens_per_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "has_steps": self.has_steps,
            "step_time_ns": self.stats,
            "steady_steps": list(self.steady_steps),
            "warmup_steps": self.warmup.to_dicts(),
            "truncated_steps": self.truncated.to_dicts(),
            "batch_size": self.batch_size,
            "batch_source": self.batch_source,
            "samples_per_s": self.samples_per_s,
            "inference_engine": self.inference_engine,
            "tokens_per_s": self.tokens_per_s,
            "conditions": self.conditions,
        }

    def headline(self) -> str:
        """One line: the step time distribution (or the window length without steps)."""
        s = self.stats
        if not self.has_steps:
            return f"no ProfilerStep# ranges: the whole trace ({ms(s['max'])}) is one window"
        out = (
            f"step time mean {ms(s['mean'])}, median {ms(s['median'])}, std {ms(s['std'])}"
            f" (cv {100 * (s['cv'] or 0):.1f} %), p95 {ms(s['p95'])}, p99 {ms(s['p99'])},"
            f" min {ms(s['min'])}, max {ms(s['max'])} over {s['count']} steady step(s)"
        )
        if self.warmup.height:
            out += "; warm-up " + ", ".join(
                f"#{r['step']} {ms(r['dur_ns'])}" for r in self.warmup.iter_rows(named=True)
            ) + " excluded"
        if self.truncated.height:
            out += "; truncated last step " + ", ".join(f"#{s}" for s in self.truncated["step"].to_list()) + " excluded"
        return out

    def conditions_line(self) -> str:
        c = self.conditions
        parts = []
        if c["devices"]:
            parts.append(", ".join(f"{d['count']}× {d['name'] or '(unnamed)'}"
                                   + (f" {d['memory_gib']:.0f} GiB" if d["memory_gib"] else "")
                                   for d in c["devices"]))
        elif c["vendor"]:
            parts.append(f"vendor {c['vendor']}")
        if c["versions"]:
            parts.append(", ".join(f"{k} {v}" for k, v in c["versions"].items()))
        if c["world_size"] is not None or c["rank"] is not None:
            parts.append(f"rank {c['rank'] if c['rank'] is not None else '?'} of {c['world_size'] or '?'}")
        flags = [k for k, v in (c["profiler_flags"] or {}).items() if v]
        if flags:
            parts.append("profiler: " + ", ".join(flags))
        dt = c["dtypes"]
        if dt["ops"] or dt["kernels"]:
            parts.append("dtypes: " + ", ".join(sorted(set(dt["ops"]) | set(dt["kernels"]))))
        parts.append(c["schedule"])
        return "; ".join(parts)

    def summary(self) -> list[tuple[str, str]]:
        out = [("Step time", self.headline())]
        if self.inference_engine:
            out.append(("Throughput", f"{self.tokens_per_s:,.1f} tokens/s ({self.inference_engine})"
                        if self.tokens_per_s else f"{self.inference_engine} inference: tokens/s not recorded "
                        "in the trace (samples/s does not apply)"))
        elif self.samples_per_s is not None:
            out.append(("Throughput",
                        f"{self.samples_per_s:,.1f} samples/s (batch {self.batch_size}, {self.batch_source})"))
        else:
            out.append(("Throughput", "batch size unknown (no input shapes recorded): set baseline.batch_size"))
        out.append(("Conditions", self.conditions_line()))
        return out

    def tables(self) -> dict[str, pl.DataFrame]:
        st = self.stats
        rows = [{"stat": k, "value_ns": (float(v) if v is not None else None)} for k, v in st.items()
                if k not in ("count", "cv")]
        out = {"Step time (steady steps)": pl.DataFrame(rows, schema={"stat": pl.String, "value_ns": pl.Float64})}
        apart = pl.concat(
            [self.warmup.with_columns(kind=pl.lit("warm-up")), self.truncated.with_columns(kind=pl.lit("truncated"))]
        )
        if apart.height:
            out["Steps excluded from the statistics"] = apart
        devs = self.conditions["devices"]
        if devs:
            out["Devices"] = pl.DataFrame(devs)
        return out


def _batch_size(model: TraceModel, sr: StepsResult) -> tuple[int | None, str | None]:
    ops = model.cpu_ops.filter(contains_by_name(model.cpu_ops, BATCH_OPS_RE) & pl.col("input_dims").is_not_null())
    if ops.is_empty():
        return None, None
    ops = assign_steps(ops.select("name", "ts_ns", "input_dims"), sr, "ts_ns").filter(
        pl.col("window").is_in(sr.steady_windows())
    )
    first = ops.sort("ts_ns").group_by("window", maintain_order=True).first()
    first = first.with_columns(
        batch=pl.when(pl.col("name") == "aten::embedding")
        .then(pl.col("input_dims").str.extract(r"^\s*\[\s*\[[\d,\s]*\]\s*,\s*\[\s*(\d+)", 1))
        .otherwise(pl.col("input_dims").str.extract(r"^\s*\[\s*\[\s*(\d+)", 1))
        .cast(pl.Int64, strict=False)
    ).filter(pl.col("batch").is_not_null() & (pl.col("batch") > 0))
    if first.is_empty():
        return None, None
    counts = first.group_by("batch").agg(n=pl.len(), name=pl.col("name").first(), dims=pl.col("input_dims").first())
    best = counts.sort(["n", "batch"], descending=[True, True]).row(0, named=True)
    src = f"leading dim of the first {best['name']} input {best['dims']} in {best['n']} of {first.height} step(s)"
    return int(best["batch"]), src


def _dtypes(model: TraceModel) -> dict[str, Any]:
    ops = model.cpu_ops.filter(contains_by_name(model.cpu_ops, GEMM_OPS_RE) & pl.col("input_types").is_not_null())
    op_types: dict[str, int] = {}
    if ops.height:
        t = (
            ops.select(pl.col("input_types").str.extract_all(r'"([^"]*)"').alias("t"))
            .explode("t")
            .with_columns(pl.col("t").str.strip_chars('"'))
            .filter(pl.col("t").is_in(list(_TYPE_MAP)))
            .with_columns(pl.col("t").replace_strict(_TYPE_MAP, default=None))
            .group_by("t")
            .len()
            .sort(["len", "t"], descending=[True, False])
        )
        op_types = {r[0]: int(r[1]) for r in t.iter_rows()}
    k = model.kernels.filter(contains_by_name(model.kernels, GEMM_KERNEL_RE))
    kern: dict[str, int] = {}
    if k.height:
        tok = pl.col("name").str.to_lowercase()
        # the dtype once per distinct kernel name (long names, repeated thousands of times)
        kd = (
            on_distinct(k.select("name", "dur_ns"), ["name"], d=(
                pl.when(tok.str.contains("tf32"))
                .then(pl.lit("tf32"))
                .otherwise(tok.str.extract(r"(bf16|fp16|f16|half|hgemm|fp32|f32|sgemm|fp8|e4m3|e5m2|int8)", 1)
                           .replace_strict(_KERNEL_DTYPE_MAP, default=None))
            ))
            .select("d", "dur_ns")
            .filter(pl.col("d").is_not_null())
            .group_by("d")
            .agg(pl.col("dur_ns").sum())
            .sort(["dur_ns", "d"], descending=[True, False])
        )
        kern = {r[0]: int(r[1]) for r in kd.iter_rows()}
    return {"ops": op_types, "kernels": kern, "ops_unit": "input count", "kernels_unit": "kernel ns"}


def _devices(t: TraceTables) -> list[dict[str, Any]]:
    model = t.model
    used = set(gpu_activity(t)["device"].drop_nulls().unique().to_list()) if model.has_gpu else set()
    props = [d for d in model.meta.device_properties if isinstance(d, dict)]
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for i, d in enumerate(props):  # a handful of devices: metadata, not events
        name = str(d.get("name") or "")
        mem = int(d.get("totalGlobalMem") or 0)
        g = groups.setdefault((name, mem), {"name": name, "memory_gib": round(mem / 2**30, 1) if mem else None,
                                             "count": 0, "ids": [], "used_ids": []})
        did = d.get("id", i)
        g["count"] += 1
        g["ids"].append(did)
        if did in used:
            g["used_ids"].append(did)
    if not props and used:
        return [{"name": None, "memory_gib": None, "count": len(used), "ids": sorted(used), "used_ids": sorted(used)}]
    return list(groups.values())


@analysis("baseline", depends_on=("steps",), after=("context",), title="Baseline", order=2, shared=("gpu_activity",),
          params={"batch_size": 0})
def baseline(ctx: AnalysisContext[TraceModel]) -> BaselineResult:
    """Steady step-time statistics (warm-up apart), samples/s, and the measurement conditions."""
    model = ctx.model
    sr = ctx.need("steps", StepsResult)
    t = sr.table
    steady = t.filter(pl.col("window").is_in(sr.steady_windows()))
    stats = step_stats(steady["dur_ns"])
    warm = t.filter(pl.col("is_warmup")).select("step", "dur_ns")
    trunc = t.filter(pl.col("is_truncated") & ~pl.col("is_warmup")).select("step", "dur_ns")
    override = ctx.params.batch_size
    batch: int | None
    src: str | None
    if override > 0:
        batch, src = int(override), "baseline.batch_size setting"
    else:
        batch, src = _batch_size(model, sr)
    sps = round(batch * 1e9 / stats["mean"], 2) if batch and stats["mean"] else None
    # An inference engine's throughput is tokens, not samples: never claim samples/s for it.
    run_ctx = ctx.typed("context", ContextResult)
    engine = getattr(run_ctx, "inference_engine", None)
    tps = ((getattr(run_ctx, "inference", None) or {}).get("tokens_per_s")) if engine else None
    if engine:
        sps = None
    lowest = t["step"].drop_nulls().min() if sr.has_steps else None
    first = int(lowest) if isinstance(lowest, int) else None
    if first is None:
        schedule = "no ProfilerStep# ranges (no schedule recorded)"
    elif first > 0:
        schedule = f"recording starts at ProfilerStep#{first}: {first} step(s) ran before it (schedule wait + warm-up)"
    else:
        schedule = ("recording starts at ProfilerStep#0: no warm-up in the schedule "
                    "(the first step carries one-time costs)")
    m = model.meta
    conditions = {
        "devices": _devices(ctx.tables),
        "vendor": m.vendor,
        "versions": dict(m.versions),
        "world_size": m.world_size,
        "rank": m.rank,
        "profiler_flags": dict(m.profiler_flags),
        "dtypes": _dtypes(model),
        "n_steps": t.height if sr.has_steps else 0,
        "first_step": first,
        "warmup_detected": [int(s) for s in sr.warmup_steps],
        "schedule": schedule,
    }
    return BaselineResult(
        has_steps=sr.has_steps,
        stats=stats,
        steady_steps=tuple(int(s) for s in steady["step"].drop_nulls().to_list()),
        warmup=warm,
        truncated=trunc,
        batch_size=batch,
        batch_source=src,
        samples_per_s=sps,
        conditions=conditions,
        inference_engine=engine,
        tokens_per_s=tps,
    )
