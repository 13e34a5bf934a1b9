"""Are the two sides of a comparison comparable at all? Checked before any step time.

A step-time change between an H100 and an MI300X, or between 8 and 2 ranks, says
nothing about the code change it is supposed to judge. Every ``compare`` output starts
with this check; the ``--fail-if-slower`` gate refuses to run across different hardware
unless ``--allow-mismatch`` is given.

Facts per input (:func:`input_facts`), read from the ``baseline`` analysis' conditions
(which come from the trace's metadata) and, without it, from the trace metadata alone:

* ``device_model``: names (``deviceProperties``) of the devices that ran GPU work; every
  listed device when none did;
* ``device_count``: devices that ran GPU work in the trace (a rank usually drives one);
  the listed devices when none did; 0 for a CPU-only trace;
* ``vendor``: ``nvidia`` / ``amd`` / ``xpu`` / ``mtia`` / ``cpu`` (``unknown`` is unknown);
* ``world_size``: ``distributedInfo.world_size`` (absent when the trace has none);
* ``torch``, ``cuda_runtime``, ``cuda_driver``, ``hip_runtime`` (ROCm), ``nccl``: the
  versions the trace records (CUDA ``12040`` is shown as ``12.4``, HIP ``60443483`` as
  ``6.4.43483``);
* ``batch_size``: the ``baseline`` analysis' batch size (inferred from input shapes, or
  the ``baseline.batch_size`` setting).

A side's value of a field is the set of its inputs' known values (a directory side may
mix). Per field (:func:`check_comparability`): ``match`` (both sides known and equal),
``mismatch`` (both known and different) or ``unknown`` (a side does not record it).
Unknown never blocks. A **hardware** mismatch (device model, device count, vendor, world
size) makes the runs **not comparable**; a **software** mismatch (versions) or a
**workload** mismatch (batch size) is a warning stated at the top of the outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: (key, label, class) in report order; class is "hardware", "software" or "workload".
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("device_model", "Device model", "hardware"),
    ("device_count", "Devices per trace (that ran work)", "hardware"),
    ("vendor", "Vendor", "hardware"),
    ("world_size", "World size", "hardware"),
    ("torch", "PyTorch version", "software"),
    ("cuda_runtime", "CUDA runtime", "software"),
    ("cuda_driver", "CUDA driver", "software"),
    ("hip_runtime", "HIP runtime (ROCm)", "software"),
    ("nccl", "NCCL version", "software"),
    ("batch_size", "Batch size", "workload"),
)
HARDWARE = frozenset(k for k, _, c in FIELDS if c == "hardware")


def _cuda_version(raw: Any) -> str | None:
    """CUDA's integer version (1000·major + 10·minor) as ``major.minor``."""
    try:
        v = int(str(raw))
    except ValueError:
        return str(raw) if raw not in (None, "") else None
    return f"{v // 1000}.{(v % 1000) // 10}" if v >= 1000 else str(v)


def _hip_version(raw: Any) -> str | None:
    """HIP's integer version (10⁷·major + 10⁵·minor + patch) as ``major.minor.patch``."""
    try:
        v = int(str(raw))
    except ValueError:
        return str(raw) if raw not in (None, "") else None
    return f"{v // 10_000_000}.{(v // 100_000) % 100}.{v % 100_000}" if v >= 10_000_000 else str(v)


def input_facts(model: Any, report: Any) -> dict[str, Any]:
    """The facts of one analysed input (see the module docstring); ``None`` = not recorded."""
    facts: dict[str, Any] = {k: None for k, _, _ in FIELDS}
    bl = report.results.values.get("baseline") if report is not None else None
    meta = getattr(model, "meta", None) if getattr(model, "kind", None) == "trace" else None
    cond: Mapping[str, Any] = {}
    if bl is not None:
        cond = bl.to_json().get("conditions") or {}
        facts["batch_size"] = bl.batch_size
    elif meta is not None:  # no baseline result: the metadata alone (no "ran work" marks)
        props = [d for d in meta.device_properties if isinstance(d, dict)]
        cond = {"devices": [{"name": d.get("name"), "count": 1, "used_ids": []} for d in props],
                "vendor": meta.vendor, "versions": dict(meta.versions), "world_size": meta.world_size}
    if not cond:
        return facts
    devices = [d for d in cond.get("devices") or [] if isinstance(d, dict)]
    used = [d for d in devices if d.get("used_ids")]
    named = {str(d["name"]) for d in (used or devices) if d.get("name")}
    facts["device_model"] = sorted(named) or None
    vendor = cond.get("vendor")
    facts["vendor"] = vendor if vendor and vendor != "unknown" else None
    if used:
        facts["device_count"] = sum(len(d["used_ids"]) for d in used)
    elif devices:
        facts["device_count"] = sum(int(d.get("count") or 0) for d in devices)
    elif vendor == "cpu":
        facts["device_count"] = 0
    facts["world_size"] = cond.get("world_size")
    versions = cond.get("versions") or {}
    torch = versions.get("pytorch_version") or versions.get("torch_version")
    facts["torch"] = str(torch) if torch else None
    facts["cuda_runtime"] = _cuda_version(versions.get("cuda_runtime_version"))
    facts["cuda_driver"] = _cuda_version(versions.get("cuda_driver_version"))
    facts["hip_runtime"] = _hip_version(versions.get("hip_runtime_version"))
    dist = getattr(meta, "distributed_info", None) if meta is not None else None
    nccl = dist.get("nccl_version") if isinstance(dist, dict) else None
    facts["nccl"] = str(nccl) if nccl else None
    return facts


def _side_values(facts: Iterable[Mapping[str, Any]], key: str) -> frozenset[str]:
    out: set[str] = set()
    for f in facts:
        v = f.get(key)
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            out.add(" + ".join(str(x) for x in v))  # one trace's devices, as one value
        else:
            out.add(str(v))
    return frozenset(out)


def _show(values: frozenset[str]) -> str | None:
    if not values:
        return None
    return next(iter(values)) if len(values) == 1 else "mixed: " + ", ".join(sorted(values))


@dataclass(frozen=True)
class FieldCheck:
    """One compared fact: each side's value (``None`` = not recorded) and the status."""

    key: str
    label: str
    kind: str  # "hardware", "software", "workload"
    baseline: str | None
    candidate: str | None
    status: str  # "match", "mismatch", "unknown"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "kind": self.kind, "baseline": self.baseline,
                "candidate": self.candidate, "status": self.status}

    def phrase(self) -> str:
        return f"{self.label.lower()} {self.baseline} vs {self.candidate}"


@dataclass(frozen=True)
class Comparability:
    """The comparability check of two sides (module docstring)."""

    fields: tuple[FieldCheck, ...]

    @property
    def hardware_mismatches(self) -> list[FieldCheck]:
        return [f for f in self.fields if f.status == "mismatch" and f.key in HARDWARE]

    @property
    def warnings(self) -> list[FieldCheck]:
        """Software and workload mismatches: stated, not blocking."""
        return [f for f in self.fields if f.status == "mismatch" and f.key not in HARDWARE]

    @property
    def comparable(self) -> bool:
        """No hardware mismatch (unknown fields do not count against it)."""
        return not self.hardware_mismatches

    @property
    def status(self) -> str:
        """``"not comparable"``, ``"comparable with warnings"`` or ``"comparable"``."""
        if not self.comparable:
            return "not comparable"
        return "comparable with warnings" if self.warnings else "comparable"

    def headline(self) -> str | None:
        """The line every output states at its top; ``None`` when nothing mismatches."""
        parts = []
        if self.hardware_mismatches:
            what = "; ".join(f.phrase() for f in self.hardware_mismatches)
            parts.append(f"NOT COMPARABLE: different hardware ({what}); the step-time change measures the hardware, "
                         "not the code")
        if self.warnings:
            parts.append("warning: " + "; ".join(f.phrase() for f in self.warnings) + " differ")
        return ". ".join(parts) or None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "comparable": self.comparable,
            "headline": self.headline(),
            "hardware_mismatches": [f.key for f in self.hardware_mismatches],
            "warnings": [f.key for f in self.warnings],
            "fields": [f.to_json() for f in self.fields],
        }


def check_comparability(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]]) -> Comparability:
    """Compare the facts of the baseline's inputs with the candidate's (pure)."""
    out = []
    for key, label, kind in FIELDS:
        b, c = _side_values(base, key), _side_values(cand, key)
        status = "unknown" if not b or not c else "match" if b == c else "mismatch"
        out.append(FieldCheck(key, label, kind, _show(b), _show(c), status))
    return Comparability(tuple(out))
