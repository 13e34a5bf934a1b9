"""The input budget as settings: ``[budget]`` in --config, ``--set budget.KEY=…``, the global
options (which win), ``--max-memory`` (a supervised child process, batch's per-file limit) and
the budget reaching batch workers that do not share this process's environment (Dask)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from traceanalyzer import params
from traceanalyzer.batch.discover import Input
from traceanalyzer.batch.runner import analyse_one, make_tasks
from traceanalyzer.errors import ConfigError
from traceanalyzer.params import apply_budget, budget_environment, budget_settings, split_budget

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_traces" / "resnet_like_a100.json.gz"
BUDGET_ENV = [s.env for s in budget_settings().values()]


@pytest.fixture(autouse=True)
def _clean_budget_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No budget variable leaks in from the caller's environment or out of a test: apply_budget
    writes os.environ itself (what the loaders read), so the whole environment is restored."""
    for env in [*BUDGET_ENV, "TRACEANALYZER_MAX_MEMORY", "TRACEANALYZER_SUPERVISED"]:
        monkeypatch.delenv(env, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    params._FROM_OPTIONS.clear()


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in BUDGET_ENV}
    return subprocess.run([sys.executable, "-m", "traceanalyzer", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_budget_keys_are_split_from_thresholds() -> None:
    budget, rest = split_budget({"budget.max_input_bytes": "1G", "idle_gaps.long_gap_us": 5})
    assert budget == {"max_input_bytes": "1G"} and rest == {"idle_gaps.long_gap_us": 5}


def test_apply_budget_sets_the_loaders_variables() -> None:
    apply_budget({"max_input_bytes": "2K", "snapshot_max_depth": 12, "max_gzip_ratio": 50}, "test")
    assert os.environ["TRACEANALYZER_MAX_INPUT_BYTES"] == "2048"
    assert os.environ["TRACEANALYZER_SNAPSHOT_MAX_DEPTH"] == "12"
    assert float(os.environ["TRACEANALYZER_MAX_GZIP_RATIO"]) == 50.0
    assert budget_environment()["TRACEANALYZER_MAX_INPUT_BYTES"] == "2048"


@pytest.mark.parametrize("values, expected", [
    ({"max_nothing": 1}, "the input budget has no limit 'max_nothing'"),
    ({"max_input_bytes": "12Q"}, "expected a size such as 40G"),
    ({"max_gzip_ratio": "nan"}, "expected a number such as 500, above zero"),
    ({"snapshot_max_objects": -3}, "expected a positive whole number"),
    ({"snapshot_max_objects": 1.5}, "expected a positive whole number"),
    ({"snapshot_max_depth": True}, "expected a number or a size"),
])
def test_a_bad_budget_value_is_one_line_and_sets_nothing(values: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_budget({"max_input_bytes": "1G", **values}, "cfg.toml")
    assert str(err.value).startswith("cfg.toml: ") and expected in str(err.value)
    assert "TRACEANALYZER_MAX_INPUT_BYTES" not in os.environ  # checked whole before anything is set


def test_config_budget_table_refuses_and_the_global_option_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "budget.toml"
    cfg.write_text('[budget]\nmax_input_bytes = "1K"\n\n[idle_gaps]\nlong_gap_us = 100\n')
    refused = _run("analyze", str(SAMPLE), "-o", str(tmp_path / "a"), "--format", "json", "--config", str(cfg),
                   cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "input size limit of 1.0 KiB" in refused.stderr
    read = _run("--max-input-size", "1G", "analyze", str(SAMPLE), "-o", str(tmp_path / "b"), "--format", "json",
                "--config", str(cfg), cwd=tmp_path)
    assert read.returncode == 0, read.stderr
    assert (tmp_path / "b" / "summary.json").exists()


def test_set_budget_bad_key_is_a_usage_error(tmp_path: Path) -> None:
    proc = _run("analyze", str(SAMPLE), "-o", str(tmp_path / "o"), "--set", "budget.max_foo=3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --set budget.max_foo=3: the input budget has no limit 'max_foo'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_max_memory_stops_the_run_with_one_line(tmp_path: Path) -> None:
    """Past --max-memory the supervised child is stopped: exit 2, one line naming the command, its
    input and the limit; nothing of a traceback. (40 MiB is below what the interpreter and polars
    take to start, so any input trips it.)"""
    proc = _run("--max-memory", "40M", "analyze", str(SAMPLE), "-o", str(tmp_path / "o"), "--format", "json",
                cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: analyze {SAMPLE}: ") and "the memory limit of 40 MiB (--max-memory)" in last
    assert "Traceback" not in proc.stderr


def test_max_memory_with_room_gives_the_same_report(tmp_path: Path) -> None:
    plain = _run("analyze", str(SAMPLE), "-o", str(tmp_path / "a"), "--format", "json", cwd=tmp_path)
    capped = _run("--max-memory", "4G", "analyze", str(SAMPLE), "-o", str(tmp_path / "b"), "--format", "json",
                  cwd=tmp_path)
    assert plain.returncode == capped.returncode == 0, capped.stderr
    a = (tmp_path / "a" / "summary.json").read_text()
    b = (tmp_path / "b" / "summary.json").read_text()
    strip = [line for line in a.splitlines() if "generated" not in line and "seconds" not in line]
    assert strip == [line for line in b.splitlines() if "generated" not in line and "seconds" not in line]


def test_max_memory_bad_value(tmp_path: Path) -> None:
    proc = _run("--max-memory", "lots", "analyze", str(SAMPLE), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --max-memory 'lots': expected a size such as 40G, 512M or 1000000"


def test_max_memory_is_batch_per_file_limit(tmp_path: Path) -> None:
    """In batch, --max-memory is each file's limit: the file fails with the reason, the batch
    goes on and exits 1."""
    proc = _run("--max-memory", "40M", "batch", str(SAMPLE), "-o", str(tmp_path / "out"), "-j", "1",
                "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "memory" in proc.stderr and "Traceback" not in proc.stderr


def test_budget_travels_with_batch_tasks(tmp_path: Path) -> None:
    """A task carries the client's budget (a Dask worker on another machine has its own
    environment) and the worker applies it: a limit lowered on the client refuses the file."""
    apply_budget({"max_input_bytes": "1K"}, "test")
    task = make_tasks([Input(path=str(SAMPLE), rel=SAMPLE.name, run="r", kind="trace", rank=None, world_size=None,
                             size=SAMPLE.stat().st_size)], {}, "fp", {}, ["json"], None)[0]
    assert task["budget_env"] == {"TRACEANALYZER_MAX_INPUT_BYTES": "1024"}
    # The worker's own environment lacks it. (Not monkeypatch.delenv: its undo would put the
    # lowered limit back after this test, into every later test of the process.)
    del os.environ["TRACEANALYZER_MAX_INPUT_BYTES"]
    answer = analyse_one(task)
    assert answer["row"]["status"] == "error" and "input size limit of 1.0 KiB" in answer["row"]["error"]


def test_every_limit_of_the_loaders_is_a_setting() -> None:
    """One registry: every limit the loaders read (load.budget.LIMITS) can be set by name."""
    from traceanalyzer.load.budget import LIMITS

    settings = budget_settings()
    assert {s.env for s in settings.values()} == {limit.env for limit in LIMITS}
    assert {"max_events", "max_string_bytes", "max_depth", "snapshot_max_objects"} <= set(settings)


def test_depth_past_the_decoders_ceiling_is_refused_as_a_setting() -> None:
    with pytest.raises(ConfigError) as err:
        apply_budget({"max_depth": 5000}, "--set budget.max_depth=5000")
    assert str(err.value).startswith("--set budget.max_depth=5000: ") and "at most 1,000" in str(err.value)
    assert "TRACEANALYZER_MAX_DEPTH" not in os.environ


def test_limit_option_and_config_table_reach_the_trace_loader(tmp_path: Path) -> None:
    """--limit max_events=N refuses a trace of more events, with one line naming the option; the
    same limit from a [budget] table does too; a bad --limit is a usage error."""
    by_option = _run("--limit", "max_events=50", "analyze", str(SAMPLE), "-o", str(tmp_path / "a"), "--format",
                     "json", cwd=tmp_path)
    assert by_option.returncode == 2, by_option.stderr
    assert "more than 50 events" in by_option.stderr and "--limit max_events=" in by_option.stderr
    assert len(by_option.stderr.strip().splitlines()) == 1
    cfg = tmp_path / "b.toml"
    cfg.write_text("[budget]\nmax_events = 50\n")
    by_file = _run("analyze", str(SAMPLE), "-o", str(tmp_path / "b"), "--format", "json", "--config", str(cfg),
                   cwd=tmp_path)
    assert by_file.returncode == 2 and "more than 50 events" in by_file.stderr
    for bad, expected in (("max_events", "expected NAME=N"), ("max_foo=3", "the input budget has no limit"),
                          ("max_events=-1", "expected a positive whole number")):
        proc = _run("--limit", bad, "analyze", str(SAMPLE), cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: --limit '{bad}': "), proc.stderr
        assert expected in proc.stderr


def test_zz_no_budget_variable_left_behind() -> None:
    """Runs after the others of this file in the same process: nothing they set is left."""
    assert not [env for env in BUDGET_ENV if env in os.environ]
