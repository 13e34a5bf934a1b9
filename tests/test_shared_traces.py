"""Every real trace in ../shared loads (or fails with the designed one-line error),
and the model's counts match an independent count done here with plain ``json``."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import (
    REFUSED,
    REPRESENTATIVE,
    SHARED,
    SHARED_TRACES,
    needs_shared,
    shared_model,
    shared_params,
    shared_trace_files,
)

from traceanalyzer.errors import InputError
from traceanalyzer.load import load, sniff

KERNEL_CATS = {"kernel", "Kernel"}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver", "xpu_runtime", "xpu_driver", "mtia_runtime",
                "privateuse1_runtime", "privateuse1_driver"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}


def independent_counts(path: Path) -> Counter[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        doc = json.load(f)
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    c: Counter[str] = Counter()
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or e["dur"] < 0:
            continue
        cat = e.get("cat")
        if cat == "mtia_ccp_events":  # MTIA device events: DMA → memcpy, markers/waits → neither
            name = e.get("name")
            if name == "dma_request":
                c["memcpy"] += 1
            elif name not in ("event_record", "event_wait"):
                c["kernels"] += 1
        elif cat in KERNEL_CATS:
            c["kernels"] += 1
        elif cat in RUNTIME_CATS:
            c["runtime"] += 1
        elif cat in MEMCPY_CATS:
            c["memcpy"] += 1
        elif cat in MEMSET_CATS:
            c["memset"] += 1
        elif cat in ("cpu_op", "Operator"):
            c["cpu_ops"] += 1
    for e in events:
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            c["memory_events"] += 1
    return c


FILES = shared_trace_files()


@needs_shared
def test_shared_traces_present() -> None:
    assert len(FILES) >= 40


@needs_shared
def test_representative_inputs_exist() -> None:
    """A renamed file must not leave the default run's sweeps silently smaller."""
    assert [r for r in sorted(REPRESENTATIVE) if not (SHARED / "data" / r).is_file()] == []


@needs_shared
@pytest.mark.parametrize("path", shared_params(FILES))
def test_loads_and_counts_match(path: Path) -> None:
    rel = str(path.relative_to(SHARED_TRACES))
    if rel in REFUSED:
        with pytest.raises(InputError, match=REFUSED[rel]) as info:
            load(path)
        assert "\n" not in str(info.value)
        return
    if sniff(path) != "trace":  # export_memory_timeline output: covered by the memory tests
        pytest.skip("not a chrome trace")
    model = shared_model(path)
    expected = independent_counts(path)
    got = {t: model.table(t).height for t in ("kernels", "runtime", "memcpy", "memset", "cpu_ops", "memory_events")}
    assert got == {t: expected.get(t, 0) for t in got}
    if model.has_gpu:
        assert model.meta.vendor in {"nvidia", "amd", "xpu", "mtia", "unknown"}
    assert model.meta.span_end_ns >= model.meta.span_start_ns
    # Every GPU row has a device and a stream; every time is ns (end = ts + dur).
    for t in ("kernels", "memcpy", "memset"):
        df = model.table(t)
        assert df["device"].null_count() == 0 and df["stream"].null_count() == 0
        assert (df["end_ns"] - df["ts_ns"] - df["dur_ns"]).abs().max() in (None, 0)
