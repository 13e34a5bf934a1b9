#!/usr/bin/env python
"""Record a real CPU-only torch.profiler trace of a tiny training loop.

Writes ``sample_traces/cpu_real_torch.json.gz`` (default): a small CNN trained for a few steps on
random data through a ``DataLoader``, profiled with ``schedule(wait=1, warmup=1, active=3)``,
``record_shapes=True, profile_memory=True, with_stack=True``. The result is a genuine Kineto file
from the installed PyTorch (``ProfilerStep#2..4``, ``enumerate(DataLoader)#…``, ``Optimizer.step#SGD.step``,
``[memory]`` events with ``Device Type`` 0, ``python_function`` events, ``fwdbwd`` flows) — the
CPU-side ground that synthetic GPU traces are checked against.

Usage::

    python scripts/record_cpu_trace.py [--out sample_traces/cpu_real_torch.json.gz] [--steps 5]

Needs ``torch`` (``pip install torch``); the output is kept under ~1.5 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sample_traces/cpu_real_torch.json.gz", help="output .json or .json.gz")
    ap.add_argument("--steps", type=int, default=5, help="loop iterations (>= 5 for wait+warmup+active)")
    args = ap.parse_args(argv)

    try:
        import torch
        from torch import nn
        from torch.profiler import ProfilerActivity, profile, schedule
        from torch.utils.data import DataLoader, TensorDataset
    except ImportError:
        print("record_cpu_trace: torch is not installed (pip install torch)", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    torch.set_num_threads(1)  # small, reproducible-ish timings; the trace stays compact

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(16 * args.steps, 3, 16, 16), torch.randint(0, 10, (16 * args.steps,)))
    loader = DataLoader(data, batch_size=16, shuffle=False, num_workers=0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def on_ready(prof: profile) -> None:
        prof.export_chrome_trace(str(out))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as prof:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            _ = loss.item()
            prof.step()

    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.2f} MB) with torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
