#!/usr/bin/env python
"""Regenerate the committed synthetic sample traces and their ground-truth files.

Writes into ``sample_traces/`` (default) — see ``sample_traces/README.md`` for what each file is
and what is planted in it:

* ``resnet_like_a100.json.gz``        modern NVIDIA A100 training, several problems planted
* ``amd_mi300_inference.json.gz``     modern AMD MI300X inference with HIP graph replay
* ``legacy_pt18.json``                PyTorch 1.8-era layout (V100), DataLoader gaps
* ``pt113_sync_bound.json.gz``        PyTorch 1.13-era layout, repeated ``.item()`` syncs
* ``ddp_run/rank-{0,1}.json.gz``      2-rank DDP, rank 1 is a straggler
* ``regression/{baseline,candidate}.json.gz``  one kernel 3× slower in the candidate

Each trace ``X.json[.gz]`` has ``X.truth.json`` next to it (``tests/support/synthetic.py``
truth dict: exact planted numbers in ns). Output is byte-identical run to run.

Usage::

    python scripts/make_samples.py [--out sample_traces]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The generator is test-support code (tests/support/), not part of the installed package.
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support import synthetic as S  # noqa: E402


def _truth_path(trace_path: Path) -> Path:
    name = trace_path.name
    for ext in (".json.gz", ".json"):
        if name.endswith(ext):
            return trace_path.with_name(name[: -len(ext)] + ".truth.json")
    raise ValueError(name)


def _save(out: Path, rel: str, scenario: tuple[dict[str, Any], dict[str, Any]]) -> tuple[Path, Path]:
    trace, truth = scenario
    p = out / rel
    truth = {"file": rel, **truth}
    S.write_bytes(p, S.dumps_trace(trace))
    t = _truth_path(p)
    S.write_bytes(t, S.dumps_truth(truth))
    return p, t


def make_all(out: Path) -> list[Path]:
    """Write every sample under ``out``; returns the written paths."""
    written: list[Path] = []

    def add(rel: str, sc: tuple[dict[str, Any], dict[str, Any]]) -> None:
        written.extend(_save(out, rel, sc))

    add("resnet_like_a100.json.gz", S.scenario_resnet_like(seed=0, steps=5, gpu="A100"))
    add("amd_mi300_inference.json.gz", S.scenario_inference(seed=0, steps=4, vendor="amd"))
    add("legacy_pt18.json", S.scenario_idle_gaps(seed=1, steps=3, layout="legacy_1_8", gpu="V100"))
    add("pt113_sync_bound.json.gz", S.scenario_sync_bound(seed=2, steps=2, layout="pt_1_13"))
    for rank in (0, 1):
        add(f"ddp_run/rank-{rank}.json.gz", S.scenario_multi_rank(rank, world_size=2, straggler_rank=1, seed=3))
    add("regression/baseline.json.gz", S.scenario_regression(True, seed=4))
    add("regression/candidate.json.gz", S.scenario_regression(False, seed=4))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "sample_traces"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    paths = make_all(out)
    total = 0
    for p in paths:
        size = p.stat().st_size
        total += size
        print(f"{size / 1024:8.1f} KiB  {p.relative_to(out)}")
    print(f"{total / 1024:8.1f} KiB  total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
