"""Run the analysis of many inputs on a local process pool or a Dask cluster.

Both backends run the same worker function, :func:`analyse_one`, on a plain-dict task
and get a plain-dict answer back, so the result (and the index) does not depend on
where the work ran:

* the worker hashes the input (:func:`~traceanalyzer.batch.cache.content_hash`); when
  the key equals the one the client already holds for that file it answers "cached"
  without loading anything;
* otherwise it calls :func:`traceanalyzer.pipeline.analyze`, renders the per-file
  reports and returns the compact row (:mod:`~traceanalyzer.batch.summary`).

The local backend's workers write the reports straight into ``OUTDIR`` (each file
atomically). Dask workers may not share a file system with the client, so they render
into a private temporary directory and return the bytes; the client writes them. Inputs
given as fsspec URLs are read by the workers themselves.

:func:`run_batch` drives one batch: cache look-up, dispatch, writing reports and cache
entries as results arrive (never all at the end), multi-rank summaries and the index.
An interrupted batch (Ctrl-C) still writes the index of what finished, flagged
``interrupted``; everything already written stays.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

from traceanalyzer.batch.cache import Cache, cache_key, content_hash, settings_fingerprint, slug
from traceanalyzer.batch.discover import Discovery, Input, is_url, open_binary
from traceanalyzer.report.fsutil import atomic_write_bytes, make_dir

REPORTS_DIR = "reports"
Task = dict[str, Any]
Answer = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------------------------


def _local_copy(path: str, tmpdir: str) -> str:
    """A local file with the bytes of ``path`` (URLs are downloaded into ``tmpdir``)."""
    if not is_url(path):
        return path
    name = path.rstrip("/").rsplit("/", 1)[-1] or "input"
    dest = os.path.join(tmpdir, name)
    with open_binary(path) as src, open(dest, "wb") as dst:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            dst.write(chunk)
    return dest


def base_row(task: Task) -> dict[str, Any]:
    """The index row of a task before analysis (what discovery knows)."""
    return {
        "file": task["rel"], "path": task["path"], "run": task["run"], "kind": task["kind"],
        "rank": task.get("rank"), "world_size": task.get("world_size"), "size": task.get("size"),
        "status": "ok", "error": None, "cached": False, "seconds": None, "blake2b": None,
        "reports": [], "metrics": {}, "warnings": 0, "skipped_analyses": 0, "failed_analyses": 0,
    }


def analyse_one(task: Task) -> Answer:
    """Analyse one input; see the module docstring. Never raises for a bad input.

    ``task`` keys: ``path``, ``rel``, ``run``, ``kind``, ``rank``, ``world_size``,
    ``size``, ``known_key`` (the cached key or ``None``), ``fingerprint``, ``overrides``,
    ``formats``, ``outdir`` (``None``: return the report bytes instead of writing).
    """
    from traceanalyzer.batch.summary import report_metrics
    from traceanalyzer.config import Config
    from traceanalyzer.errors import InputError, TraceAnalyzerError
    from traceanalyzer.pipeline import analyze, write_outputs

    t0 = time.perf_counter()
    row = base_row(task)
    answer: Answer = {"rel": task["rel"], "key": None, "cacheable": True, "files": None}
    try:
        digest = content_hash(task["path"])
        key = cache_key(digest, task["fingerprint"])
        answer["key"] = key
        row["blake2b"] = digest
        if task.get("known_key") == key:
            answer["cached"] = True
            return answer
        with tempfile.TemporaryDirectory(prefix="traceanalyzer-") as tmp:
            local = _local_copy(task["path"], tmp)
            report = analyze(local, Config(dict(task["overrides"])))
            row["kind"] = report.kind
            meta = report.meta or {}
            if meta.get("rank") is not None:
                row["rank"] = meta.get("rank")
            if meta.get("world_size") is not None:
                row["world_size"] = meta.get("world_size")
            row["metrics"] = report_metrics(report)
            row["warnings"] = len(report.warnings)
            row["skipped_analyses"] = len(report.results.skipped)
            row["failed_analyses"] = len(report.results.failed)
            sub = f"{REPORTS_DIR}/{slug(task['rel'])}"
            if task.get("outdir"):
                base = Path(task["outdir"])
                written = write_outputs(report, base / sub, task["formats"])
                row["reports"] = sorted(p.relative_to(base).as_posix() for p in written)
            else:
                out = Path(tmp) / "out"
                written = write_outputs(report, out / sub, task["formats"])
                files = {p.relative_to(out).as_posix(): p.read_bytes() for p in written}
                answer["files"] = files
                row["reports"] = sorted(files)
    except InputError as exc:
        row.update(status="error", error=exc.problem)
    except TraceAnalyzerError as exc:
        row.update(status="error", error=str(exc))
    except MemoryError:
        row.update(status="error", error="out of memory while analysing this file")
        answer["cacheable"] = False
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop the batch
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
        row.update(status="error", error=f"internal error: {type(exc).__name__}: {exc}{where}")
        answer["cacheable"] = False
    row["seconds"] = round(time.perf_counter() - t0, 3)
    answer["row"] = row
    return answer


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------


class Backend(Protocol):
    """Runs :func:`analyse_one` over tasks; yields answers as they complete."""

    name: str
    writes_reports: bool  # True: workers write into OUTDIR themselves

    def run(self, tasks: list[Task]) -> Iterator[Answer]: ...


@contextlib.contextmanager
def _worker_env(jobs: int) -> Iterator[None]:
    """Cap each worker's polars thread pool so ``jobs`` processes do not oversubscribe."""
    key = "POLARS_MAX_THREADS"
    if key in os.environ:
        yield
        return
    os.environ[key] = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    try:
        yield
    finally:
        os.environ.pop(key, None)


@dataclass
class LocalBackend:
    """A :class:`~concurrent.futures.ProcessPoolExecutor` of ``jobs`` spawned processes
    (``jobs=1``: in this process, which is easier to debug)."""

    jobs: int = 0
    name: str = "local"
    writes_reports: bool = True

    def __post_init__(self) -> None:
        if self.jobs <= 0:
            self.jobs = os.cpu_count() or 1

    def run(self, tasks: list[Task]) -> Iterator[Answer]:
        if self.jobs == 1 or len(tasks) <= 1:
            for t in tasks:
                yield analyse_one(t)
            return
        crashed: list[Task] = []
        yield from self._pool(tasks, min(self.jobs, len(tasks)), crashed)
        # A worker that died (killed for memory, a crash in native code) breaks the whole
        # pool; redo the tasks it took down one at a time so only the culprit fails.
        for t in crashed:
            again: list[Task] = []
            yield from self._pool([t], 1, again)
            for lost in again:
                yield failed_answer(lost, "the worker process died while analysing this file "
                                          "(killed for memory? try fewer --jobs)")

    def _pool(self, tasks: list[Task], jobs: int, crashed: list[Task]) -> Iterator[Answer]:
        import multiprocessing
        from concurrent.futures.process import BrokenProcessPool

        ctx = multiprocessing.get_context("spawn")  # fork + polars threads can deadlock
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
        try:
            with _worker_env(jobs):
                pending: dict[Future[Answer], Task] = {pool.submit(analyse_one, t): t for t in tasks}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    task = pending.pop(fut)
                    try:
                        yield fut.result()
                    except BrokenProcessPool:
                        crashed.append(task)
                    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable answer
                        yield failed_answer(task, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            # On Ctrl-C / generator close: drop queued work, let running files finish writing.
            pool.shutdown(wait=True, cancel_futures=True)


def failed_answer(task: Task, error: str) -> Answer:
    """The answer for a task whose worker never answered."""
    row = {**base_row(task), "status": "error", "error": error}
    return {"rel": task["rel"], "key": None, "cacheable": False, "files": None, "row": row}


@dataclass
class DaskBackend:
    """Tasks on a Dask distributed cluster.

    ``address`` is a scheduler (``tcp://host:8786``); ``None`` starts a
    :class:`distributed.LocalCluster` of ``jobs`` single-threaded worker processes
    (``processes=False``: threads in this process, for tests). ``client`` reuses an
    existing :class:`distributed.Client`.
    """

    address: str | None = None
    jobs: int = 0
    processes: bool = True
    client: Any = None
    name: str = "dask"
    writes_reports: bool = False
    _own: list[Any] = field(default_factory=list)

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            from traceanalyzer.errors import ConfigError

            raise ConfigError("--dask/--scheduler needs the dask extra: pip install 'traceanalyzer[dask]'") from None
        if self.address:
            try:
                client = Client(self.address, timeout="20s")
            except OSError as exc:
                from traceanalyzer.errors import ConfigError

                raise ConfigError(f"cannot reach the Dask scheduler at {self.address}: {exc}") from None
            self._own.append(client)
            return client
        n = self.jobs if self.jobs > 0 else (os.cpu_count() or 1)
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=self.processes,
                               dashboard_address=None)
        client = Client(cluster)
        self._own += [client, cluster]
        return client

    def run(self, tasks: list[Task]) -> Iterator[Answer]:
        if not tasks:
            return
        from distributed import as_completed

        client = self._client()
        try:
            futures = client.map(analyse_one, tasks, pure=False)
            task_of = {f.key: t for f, t in zip(futures, tasks)}
            try:
                for fut in as_completed(futures):
                    try:
                        yield fut.result()
                    except Exception as exc:  # noqa: BLE001 - KilledWorker, lost worker …
                        yield failed_answer(task_of[fut.key], f"Dask task failed: {type(exc).__name__}: {exc}")
            finally:
                for f in futures:
                    f.cancel()
        finally:
            for obj in self._own:
                with contextlib.suppress(Exception):
                    obj.close()
            self._own.clear()


# ---------------------------------------------------------------------------------------------
# One batch
# ---------------------------------------------------------------------------------------------


@dataclass
class BatchResult:
    """Rows (one per input, in discovery order), the runs, what was ignored, totals."""

    rows: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    ignored: list[tuple[str, str]]
    outdir: Path
    backend: str
    wall_s: float
    interrupted: bool = False
    index_files: list[Path] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return sum(1 for r in self.rows if r.get("status") != "ok")

    @property
    def n_cached(self) -> int:
        return sum(1 for r in self.rows if r.get("cached"))


def make_tasks(inputs: Iterable[Input], known: Mapping[str, str], fingerprint: str,
               overrides: Mapping[str, Any], formats: list[str], outdir: Path | None) -> list[Task]:
    return [
        {"path": i.path, "rel": i.rel, "run": i.run, "kind": i.kind, "rank": i.rank, "world_size": i.world_size,
         "size": i.size, "known_key": known.get(i.rel), "fingerprint": fingerprint, "overrides": dict(overrides),
         "formats": list(formats), "outdir": str(outdir) if outdir is not None else None}
        for i in inputs
    ]


def run_batch(
    discovery: Discovery,
    outdir: str | Path,
    backend: Backend,
    *,
    overrides: Mapping[str, Any] | None = None,
    formats: list[str] | None = None,
    use_cache: bool = True,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> BatchResult:
    """Analyse every input of ``discovery`` into ``outdir`` and write the index.

    ``formats`` are the per-file report formats (default json, md). ``on_result`` is
    called with each row as it completes (progress bars).
    """
    from traceanalyzer.batch.index import write_index
    from traceanalyzer.batch.multirank import summarize_runs

    out = Path(outdir)
    make_dir(out)
    overrides = dict(overrides or {})
    formats = list(formats or ["json", "md"])
    fp = settings_fingerprint(overrides, formats)
    cache = Cache(out)
    known = cache.known_keys([i.rel for i in discovery.inputs], out) if use_cache else {}
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    # Local files with a cache entry are hashed here: no worker needs to start for them.
    # (URL inputs are hashed by the workers, which are closer to the data.)
    todo: list[Input] = []
    for inp in discovery.inputs:
        key = known.get(inp.rel)
        if key is not None and not is_url(inp.path):
            try:
                hit = cache.get(inp.rel, key, out) if cache_key(content_hash(inp.path), fp) == key else None
            except OSError:
                hit = None
            if hit is not None:
                rows[inp.rel] = {**hit, "path": inp.path, "run": inp.run, "cached": True, "seconds": 0.0}
                if on_result:
                    on_result(rows[inp.rel])
                continue
        todo.append(inp)
    tasks = make_tasks(todo, known, fp, overrides, formats, out if backend.writes_reports else None)
    interrupted = False
    try:
        for ans in backend.run(tasks):
            rel = ans["rel"]
            if ans.get("cached"):
                row = cache.get(rel, ans["key"], out)
                if row is None:  # vanished between the look-up and now: redo it here
                    task = next(t for t in tasks if t["rel"] == rel)
                    ans = analyse_one({**task, "known_key": None, "outdir": str(out)})
                else:
                    task = next(t for t in tasks if t["rel"] == rel)
                    row = {**row, "path": task["path"], "run": task["run"], "cached": True, "seconds": 0.0}
                    rows[rel] = row
                    if on_result:
                        on_result(row)
                    continue
            row = ans["row"]
            for name, data in (ans.get("files") or {}).items():
                atomic_write_bytes(out / name, data)
            if use_cache and ans.get("key") and ans.get("cacheable"):
                cache.put(rel, ans["key"], row)
            rows[rel] = row
            if on_result:
                on_result(row)
    except KeyboardInterrupt:
        interrupted = True
    ordered = [rows[i.rel] for i in discovery.inputs if i.rel in rows]
    # The straggler finding is the rank_imbalance rule's: its thresholds come from --set/--config.
    params = {k.split(".", 1)[1]: float(v) for k, v in overrides.items() if k.startswith("rank_imbalance.")}
    runs = summarize_runs(ordered, params)
    result = BatchResult(rows=ordered, runs=runs, ignored=list(discovery.ignored), outdir=out,
                         backend=backend.name, wall_s=round(time.perf_counter() - t0, 3), interrupted=interrupted)
    result.index_files = write_index(result, expected=len(discovery.inputs))
    if interrupted:
        raise KeyboardInterrupt
    return result
