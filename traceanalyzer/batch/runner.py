"""Run the analysis of many inputs on local worker processes or a Dask cluster.

Both backends run the same worker function, :func:`analyse_one`, on a plain-dict task
and get a plain-dict answer back, so the result (and the index) does not depend on
where the work ran:

* the worker hashes the input (:func:`~traceanalyzer.batch.cache.content_hash`); when
  the key equals the one the client already holds for that file it answers "cached"
  without loading anything;
* otherwise it calls :func:`traceanalyzer.pipeline.analyze`, renders the per-file
  reports and returns the compact row (:mod:`~traceanalyzer.batch.summary`).

The local backend (:class:`LocalBackend`) supervises its own spawned worker processes,
one file at a time each, under per-file OS limits (:class:`Limits`: wall-clock time,
resident memory, address space); a file past a limit, or whose worker dies, fails alone
with the reason and the worker is replaced. Its workers write the reports straight into
``OUTDIR`` (a report folder is built aside and renamed into place whole). Dask workers
may not share a file system with the client, so they render into a private temporary
directory and return the bytes; the client writes them the same way. Inputs given as
fsspec URLs are read by the workers themselves.

:func:`run_batch` drives one batch under the output directory's lock
(:mod:`~traceanalyzer.batch.lock`): cache look-up, dispatch, writing reports and cache
entries as results arrive (never all at the end), multi-rank summaries and the index,
rewritten as files finish. Ctrl-C lets the files in flight finish, writes the index
flagged ``interrupted`` and raises :class:`BatchInterrupted`; re-running resumes from
the cache. An output directory that refuses writes stops the batch with
:class:`~traceanalyzer.errors.OutputError`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from traceanalyzer.batch.cache import Cache, cache_key, content_hash, report_folders, settings_fingerprint, slug
from traceanalyzer.batch.discover import Discovery, Input, is_url, open_binary
from traceanalyzer.errors import OutputError
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


def _internal_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
    return f"internal error: {type(exc).__name__}: {exc}{where}"


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
    ``formats``, ``outdir`` (``None``: return the report bytes instead of writing),
    ``budget_env`` (the input budget's environment variables of the client).
    """
    t0 = time.perf_counter()
    row = base_row(task)
    answer: Answer = {"rel": task["rel"], "key": None, "cacheable": True, "files": None}
    _apply_budget_env(task.get("budget_env") or {})
    return _analyse_one(task, row, answer, t0)


def _apply_budget_env(env: Mapping[str, str]) -> None:
    """Put the client's input budget into this worker's environment (a local worker inherits
    it anyway; a Dask worker on another machine does not). Left in place: every task of a
    batch carries the same values, and restoring them would race between a Dask worker's
    threads."""
    os.environ.update(env)


def _analyse_one(task: Task, row: dict[str, Any], answer: Answer, t0: float) -> Answer:
    from traceanalyzer.batch.summary import report_metrics
    from traceanalyzer.config import Config
    from traceanalyzer.errors import InputError, OutputError, TraceAnalyzerError
    from traceanalyzer.pipeline import analyze, write_outputs

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
            sub = f"{REPORTS_DIR}/{task.get('folder') or slug(task['rel'])}"
            if task.get("outdir"):
                base = Path(task["outdir"])
                final = base / sub
                partial = final.parent / f".{final.name}.partial-{os.getpid()}"
                try:
                    written = write_outputs(report, partial, task["formats"])
                    publish_folder(partial, final)
                except BaseException:
                    import shutil

                    shutil.rmtree(partial, ignore_errors=True)
                    raise
                row["reports"] = sorted((final / p.relative_to(partial)).relative_to(base).as_posix()
                                        for p in written)
            else:
                out = Path(tmp) / "out"
                written = write_outputs(report, out / sub, task["formats"])
                files = {p.relative_to(out).as_posix(): p.read_bytes() for p in written}
                answer["files"] = files
                row["reports"] = sorted(files)
    except InputError as exc:
        row.update(status="error", error=exc.problem)
    except OutputError as exc:
        # The output location, not the file: not cached, and the batch stops (run_batch).
        row.update(status="error", error=str(exc))
        answer.update(cacheable=False, output_error=[exc.path, exc.reason])
    except TraceAnalyzerError as exc:
        row.update(status="error", error=str(exc))
    except MemoryError:
        row.update(status="error", error="out of memory while analysing this file")
        answer["cacheable"] = False
    except RuntimeError as exc:
        # Under an address-space limit, a thread stack that cannot be reserved says so.
        if "can't start new thread" not in str(exc):
            row.update(status="error", error=_internal_text(exc))
        else:
            row.update(status="error", error="out of memory while analysing this file (could not start a thread)")
        answer["cacheable"] = False
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop the batch
        row.update(status="error", error=_internal_text(exc))
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

    def run(self, tasks: list[Task], stop: StopFlag | None = None) -> Iterator[Answer]: ...


@contextlib.contextmanager
def _worker_env(jobs: int) -> Iterator[None]:
    """Cap each worker's polars thread pool and chart processes so ``jobs`` processes do not
    oversubscribe the machine (the batch already runs files in parallel)."""
    share = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    added = [key for key in ("POLARS_MAX_THREADS", "TRACEANALYZER_CHART_JOBS") if key not in os.environ]
    for key in added:
        os.environ[key] = share
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class StopFlag:
    """Set by the first Ctrl-C of a batch: start nothing new, let files in flight finish."""

    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


@dataclass(frozen=True)
class Limits:
    """OS limits on one file's analysis, applied in the worker processes only.

    * ``memory_bytes``: the most resident memory (RSS) a worker may use for one file; the
      parent polls each busy worker's RSS (Linux ``/proc``) and kills one that exceeds it.
      Default: 80 % of physical memory, so a runaway file fails alone instead of waking the
      kernel's OOM killer (which may pick the wrong process).
    * ``address_space_bytes``: ``RLIMIT_AS`` set in the worker (an allocation beyond it
      fails at once: ``MemoryError`` in Python, an abort in native code). Default: 4 ×
      ``memory_bytes`` + 2 GiB, because allocators and thread stacks reserve much more
      address space than they touch.
    * ``timeout_s``: wall-clock seconds per file; the parent kills a worker past it.
      Default 1800 s.

    ``None`` disables a limit. Either way the file is reported failed with the reason and
    the batch goes on.
    """

    memory_bytes: int | None = None
    address_space_bytes: int | None = None
    timeout_s: float | None = 1800.0

    @classmethod
    def default(cls, memory_bytes: int | None = -1, timeout_s: float | None = 1800.0) -> Limits:
        """Limits with the documented defaults (``-1``: the default memory budget)."""
        if memory_bytes == -1:
            phys = _physical_memory()
            memory_bytes = int(phys * 0.8) if phys else None
        # Reserved address space runs several times the resident memory (polars' allocator and
        # thread stacks): 4x plus 2 GiB leaves a small trace's workers room.
        space = 4 * memory_bytes + (2 << 30) if memory_bytes else None
        return cls(memory_bytes=memory_bytes, address_space_bytes=space, timeout_s=timeout_s)


def _rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (Linux), else ``None``."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _worker_main(conn: Any, address_space: int | None) -> None:
    """A batch worker: analyse the tasks the parent sends, one at a time, until ``None``.

    Ctrl-C is the parent's to handle (it lets the file in flight finish), so the worker
    ignores SIGINT."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if address_space:
        try:
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = address_space if hard == resource.RLIM_INFINITY else min(address_space, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        except (ImportError, ValueError, OverflowError, OSError):
            pass  # not on this platform: the parent's RSS watchdog still applies
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(analyse_one(task))


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


@dataclass
class _Slot:
    proc: Any
    conn: Any
    task: Task | None = None
    started: float = 0.0


@dataclass
class LocalBackend:
    """``jobs`` spawned worker processes on this machine, each analysing one file at a time
    under :class:`Limits`; ``in_process=True`` runs the files in this process instead
    (no limits, for debugging and tests).

    A worker that dies (a native crash, killed for memory or time) fails only the file it
    held, with the reason, and is replaced; the batch goes on."""

    jobs: int = 0
    name: str = "local"
    writes_reports: bool = True
    limits: Limits = field(default_factory=Limits.default)
    in_process: bool = False
    poll_s: float = 0.25

    def __post_init__(self) -> None:
        if self.jobs <= 0:
            self.jobs = os.cpu_count() or 1

    def run(self, tasks: list[Task], stop: StopFlag | None = None) -> Iterator[Answer]:
        stop = stop if stop is not None else StopFlag()
        if self.in_process:
            for t in tasks:
                if stop:
                    return
                yield analyse_one(t)
            return
        if tasks:
            yield from self._pool(tasks, min(self.jobs, len(tasks)), stop)

    def _spawn(self, ctx: Any, jobs: int) -> _Slot:
        parent, child = ctx.Pipe()
        with _worker_env(jobs), _sigint_ignored():
            proc = ctx.Process(target=_worker_main, args=(child, self.limits.address_space_bytes), daemon=True)
            proc.start()
        child.close()
        return _Slot(proc, parent)

    def _pool(self, tasks: list[Task], jobs: int, stop: StopFlag) -> Iterator[Answer]:
        import multiprocessing
        from multiprocessing.connection import wait as mp_wait

        ctx = multiprocessing.get_context("spawn")  # fork + polars threads can deadlock
        queue = list(reversed(tasks))
        slots = [self._spawn(ctx, jobs) for _ in range(jobs)]
        lim = self.limits
        try:
            while True:
                for i, slot in enumerate(slots):
                    if slot.task is None and queue and not stop:
                        if not slot.proc.is_alive():  # killed for its last file: a fresh one
                            slot = slots[i] = self._spawn(ctx, jobs)
                        slot.task, slot.started = queue.pop(), time.monotonic()
                        try:
                            slot.conn.send(slot.task)
                        except (OSError, ValueError):
                            pass  # a dead worker: found below through its sentinel
                busy = [s for s in slots if s.task is not None]
                if not busy:
                    return
                ready = mp_wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=self.poll_s)
                now = time.monotonic()
                for slot in slots:
                    task = slot.task
                    if task is None:
                        continue
                    failure = None
                    if slot.conn in ready or slot.proc.sentinel in ready:
                        try:
                            if slot.conn.poll():
                                answer = slot.conn.recv()
                                slot.task = None
                                yield answer
                                continue
                        except (EOFError, OSError):
                            pass
                        code = slot.proc.exitcode
                        failure = ("the worker process died while analysing this file "
                                   f"({_exit_text(code)}; out of memory? try fewer --jobs)")
                    elif lim.timeout_s is not None and now - slot.started > lim.timeout_s:
                        failure = f"exceeded the per-file time limit of {lim.timeout_s:g} s (--file-timeout)"
                    elif lim.memory_bytes is not None:
                        rss = _rss_bytes(slot.proc.pid)
                        if rss is not None and rss > lim.memory_bytes:
                            failure = (f"exceeded the per-file memory limit: {_gib(rss)} resident > "
                                       f"{_gib(lim.memory_bytes)} (--file-memory)")
                    if failure is None:
                        continue
                    _kill(slot)  # the slot is idle now; a fresh worker is started when needed
                    yield failed_answer(task, failure)
        finally:
            for slot in slots:
                _kill(slot, graceful=slot.task is None)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Start a worker with SIGINT ignored: an ignored signal stays ignored across exec and
    Python then installs no KeyboardInterrupt handler, so a Ctrl-C (sent to the whole
    process group by the terminal) during the worker's start-up cannot kill it with a
    traceback; :func:`_worker_main` keeps it ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _kill(slot: _Slot, graceful: bool = False) -> None:
    """End a worker: ask an idle one to exit, kill a busy (or stuck) one."""
    proc = slot.proc
    if graceful and proc.is_alive():
        with contextlib.suppress(OSError, ValueError):
            slot.conn.send(None)
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(5.0)
    with contextlib.suppress(OSError):
        slot.conn.close()
    slot.task = None


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

    def run(self, tasks: list[Task], stop: StopFlag | None = None) -> Iterator[Answer]:
        if not tasks:
            return
        from distributed import as_completed

        client = self._client()
        try:
            futures = client.map(analyse_one, tasks, pure=False)
            task_of = {f.key: t for f, t in zip(futures, tasks)}
            try:
                for fut in as_completed(futures):
                    if stop:  # Ctrl-C: what has not finished is cancelled (the finally below)
                        return
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


def make_backend(*, jobs: int = 0, scheduler: str | None = None, use_dask: bool = False, in_process: bool = False,
                 timeout_s: float | None = 1800.0, memory_gib: float | None = None) -> LocalBackend | DaskBackend:
    """The backend the ``batch`` options select: a Dask cluster (``scheduler``, or a local one
    with ``use_dask``), else local worker processes under :class:`Limits` (``timeout_s`` 0 or
    ``None``: no time limit; ``memory_gib`` ``None``: the default budget, 0: none), or this
    process with ``in_process``."""
    if scheduler or use_dask:
        return DaskBackend(address=scheduler, jobs=jobs)
    memory = -1 if memory_gib is None else (int(memory_gib * (1 << 30)) or None)
    limits = Limits.default(memory_bytes=memory, timeout_s=timeout_s or None)
    return LocalBackend(jobs=1 if in_process else jobs, limits=limits, in_process=in_process)


def backend_text(backend: LocalBackend | DaskBackend) -> str:
    """Where the files are analysed, as the ``batch`` start line says it."""
    if isinstance(backend, DaskBackend):
        return backend.address or "local Dask cluster"
    if backend.in_process:
        return "this process"
    return f"{backend.jobs} worker process{'es' if backend.jobs > 1 else ''}"


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
    in_progress: bool = False
    index_files: list[Path] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return sum(1 for r in self.rows if r.get("status") != "ok")

    @property
    def n_cached(self) -> int:
        return sum(1 for r in self.rows if r.get("cached"))


def make_tasks(inputs: Iterable[Input], known: Mapping[str, str], fingerprint: str,
               overrides: Mapping[str, Any], formats: list[str], outdir: Path | None,
               folders: Mapping[str, str] | None = None) -> list[Task]:
    from traceanalyzer.params import budget_environment

    folders = folders or {}
    budget = budget_environment()  # a Dask worker on another machine must apply the same limits
    return [
        {"path": i.path, "rel": i.rel, "folder": folders.get(i.rel) or slug(i.rel), "run": i.run, "kind": i.kind,
         "rank": i.rank, "world_size": i.world_size,
         "size": i.size, "known_key": known.get(i.rel), "fingerprint": fingerprint, "overrides": dict(overrides),
         "formats": list(formats), "outdir": str(outdir) if outdir is not None else None,
         "budget_env": budget}
        for i in inputs
    ]


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the batch; ``result`` holds what finished (its index is written)."""

    def __init__(self, result: BatchResult) -> None:
        super().__init__()
        self.result = result


@contextlib.contextmanager
def _sigint_to_flag(stop: StopFlag) -> Iterator[None]:
    """The first Ctrl-C sets ``stop`` (files in flight finish and are kept); the second
    raises :class:`KeyboardInterrupt` (workers are killed, their files redone next time)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.set:
            raise KeyboardInterrupt
        stop.set = True
        import sys

        print("\ninterrupt: finishing the files in progress (Ctrl-C again to stop at once)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _clean_partials(out: Path) -> None:
    """Remove report folders a killed batch left half-built (``.NAME.partial-PID``)."""
    import shutil

    reports = out / REPORTS_DIR
    if reports.is_dir():
        for p in reports.glob(".*.partial-*"):
            shutil.rmtree(p, ignore_errors=True)
        for p in reports.glob(".*.old-*"):
            shutil.rmtree(p, ignore_errors=True)


#: The index is rewritten after each finished file, but not more often than this (s) or
#: than 10 × its last writing time, so a batch of many files does not spend its time
#: rewriting it; it is always written at the end.
INDEX_MIN_INTERVAL_S = 1.0


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

    Crash safety: the output directory is locked (:mod:`~traceanalyzer.batch.lock`); each
    file's report folder appears complete or not at all; its cache entry follows; the index
    is rewritten atomically as files finish (``in_progress`` until the end). Ctrl-C: the
    files in flight finish and are kept, the index is written, and
    :class:`BatchInterrupted` (a ``KeyboardInterrupt``) is raised; re-running the same
    command resumes (finished files come from the cache).
    """
    from traceanalyzer.batch.lock import BatchLock

    out = Path(outdir)
    make_dir(out)
    stop = StopFlag()
    with BatchLock(out), _sigint_to_flag(stop):
        _clean_partials(out)
        return _run_locked(discovery, out, backend, stop, overrides=dict(overrides or {}),
                           formats=list(formats or ["json", "md"]), use_cache=use_cache, on_result=on_result)


def _run_locked(discovery: Discovery, out: Path, backend: Backend, stop: StopFlag, *, overrides: dict[str, Any],
                formats: list[str], use_cache: bool,
                on_result: Callable[[dict[str, Any]], None] | None) -> BatchResult:
    from traceanalyzer.batch.index import write_index
    from traceanalyzer.batch.multirank import summarize_runs

    fp = settings_fingerprint(overrides, formats)
    cache = Cache(out)
    known = cache.known_keys([i.rel for i in discovery.inputs], out) if use_cache else {}
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    # The straggler finding is the rank_imbalance rule's: its thresholds come from --set/--config.
    params = {k.split(".", 1)[1]: float(v) for k, v in overrides.items() if k.startswith("rank_imbalance.")}
    last_index = {"at": 0.0, "took": 0.0}

    def index(interrupted: bool = False, in_progress: bool = False) -> BatchResult:
        started = time.perf_counter()
        ordered = [rows[i.rel] for i in discovery.inputs if i.rel in rows]
        result = BatchResult(rows=ordered, runs=summarize_runs(ordered, params), ignored=list(discovery.ignored),
                             outdir=out, backend=backend.name, wall_s=round(time.perf_counter() - t0, 3),
                             interrupted=interrupted, in_progress=in_progress)
        result.index_files = write_index(result, expected=len(discovery.inputs))
        last_index.update(at=time.perf_counter(), took=time.perf_counter() - started)
        return result

    def progress_index() -> None:
        if time.perf_counter() - last_index["at"] >= max(INDEX_MIN_INTERVAL_S, 10 * last_index["took"]):
            index(in_progress=True)

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
    folders = report_folders(i.rel for i in discovery.inputs)
    tasks = make_tasks(todo, known, fp, overrides, formats, out if backend.writes_reports else None, folders)
    by_rel = {t["rel"]: t for t in tasks}
    interrupted = False
    output_error: OutputError | None = None
    try:
        for ans in _run_backend(backend, tasks, stop):
            rel = ans["rel"]
            task = by_rel[rel]
            if ans.get("cached"):
                row = cache.get(rel, ans["key"], out)
                if row is None:  # vanished between the look-up and now: redo it here
                    ans = analyse_one({**task, "known_key": None, "outdir": str(out)})
                else:
                    row = {**row, "path": task["path"], "run": task["run"], "cached": True, "seconds": 0.0}
                    rows[rel] = row
                    if on_result:
                        on_result(row)
                    progress_index()
                    continue
            row = ans["row"]
            if ans.get("output_error"):
                # The output directory refuses writes (full, read-only): every further file would
                # fail the same way, so stop, and keep this file out of the index (not its fault).
                output_error = OutputError(out, ans["output_error"][1])
                stop.set = True
                continue
            try:
                if ans.get("files"):
                    _write_folder(out, f"{REPORTS_DIR}/{task['folder']}", ans["files"])
                if use_cache and ans.get("key") and ans.get("cacheable"):
                    cache.put(rel, ans["key"], row)
            except OutputError as exc:
                output_error = exc
                stop.set = True
                continue
            rows[rel] = row
            if on_result:
                on_result(row)
            progress_index()
    except KeyboardInterrupt:
        interrupted = True
    interrupted = interrupted or bool(stop) or len(rows) < len(discovery.inputs)
    if interrupted or output_error is not None:
        _clean_partials(out)  # folders of files killed in flight (no worker is left to finish them)
    if output_error is not None:
        with contextlib.suppress(OutputError):  # the index may not fit either
            index(interrupted=True)
        raise output_error
    result = index(interrupted=interrupted)
    if interrupted:
        raise BatchInterrupted(result)
    return result


def _run_backend(backend: Backend, tasks: list[Task], stop: StopFlag) -> Iterator[Answer]:
    """``backend.run`` with the stop flag where the backend takes one."""
    import inspect

    try:
        takes_stop = "stop" in inspect.signature(backend.run).parameters
    except (TypeError, ValueError):
        takes_stop = False
    return backend.run(tasks, stop=stop) if takes_stop else backend.run(tasks)


def _write_folder(out: Path, sub: str, files: Mapping[str, bytes]) -> None:
    """Write a report folder's files (paths relative to ``out``, all under ``sub``) so the
    folder appears complete or not at all (see :func:`publish_folder`)."""
    final = out / sub
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    prefix = sub.rstrip("/") + "/"
    for name, data in files.items():
        rest = name[len(prefix):] if name.startswith(prefix) else Path(name).name
        atomic_write_bytes(tmp / rest, data)
    publish_folder(tmp, final)


def publish_folder(tmp: Path, final: Path) -> None:
    """Replace the folder ``final`` by the fully written ``tmp`` (two renames; an older
    ``final`` is moved aside first and removed after), so a report folder is never a mix
    of two runs or half a run."""
    import shutil

    old = final.parent / f".{final.name}.old-{os.getpid()}"
    try:
        if final.exists():
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
    except OSError as exc:
        raise OutputError.from_os(final, exc) from None
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
