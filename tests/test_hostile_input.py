"""Hostile and degenerate input: bounded time and memory, one line (exit 2) or a counted
warning, never an internal error (see ``traceanalyzer/load/budget.py``)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import REPO, shared_trace_files
from test_chunked_loader import assert_paths_agree

from traceanalyzer.errors import ConfigError, InputError
from traceanalyzer.load import budget, load, sniff
from traceanalyzer.load.budget import ENV_MAX_GZIP_RATIO, ENV_MAX_INPUT_BYTES, Budget
from traceanalyzer.load.jsonio import ByteStream, read_bytes
from traceanalyzer.model.trace import TraceModel

EV = b'{"ph":"X","cat":"cpu_op","name":"aten::a","ts":%s,"dur":%s,"pid":1,"tid":1,"args":{"External id":%s}}'


def _trace(path: Path) -> TraceModel:
    """:func:`load` of a file that must be a trace."""
    m = load(path)
    assert isinstance(m, TraceModel), m
    return m


def _doc(*events: bytes) -> bytes:
    good = [EV % (str(10 * i).encode(), b"5", str(i).encode()) for i in range(4)]
    return b'{"baseTimeNanoseconds": 1000, "traceEvents": [\n  ' + b",\n  ".join([*good, *events]) + b"\n]}"


def _cli(path: Path, tmp_path: Path, env: dict[str, str] | None = None, *, opts: tuple[str, ...] = (),
         command: str = "analyze") -> subprocess.CompletedProcess[str]:
    """``traceanalyzer [opts] command path`` (global options such as the input budget go before
    the sub-command), JSON report into ``tmp_path/out``."""
    return subprocess.run(
        [sys.executable, "-m", "traceanalyzer", *opts, command, str(path), "-o", str(tmp_path / "out"), "--format",
         "json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
        cwd=REPO,
    )


# ---------------------------------------------------------------------------
# 1. Non-finite and out-of-range numbers
# ---------------------------------------------------------------------------

RANGE_WARNING = "duration events with ts or dur out of range"


@pytest.mark.parametrize("field", ["ts", "dur"])
@pytest.mark.parametrize("value, warning", [
    (b"NaN", None),  # the token repair makes it null: "without a numeric ts" / "without dur"
    (b"Infinity", None),
    (b"-Infinity", None),
    (b"1e308", RANGE_WARNING),
    (b"-1e308", RANGE_WARNING),
    (b"1e400", RANGE_WARNING),  # inf through the lenient decoder
    (str(2**70).encode(), RANGE_WARNING),
    (b"1e17", RANGE_WARNING),  # finite, but ts_ns overflows int64
])
def test_non_finite_and_huge_ts_dur_skip_the_event(tmp_path: Path, field: str, value: bytes,
                                                   warning: str | None) -> None:
    ts, dur = (value, b"1") if field == "ts" else (b"100", value)
    if field == "dur" and value.startswith(b"-") and warning:
        warning = "duration events with negative dur"
    p = tmp_path / "n.json"
    p.write_bytes(_doc(EV % (ts, dur, b"99")))
    m = assert_paths_agree(p, chunks=(1, 4096))
    assert not isinstance(m, tuple), m
    assert m.cpu_ops.height == 4  # the odd event is skipped, the others kept
    if warning is None:
        warning = "without a numeric ts" if field == "ts" else "duration events without dur"
    assert any(warning in w and w.startswith("skipped 1 ") for w in m.warnings), m.warnings
    assert not any("not strict JSON" in w for w in m.warnings)


@pytest.mark.parametrize("value", [str(2**70).encode(), b"1e308", b"-1e308", b"18446744073709551616"])
def test_huge_ids_become_null(tmp_path: Path, value: bytes) -> None:
    p = tmp_path / "ids.json"
    p.write_bytes(_doc(EV % (b"100", b"1", value)))
    m = assert_paths_agree(p, chunks=(1, 4096))
    assert not isinstance(m, tuple) and m.cpu_ops.height == 5
    assert m.cpu_ops["external_id"][-1] is None


def test_flows_memory_and_base_out_of_range(tmp_path: Path) -> None:
    events = [
        b'{"ph":"s","cat":"ac2g","name":"a","ts":1e308,"id":1,"pid":1,"tid":1}',
        b'{"ph":"f","cat":"ac2g","name":"a","ts":5,"id":1,"pid":1,"tid":1}',
        b'{"ph":"i","name":"[memory]","ts":-1e300,"pid":1,"tid":1,"args":{"Bytes":8,"Total Allocated":8}}',
        b'{"ph":"i","name":"[memory]","ts":7,"pid":1,"tid":1,"args":{"Bytes":8,"Total Allocated":16}}',
    ]
    p = tmp_path / "f.json"
    p.write_bytes(_doc(*events).replace(b'"baseTimeNanoseconds": 1000', b'"baseTimeNanoseconds": 9000000000000000000'))
    m = assert_paths_agree(p, chunks=(1, 4096))
    assert not isinstance(m, tuple)
    assert m.flows.height == 1 and m.memory_events.height == 1
    assert m.meta.base_time_ns == 0
    joined = "\n".join(m.warnings)
    assert "skipped 1 flow events with ts out of range" in joined
    assert "skipped 1 [memory] events with ts out of range" in joined
    assert "ignored baseTimeNanoseconds 9,000,000,000,000,000,000" in joined


def test_cli_huge_numbers_exit_0_with_warning(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    p.write_bytes(_doc(EV % (b"1e308", b"1", b"1"), EV % (b"1", str(2**70).encode(), b"1")))
    proc = _cli(p, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "skipped 2 duration events with ts or dur out of range" in proc.stdout + proc.stderr


# ---------------------------------------------------------------------------
# 2. Multi-member gzip, 3. byte-order mark
# ---------------------------------------------------------------------------


def test_multi_member_gzip_is_read_to_the_end(tmp_path: Path) -> None:
    data = _doc()
    plain = tmp_path / "plain.json"
    plain.write_bytes(data)
    cuts = (0, 100, len(data) // 2, len(data))
    members = b"".join(gzip.compress(data[a:b]) for a, b in zip(cuts, cuts[1:]))
    for name, blob in (("cat.json.gz", members), ("padded.json.gz", members + b"\0" * 512)):
        p = tmp_path / name
        p.write_bytes(blob)
        m = assert_paths_agree(p, chunks=(1, 61, 4096))
        assert not isinstance(m, tuple) and m.warnings == () and m.cpu_ops.height == 4
        assert read_bytes(p) == (data, [])


def test_gzip_junk_after_the_data_and_truncated_second_member(tmp_path: Path) -> None:
    data = _doc()
    p = tmp_path / "junk.json.gz"
    p.write_bytes(gzip.compress(data) + b"junk")
    m = _trace(p)
    assert m.cpu_ops.height == 4 and m.warnings == ("ignored 4 bytes after the end of the gzip data (not gzip)",)
    second = gzip.compress(data[200:])
    p.write_bytes(gzip.compress(data[:200]) + second[: len(second) // 2])
    m = _trace(p)
    assert any("gzip stream is truncated" in w for w in m.warnings)


@pytest.mark.parametrize("gz", [False, True])
def test_byte_order_mark_is_accepted_silently(tmp_path: Path, gz: bool) -> None:
    data = b"\xef\xbb\xbf" + _doc()
    p = tmp_path / ("bom.json.gz" if gz else "bom.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    assert sniff(p) == "trace"
    m = assert_paths_agree(p, chunks=(1, 4096))
    assert not isinstance(m, tuple) and m.warnings == () and m.cpu_ops.height == 4


# ---------------------------------------------------------------------------
# 4. The gzip bomb budget
# ---------------------------------------------------------------------------

ONE = EV % (b"1", b"1", b"1")


def _bomb(pre: bytes, filler: bytes, post: bytes, n: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(pre)]
    block = filler * (1 << 20)
    out += [c.compress(block) for _ in range(n >> 20)]
    return b"".join([*out, c.compress(post), c.flush()])


BOMBS = {
    "inside the events": (b'{"traceEvents":[' + ONE + b",", b" ", ONE + b"]}"),
    "before traceEvents": (b"{", b" ", b'"traceEvents":[' + ONE + b"]}"),
    "after the array": (b'{"traceEvents":[' + ONE + b"]", b" ", b"}"),
    "one huge string": (b'{"traceEvents":[' + ONE + b',{"ph":"X","cat":"cpu_op","ts":1,"dur":1,"name":"', b"a",
                        b'"}]}'),
}


@pytest.fixture
def small_floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ratio check from 1 MiB of output (16 MiB by default), so that bombs stay small."""
    monkeypatch.setattr(budget, "RATIO_FLOOR_BYTES", 1 << 20)
    monkeypatch.delenv(ENV_MAX_GZIP_RATIO, raising=False)
    monkeypatch.delenv(ENV_MAX_INPUT_BYTES, raising=False)
    yield


@pytest.mark.parametrize("where", list(BOMBS))
def test_gzip_bomb_refused_by_ratio_while_decompressing(tmp_path: Path, where: str, small_floor: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(_bomb(*BOMBS[where], n=8 << 20))
    assert p.stat().st_size < 16 << 10  # ~1,000x
    with pytest.raises(InputError) as info:
        load(p)
    msg = str(info.value)
    assert msg.startswith(str(p)) and "\n" not in msg
    assert "past the decompression ratio limit of 200x" in msg and ENV_MAX_GZIP_RATIO in msg
    # Stopped at the floor, not at the end of the 8 MiB.
    stream = ByteStream(p)
    with pytest.raises(InputError, match="ratio limit"):
        for _ in stream.blocks(256 << 10):
            pass
    assert stream.nbytes <= (1 << 20) + (256 << 10)
    # Raised, the same file loads (its whitespace is valid JSON) or fails on its content.
    monkeypatch.setenv(ENV_MAX_GZIP_RATIO, "5000")
    try:
        m = _trace(p)
    except InputError as exc:
        assert "limit" not in str(exc)
    else:
        assert m.cpu_ops.height >= 1


def test_gzip_bomb_refused_by_size(tmp_path: Path, small_floor: None, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(_bomb(*BOMBS["inside the events"], n=4 << 20))
    monkeypatch.setenv(ENV_MAX_GZIP_RATIO, "5000")
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "2M")
    with pytest.raises(InputError, match=r"more than the input size limit of 2\.0 MiB .*TRACEANALYZER_MAX_INPUT_BYTES"):
        load(p)
    plain = tmp_path / "plain.json"
    plain.write_bytes(_doc() + b" " * (3 << 20))
    with pytest.raises(InputError, match=r"is 3\.0 MiB, over the input size limit of 2\.0 MiB; raise it with "
                                         r"--max-input-size 1G \(or TRACEANALYZER_MAX_INPUT_BYTES=1G\)"):
        load(plain)
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "4M")
    assert _trace(plain).cpu_ops.height == 4


def test_small_files_never_trip_the_ratio(tmp_path: Path) -> None:
    # 1,000x, but under the floor: harmless, loads.
    p = tmp_path / "small.json.gz"
    p.write_bytes(_bomb(*BOMBS["inside the events"], n=2 << 20))
    assert _trace(p).cpu_ops.height == 2


def test_budget_env_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "40G")
    monkeypatch.setenv(ENV_MAX_GZIP_RATIO, "1000")
    assert Budget.from_env() == Budget(40 << 30, 1000.0)
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "1.5GiB")
    assert Budget.from_env().max_input_bytes == 3 << 29
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "lots")
    with pytest.raises(ConfigError, match=ENV_MAX_INPUT_BYTES):
        Budget.from_env()
    monkeypatch.setenv(ENV_MAX_INPUT_BYTES, "1G")
    monkeypatch.setenv(ENV_MAX_GZIP_RATIO, "x")
    with pytest.raises(ConfigError, match=ENV_MAX_GZIP_RATIO):
        Budget.from_env()


def test_cli_bomb_exit_2_one_line(tmp_path: Path) -> None:
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(_bomb(*BOMBS["one huge string"], n=20 << 20))  # past the default 16 MiB floor
    proc = _cli(p, tmp_path)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and str(p) in err and "ratio limit" in err and "Traceback" not in err


@pytest.mark.shared
@pytest.mark.skipif(not shared_trace_files(), reason="../shared reference data not present")
def test_real_gzip_traces_are_far_below_the_ratio_limit() -> None:
    """Every real .gz in ../shared and sample_traces decompresses at under a fifth of the
    default ratio limit, prefixes included (the check runs on the running figure)."""
    files = [p for p in [*shared_trace_files(), *(REPO / "sample_traces").rglob("*.gz")]
             if p.read_bytes()[:2] == b"\x1f\x8b"]
    worst = 0.0
    for p in files:
        stream = ByteStream(p)
        for _ in stream.blocks(4 << 20):
            worst = max(worst, stream.nbytes / max(stream.consumed, 1))
    assert files and worst < budget.DEFAULT_MAX_GZIP_RATIO / 5, worst


# ---------------------------------------------------------------------------
# 5. Only regular files
# ---------------------------------------------------------------------------


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail instead of hanging forever if something opens a FIFO."""
    def boom(*_: object) -> None:
        raise TimeoutError("blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_fifo_socket_device_refused_at_once(tmp_path: Path, alarm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    monkeypatch.chdir(tmp_path)  # a short relative name: AF_UNIX paths are limited to ~100 bytes
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("s.json")
    try:
        for path, what in (
            (fifo, "a FIFO (named pipe)"),
            (tmp_path / "s.json", "a socket"),
            (Path("/dev/null"), "a character device"),
        ):
            if not os.path.lexists(path):
                continue
            for fn in (load, sniff, read_bytes, lambda p: load(p, kind="trace"), ByteStream):
                with pytest.raises(InputError) as info:
                    fn(path)
                assert str(info.value) == f"{path}: is {what}, not a regular file: only regular files are read"
    finally:
        sock.close()


def test_symlink_loop_and_broken_link_named(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(InputError, match="is a symbolic link loop"):
        load(a)
    broken = tmp_path / "broken.json"
    broken.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(InputError, match="is a broken symbolic link"):
        load(broken)
    good = tmp_path / "good.json"
    good.write_bytes(_doc())
    link = tmp_path / "link.json"
    link.symlink_to(good)
    assert _trace(link).cpu_ops.height == 4


def test_cli_fifo_exit_2_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    proc = _cli(fifo, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {fifo}: is a FIFO (named pipe), not a regular file: "
                                                "only regular files are read"]


def test_plain_loading_is_unchanged(tmp_path: Path) -> None:
    p = tmp_path / "ok.json"
    p.write_bytes(orjson.dumps(orjson.loads(_doc())))
    m = _trace(p)
    assert m.warnings == () and m.cpu_ops.height == 4


def test_sniff_reads_past_an_empty_first_member(tmp_path: Path) -> None:
    p = tmp_path / "e.json.gz"
    p.write_bytes(gzip.compress(b"") + gzip.compress(b"\n") + gzip.compress(_doc()))
    assert sniff(p) == "trace"
    m = _trace(p)
    assert m.cpu_ops.height == 4 and m.warnings == ()


def test_budget_options_raise_the_limits_for_one_run(tmp_path: Path) -> None:
    """A valid trace padded with 20 MiB of whitespace gzips ~1,000x: refused by default (exit 2,
    one line naming the option that raises the limit), read with --max-gzip-ratio above it, and
    refused again with --max-input-size below its decompressed size."""
    p = tmp_path / "padded.json.gz"
    p.write_bytes(_bomb(_doc(), b" ", b"\n", n=20 << 20))
    refused = _cli(p, tmp_path)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "ratio limit of 200x" in refused.stderr and "--max-gzip-ratio <ratio>" in refused.stderr

    read = _cli(p, tmp_path, opts=("--max-gzip-ratio", "5000"))
    assert read.returncode == 0, read.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["meta"]["span_ns"] == 35_000  # the four events of _doc(), 0-30 µs, 5 µs each

    small = _cli(p, tmp_path, opts=("--max-gzip-ratio", "5000", "--max-input-size", "8M"))
    assert small.returncode == 2
    assert "more than the input size limit of 8.0 MiB" in small.stderr and "--max-input-size <size>" in small.stderr


def test_snapshot_limit_option(tmp_path: Path) -> None:
    """--snapshot-limit lowers or raises one snapshot limit for the run; a bad name or value is
    a usage error (exit 2, one line) before anything is read."""
    import pickle

    fan = tmp_path / "fanout.pickle"
    big = list(range(2000))
    fan.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "extra": [big] * 5000}, protocol=4))
    low = _cli(fan, tmp_path, opts=("--snapshot-limit", "max_objects=1000000"), command="memory")
    assert low.returncode == 2
    assert "max_objects = 1,000,000" in low.stderr and "--snapshot-limit max_objects=N" in low.stderr
    for bad in ("max_foo=3", "max_depth=-1", "max_depth=abc"):
        proc = _cli(fan, tmp_path, opts=("--snapshot-limit", bad), command="memory")
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: --snapshot-limit '{bad}'"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    for opt, value in (("--max-input-size", "12Q"), ("--max-gzip-ratio", "0")):
        proc = _cli(fan, tmp_path, opts=(opt, value), command="memory")
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: {opt} '{value}'"), proc.stderr


def test_a_protocol0_pickle_naming_code_is_refused_by_name(tmp_path: Path) -> None:
    """A protocol 0/1 pickle that opens with GLOBAL (os.system) is refused with one line saying
    what it names, and nothing of it runs."""
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    proc = _cli(evil, tmp_path, command="memory")
    assert proc.returncode == 2 and not marker.exists()
    assert proc.stderr.strip() == (f"error: {evil}: a protocol 0/1 pickle that starts by naming code to run "
                                   "(os.system); memory snapshots start with the protocol byte 0x80 and are never "
                                   "unpickled with code: refused")


# ---------------------------------------------------------------------------
# 10. Events, string length and nesting depth (both decode paths)
# ---------------------------------------------------------------------------

def _paths(path: Path) -> list[tuple[str, Any]]:
    """Every way a trace is decoded: the simple path, the chunked one at a few chunk sizes
    with one and two regions at once, and the default entry point."""
    from test_chunked_loader import chunked

    from traceanalyzer.load.chrome_trace import load_chrome_trace, load_chrome_trace_simple
    out: list[tuple[str, Any]] = [("simple", lambda: load_chrome_trace_simple(path)),
                                  ("default", lambda: load_chrome_trace(path))]
    for cb in (300, 4096):
        for workers in (1, 2):
            out.append((f"chunked {cb}/{workers}", lambda cb=cb, workers=workers: chunked(path, cb, workers)))
    return out


def _events(n: int) -> list[bytes]:
    return [EV % (str(10 * i).encode(), b"5", str(i).encode()) for i in range(n)]


def test_event_limit_refuses_past_it_on_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a trace of 500 events and a limit of 100
    monkeypatch.setenv(budget.ENV_MAX_EVENTS, "100")
    p = tmp_path / "many.json"
    p.write_bytes(b'{"traceEvents": [\n  ' + b",\n  ".join(_events(500)) + b"\n]}")
    # WHEN loaded any way THEN refused with one line naming the file, limit, figure and variable
    for name, load_it in _paths(p):
        with pytest.raises(InputError) as e:
            load_it()
        msg = str(e.value)
        assert str(p) in msg and "more than 100 events" in msg and "TRACEANALYZER_MAX_EVENTS=" in msg, (name, msg)
        assert "\n" not in msg
    # and at the limit it loads
    p.write_bytes(b'{"traceEvents": [\n  ' + b",\n  ".join(_events(100)) + b"\n]}")
    for name, load_it in _paths(p):
        assert load_it().cpu_ops.height == 100, name


def test_event_limit_counts_the_same_with_regions_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A region is first counted by a bound (its size over the separator's), replaced by the
    # decoder's count once it is added: the regions still in flight are settled before the
    # bound may refuse, so two regions at once refuse at the same region, with the same count,
    # as one at a time, and a file just at the limit loads.
    from test_chunked_loader import chunked

    p = tmp_path / "many.json"
    p.write_bytes(b'{"traceEvents": [\n  ' + b",\n  ".join(_events(3000)) + b"\n]}")
    monkeypatch.setenv(budget.ENV_MAX_EVENTS, "2999")
    msgs = set()
    for workers in (1, 2):
        with pytest.raises(InputError) as e:
            chunked(p, 4096, workers)
        msgs.add(str(e.value))
    assert len(msgs) == 1 and "more than 2,999 events (3,000 counted by byte" in msgs.pop()
    monkeypatch.setenv(budget.ENV_MAX_EVENTS, "3000")
    for workers in (1, 2):
        assert chunked(p, 4096, workers).cpu_ops.height == 3000


def test_event_separators_inside_strings_do_not_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Separators counted as events are only a bound: a name full of them is recounted exactly.
    monkeypatch.setenv(budget.ENV_MAX_EVENTS, "20")
    name = b'aten::x},\\n  {' * 50
    evs = [b'{"ph":"X","cat":"cpu_op","name":"' + name + b'","ts":%d,"dur":1,"pid":1,"tid":1}' % i for i in range(20)]
    p = tmp_path / "seps.json"
    p.write_bytes(b'{"traceEvents": [\n  ' + b",\n  ".join(evs) + b"\n]}")
    for name_, load_it in _paths(p):
        assert load_it().cpu_ops.height == 20, name_


def _named(*names: bytes) -> bytes:
    evs = [b'{"ph":"X","cat":"cpu_op","name":"' + n + b'","ts":%d,"dur":1,"pid":1,"tid":1}' % (10 * i)
           for i, n in enumerate(names)]
    return b'{"traceEvents": [\n  ' + b",\n  ".join([*_events(3), *evs]) + b'\n], "traceName": "t"}'


@pytest.mark.parametrize("long", [
    b"a" * 5000,
    "é".encode() * 2500,  # a cut inside a 2-byte character
    "😀".encode() * 1250,  # inside a 4-byte one
    b"a" * 998 + b"\\u00e9" * 500,  # inside a \u escape
    b"a" * 999 + b'\\"' * 2000,  # inside \" (and a string of escaped quotes: no plain quote in it)
    b"a" * 997 + b"\\ud83d\\ude00" * 300,  # between the halves of a surrogate pair
    b"\\\\" * 3000,  # runs of escaped backslashes
])
def test_long_strings_are_kept_truncated_the_same_on_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 long: bytes) -> None:
    # GIVEN a string limit of 1,000 bytes and one long name among short ones
    monkeypatch.setenv(budget.ENV_MAX_STRING_BYTES, "1000")
    p = tmp_path / "long.json"
    p.write_bytes(_named(b"short", long, b"after"))
    # WHEN loaded THEN every path keeps the same model: the name cut to at most 1,000 bytes of
    # valid text, the events around it intact, one counted warning
    m = assert_paths_agree(p, chunks=(300, 700, 4096, 1 << 20))
    assert not isinstance(m, tuple), m
    names = m.cpu_ops["name"].to_list()
    assert names[:3] == ["aten::a"] * 3 and names[3] == "short" and names[-1] == "after"
    cut = names[4]
    # the limit counts the string as written (an escape is several bytes): what is kept
    # decodes to at most that many bytes, and is the string's beginning
    assert 400 <= len(cut.encode("utf-8", "surrogatepass")) <= 1000
    assert json.loads(b'"' + long + b'"').startswith(cut)
    assert m.meta.trace_name == "t"  # the keys after the array survive the cut
    assert any(w.startswith("truncated 1 string longer than the string limit of 1,000 bytes") for w in m.warnings), \
        m.warnings


def test_a_string_longer_than_the_buffer_is_dropped_as_it_streams(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a 4 MB name (gzipped, so it streams block by block) and a string limit of 1,000
    monkeypatch.setenv(budget.ENV_MAX_STRING_BYTES, "1000")
    p = tmp_path / "huge.json.gz"
    p.write_bytes(gzip.compress(_named(b"x" * (4 << 20), b"after"), 1))
    from test_chunked_loader import chunked
    # WHEN read in 64 KB chunks THEN the name is cut and the event after it kept
    m = chunked(p, 64 << 10, 1)
    assert m.cpu_ops["name"].to_list()[-2:] == ["x" * 1000, "after"]
    assert any("longest: 4.0 MiB" in w for w in m.warnings), m.warnings


def test_default_string_limit_keeps_a_50_mb_name_bounded(tmp_path: Path) -> None:
    p = tmp_path / "name50.json"
    p.write_bytes(_named(b"n" * (50 << 20)))
    from traceanalyzer.load.chrome_trace import load_chrome_trace
    m = load_chrome_trace(p)
    assert len(m.cpu_ops["name"][-1]) == budget.DEFAULT_MAX_STRING_BYTES
    assert any("longest: 50.0 MiB" in w for w in m.warnings), m.warnings


@pytest.mark.parametrize("where", ["args", "item", "unclosed"])
def test_deep_nesting_is_refused_with_the_depth_reached(tmp_path: Path, where: str) -> None:
    # GIVEN JSON nested 100,000 deep (in an event's args, as an item of the events array, or
    # opened and never closed)
    n = 100_000
    if where == "args":
        odd = b'{"ph":"X","cat":"cpu_op","name":"x","ts":1,"dur":1,"pid":1,"tid":1,"args":{"z":' + \
              b"[" * n + b"]" * n + b"}}"
    elif where == "item":
        odd = b"[" * n + b"]" * n
    else:
        odd = b"[" * n
    p = tmp_path / "deep.json"
    p.write_bytes(_doc(odd))
    # WHEN loaded any way THEN refused by the depth limit, naming the depth reached
    for name, load_it in _paths(p):
        with pytest.raises(InputError) as e:
            load_it()
        msg = str(e.value)
        assert "levels deep" in msg and "past the nesting depth limit of 1,000" in msg, (name, msg)
        assert "\n" not in msg


def test_lowered_depth_limit_is_exact_on_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Document levels: the object, traceEvents, the event, args, "Input Dims", its inner lists: 6.
    ev = b'{"ph":"X","cat":"cpu_op","name":"x","ts":1,"dur":1,"pid":1,"tid":1,"args":{"Input Dims":[[1,2],[3]]}}'
    p = tmp_path / "six.json"
    p.write_bytes(_doc(ev))
    monkeypatch.setenv(budget.ENV_MAX_DEPTH, "6")
    for name, load_it in _paths(p):
        assert load_it().cpu_ops.height == 5, name
    monkeypatch.setenv(budget.ENV_MAX_DEPTH, "5")
    for _, load_it in _paths(p):
        with pytest.raises(InputError, match="JSON nested 6 levels deep.*limit of 5.*TRACEANALYZER_MAX_DEPTH=N"):
            load_it()


def test_trace_budget_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Budget.from_env().max_events == budget.DEFAULT_MAX_EVENTS
    for env, value, match in ((budget.ENV_MAX_EVENTS, "lots", "whole number"),
                              (budget.ENV_MAX_DEPTH, "2000", "at most"),
                              (budget.ENV_MAX_STRING_BYTES, "-5", "size"),
                              (budget.ENV_MAX_EVENTS, "0", "positive")):
        monkeypatch.setenv(env, value)
        with pytest.raises(ConfigError, match=match):
            Budget.from_env()
        monkeypatch.delenv(env)
    monkeypatch.setenv(budget.ENV_MAX_STRING_BYTES, "4M")
    monkeypatch.setenv(budget.ENV_MAX_EVENTS, "1e8")
    b = Budget.from_env()
    assert (b.max_string_bytes, b.max_events) == (4 << 20, 100_000_000)


def test_limits_registry_names_every_limit() -> None:
    from dataclasses import fields

    from traceanalyzer.load.pickle_budget import PickleBudget
    trace = [lim.name for lim in budget.LIMITS if lim.applies_to == "trace"]
    snap = [lim.name for lim in budget.LIMITS if lim.applies_to == "snapshot"]
    assert trace == [f.name for f in fields(Budget)] and snap == [f.name for f in fields(PickleBudget)]
    assert len({lim.env for lim in budget.LIMITS}) == len(budget.LIMITS)
    for lim in budget.LIMITS:
        assert lim.env.startswith("TRACEANALYZER_") and lim.description and lim.trips and lim.default > 0
        assert lim.kind in ("size", "count", "ratio")
    assert {lim.name: lim.default for lim in budget.TRACE_LIMITS} == {f.name: f.default for f in fields(Budget)}


def test_cli_event_and_depth_refusals_are_one_line_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "many.json"
    p.write_bytes(b'{"traceEvents": [\n  ' + b",\n  ".join(_events(50)) + b"\n]}")
    r = _cli(p, tmp_path, {budget.ENV_MAX_EVENTS: "10"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "TRACEANALYZER_MAX_EVENTS" in r.stderr and "Traceback" not in r.stderr
    p = tmp_path / "deep.json"
    p.write_bytes(_doc(b"[" * 50_000 + b"]" * 50_000))
    r = _cli(p, tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "levels deep" in r.stderr, r.stderr


def test_string_cuts_stay_valid_json_whatever_the_escapes() -> None:
    # Random strings of escapes, multi-byte characters and surrogate pairs, cut at every
    # limit from 1 to 60 bytes: the result decodes, and is the beginning of the original.
    import random

    from traceanalyzer.load.chrome_trace.guard import StringSkipper, clip_strings
    rng = random.Random(1)
    atoms = [b"a", b"\\\\", b'\\"', b"\\n", b"\\u00e9", b"\\ud83d\\ude00", "é".encode(), "😀".encode()]
    for _ in range(1500):
        s = b"".join(rng.choice(atoms) for _ in range(rng.randint(1, 60)))
        limit = rng.randint(1, 60)
        doc = b'["x", "' + s + b'", "y"]'
        out, n, longest, open_len = clip_strings(doc, limit)
        got = orjson.loads(out)
        assert got[0] == "x" and got[2] == "y" and json.loads(doc)[1].startswith(got[1]), (s, limit)
        assert (n, longest) == ((1, len(s)) if len(s) > limit else (0, 0)) and not open_len
        # cut while still open (the rest streams in blocks): the skipper finds the real end
        head = doc[: rng.randint(7, max(7, len(doc) - 9))]
        clipped, n, _, open_len = clip_strings(head, limit)
        if not open_len:
            continue
        skip = StringSkipper()
        skip.start(head)
        rest, i = doc[len(head):], 0
        while True:
            j = i + rng.randint(1, 5)
            found = skip.feed(rest[i:j])
            if found is not None:
                assert orjson.loads(clipped + found + rest[j:])[2] == "y", (s, limit, head)
                break
            i = j
