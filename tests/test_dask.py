"""The Dask backend gives the same index as the local one; workers read fsspec URLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("distributed")
fsspec = pytest.importorskip("fsspec")

from support.synthetic import dumps_trace, scenario_multi_rank, write_bytes  # noqa: E402

from traceanalyzer.batch.discover import discover  # noqa: E402
from traceanalyzer.batch.runner import DaskBackend, LocalBackend, run_batch  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dask_runs")
    for r in (0, 1):
        trace, _ = scenario_multi_rank(rank=r, world_size=2, straggler_rank=1, steps=3)
        write_bytes(root / "ddp" / f"rank-{r}.json.gz", dumps_trace(trace))
    (root / "broken.json").write_bytes(b"\x00\x01 not json")
    return root


def _stable(doc: dict[str, Any]) -> dict[str, Any]:
    files = [{k: v for k, v in r.items() if k not in ("seconds",)} for r in doc["files"]]
    totals = {k: v for k, v in doc["totals"].items() if k != "wall_s"}
    return {"files": files, "runs": doc["runs"], "totals": totals, "ignored": doc["ignored"]}


def test_dask_index_equals_local_index(run_dir: Path, tmp_path: Path) -> None:
    found = discover([str(run_dir)])
    local = run_batch(found, tmp_path / "local", LocalBackend(jobs=1))
    dask = run_batch(found, tmp_path / "dask", DaskBackend(jobs=1, processes=False))
    a = orjson.loads((tmp_path / "local" / "index.json").read_bytes())
    b = orjson.loads((tmp_path / "dask" / "index.json").read_bytes())
    assert a["backend"] == "local" and b["backend"] == "dask"
    assert _stable(a) == _stable(b)
    assert (tmp_path / "local" / "index.csv").read_text() .splitlines()[0] == \
        (tmp_path / "dask" / "index.csv").read_text().splitlines()[0]
    # the client wrote the reports the workers returned
    for row in dask.rows:
        assert all((tmp_path / "dask" / p).is_file() for p in row["reports"])
    assert local.n_failed == dask.n_failed == 1
    assert dask.runs[-1]["straggler"] == 1 or any(r["straggler"] == 1 for r in dask.runs)
    # and the cache works the same way on the Dask path
    again = run_batch(found, tmp_path / "dask", DaskBackend(jobs=1, processes=False))
    assert again.n_cached == 3


def test_workers_read_fsspec_urls(run_dir: Path, tmp_path: Path) -> None:
    mem = fsspec.filesystem("memory")
    for p in (run_dir / "ddp").iterdir():
        mem.pipe(f"/ta-test/ddp/{p.name}", p.read_bytes())
    found = discover(["memory://ta-test/"])
    assert sorted(i.rel for i in found.inputs) == ["ddp/rank-0.json.gz", "ddp/rank-1.json.gz"]
    assert {i.run for i in found.inputs} == {"ddp"}
    res = run_batch(found, tmp_path / "out", DaskBackend(jobs=1, processes=False))
    assert res.n_failed == 0 and res.runs[0]["multirank"]["straggler"] == 1
    assert all(r["path"].startswith("memory://") for r in res.rows)
