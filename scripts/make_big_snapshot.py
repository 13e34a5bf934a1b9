#!/usr/bin/env python3
"""Build a large, allocator-consistent CUDA memory snapshot for measuring the loader.

Uses ``../shared/tools/make_snapshot_like.py`` (exact schema of any release 2.0…2.13).
The size is steered by ``--steps`` (≈ 60 trace entries per step and layer group);
``--target-mb`` picks the number of steps for a target file size instead.

    python scripts/make_big_snapshot.py -o /tmp/big100.pickle --target-mb 100
    python scripts/make_big_snapshot.py -o /tmp/big1g.pickle --target-mb 1000   # slow (minutes)

Then measure::

    /usr/bin/time -v traceanalyzer memory /tmp/big100.pickle -o /tmp/big100.out -q
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

SHARED_TOOLS = Path(__file__).resolve().parents[2] / "shared" / "tools"

# Measured with --version 2.13 --context all --layers 12: bytes of pickle per step.
_BYTES_PER_STEP_12_LAYERS = 6_300


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--target-mb", type=float, default=None, help="approximate output size in MB")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--version", default="2.13")
    ap.add_argument("--context", default="all", choices=["none", "state", "alloc", "all"])
    ap.add_argument("--stacks", default="python", choices=["python", "all"])
    ap.add_argument("--max-entries", type=int, default=None, help="emulate the ring buffer")
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--protocol", type=int, default=4)
    a = ap.parse_args()
    if not SHARED_TOOLS.exists():
        sys.exit(f"needs {SHARED_TOOLS}/make_snapshot_like.py")
    sys.path.insert(0, str(SHARED_TOOLS))
    from make_snapshot_like import make_snapshot  # type: ignore[import-not-found]

    steps = a.steps
    if a.target_mb:
        per_step = _BYTES_PER_STEP_12_LAYERS * a.layers / 12
        steps = max(2, int(a.target_mb * 1e6 / per_step))
    t0 = time.perf_counter()
    snap = make_snapshot(a.version, None if a.context == "none" else a.context, a.stacks, steps, a.layers,
                         seed=1, max_entries=a.max_entries, with_oom=a.oom)
    with open(a.output, "wb") as fh:
        pickle.dump(snap, fh, protocol=a.protocol)
    n = sum(len(t) for t in snap["device_traces"])
    size = Path(a.output).stat().st_size
    print(f"wrote {a.output}: {size / 1e6:.1f} MB, steps={steps}, trace entries={n:,}, "
          f"segments={len(snap['segments'])} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
