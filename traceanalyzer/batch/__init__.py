"""Many inputs at once: find, group into runs, analyse in parallel, index.

* :mod:`~traceanalyzer.batch.discover` — find traces and snapshots under directories,
  globs or fsspec URLs (recognised by content) and group the files of one run.
* :mod:`~traceanalyzer.batch.summary` — the compact per-file row (step time, busy %,
  communication …) read from a :class:`~traceanalyzer.report.document.Report`.
* :mod:`~traceanalyzer.batch.cache` — content hash + tool version → cached row, so a
  nightly re-run only analyses what changed.
* :mod:`~traceanalyzer.batch.runner` — local worker processes (per-file limits) and Dask
  backends behind one interface; workers call :mod:`traceanalyzer.pipeline` and return
  compact rows.
* :mod:`~traceanalyzer.batch.lock` — one batch per output directory.
* :mod:`~traceanalyzer.batch.multirank` — straggler/imbalance and overlap across the
  ranks of one run (a pure function over per-rank rows).
* :mod:`~traceanalyzer.batch.index` — the CSV/JSON/HTML index.

``traceanalyzer batch`` (:mod:`traceanalyzer.commands.batch`) wires them together.
"""
