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
# 10 s: a pipeline of large transient tables then holds them all at once. Returning them
# at once (decay 0) halves the peak RSS of a 100 MB snapshot (880 -> 445 MB) but makes
# the chunked trace loader fault every chunk's pages in again (system time 1.2-1.4 s of a
# 2.8-3.4 s analyze of df_index_resolver). 100 ms keeps most of both: 530 MB on the
# snapshot, 0.4 s system time on the trace (docs/performance.md). Read when polars is
# first imported, so only effective when traceanalyzer is imported first; a value set by
# the user wins.
_os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:0")

# ``read`` (not ``load``): a package attribute named ``load`` would shadow the
# ``traceanalyzer.load`` sub-package for ``import traceanalyzer.load.x as y``.
from traceanalyzer.pipeline import analyze, build_report, write_outputs  # noqa: E402
from traceanalyzer.pipeline import load as read  # noqa: E402

__all__ = ["__version__", "analyze", "build_report", "read", "write_outputs"]
