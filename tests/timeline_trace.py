"""Tiny hand-built Kineto traces for the GPU-timeline tests (steps, gpu_time, idle_gaps …).

Times are given in µs (ints or floats, ns resolution) relative to ``baseTimeNanoseconds = 0``,
so in the model ``ts_ns == round(ts_us * 1000)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceanalyzer.load.chrome_trace import build_model
from traceanalyzer.model import TraceModel

PID = 100
TID = 100


class Trace:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._corr = 1000

    def _x(self, cat: str, name: str, ts: float, dur: float, pid: Any = PID, tid: Any = TID, **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
                            "args": args})

    def step(self, n: int, ts: float, dur: float, gpu_copy: bool = True) -> None:
        self._x("user_annotation", f"ProfilerStep#{n}", ts, dur)
        if gpu_copy:  # Kineto's GPU-side projection: must never become a step
            self._x("gpu_user_annotation", f"ProfilerStep#{n}", ts + 1, dur, pid=0, tid=7, device=0, stream=7)

    def op(self, name: str, ts: float, dur: float, tid: int = TID, cat: str = "cpu_op") -> None:
        self._x(cat, name, ts, dur, tid=tid)

    def ann(self, name: str, ts: float, dur: float, tid: int = TID) -> None:
        self._x("user_annotation", name, ts, dur, tid=tid)

    def runtime(self, name: str, ts: float, dur: float, tid: int = TID, cat: str = "cuda_runtime") -> int:
        self._corr += 1
        self._x(cat, name, ts, dur, tid=tid, correlation=self._corr)
        return self._corr

    def gpu(self, corr: int | None, ts: float, dur: float, name: str = "k", stream: int = 7, device: int = 0,
            activity: str = "kernel", **extra: Any) -> None:
        cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[activity]
        args = {"device": device, "stream": stream, **extra}
        if corr is not None:
            args["correlation"] = corr
        self._x(cat, name, ts, dur, pid=device, tid=stream, **args)

    def launch(self, ts: float, dur: float, k_ts: float, k_dur: float, name: str = "k", stream: int = 7,
               api: str = "cudaLaunchKernel", activity: str = "kernel", tid: int = TID, device: int = 0,
               cat: str = "cuda_runtime", **extra: Any) -> int:
        corr = self.runtime(api, ts, dur, tid=tid, cat=cat)
        self.gpu(corr, k_ts, k_dur, name=name, stream=stream, device=device, activity=activity, **extra)
        return corr

    def doc(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "baseTimeNanoseconds": 0, "traceEvents": list(self.events)}

    def model(self) -> TraceModel:
        return build_model(Path("x.json"), self.doc())


def ns(us: float) -> int:
    return round(us * 1000)
