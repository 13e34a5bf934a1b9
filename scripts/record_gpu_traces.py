#!/usr/bin/env python
"""Record real GPU torch.profiler traces (and a CUDA memory snapshot) of a tiny training loop.

On a CUDA (or ROCm) machine this writes into ``--out-dir`` (default ``gpu_traces/``):

* ``<gpu>_train.json.gz`` — a small CNN trained on random data through a ``DataLoader``, profiled
  with ``schedule(wait=1, warmup=1, active=3)``, CPU+CUDA activities, ``record_shapes``,
  ``profile_memory`` and ``with_stack``; the loop deliberately contains pageable host→device copies
  and a ``loss.item()`` sync per step, so the analyzer has something to find;
* ``<gpu>_memory_snapshot.pickle`` — ``torch.cuda.memory._dump_snapshot`` after recording the
  allocator history (``_record_memory_history``) over the same loop.

Without a GPU it refuses with exit status 2 and a one-line message. Usage::

    python scripts/record_gpu_traces.py [--out-dir gpu_traces] [--steps 6]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="gpu_traces", help="output folder")
    ap.add_argument("--steps", type=int, default=6, help="loop iterations (>= 5 for wait+warmup+active)")
    args = ap.parse_args(argv)

    try:
        import torch
        from torch import nn
        from torch.profiler import ProfilerActivity, profile, schedule
        from torch.utils.data import DataLoader, TensorDataset
    except ImportError:
        print("record_gpu_traces: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("record_gpu_traces: no CUDA/ROCm device available; nothing recorded", file=sys.stderr)
        return 2

    dev = torch.device("cuda")
    gpu = re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name(0)).strip("_").lower()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / f"{gpu}_train.json.gz"
    snap_path = out_dir / f"{gpu}_memory_snapshot.pickle"

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    n = 64 * args.steps
    data = TensorDataset(torch.randn(n, 3, 64, 64), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=64, num_workers=0, pin_memory=False)  # pageable on purpose

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as prof:
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)  # pageable HtoD: blocking copies
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            _ = loss.item()  # DtoH + cudaStreamSynchronize every step
            prof.step()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(snap_path))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"wrote {trace_path} and {snap_path} (torch {torch.__version__}, {torch.cuda.get_device_name(0)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
