"""export_memory_timeline outputs (.json, .json.gz, .raw.json.gz) as categorised timelines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from traceanalyzer.analyses import run_analyses
from traceanalyzer.errors import InputError
from traceanalyzer.load import load, sniff

SHARED = Path(__file__).resolve().parents[2] / "shared"
PCPU = SHARED / "data" / "profiler_cpu"
needs_shared = pytest.mark.skipif(not PCPU.exists(), reason="../shared not available")


def test_stacked_layout(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    sizes = [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 50, 0, 10, 0, 0, 0, 0], [0, 100, 50, 0, 0, 0, 0, 0, 0]]
    f.write_text(json.dumps([[10, 20, 30], sizes]))
    assert sniff(f) == "memory_timeline"
    m = load(f)
    assert m.kind == "memory_timeline" and m.meta.layout == "stacked"
    assert m.samples["ts_ns"].to_list() == [10_000, 20_000, 30_000]
    r = run_analyses(m, strict=True)["export_timeline"]
    assert r.peak_total_bytes == 160 and r.peak_ts_ns == 20_000
    assert dict(zip(r.at_peak["category"], r.at_peak["bytes"])) == {"parameter": 100, "optimizer_state": 50,
                                                                   "temporary": 10}


def test_raw_layout_gz(tmp_path: Path) -> None:
    f = tmp_path / "t.raw.json.gz"
    rows = [[-1, 1, 100, 0], [5000, 2, 30, 4], [6000, 2, 20, 3], [7000, 4, -20, 3], [8000, 4, -30, 4]]
    f.write_bytes(gzip.compress(json.dumps(rows).encode()))
    m = load(f)
    assert m.meta.layout == "raw" and m.meta.n_preexisting == 1
    r = run_analyses(m, strict=True)["export_timeline"]
    assert r.peak_total_bytes == 150 and r.final_total_bytes == 100


def test_garbage_is_input_error(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text("[[1, 2], [3]]")
    with pytest.raises(InputError):
        load(f)


@needs_shared
@pytest.mark.shared
def test_three_real_exports_agree() -> None:
    peaks = {}
    for name in ("timeline.json", "timeline.json.gz", "timeline.raw.json.gz"):
        m = load(PCPU / name)
        peaks[name] = run_analyses(m, strict=True)["export_timeline"].peak_total_bytes
    # independent: max row sum of the stacked JSON
    times, sizes = json.loads((PCPU / "timeline.json").read_text())
    ref = max(sum(r[1:]) for r in sizes)
    assert set(peaks.values()) == {ref}
