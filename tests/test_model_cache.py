"""The model cache (traceanalyzer.store.cache), ``cache info|clear`` and ``export``.

Functional only (no timings): a hit gives a byte-identical summary.json and the same load
warnings without calling the loader; a changed file, another loader version or another input
budget misses; a damaged entry is ignored and rebuilt; the cap evicts the least recently used
entry; --no-cache bypasses; ``cache clear`` empties; ``export`` writes the documented Parquet.
Every test uses its own cache directory (the session one, tests/conftest.py, is off).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, needs_shared

import traceanalyzer.load as load_pkg
from traceanalyzer.cli import cli
from traceanalyzer.load.cache_version import LOADER_VERSION
from traceanalyzer.model import SCHEMAS, TraceModel
from traceanalyzer.pipeline import build_report, load, write_outputs
from traceanalyzer.store import cache as cache_mod
from traceanalyzer.store.cache import ENTRY_FILE, ModelCache

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "resnet_like_a100.json.gz"
LEGACY = REPO / "sample_traces" / "legacy_pt18.json"
REAL = SHARED_TRACES / "hta" / "trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache on, in a directory of this test's own."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRACEANALYZER_CACHE_DIR", str(root))
    monkeypatch.delenv("TRACEANALYZER_NO_CACHE", raising=False)
    return root


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Counts the loader's calls (what a hit must not make)."""
    calls: list[Path] = []
    real = load_pkg.load

    def counting(path: Any, kind: str | None = None) -> Any:
        calls.append(Path(path))
        return real(path, kind)

    monkeypatch.setattr(cache_mod, "load_file", counting)
    return calls


def _entries(root: Path) -> list[str]:
    models = root / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.startswith(".")) if models.exists() else []


def _trace(path: Path) -> TraceModel:
    model = load(path)
    assert isinstance(model, TraceModel)
    return model


def _summary(path: Path, out: Path) -> bytes:
    write_outputs(build_report(load(path), source=str(path)), out, ["json"])
    return (out / "summary.json").read_bytes()


def _hit_is_identical(path: Path, tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    first = _summary(path, tmp_path / "first")
    assert len(loads) == 1 and len(_entries(cache_dir)) == 1
    second = _summary(path, tmp_path / "second")
    assert len(loads) == 1, "the second load parsed the file instead of reading the cache"
    assert second == first


def test_hit_gives_identical_summary(tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    _hit_is_identical(SAMPLE, tmp_path, cache_dir, loads)


@needs_shared
@pytest.mark.shared
def test_hit_gives_identical_summary_real_trace(tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    _hit_is_identical(REAL, tmp_path, cache_dir, loads)


def test_hit_keeps_warnings_and_names_the_path_read(tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    data = LEGACY.read_bytes()
    cut = tmp_path / "a" / "truncated.json"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) * 2 // 3])  # truncated: the loader recovers with a warning
    parsed = load(cut)
    assert parsed.warnings, "the truncated file should load with a warning"
    copy = tmp_path / "b" / "same_bytes.json"
    copy.parent.mkdir()
    shutil.copy(cut, copy)
    hit = load(copy)
    assert len(loads) == 1
    assert hit.warnings == parsed.warnings
    assert hit.meta.path == str(copy) and parsed.meta.path == str(cut)
    for name in SCHEMAS:
        assert hit.table(name).equals(parsed.table(name)), name
    res = CliRunner().invoke(cli, ["analyze", str(copy), "-o", str(tmp_path / "out"), "-f", "json"])
    assert res.exit_code == 0, res.output
    assert len(loads) == 1
    assert orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["warnings"] == list(parsed.warnings)


def test_changed_file_misses(tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    path = tmp_path / "t.json"
    data = bytearray(LEGACY.read_bytes())
    path.write_bytes(data)
    first = _trace(path)
    i = data.index(b'"dur":14052') + len(b'"dur":')
    data[i] = ord("9")  # same size, the first step's duration changed
    path.write_bytes(data)
    second = _trace(path)
    assert len(loads) == 2 and len(_entries(cache_dir)) == 2
    assert first.steps["dur_ns"][0] == 14_052_000 and second.steps["dur_ns"][0] == 94_052_000


def test_loader_version_bump_misses(cache_dir: Path, loads: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    load(SAMPLE)
    load(SAMPLE)
    assert len(loads) == 1
    monkeypatch.setattr(cache_mod, "LOADER_VERSION", LOADER_VERSION + 1)
    load(SAMPLE)
    assert len(loads) == 2 and len(_entries(cache_dir)) == 2


def test_budget_change_misses(cache_dir: Path, loads: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    load(SAMPLE)
    monkeypatch.setenv("TRACEANALYZER_MAX_INPUT_BYTES", "1G")
    load(SAMPLE)
    assert len(loads) == 2


@pytest.mark.parametrize("damage", ["truncated_table", "flipped_bit", "garbage_entry_json", "missing_table",
                                    "edited_rows"])
def test_damaged_entry_is_ignored_and_rebuilt(tmp_path: Path, cache_dir: Path, loads: list[Path],
                                              damage: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    first = _summary(SAMPLE, tmp_path / "first")
    (key,) = _entries(cache_dir)
    entry = cache_dir / "models" / key
    kernels = entry / "kernels.arrow"
    if damage == "truncated_table":
        kernels.write_bytes(kernels.read_bytes()[: kernels.stat().st_size // 2])
    elif damage == "flipped_bit":  # a value changed on disk: the digest catches what the IPC reader would not
        data = bytearray(kernels.read_bytes())
        data[len(data) // 2] ^= 0x10
        kernels.write_bytes(bytes(data))
    elif damage == "garbage_entry_json":
        (entry / ENTRY_FILE).write_bytes(b"{not json")
    elif damage == "missing_table":
        kernels.unlink()
    else:
        doc = orjson.loads((entry / ENTRY_FILE).read_bytes())
        doc["tables"]["kernels"]["rows"] += 1
        (entry / ENTRY_FILE).write_bytes(orjson.dumps(doc))
    monkeypatch.setenv("TRACEANALYZER_VERBOSE", "1")
    second = _summary(SAMPLE, tmp_path / "second")
    assert second == first
    assert len(loads) == 2, "a damaged entry must be loaded from the file again"
    assert "ignoring damaged entry" in capsys.readouterr().err
    assert _entries(cache_dir) == [key]  # rebuilt under the same key, whole again
    assert ModelCache(cache_dir).get(key) is not None
    third = _summary(SAMPLE, tmp_path / "third")
    assert third == first and len(loads) == 2


def test_damaged_entry_is_silent_without_verbose(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load(SAMPLE)
    (key,) = _entries(cache_dir)
    (cache_dir / "models" / key / ENTRY_FILE).write_bytes(b"")
    capsys.readouterr()
    load(SAMPLE)
    assert capsys.readouterr().err == ""


def test_cap_evicts_least_recently_used(tmp_path: Path, cache_dir: Path) -> None:
    files = []
    for i in range(3):
        p = tmp_path / f"t{i}.json.gz"
        shutil.copy(SAMPLE, p)
        with p.open("ab") as f:
            f.write(b"\0" * (i + 1))  # distinct bytes; trailing garbage after the gzip member
        files.append(p)
    big = ModelCache(cache_dir, max_bytes=1 << 40)
    keys = []
    for i, p in enumerate(files):
        model = load(p)
        parts = cache_mod.key_parts(p, "trace")
        keys.append(cache_mod.key_of(parts))
        assert big.put(keys[-1], parts, model, source=str(p))
        os.utime(cache_dir / "models" / keys[-1] / ENTRY_FILE, (1000.0 + i, 1000.0 + i))
    # A hit makes t0 the most recently used: t1 is now the oldest.
    assert big.get(keys[0]) is not None
    sizes = {e.key: e.bytes for e in big.entries()}
    assert [e.key for e in big.entries()] == [keys[1], keys[2], keys[0]]
    capped = ModelCache(cache_dir, max_bytes=sizes[keys[0]] + sizes[keys[2]])
    removed = capped.evict()
    assert [e.key for e in removed] == [keys[1]]
    assert set(_entries(cache_dir)) == {keys[0], keys[2]}


def test_model_over_the_cap_is_not_stored(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEANALYZER_CACHE_MAX", "1K")
    load(SAMPLE)
    assert _entries(cache_dir) == []


def test_no_cache_bypasses(tmp_path: Path, cache_dir: Path, loads: list[Path],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "out")
    res = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", out, "-f", "json", "-q", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert _entries(cache_dir) == []
    res = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", out, "-f", "json", "-q"])
    assert res.exit_code == 0, res.output
    assert len(_entries(cache_dir)) == 1 and len(loads) == 2
    # A stored entry is not read either.
    res = CliRunner().invoke(cli, ["analyze", str(SAMPLE), "-o", out, "-f", "json", "-q", "--no-cache"])
    assert res.exit_code == 0 and len(loads) == 3
    monkeypatch.setenv("TRACEANALYZER_NO_CACHE", "1")
    load(SAMPLE)
    assert len(loads) == 4


def test_unwritable_cache_never_fails_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TRACEANALYZER_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("TRACEANALYZER_NO_CACHE", raising=False)
    assert _trace(SAMPLE).kernels.height > 0


def test_cache_info_and_clear(tmp_path: Path, cache_dir: Path) -> None:
    load(SAMPLE)
    load(LEGACY)
    (cache_dir / "models" / ".tmp-crashed-writer").mkdir()
    res = CliRunner().invoke(cli, ["cache", "info"])
    assert res.exit_code == 0, res.output
    assert str(cache_dir) in res.output and "2 entries" in res.output and "of a 5.00 GiB cap" in res.output
    assert str(SAMPLE) in res.output
    res = CliRunner().invoke(cli, ["cache", "clear"])
    assert res.exit_code == 0, res.output
    assert re.search(r"removed 2 entries \([0-9.]+ [KM]iB\)", res.output)
    assert list((cache_dir / "models").iterdir()) == []
    res = CliRunner().invoke(cli, ["cache", "info"])
    assert "0 entries" in res.output


def test_export_writes_documented_parquet(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "tables"
    res = CliRunner().invoke(cli, ["export", str(SAMPLE), "-o", str(out)])
    assert res.exit_code == 0, res.output
    model = _trace(SAMPLE)
    doc = orjson.loads((out / "meta.json").read_bytes())
    assert doc["kind"] == "trace" and doc["meta"] == model.meta.to_json()
    assert set(doc["tables"]) == set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        df = pl.read_parquet(out / f"{name}.parquet")
        assert df.schema == pl.Schema(schema), name
        assert df.equals(model.table(name)), name
        assert doc["tables"][name]["rows"] == df.height
    assert pl.read_parquet(out / "kernels.parquet")["dur_ns"].sum() == model.kernels["dur_ns"].sum() > 0


def test_export_docs_list_every_column() -> None:
    """docs/export.md documents each table and column of the trace model (SCHEMAS)."""
    text = (REPO / "docs" / "export.md").read_text()
    for name, schema in SCHEMAS.items():
        section = re.search(rf"^### `{name}`\n(.*?)(?=^### |\Z)", text, re.M | re.S)
        assert section, f"docs/export.md has no section for {name}"
        for col, dtype in schema.items():
            assert f"| `{col}` | {dtype} |" in section.group(1), f"{name}.{col} ({dtype}) undocumented"


def test_bad_input_is_still_one_line(tmp_path: Path, cache_dir: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"hello")
    res = CliRunner().invoke(cli, ["export", str(bad), "-o", str(tmp_path / "o")])
    assert res.exit_code != 0 and _entries(cache_dir) == []


def test_file_over_the_input_budget_is_refused_as_without_cache(cache_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from traceanalyzer.errors import InputError

    monkeypatch.setenv("TRACEANALYZER_MAX_INPUT_BYTES", "10K")
    with pytest.raises(InputError, match="over the input size limit"):
        load(LEGACY)
    assert _entries(cache_dir) == []


def test_snapshot_hit_gives_identical_summary(tmp_path: Path, cache_dir: Path, loads: list[Path]) -> None:
    """Memory snapshots go through the cache too (Categorical and UInt64 columns included)."""
    _hit_is_identical(REPO / "tests" / "data" / "snapshot_2.13_oom_small.pickle", tmp_path, cache_dir, loads)


def test_hit_tables_are_one_chunk(cache_dir: Path) -> None:
    """Tables come back as one chunk each, however many rows (polars would otherwise read one chunk
    per record batch of its default size, and every analysis on a big trace would pay for it)."""
    import dataclasses

    model = _trace(SAMPLE)
    k = model.kernels
    big = dataclasses.replace(model, kernels=pl.concat([k] * (300_000 // k.height + 1), rechunk=True))
    cache = ModelCache(cache_dir)
    parts = cache_mod.key_parts(SAMPLE, "trace")
    assert cache.put("0" * 32, parts, big)
    hit = cache.get("0" * 32)
    assert isinstance(hit, TraceModel)
    assert hit.kernels.height > 300_000 and hit.kernels.n_chunks() == 1
    assert hit.kernels.equals(big.kernels)


@pytest.mark.parametrize("size", [0, 1, 1000, (1 << 20) + 1, 3 * (1 << 20) + 7])
def test_content_digest_sees_every_byte(tmp_path: Path, size: int) -> None:
    # GIVEN a file of `size` bytes (one lane up to 1 MiB, two lanes above) and copies of it
    # with one byte changed at the start, at the lanes' boundary and at the end
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    f = tmp_path / "t.json"
    f.write_bytes(data)
    same = tmp_path / "same.json"
    same.write_bytes(data)
    # WHEN each is digested
    digest = cache_mod.content_digest(f)
    # THEN equal bytes give the same key, and a change anywhere (or a byte more) another
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert cache_mod.content_digest(same) == digest
    positions = sorted({0, size // 2, -(-size // 2), size - 1} & set(range(size)))
    changed = {digest}
    for at in positions:
        other = bytearray(data)
        other[at] ^= 1
        f.write_bytes(bytes(other))
        changed.add(cache_mod.content_digest(f))
    f.write_bytes(data + b" ")
    changed.add(cache_mod.content_digest(f))
    assert len(changed) == len(positions) + 2


def test_before_read_is_called_once_after_the_content_hash(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``before_read`` (the pipeline's warm-up) runs once per load, after the content hash
    where there is one (a miss and a hit), at once with the cache off."""
    events: list[str] = []
    digest = cache_mod.content_digest

    def recording(path: Path) -> str:
        events.append("hash")
        return digest(path)

    monkeypatch.setattr(cache_mod, "content_digest", recording)
    for use_cache in (True, True, False):  # a miss that stores, a hit, the cache off
        events.clear()
        model = cache_mod.load(SAMPLE, use_cache=use_cache, before_read=lambda: events.append("before_read"))
        assert model.kernels.height > 0
        assert events == (["hash", "before_read"] if use_cache else ["before_read"])
