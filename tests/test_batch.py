"""Batch mode: discovery by content, run grouping, bad files, index, cache, interruption."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, fail_writes, needs_shared
from support.synthetic import dumps_trace, scenario_idle_gaps, scenario_multi_rank, write_bytes

from traceanalyzer.batch.cache import content_hash
from traceanalyzer.batch.discover import discover
from traceanalyzer.batch.runner import LocalBackend, run_batch
from traceanalyzer.cli import cli

BAD = {
    "bad/empty.json": b"",
    "bad/garbage.json": b"this is not a trace at all",
    "bad/corrupt.json.gz": b"\x1f\x8b\x08\x00" + bytes(range(7, 200)),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/ddp/rank-{0,1}.json.gz (a straggler pair), runs/single.json, 3 bad files,
    a truth-like JSON that is not a trace, and a file name that needs HTML escaping."""
    root = tmp_path_factory.mktemp("runs")
    for r in (0, 1):
        trace, _ = scenario_multi_rank(rank=r, world_size=2, straggler_rank=1, steps=3)
        write_bytes(root / "ddp" / f"rank-{r}.json.gz", dumps_trace(trace))
    trace, _ = scenario_idle_gaps(steps=3)
    write_bytes(root / "single.json", dumps_trace(trace))
    write_bytes(root / "odd" / "x<b>&y.json", dumps_trace(trace))
    for rel, data in BAD.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "single.truth.json").write_bytes(orjson.dumps({"planted": {"x": 1}}))
    (root / "notes.txt").write_text("ignored by name")
    return root


def _index(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((out / "index.json").read_bytes())
    return doc


def test_discover_by_content_and_group_runs(tree: Path) -> None:
    # GIVEN a directory of traces, bad files and a non-trace JSON
    # WHEN it is searched
    d = discover([str(tree)])
    # THEN every trace-named file is an input, the truth JSON is ignored with a reason
    rels = sorted(i.rel for i in d.inputs)
    assert rels == sorted(["ddp/rank-0.json.gz", "ddp/rank-1.json.gz", "single.json", "odd/x<b>&y.json", *BAD])
    assert [Path(p).name for p, _ in d.ignored] == ["single.truth.json"]
    assert "not a profiler trace" in d.ignored[0][1]
    # AND the two ranks (distributedInfo) form one run named after their directory
    runs = {i.rel: i.run for i in d.inputs}
    assert runs["ddp/rank-0.json.gz"] == runs["ddp/rank-1.json.gz"] == "ddp"
    assert {i.rank for i in d.inputs if i.run == "ddp"} == {0, 1}
    assert runs["single.json"] == "single.json"


def test_batch_cli_index_complete_errors_listed_exit_1(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["batch", str(tree), "-o", str(out), "--jobs", "1"])
    # exit code 1: some files failed, but the batch went on
    assert res.exit_code == 1, res.output
    idx = _index(out)
    files = {r["file"]: r for r in idx["files"]}
    assert len(files) == 7 and idx["totals"]["failed"] == 3
    for rel in BAD:
        assert files[rel]["status"] == "error" and files[rel]["error"], rel
        assert rel in res.output  # failures are named on the terminal too
    assert "empty" in files["bad/empty.json"]["error"]
    ok = [r for r in idx["files"] if r["status"] == "ok"]
    assert len(ok) == 4
    for r in ok:  # per-file reports exist and the numbers come through
        assert r["reports"] and all((out / p).is_file() for p in r["reports"])
        assert r["metrics"]["step_ms"] > 0 and 0 < r["metrics"]["gpu_busy_pct"] <= 100
    # one CSV row per file and per run
    with open(out / "index.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 7
    with open(out / "runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    ddp = next(r for r in runs if r["run"] == "ddp")
    assert ddp["n_files"] == "2" and ddp["straggler"] == "1" and "straggler" in ddp["top_finding"]
    # HTML: self-contained, names escaped
    page = (out / "index.html").read_text()
    assert "x&lt;b&gt;&amp;y.json" in page and "x<b>&y.json" not in page
    assert "<script" not in page and "http" not in page.split("</head>")[1]


def test_rerun_uses_cache_and_redoes_changed_files(tree: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in ("single.json", "bad/empty.json"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((tree / rel).read_bytes())
    out = tmp_path / "out"
    first = run_batch(discover([str(src)]), out, LocalBackend(jobs=1))
    assert first.n_cached == 0 and first.n_failed == 1
    report = out / first.rows[0]["reports"][0] if first.rows[0]["reports"] else None
    # an unchanged re-run analyses nothing (bad files included: their error is cached)
    again = run_batch(discover([str(src)]), out, LocalBackend(jobs=1))
    assert again.n_cached == 2 and again.n_failed == 1
    assert [r["metrics"] for r in again.rows] == [r["metrics"] for r in first.rows]
    # a changed file is redone; a deleted report forces a redo too
    (src / "bad/empty.json").write_bytes((tree / "single.json").read_bytes())
    third = run_batch(discover([str(src)]), out, LocalBackend(jobs=1))
    by = {r["file"]: r for r in third.rows}
    assert by["single.json"]["cached"] and not by["bad/empty.json"]["cached"]
    assert third.n_failed == 0
    if report is not None:
        report.unlink()
        fourth = run_batch(discover([str(src)]), out, LocalBackend(jobs=1))
        assert {r["file"]: r["cached"] for r in fourth.rows}[first.rows[0]["file"]] is False
    # different settings → different cache key
    fifth = run_batch(discover([str(src)]), out, LocalBackend(jobs=1), overrides={"idle_gaps.long_gap_us": 123})
    assert fifth.n_cached == 0


def test_interrupted_batch_keeps_finished_work(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    d = discover([str(tree / "ddp"), str(tree / "single.json")])
    seen: list[str] = []

    def stop_after_first(row: dict[str, Any]) -> None:
        seen.append(row["file"])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_batch(d, out, LocalBackend(jobs=1), on_result=stop_after_first)
    idx = _index(out)
    assert idx["interrupted"] is True and idx["totals"]["expected"] == 3
    assert [r["file"] for r in idx["files"]] == seen
    assert all((out / p).is_file() for p in idx["files"][0]["reports"])
    assert not [p for p in out.rglob("*.tmp")]  # no half-written files
    resumed = run_batch(d, out, LocalBackend(jobs=1))
    assert resumed.n_cached == 1 and len(resumed.rows) == 3 and not resumed.interrupted


def test_process_pool_matches_in_process(tree: Path, tmp_path: Path) -> None:
    d = discover([str(tree / "single.json"), str(tree / "bad")])
    a = run_batch(d, tmp_path / "a", LocalBackend(jobs=1), use_cache=False)
    b = run_batch(d, tmp_path / "b", LocalBackend(jobs=2), use_cache=False)
    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(a.rows) == strip(b.rows)
    assert a.runs == b.runs and b.n_failed == 3


def test_no_inputs_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("nothing")
    res = CliRunner().invoke(cli, ["batch", str(tmp_path), "-o", str(tmp_path / "o")])
    assert res.exit_code != 0 and "no traces or snapshots found" in str(res.exception)


def test_content_hash_streams(tmp_path: Path) -> None:
    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(3 << 20))
    import hashlib

    assert content_hash(str(p)) == hashlib.blake2b(p.read_bytes(), digest_size=32).hexdigest()


@needs_shared
def test_hta_two_rank_pair_multirank(tmp_path: Path) -> None:
    res = run_batch(discover([str(SHARED_TRACES / "hta" / "trace_filter")]), tmp_path, LocalBackend(jobs=1))
    assert res.n_failed == 0
    (run,) = res.runs
    mr = run["multirank"]
    assert run["n_files"] == 2 and mr["n_ranks"] == 2 and mr["world_size"] == 128
    ranks = {e["rank"]: e for e in mr["ranks"]}
    assert set(ranks) == {0, 1}
    for e in ranks.values():
        assert e["step_ms"] > 100 and e["comm_ms"] > 0 and e["exposed_comm_ms"] > 0
        assert 0 <= e["overlap_pct"] <= 100
    assert mr["straggler"] == 1 and mr["imbalance_pct"] == pytest.approx(3.383)


# --- Hostile and degenerate batches (issue 19) -----------------------------------------------------------------------


def _copies(tree: Path, dest: Path, rels: list[str]) -> Path:
    for rel in rels:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((tree / "single.json").read_bytes())
    return dest


def test_report_folders_never_collide(tree: Path, tmp_path: Path) -> None:
    from traceanalyzer.batch.cache import report_folders

    rels = ["a/b.json", "a__b.json", "x y.json", "x_y.json", "Solo.json", "solo.JSON"]
    folders = report_folders(rels)
    assert len(set(f.lower() for f in folders.values())) == len(rels)
    assert folders == report_folders(list(reversed(rels)))  # deterministic, order-free
    src = _copies(tree, tmp_path / "src", ["a/b.json", "a__b.json", "x y.json", "x_y.json"])
    out = tmp_path / "out"
    res = run_batch(discover([str(src)]), out, LocalBackend(jobs=1, in_process=True), formats=["json"])
    assert res.n_failed == 0
    summaries = [r["reports"][0] for r in res.rows]
    assert len(set(summaries)) == 4
    for r in res.rows:  # each report names its own input
        doc = orjson.loads((out / r["reports"][0]).read_bytes())
        assert doc["source"].endswith("/src/" + r["file"])
    again = run_batch(discover([str(src)]), out, LocalBackend(jobs=1, in_process=True), formats=["json"])
    assert again.n_cached == 4 and [r["reports"] for r in again.rows] == [r["reports"] for r in res.rows]


def test_gzipped_pickles_are_discovered_as_snapshots(tmp_path: Path) -> None:
    import gzip

    data = (Path(__file__).parent / "data" / "snapshot_2.13_oom_small.pickle").read_bytes()
    (tmp_path / "snap.pickle.gz").write_bytes(gzip.compress(data))
    (tmp_path / "snap2.pkl.gz").write_bytes(gzip.compress(data))
    d = discover([str(tmp_path)])
    assert sorted((i.rel, i.kind) for i in d.inputs) == [("snap.pickle.gz", "snapshot"), ("snap2.pkl.gz", "snapshot")]


def test_second_batch_on_same_outdir_refuses_and_stale_lock_is_taken_over(tree: Path, tmp_path: Path) -> None:
    from traceanalyzer.batch.lock import BatchLock

    out = tmp_path / "out"
    out.mkdir()
    with BatchLock(out):
        res = CliRunner().invoke(cli, ["batch", str(tree / "single.json"), "-o", str(out), "--in-process"])
        assert res.exit_code != 0 and "another batch is writing into this output directory" in str(res.exception)
        assert f"pid {os.getpid()}" in str(res.exception)
        assert not (out / "index.json").exists()
    # a lock file left by a process that is gone holds no OS lock: the next batch takes it over
    (out / ".lock").write_text("pid 999999 on elsewhere, since yesterday\n")
    res = CliRunner().invoke(cli, ["batch", str(tree / "single.json"), "-o", str(out), "--in-process", "-q"])
    assert res.exit_code == 0, res.output
    assert _index(out)["totals"]["files"] == 1


def test_index_is_rewritten_as_files_finish(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.batch import runner

    monkeypatch.setattr(runner, "INDEX_MIN_INTERVAL_S", 0.0)
    src = _copies(tree, tmp_path / "src", [f"f{i}.json" for i in range(3)])
    out = tmp_path / "out"
    states: list[tuple[int, bool]] = []

    def look(row: dict[str, Any]) -> None:
        if (out / "index.json").exists():
            idx = _index(out)
            states.append((idx["totals"]["files"], idx["in_progress"]))

    run_batch(discover([str(src)]), out, LocalBackend(jobs=1, in_process=True), formats=["json"], on_result=look)
    # when the n-th result arrives the index on disk holds the n-1 before it, flagged in progress
    assert states == [(1, True), (2, True)]
    final = _index(out)
    assert final["totals"]["files"] == 3 and final["in_progress"] is False and final["interrupted"] is False


def test_per_file_time_and_memory_limits_fail_the_file_not_the_batch(tree: Path, tmp_path: Path) -> None:
    from traceanalyzer.batch.runner import Limits

    d = discover([str(tree / "single.json"), str(tree / "ddp")])
    slow = run_batch(d, tmp_path / "t", LocalBackend(jobs=2, limits=Limits(timeout_s=0.01)), use_cache=False)
    assert len(slow.rows) == 3 and slow.n_failed == 3
    assert all("per-file time limit of 0.01 s" in r["error"] for r in slow.rows)
    big = run_batch(d, tmp_path / "m", LocalBackend(jobs=1, limits=Limits(memory_bytes=1 << 20, timeout_s=None)),
                    use_cache=False)
    assert len(big.rows) == 3 and big.n_failed == 3
    assert all("per-file memory limit" in r["error"] and "resident" in r["error"] for r in big.rows)
    # failures of a limit are not cached: a re-run with a larger budget redoes them
    ok = run_batch(d, tmp_path / "t", LocalBackend(jobs=2))
    assert ok.n_failed == 0 and ok.n_cached == 0


def test_address_space_limit_fails_the_file_with_a_reason(tree: Path, tmp_path: Path) -> None:
    from traceanalyzer.batch.runner import Limits

    d = discover([str(tree / "single.json")])
    res = run_batch(d, tmp_path / "o", LocalBackend(jobs=1, limits=Limits(address_space_bytes=300 << 20,
                                                                           timeout_s=120)), use_cache=False)
    (row,) = res.rows
    # MemoryError in Python (or an abort in native code) → the file fails with the reason, the batch returns
    assert row["status"] == "error", row
    assert "out of memory" in row["error"] or "worker process died" in row["error"], row["error"]


def test_sigint_keeps_finished_files_writes_index_and_says_how_to_resume(tree: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    # 6 files: the interrupt lands after the first one finishes, with at most the two in flight
    # finishing after it, so some are always left for the resume (12 only made the resume longer).
    src = _copies(tree, tmp_path / "src", [f"f{i:02d}.json" for i in range(6)])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "traceanalyzer", "batch", str(src), "-o", str(out), "-j", "2",
                             "--format", "json,md"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "index.json").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the batch and its workers
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr and "Traceback" not in stderr
    idx = _index(out)
    assert idx["interrupted"] is True and idx["in_progress"] is False and 1 <= idx["totals"]["files"] < 6
    for r in idx["files"]:  # every finished file is complete: both formats, nothing half-built
        assert sorted(Path(p).name for p in r["reports"]) == ["report.md", "summary.json"]
        assert all((out / p).is_file() for p in r["reports"])
    assert not list((out / "reports").glob(".*")) and not list(out.rglob("*.tmp"))
    resumed = run_batch(discover([str(src)]), out, LocalBackend(jobs=2), formats=["json", "md"])
    assert resumed.n_cached == idx["totals"]["files"] and len(resumed.rows) == 6


def test_unsupported_compression_is_listed_as_ignored_not_skipped_silently(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "a.pt.trace.json.zst").write_bytes(b"(\\xb5/\\xfd junk")
    (tmp_path / "snap.pickle.bz2").write_bytes(b"BZh9 junk")
    (tmp_path / "ok.json").write_bytes((tree / "single.json").read_bytes())
    d = discover([str(tmp_path)])
    assert [i.rel for i in d.inputs] == ["ok.json"]
    why = {Path(p).name: r for p, r in d.ignored}
    assert set(why) == {"a.pt.trace.json.zst", "snap.pickle.bz2"}
    assert "compressed with .zst" in why["a.pt.trace.json.zst"] and "gzip" in why["snap.pickle.bz2"]


def test_client_written_reports_path_is_whole_and_collision_free(tree: Path, tmp_path: Path) -> None:
    """The Dask path (workers return the report bytes, the client writes them) on a fake backend."""
    from traceanalyzer.batch.runner import analyse_one

    class ReturnsBytes:
        name = "fake"
        writes_reports = False

        def run(self, tasks: list[dict[str, Any]], stop: Any = None) -> Any:
            for t in tasks:
                assert t["outdir"] is None
                yield analyse_one(t)

    src = _copies(tree, tmp_path / "src", ["a/b.json", "a__b.json"])
    out = tmp_path / "out"
    res = run_batch(discover([str(src)]), out, ReturnsBytes(), formats=["json", "md"])
    assert res.n_failed == 0
    reports = [p for r in res.rows for p in r["reports"]]
    assert len(reports) == 4 and len(set(reports)) == 4 and all((out / p).is_file() for p in reports)
    for r in res.rows:
        doc = orjson.loads((out / next(p for p in r["reports"] if p.endswith(".json"))).read_bytes())
        assert doc["source"].endswith("/src/" + r["file"])
    assert not list((out / "reports").glob(".*"))


def test_full_disk_stops_the_batch_with_one_line_exit_2(tree: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    src = _copies(tree, tmp_path / "src", ["a.json", "b.json", "c.json"])
    out = tmp_path / "out"
    # the first file's json, md and cache entry fit; then the disk is full
    calls = fail_writes(monkeypatch, errno.ENOSPC, after=3)
    res = CliRunner().invoke(cli, ["batch", str(src), "-o", str(out), "--in-process", "-q"])
    from traceanalyzer.errors import OutputError

    assert isinstance(res.exception, OutputError)  # the CLI's exit 2 with one line
    assert "cannot write (No space left on device)" in str(res.exception)
    assert calls["n"] == 4  # it stopped at the first refused write, not one failure per file
    assert not list(out.rglob("*.tmp")) and not list((out / "reports").glob(".*"))


def test_fifo_in_a_batch_directory_is_ignored_with_its_reason_not_waited_on(tmp_path: Path) -> None:
    """A FIFO is never opened (it would block until a writer comes): discovery lists it as
    ignored with the reason, and the regular trace beside it is analysed."""
    import os

    from traceanalyzer.batch.discover import discover

    d = tmp_path / "runs"
    d.mkdir()
    os.mkfifo(d / "rank0.json")
    (d / "rank1.json").write_bytes(
        (Path(__file__).resolve().parents[1] / "sample_traces" / "legacy_pt18.json").read_bytes()
    )
    found = discover([str(d)])
    assert [os.path.basename(i.path) for i in found.inputs] == ["rank1.json"]
    assert len(found.ignored) == 1 and "regular file" in found.ignored[0][1]
