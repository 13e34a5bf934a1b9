"""The one place that knows how a Kineto chrome-trace event is laid out.

Every hand-built event in the tests comes from here: the synthetic generator
(:mod:`support.synthetic`) serialises its simulated events through :func:`complete`,
:func:`flow`, :func:`instant` and :func:`meta`; :class:`Trace` builds the tiny timelines of
the analysis and rule tests; test modules with their own small helpers (a launch and its
kernel, a copy nest) build on :func:`x`, :func:`gpu` and :func:`launch`.

Layout (PyTorch ≥ 2.4 Kineto, also read by the loader for older layouts): a complete event is
``{"ph": "X", "cat", "name", "pid", "tid", "ts", "dur", "args"}`` with ``ts``/``dur`` in µs; a
GPU activity runs on ``pid = device``, ``tid = stream`` and carries ``device``, ``stream`` and
the ``correlation`` id of the runtime call that launched it in its args. Key order is Kineto's
(the generator's output must stay byte-identical).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceanalyzer.model import TraceModel

#: The CPU process and thread of hand-built traces.
PID = 100
TID = 100
#: The GPU stream of hand-built traces (Kineto's default compute stream).
STREAM = 7

#: The ``cat`` of each GPU activity kind.
GPU_CATS = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def complete(cat: str | None, name: str, ts: float, dur: float, pid: Any = PID, tid: Any = TID,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete (``ph: X``) event; ``cat`` and ``args`` are left out when ``None``."""
    d: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if cat is None:
        del d["cat"]
    if args is not None:
        d["args"] = args
    return d


def x(cat: str, name: str, ts: float, dur: float, *, pid: Any = PID, tid: Any = TID, **args: Any) -> dict[str, Any]:
    """:func:`complete` with its args as keyword arguments (``External id`` and the like go through
    ``**{"External id": n}``)."""
    return complete(cat, name, ts, dur, pid=pid, tid=tid, args=args)


def gpu(cat: str, name: str, ts: float, dur: float, corr: int | None, *, stream: int = STREAM, device: int = 0,
        **args: Any) -> dict[str, Any]:
    """A GPU activity (``cat`` kernel, gpu_memcpy or gpu_memset) on ``device``/``stream``, launched by
    the runtime call with correlation id ``corr`` (``None``: no correlation, an orphan)."""
    a: dict[str, Any] = {"device": device, "stream": stream, **args}
    if corr is not None:
        a["correlation"] = corr
    return complete(cat, name, ts, dur, pid=device, tid=stream, args=a)


def runtime(name: str, ts: float, dur: float, corr: int | None, *, tid: Any = TID, cat: str = "cuda_runtime",
            **args: Any) -> dict[str, Any]:
    """A runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync`` …) with correlation id ``corr``
    (``None``: a call that launches nothing, such as a synchronize)."""
    a = dict(args)
    if corr is not None:
        a["correlation"] = corr
    return complete(cat, name, ts, dur, pid=PID, tid=tid, args=a)


def launch(corr: int, ts: float, dur: float, k_ts: float, k_dur: float, name: str = "k", *,
           api: str = "cudaLaunchKernel", cat: str = "kernel", stream: int = STREAM, device: int = 0,
           **args: Any) -> list[dict[str, Any]]:
    """A runtime call ``[ts, ts + dur)`` and the GPU activity ``[k_ts, k_ts + k_dur)`` it launched."""
    return [runtime(api, ts, dur, corr), gpu(cat, name, k_ts, k_dur, corr, stream=stream, device=device, **args)]


def flow(ph: str, flow_id: int, pid: Any, tid: Any, ts: float, cat: str, name: str,
         bp: str | None = None) -> dict[str, Any]:
    """A flow start (``ph: s``) or end (``ph: f``) event; ``bp: e`` binds it to its enclosing slice."""
    d: dict[str, Any] = {"ph": ph, "id": flow_id, "pid": pid, "tid": tid, "ts": ts, "cat": cat, "name": name}
    if bp is not None:
        d["bp"] = bp
    return d


def instant(name: str, ts: float, pid: Any, tid: Any, args: dict[str, Any], cat: str | None = "cpu_instant_event",
            scope: str = "t") -> dict[str, Any]:
    """An instant (``ph: i``) event such as an allocator ``[memory]`` row (``cat`` left out when
    ``None``, as PyTorch 1.8 wrote them)."""
    d: dict[str, Any] = {"ph": "i"}
    if cat is not None:
        d["cat"] = cat
    d.update({"s": scope, "name": name, "pid": pid, "tid": tid, "ts": ts, "args": args})
    return d


def memory(ts: float, total: int, delta: int, reserved: int = 64 << 20, dev: int = 0, dtype: int = 1,
           name: str = "[memory]", pid: Any = 1, tid: Any = 1) -> dict[str, Any]:
    """One allocator ``[memory]`` instant event as Kineto writes it (totals are after the event)."""
    return instant(name, ts, pid, tid, {"Total Reserved": reserved, "Total Allocated": total, "Bytes": delta,
                                        "Device Id": dev, "Device Type": dtype, "Addr": 1000 + int(ts)})


def profiler_span(ts: float, dur: float, pid: Any = "Spans") -> dict[str, Any]:
    """The ``PyTorch Profiler (0)`` span over the whole recorded window (its own key order in
    Kineto's output)."""
    return {"ph": "X", "cat": "Trace", "ts": ts, "dur": dur, "pid": pid, "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)", "args": {"Op count": 0}}


def marker(name: str, pid: Any, tid: Any, ts: float) -> dict[str, Any]:
    """A global instant the profiler writes around its window (``Iteration Start: PyTorch Profiler``,
    ``Record Window End``)."""
    return {"name": name, "ph": "i", "s": "g", "pid": pid, "tid": tid, "ts": ts}


def meta(name: str, pid: Any, tid: Any, args: dict[str, Any], ts: float | None = None) -> dict[str, Any]:
    """A metadata (``ph: M``) row: ``process_name``, ``thread_name``, ``*_sort_index`` …"""
    d: dict[str, Any] = {"name": name, "ph": "M"}
    if ts is not None:
        d["ts"] = ts
    d.update({"pid": pid, "tid": tid, "args": args})
    return d


def kineto_doc(events: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    """A minimal modern Kineto document around ``events`` (``top``: other top-level keys)."""
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}
    doc.update(top)
    return doc


def ns(us: float) -> int:
    """µs as the model's ns (``ts_ns == round(ts_us * 1000)`` with ``baseTimeNanoseconds = 0``)."""
    return round(us * 1000)


class Trace:
    """A tiny hand-built timeline for the analysis and rule tests. Times are in µs (ints or floats,
    ns resolution) relative to ``baseTimeNanoseconds = 0``, so in the model
    ``ts_ns == round(ts_us * 1000)`` (:func:`ns`)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._corr = 1000

    def _x(self, cat: str, name: str, ts: float, dur: float, pid: Any = PID, tid: Any = TID, **args: Any) -> None:
        self.events.append(x(cat, name, ts, dur, pid=pid, tid=tid, **args))

    def step(self, n: int, ts: float, dur: float, gpu_copy: bool = True) -> None:
        self._x("user_annotation", f"ProfilerStep#{n}", ts, dur)
        if gpu_copy:  # Kineto's GPU-side projection: must never become a step
            self._x("gpu_user_annotation", f"ProfilerStep#{n}", ts + 1, dur, pid=0, tid=STREAM, device=0,
                    stream=STREAM)

    def op(self, name: str, ts: float, dur: float, tid: int = TID, cat: str = "cpu_op") -> None:
        self._x(cat, name, ts, dur, tid=tid)

    def ann(self, name: str, ts: float, dur: float, tid: int = TID) -> None:
        self._x("user_annotation", name, ts, dur, tid=tid)

    def runtime(self, name: str, ts: float, dur: float, tid: int = TID, cat: str = "cuda_runtime") -> int:
        self._corr += 1
        self.events.append(runtime(name, ts, dur, self._corr, tid=tid, cat=cat))
        return self._corr

    def gpu(self, corr: int | None, ts: float, dur: float, name: str = "k", stream: int = STREAM, device: int = 0,
            activity: str = "kernel", **extra: Any) -> None:
        self.events.append(gpu(GPU_CATS[activity], name, ts, dur, corr, stream=stream, device=device, **extra))

    def launch(self, ts: float, dur: float, k_ts: float, k_dur: float, name: str = "k", stream: int = STREAM,
               api: str = "cudaLaunchKernel", activity: str = "kernel", tid: int = TID, device: int = 0,
               cat: str = "cuda_runtime", **extra: Any) -> int:
        corr = self.runtime(api, ts, dur, tid=tid, cat=cat)
        self.gpu(corr, k_ts, k_dur, name=name, stream=stream, device=device, activity=activity, **extra)
        return corr

    def doc(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "baseTimeNanoseconds": 0, "traceEvents": list(self.events)}

    def model(self) -> TraceModel:
        from traceanalyzer.load.chrome_trace import build_model

        return build_model(Path("x.json"), self.doc())
