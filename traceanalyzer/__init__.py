"""traceanalyzer: offline analysis of PyTorch profiler traces and CUDA memory snapshots.

Python API::

    import traceanalyzer as ta
    model = ta.read("rank0.pt.trace.json.gz")      # a TraceModel (or a snapshot model)
    report = ta.analyze("rank0.pt.trace.json.gz")  # load → analyses → rules → Report
    report.to_json()["analyses"]["overview"]["gpu_busy_pct"]
"""

from __future__ import annotations

__version__ = "0.1.0"

import os as _os

# polars allocates through its own jemalloc, which by default keeps freed pages for
# 10 s: a pipeline of large transient tables then holds them all at once. Returning
# them at once halves the peak RSS of a 100 MB snapshot (880 -> 454 MB) at no
# measurable cost in time (docs/memory.md, "Large snapshots"). Read when polars is first
# imported, so only effective when traceanalyzer is imported first; a value set by the
# user wins.
_os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")

# ``read`` (not ``load``): a package attribute named ``load`` would shadow the
# ``traceanalyzer.load`` sub-package for ``import traceanalyzer.load.x as y``.
from traceanalyzer.pipeline import analyze, build_report, write_outputs  # noqa: E402
from traceanalyzer.pipeline import load as read  # noqa: E402

__all__ = ["__version__", "analyze", "build_report", "read", "write_outputs"]
