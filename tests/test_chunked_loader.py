"""The chunked loader gives exactly the simple loader's model.

:func:`~traceanalyzer.load.chrome_trace.load_chrome_trace_simple` defines the
semantics; the chunked path (:class:`~traceanalyzer.load.chrome_trace._ChunkedLoader`)
must reproduce it table for table (values and dtypes), with the same metadata and the
same warnings, or raise the same one-line :class:`InputError`. Small chunk sizes force
many chunk boundaries (down to one per event) so every seam is exercised on small
files.
"""

from __future__ import annotations

import functools
import gzip
import random
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from conftest import REPO, kineto_doc, shared_model, shared_params, shared_trace_files
from polars.testing import assert_frame_equal
from support.events import complete

from traceanalyzer.errors import InputError
from traceanalyzer.load import load
from traceanalyzer.load.chrome_trace import load_chrome_trace, load_chrome_trace_simple
from traceanalyzer.load.chrome_trace.framing import (
    CHUNK_BYTES,
    MAX_REGION_SCALE,
    PARALLEL_CHUNK_BYTES,
    REGION_SCALE_BYTES,
    _ChunkedLoader,
    _Unframed,
    region_scale,
    size_hint,
)
from traceanalyzer.model import SCHEMAS

# Chunk sizes for hand-made files: the default run's land cuts inside events, strings and
# escapes at varying offsets; the slow set adds 1 byte (a cut at every byte, so at every event
# boundary) and 7 bytes (a cut inside nearly every token), the slowest by far: on a file over
# 2.5 KiB both become the sampled seams of seam_sample (see assert_paths_agree).
TINY_CHUNKS = (61, 4096)
EVERY_BYTE = (1, 7)
#: In place of EVERY_BYTE on a longer file: a cut at each :func:`seam_sample` position.
SAMPLED = 0


@pytest.fixture(params=[pytest.param(TINY_CHUNKS, id="chunks"),
                        pytest.param(EVERY_BYTE, id="every-byte", marks=pytest.mark.slow)])
def seams(request: pytest.FixtureRequest) -> tuple[int, ...]:
    """The chunk sizes a hand-made file is cut at (1 and 7 bytes in the slow set)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=[pytest.param((300, 1 << 20), id="chunks"),
                        pytest.param((1,), id="every-byte", marks=pytest.mark.slow)])
def odd_seams(request: pytest.FixtureRequest) -> tuple[int, ...]:
    """Chunk sizes for a file of one odd event: a cut inside it, one chunk for all; the slow set
    cuts it at every byte."""
    return request.param  # type: ignore[no-any-return]


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except InputError as exc:
        return ("InputError", str(exc))


def chunked(path: Path, chunk_bytes: int, workers: int | None = None) -> Any:
    """The chunked path with ``chunk_bytes`` and ``workers`` regions decoded at once
    (default: the loader's), as load_chrome_trace, with the simple path taking files the
    chunked reader cannot frame."""
    try:
        return _ChunkedLoader(path, chunk_bytes, workers).load()
    except _Unframed:
        return load_chrome_trace_simple(path)


def assert_same_model(a: Any, b: Any) -> None:
    """Same InputError text, or same meta, warnings and every table (values and dtypes)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        assert a == b
        return
    assert a.meta == b.meta
    assert a.warnings == b.warnings
    for table in SCHEMAS:
        try:
            assert_frame_equal(a.table(table), b.table(table), check_exact=True, check_dtypes=True)
        except AssertionError as exc:
            raise AssertionError(f"table {table}: {exc}") from None


#: Sampled seams (:func:`seam_sample`): every byte of the first and last ``SEAM_ENDS`` bytes,
#: every byte within ``SEAM_AROUND`` of an event boundary, within 2 of an escape or a non-ASCII
#: byte, and one byte in ``SEAM_RATE`` of the rest (seeded).
SEAM_ENDS = 1024
SEAM_AROUND = 8
SEAM_RATE = 8
_EVENT_SEP = re.compile(rb"\}\s*,\s*\{")
_SPECIAL = re.compile(rb"[\\\x80-\xff]")


def seam_sample(text: bytes) -> list[int]:
    """The positions of ``text`` (a file's decoded bytes) a sampled every-byte run cuts at.

    A cut at every byte costs one step of the loader per byte; what the cuts exercise falls
    in a few classes, each sampled whole: the header (the ``traceEvents`` key, the ``[``, the
    first events, where the separator between events is learned) and the end (the last
    event, the ``]``, the keys after it, where a truncated file stops): every byte of the
    first and last KiB; the seam between two events (inside ``}``, ``,``, the whitespace,
    ``{``) at every byte within 8 of each boundary; escapes and multi-byte UTF-8 at every
    byte within 2; and the cuts inside strings, numbers, keys and nested args objects, alike
    all along the file, one byte in 8 (seeded by the length: the same cuts on every run).
    """
    n = len(text)
    keep = set(range(1, min(n, SEAM_ENDS + 1))) | set(range(max(1, n - SEAM_ENDS), n))
    for m in _EVENT_SEP.finditer(text):
        keep.update(range(max(1, m.start() - SEAM_AROUND), min(n, m.end() + SEAM_AROUND)))
    for m in _SPECIAL.finditer(text):
        keep.update(range(max(1, m.start() - 2), min(n, m.end() + 2)))
    rest = [i for i in range(1, n) if i not in keep]
    keep.update(random.Random(n).sample(rest, len(rest) // SEAM_RATE))
    return sorted(keep)


def decoded(path: Path) -> bytes:
    """``path``'s bytes, gunzipped as far as they go (a cut gzip stream gives what it holds)."""
    raw = path.read_bytes()
    if not path.name.endswith(".gz"):
        return raw
    try:
        return zlib.decompressobj(wbits=31).decompress(raw)
    except zlib.error:
        return b""


def chunked_at(path: Path, cuts: list[int], workers: int) -> Any:
    """:func:`chunked` with one byte regions (a step at every block) and the decoded file
    handed over in blocks that end at ``cuts``: a cut at each of those bytes only."""
    loader = _ChunkedLoader(path, 1, workers)
    read = loader.stream.blocks

    def blocks(size: int = 0) -> Iterator[bytes]:
        text = b"".join(read(1 << 30))
        prev = 0
        for c in cuts:
            if prev < c < len(text):
                yield text[prev:c]
                prev = c
        if prev < len(text):
            yield text[prev:]

    loader.stream.blocks = blocks  # type: ignore[method-assign]
    try:
        return loader.load()
    except _Unframed:
        return load_chrome_trace_simple(path)


def assert_paths_agree(path: Path, chunks: tuple[int, ...] = TINY_CHUNKS, one_way: int | None = None) -> Any:
    """Every chunk size gives the simple path's outcome; returns that outcome.

    On a file longer than 2·``SEAM_ENDS`` + 512 bytes the every-byte sizes (1 and 7) become
    one run at the :func:`seam_sample` cuts (on a shorter one that is every byte anyway).
    ``one_way`` (1 or 2 workers): each size read that way only, not both."""
    ref = _outcome(lambda: load_chrome_trace_simple(path))
    cuts: list[int] = []
    if 1 in chunks:
        text = decoded(path)
        if len(text) > 2 * SEAM_ENDS + 512:
            cuts = seam_sample(text)
            chunks = tuple(SAMPLED if cb == 1 else cb for cb in chunks if cb != 7)
    for i, cb in enumerate(chunks):
        # Both ways of decoding: one region at a time, and two at once (regions cut ahead
        # of the one being decoded, rolled back where it does not decode).
        for workers in (one_way,) if one_way else (1, 2) if i % 2 else (2, 1):
            if cb == SAMPLED:
                got = _outcome(functools.partial(chunked_at, path, cuts, workers))
            else:
                got = _outcome(lambda cb=cb, workers=workers: chunked(path, cb, workers))
            try:
                assert_same_model(ref, got)
            except AssertionError as exc:
                raise AssertionError(f"chunk_bytes={cb}, workers={workers}: {exc}") from None
            if cb >= 4096:
                break  # the larger chunks: one way each (alternating), for time
    assert_same_model(ref, _outcome(lambda: load_chrome_trace(path)))
    return ref


# ---------------------------------------------------------------------------
# Real traces and the project's samples
# ---------------------------------------------------------------------------

SHARED = shared_trace_files()
#: Samples the default run checks (a plain legacy file and two gzipped layouts); the rest are slow.
FAST_SAMPLES = {"legacy_pt18.json", "pt113_sync_bound.json.gz", "amd_mi300_inference.json.gz"}
SAMPLES = sorted(p for p in (REPO / "sample_traces").rglob("*.json*") if not p.name.endswith(".truth.json"))


#: Real traces up to this much JSON are compared whole on both decoders; a bigger one on its
#: first :data:`PREFIX_BYTES` made a trace of its own (:func:`trace_prefix`), save :data:`WHOLE`.
#: The simple decoder decodes event by event: on the 15–87 MB files it was most of the slow set.
SIZE_CAP = 8 << 20
PREFIX_BYTES = 4 << 20
#: The big real trace still compared whole on both decoders (54 MB: dozens of 1 MiB regions).
WHOLE = {"df_index_resolver.json.gz"}


def json_size(path: Path) -> int:
    """The (decompressed) size of a JSON(.gz) file: gzip's ISIZE field, modulo 4 GiB."""
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    with path.open("rb") as f:
        f.seek(-4, 2)
        return int.from_bytes(f.read(4), "little")


def trace_prefix(path: Path, out: Path, nbytes: int = PREFIX_BYTES) -> Path | None:
    """``out``, gzipped: ``path``'s text up to the end of its last event that ends before
    ``nbytes``, the events array closed there and the document's keys after the array (the
    file's own text) appended: the file's own header, layout, separators and events, fewer of
    them. None when ``path`` is not a JSON object with its ``traceEvents`` array and what
    follows it in its last 64 KiB."""
    text = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    if text.lstrip()[:1] != b"{" or b'"traceEvents"' not in text[:nbytes]:
        return None
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    # The end of the last event that ends before ``nbytes``: a ``}`` back at the array's depth,
    # found by a scan of strings and brackets (a string may hold ``},{``, args nest objects).
    depth, cut = 0, -1
    for m in _TOKENS.finditer(text, start, nbytes):
        c = m.group()
        if c in (b"{", b"["):
            depth += 1
        elif c in (b"}", b"]"):
            depth -= 1
            if depth == 0 and c == b"}":
                cut = m.start()
    # The array's ``]``: the first ``]`` of the last 64 KiB after which the rest of the file
    # reads as the rest of an object (one inside an event leaves a ``}, {`` that does not).
    tail = None
    w0 = max(cut + 1, len(text) - (64 << 10))
    j = text.find(b"]", w0)
    while j >= 0 and tail is None:
        rest = text[j + 1:].strip()
        if rest == b"}" or (rest[:1] == b"," and _parses(b"{" + rest[1:])):
            tail = text[j + 1:]
        j = text.find(b"]", j + 1)
    if cut < 0 or tail is None:
        return None
    data = text[:cut + 1] + b"\n]" + tail
    assert orjson.loads(data)["traceEvents"]  # a valid trace
    out.write_bytes(gzip.compress(data, compresslevel=1))
    return out


def _parses(text: bytes) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[][{}]', re.S)


@pytest.mark.skipif(not SHARED, reason="../shared reference data not present")
@pytest.mark.parametrize("path", shared_params(SHARED))
def test_shared_trace_chunked_equals_simple(path: Path, tmp_path: Path) -> None:
    """Both decoders give one model on every real trace: whole up to :data:`SIZE_CAP` of JSON
    (and for :data:`WHOLE`), on a :func:`trace_prefix` of :data:`PREFIX_BYTES` beyond it (the
    file's own header, layout, events and keys after the array, cut in 16 regions of 256 KiB):
    the simple decoder decodes event by event, most of this test's time on a whole big file.
    The big files stay read whole by the chunked path in the other modules (test_shared_traces
    checks their counts) and here through :data:`WHOLE`."""
    size = json_size(path)
    chunk = (1 << 20) if size > (1 << 20) else 16 << 10
    whole = path
    if size > SIZE_CAP and path.name not in WHOLE:
        cut = trace_prefix(path, tmp_path / path.name)
        if cut is not None:
            whole, chunk = cut, 256 << 10
    ref = _outcome(lambda: load_chrome_trace_simple(whole))
    # The default path (through the session cache, the other test modules' load, on the file
    # itself) …
    if whole is not path:
        assert_same_model(ref, _outcome(lambda: load(whole)))
    elif path.name != "memory_timeline.raw.gz":  # not a trace: load() picks another loader
        assert_same_model(ref, _outcome(lambda: shared_model(path)))
    # … and small chunks: dozens of boundaries even on the 30–85 MB files, 16 on a prefix.
    assert_same_model(ref, _outcome(lambda: chunked(whole, chunk, workers=2)))


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.name, marks=() if p.name in FAST_SAMPLES else pytest.mark.slow) for p in SAMPLES])
def test_sample_trace_chunked_equals_simple(path: Path) -> None:
    ref = assert_paths_agree(path, chunks=(4096, 64 << 10))
    assert not isinstance(ref, tuple) and ref.kernels.height + ref.cpu_ops.height > 0


# ---------------------------------------------------------------------------
# Hand-made edge cases
# ---------------------------------------------------------------------------


def X(cat: str | None, name: Any, ts: Any, dur: Any, pid: Any = 1, tid: Any = 1, **args: Any) -> dict[str, Any]:
    return complete(cat, name, ts, dur, pid, tid, args)


BASE = 1_700_000_000_000_000_000


def modern_events(n_steps: int = 3) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "python"}}]
    for s in range(n_steps):
        t = 1000.0 * s
        c = 10 * s
        ev += [
            X("user_annotation", f"ProfilerStep#{s}", t, 900.0),
            X("cpu_op", "aten::mm", t + 1.5, 10.25, **{"External id": c, "Input Dims": [[2, 3], [3, 4]],
                                                      "Input type": ["float", "c10::Half"], "Sequence number": s}),
            X("cuda_runtime", "cudaLaunchKernel", t + 2, 3.0, correlation=c + 1, cbid=211, **{"External id": c}),
            X("kernel", "volta_sgemm_128x64_nn", t + 10.001, 20.5, pid=0, tid=7, device=0, stream=7,
              correlation=c + 1, grid=[1, 2, 1], block=[128, 1, 1], **{"registers per thread": 32}),
            X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 31, 2.0, pid=0, tid=7, device=0, stream=7,
              correlation=c + 2, bytes=4096),
            X("gpu_memset", "Memset (Device)", t + 34, 1.0, pid=0, tid=7, device=0, stream=7, correlation=c + 3,
              bytes=128),
            X("gpu_user_annotation", f"ProfilerStep#{s}", t, 60.0, pid=0, tid=7),
            X("python_function", "train.py(42): forward", t + 0.5, 30.0, **{"Python id": s + 5, "Python parent id": 1}),
            X("cuda_sync", "Event Sync", t + 50, 4.0, pid=0, tid=-1, correlation=c + 4, wait_on_stream=7,
              wait_on_cuda_event_record_corr_id=c + 1),
            {"ph": "s", "cat": "ac2g", "id": c + 1, "ts": t + 2, "pid": 1, "tid": 1, "name": "ac2g"},
            {"ph": "f", "cat": "ac2g", "id": c + 1, "ts": t + 10.001, "pid": 0, "tid": 7, "name": "ac2g", "bp": "e"},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": t + 5, "pid": 1, "tid": 1, "s": "t",
             "args": {"Addr": 1234 + s, "Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048,
                      "Device Type": 1, "Device Id": 0}},
            {"ph": "C", "name": "GPU 0 Utilization", "ts": t, "pid": 0, "args": {"GPU Utilization": 0.5}},
        ]
    return ev


def doc_of(events: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return kineto_doc(events, baseTimeNanoseconds=BASE, cupti_version=22, **top)


def pretty(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


def kineto_text(doc: dict[str, Any]) -> bytes:
    """Kineto's own writer's layout: one event per line, ``},\\n  {`` between events."""
    events = doc["traceEvents"]
    head = orjson.dumps({k: v for k, v in doc.items() if k != "traceEvents"})[:-1]
    body = b",\n  ".join(orjson.dumps(e) for e in events)
    sep = b", " if head != b"{" else b""
    return head + sep + b'\n  "traceEvents": [\n  ' + body + b"\n]}\n"


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


LAYOUTS = {"compact": orjson.dumps, "indent2": pretty, "kineto": kineto_text}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("gz", [False, True])
def test_modern_trace_every_boundary(tmp_path: Path, layout: str, gz: bool, seams: tuple[int, ...]) -> None:
    data = LAYOUTS[layout](doc_of(modern_events()))
    m = assert_paths_agree(write(tmp_path, "t.json.gz" if gz else "t.json", data), chunks=seams)
    assert (m.cpu_ops.height, m.kernels.height, m.flows.height, m.memory_events.height) == (3, 3, 6, 3)
    assert m.steps["step"].to_list() == [0, 1, 2]
    assert m.kernels["ts_ns"].to_list() == [BASE + 10_001, BASE + 1_010_001, BASE + 2_010_001]
    assert m.warnings == ("ignored 3 counter ('C') events (GPU metrics / hardware counters)",)


TRICKY_NAMES = [
    "a},{b",
    "x}, {y",
    'q"},\n  {"r',
    "}{][",
    '{"ph": "X", "ts": 1}',
    'esc\\"aped \\"quotes\\"',
    "backslash at end \\",
    "\\\\",
    "unicode é ü 中文 🚀",
    "\u2028 line separator",
    "tab\tinside",
]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strings_with_brackets_quotes_and_unicode(tmp_path: Path, layout: str, seams: tuple[int, ...]) -> None:
    ev = modern_events(1)
    for i, name in enumerate(TRICKY_NAMES):
        ev.append(X("cpu_op", name, 2000 + i, 1.0, **{"External id": 100 + i, "Input type": [name, "}", '"'],
                                                     "Concrete Inputs": [name, "[1, 1]", ""]}))
        ev.append(X("user_annotation", name + "},{", 2000 + i, 1.0))
    m = assert_paths_agree(write(tmp_path, "t.json", LAYOUTS[layout](doc_of(ev))), chunks=seams)
    names = m.cpu_ops.filter(pl.col("external_id") >= 100)["name"].to_list()
    assert names == TRICKY_NAMES
    assert m.cpu_ops.filter(pl.col("external_id") == 100)["input_types"].item() == orjson.dumps(
        ["a},{b", "}", '"']).decode()
    assert m.cpu_ops.filter(pl.col("external_id") == 100)["concrete_inputs"].item() == orjson.dumps(
        ["a},{b", "[1, 1]", ""]).decode()


@pytest.mark.parametrize("layout, gz", [
    pytest.param("indent2", False, marks=pytest.mark.slow), pytest.param("kineto", False, marks=pytest.mark.slow),
    pytest.param("compact", False, marks=pytest.mark.slow), ("kineto", True)])
def test_truncated_file_at_many_points(tmp_path: Path, layout: str, gz: bool, seams: tuple[int, ...]) -> None:
    """A file cut off anywhere: both paths keep the same events and give the same warning.

    The ``chunks`` run reads every third cut file at the smaller chunk size and at 97 bytes,
    both ways (one region at a time, two at once), and the others at 97 bytes one way each,
    alternating; the slow set's ``every-byte`` run reads every third cut file at its
    every-byte seams only (the 97-byte reads being the ``chunks`` run's, for the same layout)."""
    data = LAYOUTS[layout](doc_of(modern_events(2)))
    kept = []
    # 30 cuts from a quarter of the file on (odd strides): inside strings, numbers,
    # keys, between events, in the args object and after the array.
    stride = len(data) // 40 | 1
    every_byte = seams == EVERY_BYTE
    for i, cut in enumerate(range(len(data) // 4, len(data), stride)):
        if every_byte and i % 3:
            continue
        p = tmp_path / (f"cut{cut}.json.gz" if gz else f"cut{cut}.json")
        if gz:
            z = gzip.compress(data)
            p.write_bytes(z[: max(20, len(z) * cut // len(data))])
        else:
            p.write_bytes(data[:cut])
        if every_byte:
            m = assert_paths_agree(p, chunks=(seams[0],))
        elif i % 3 == 0:
            m = assert_paths_agree(p, chunks=(seams[0], 97))
        else:  # one way each, alternating: the rolled-back regions on every other cut file
            m = assert_paths_agree(p, chunks=(97,), one_way=1 + i % 2)
        if not isinstance(m, tuple):
            kept.append(m.cpu_ops.height + m.kernels.height + m.annotations.height)
    assert kept and min(kept) < max(kept)  # the cuts really lose different amounts


def test_truncated_file_warning_text(tmp_path: Path, seams: tuple[int, ...]) -> None:
    data = kineto_text(doc_of(modern_events(3)))
    cut = data.index(b"[memory]", len(data) // 2)  # inside the 2nd step's [memory] event
    m = assert_paths_agree(write(tmp_path, "k.json", data[:cut]), chunks=seams)
    assert m.memory_events.height == 1 and m.steps.height == 2
    assert any("truncated or corrupt near byte" in w for w in m.warnings)


def test_invalid_tokens_and_control_characters(tmp_path: Path, seams: tuple[int, ...]) -> None:
    ev = modern_events(3)
    ev[4]["args"]["bandwidth"] = "@INF@"
    ev[5]["args"]["x"] = "@NAN@"
    ev[14]["args"]["y"] = "@NA@"
    ev[20]["name"] = "op@CTRL@name"
    for layout in ("indent2", "kineto", "compact"):
        text = (LAYOUTS[layout](doc_of(ev)).replace(b'"@INF@"', b"inf").replace(b'"@NAN@"', b"NaN")
                .replace(b'"@NA@"', b"N/A").replace(b"@CTRL@", b"\x01\x1f"))
        m = assert_paths_agree(write(tmp_path, f"{layout}.json", text), chunks=seams)
        assert "replaced 3 invalid JSON tokens (NaN/inf/N/A) with null" in m.warnings
        assert "replaced 2 raw control characters with spaces" in m.warnings
        assert m.kernels.height == 3 and "op  name" in m.cpu_ops["name"].to_list() + m.runtime["name"].to_list() + \
            m.kernels["name"].to_list() + m.memcpy["name"].to_list() + m.annotations["name"].to_list() + \
            m.python_frames["name"].to_list() + m.gpu_annotations["name"].to_list() + m.memset["name"].to_list() + \
            m.other_events["name"].to_list()


def test_raw_newline_inside_string(tmp_path: Path, seams: tuple[int, ...]) -> None:
    text = kineto_text(doc_of(modern_events(2))).replace(b"aten::mm", b"aten::\nmm", 1)
    m = assert_paths_agree(write(tmp_path, "nl.json", text), chunks=seams)
    assert "aten::\nmm" in m.cpu_ops["name"].to_list()
    assert "file is not strict JSON (raw whitespace control characters in strings)" in m.warnings


def test_bare_array_legacy(tmp_path: Path, seams: tuple[int, ...]) -> None:
    ev = [
        {"name": "aten::add", "ph": "X", "ts": 1.5, "dur": 2.25, "tid": 1, "pid": "CPU functions", "args": {}},
        {"name": "add_kernel", "ph": "X", "ts": 3.0, "dur": 1.0, "tid": "stream 0", "pid": "CUDA functions",
         "args": {}},
        {"name": "aten::mul", "ph": "X", "ts": 5, "dur": 1, "tid": 2, "pid": "CPU functions"},
    ]
    for layout in ("compact", "indent2"):
        p = write(tmp_path, f"arr_{layout}.json", LAYOUTS[layout](ev))
        m = assert_paths_agree(p, chunks=seams)
        assert m.meta.layout == "autograd-array" and m.cpu_ops["name"].to_list() == ["aten::add", "aten::mul"]
        assert m.kernels["stream"].to_list() == [0]
        cut = p.read_bytes()[:-20]
        assert_paths_agree(write(tmp_path, f"arr_{layout}_cut.json", cut), chunks=seams)


def test_odd_types_string_ids_float_ids_missing_fields(tmp_path: Path, seams: tuple[int, ...]) -> None:
    ev = modern_events(1) + [
        X("cpu_op", "string pid", 10, 1, pid="7", tid="stream 9", **{"External id": "12"}),
        X("cpu_op", "float ids", 11, 1, pid=7.0, tid=3.5, **{"External id": 13.0, "Sequence number": 2.5}),
        X("cpu_op", "text ids", 12, 1, pid="Spans", tid="x 5", **{"External id": "ext 14", "Ev Idx": "1.5"}),
        X("kernel", "k", 13, 1, pid="0", tid="stream 7", correlation="55", device="0", grid="[1,1,1]"),
        X("kernel", "k2", 14, 1, pid=0, tid=7, grid=[[1], 2], block=[1.5, 2]),
        X("runtime", "noargs", 15, 1),
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "string ts", "ts": "5", "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "ts": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "neg dur", "ts": 5, "dur": -1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "bool dur", "ts": 5, "dur": True, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "ts": 6, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": 42, "ts": 6, "dur": 1, "args": None},
        {"ph": "X", "cat": "cpu_op", "name": "list args", "ts": 6, "dur": 1, "args": [1, 2]},
        {"ph": "X", "name": "no cat", "ts": 6, "dur": 1},
        {"ph": "X", "cat": 5, "name": "int cat", "ts": 6, "dur": 1},
        {"ph": "X", "cat": "mystery", "name": "unknown cat", "ts": 6, "dur": 1, "pid": [1], "tid": {"a": 1}},
        {"ph": "B", "name": "begin", "ts": 1},
        {"name": "no ph", "ts": 1},
        {"ph": "s", "cat": "async_cpu_to_gpu", "id": "77", "ts": 3, "pid": 1, "tid": 1},
        {"ph": "f", "cat": "weird", "id": 7.0, "ts": 4.5, "pid": 1, "tid": 1},
        {"ph": "t", "id": 8, "ts": 4.5},
        {"ph": "s", "cat": "ac2g", "id": 9, "pid": 1},
        {"ph": "i", "name": "[memory]", "ts": 9, "pid": 1, "tid": 1, "args": {"Bytes": "64", "Addr": 1.0}},
        {"ph": "i", "name": "[OutOfMemory]", "ts": 10, "pid": 1, "tid": 1, "args": {"Bytes": 1 << 40}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "args": {}},
        {"ph": "i", "name": "Record Window End", "ts": 1e9},
        {"ph": "M", "name": "thread_name", "pid": "1", "tid": 2, "args": {"name": None}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3},
        3,
        "not an event",
        [1, 2],
        None,
    ]
    for layout in LAYOUTS:
        m = assert_paths_agree(write(tmp_path, f"{layout}.json", LAYOUTS[layout](doc_of(ev))), chunks=seams)
        ops = dict(zip(m.cpu_ops["name"].to_list(), m.cpu_ops.select("pid", "tid", "external_id").rows()))
        assert ops["string pid"] == (7, 9, 12)
        assert ops["float ids"] == (7, 3, 13)
        assert ops["text ids"] == (None, 5, 14)
        assert "skipped 4 items that are not JSON objects" in m.warnings


# One odd event (raw JSON text, so number spellings survive) among normal ones: with
# 1-byte chunks it is framed and decoded alone, so the columnar reader meets it
# without a neighbour that would send the chunk to the slow path anyway.
ODD_EVENTS = [
    b'{"ph":"X","cat":"cpu_op","name":1.0,"ts":5,"dur":1,"pid":1,"tid":1}',
    b'{"ph":"X","cat":"cpu_op","name":true,"ts":5,"dur":1,"pid":1,"tid":1}',
    b'{"ph":"X","cat":"cpu_op","name":["a"],"ts":5,"dur":1,"pid":1,"tid":1}',
    b'{"ph":"X","cat":true,"name":"a","ts":5,"dur":1,"pid":1,"tid":1}',
    b'{"ph":"X","cat":"mystery","name":"a","ts":5,"dur":1,"pid":1.0,"tid":2.5}',
    b'{"ph":"X","cat":"mystery","name":"a","ts":5,"dur":1,"pid":true,"tid":{"a":1}}',
    b'{"ph":"X","cat":"mystery","name":"a","ts":5,"dur":1,"pid":[1,2],"tid":null}',
    b'{"ph":"X","cat":"overhead","name":"a","ts":5,"dur":1,"pid":"CPU 1","tid":-3}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"pid":1e0,"tid":1E1}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":1e3,"Sequence number":-0.0}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":18446744073709551616}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":-9223372036854775808}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":"\xc2\xb2"}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":" 7 ","Ev Idx":"x\\t7"}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":true,"Fwd thread id":[1]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input type":[1,"x"],"Input Dims":[[1.5]]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input type":"float","Input Dims":"[1]"}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input Dims":[[1.0, 2], [3]]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Concrete Inputs":["", 1.0, "[1, 1]"]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Concrete Inputs":"False"}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input Strides":[[1.0, 2], [0]]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input Strides":"[1]","Input Dims":[[2], []]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Concrete Inputs":["a\\"b", true]}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":5,"dur":1,"args":{"grid":[1E0,1,1],"block":[1, 2 ,3 ]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":"{\\"External id\\": 5}"}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":5}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input type":["C:\\\\x","a\\nb"],"External id":9}}',
    b'{"ph":"M","name":"thread_name","pid":1,"tid":9,"args":{"name":"C:\\\\tmp\\u0001"}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input type":["\\u0001x"],"External id":9.0}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"External id":9.1e18,"Sequence number":1.5e-7}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Input type":["a\\"b","\\u00e9\\n"],"Input Dims":[[],'
    b'[[2]]]}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Collective name":5,"dtype":1.0}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":{"Collective name":"ar","dtype":"Float",'
    b'"In msg nelems":"12"}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":5,"dur":1,"pid":0,"tid":7,"args":{"grid":"[1,1,1]","block":[1,1,1]}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":5,"dur":1,"pid":0,"tid":7,"args":{"grid":[1,-1,2],"queued":1.5}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":5,"dur":1,"pid":"0","tid":"stream 7","args":{"device":"1","stream":'
    b'2.0}}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":"not an object"}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":[1,2]}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":1,"args":null}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":"5","dur":1}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":"1"}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":5,"dur":true}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":null,"dur":1}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":1669783687352244,"dur":0.0005}',
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":1.0000000000000002,"dur":1.5e-3}',
    b'{"ph":1,"name":"a","ts":5}',
    b'{"ph":"s","cat":"ac2g","name":"a","ts":5,"id":7.0,"pid":1,"tid":1}',
    b'{"ph":"f","cat":"ac2g","name":"a","ts":5,"id":"7.5","pid":1,"tid":1}',
    b'{"ph":"t","cat":5,"name":"a","ts":5,"id":"x 7"}',
    b'{"ph":"i","name":"[memory]","ts":5,"args":{"Bytes":-512.0,"Addr":"0x10"}}',
    b'{"ph":"M","name":"thread_name","pid":1,"tid":9,"args":{"name":7}}',
    b'{"ph":"M","name":"thread_name","pid":1,"tid":9,"args":{"name":1.5}}',
    b'{"ph":"M","name":"thread_name","pid":1,"tid":9,"args":["x"]}',
    b'{"ph":"X","cat":"cpu_op","n\\u0061me":"escaped key","ts":5,"dur":1}',
    b'{}',
    b'{"ph":"X","cat":"cpu_op","name":"record_param_comms","ts":5,"dur":1,"args":{"Collective name":"allreduce",'
    b'"Process Group Name":"0","Process Group Description":"default_pg"}}',
    b'{"ph":"X","cat":"cpu_op","name":"record_param_comms","ts":5,"dur":1,"args":{"Process Group Name":0,'
    b'"Process Group Description":1.5}}',
]


@pytest.mark.parametrize("odd", ODD_EVENTS, ids=range(len(ODD_EVENTS)))
def test_odd_event_alone(tmp_path: Path, odd: bytes, odd_seams: tuple[int, ...]) -> None:
    normal = [orjson.dumps(e) for e in modern_events(1)]
    body = b",\n  ".join([*normal[:3], odd, *normal[3:], odd])
    data = b'{"baseTimeNanoseconds": 1000, "traceEvents": [\n  ' + body + b"\n]}"
    m = assert_paths_agree(write(tmp_path, "odd.json", data), chunks=odd_seams)
    assert not isinstance(m, tuple) and m.kernels.height >= 1


def test_huge_and_precise_numbers(tmp_path: Path, seams: tuple[int, ...]) -> None:
    ev = modern_events(1) + [
        X("cpu_op", "abs us", 1_669_783_687_352_244, 7, **{"External id": 2**62}),
        X("cpu_op", "frac", 0.001, 0.0005),
        X("cpu_op", "exp", 1e3, 2.5e1, **{"External id": 1e3}),
        X("kernel", "big", 1, 1, correlation=2**63 - 1, device=0, stream=7, bytes=-1),
    ]
    for layout in ("compact", "kineto"):
        m = assert_paths_agree(write(tmp_path, f"{layout}.json", LAYOUTS[layout](doc_of(ev))), chunks=seams)
        assert m.cpu_ops.filter(pl.col("name") == "abs us")["external_id"].item() == 2**62


def test_trace_events_not_first_and_keys_after(tmp_path: Path, seams: tuple[int, ...]) -> None:
    ev = modern_events(2)
    top = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "A100", "warpSize": 32}],
           "distributedInfo": {"rank": 3, "world_size": 8}, "baseTimeNanoseconds": BASE}
    after = {"traceName": "x.json", "displayTimeUnit": "ms", "cuda_runtime_version": 12010,
             "with_stack": 1, "odd": '"]},{'}
    first = orjson.dumps({"traceEvents": ev, **top, **after})
    middle = orjson.dumps({**top, "traceEvents": ev, **after})
    for i, data in enumerate((first, middle, pretty(orjson.loads(middle)))):
        m = assert_paths_agree(write(tmp_path, f"o{i}.json", data), chunks=seams)
        assert (m.meta.rank, m.meta.trace_name, m.meta.display_time_unit) == (3, "x.json", "ms")
        assert m.meta.base_time_ns == BASE and m.meta.extra == {"odd": '"]},{'}
        assert m.meta.profiler_flags == {"with_stack": True}
    # A trailing key cut off mid-way (the job died while writing the footer).
    m = assert_paths_agree(write(tmp_path, "footcut.json", middle[:-15]), chunks=seams)
    assert any("truncated" in w for w in m.warnings) and m.kernels.height == 2


def test_nested_trace_events_key_is_not_the_array(tmp_path: Path, seams: tuple[int, ...]) -> None:
    data = orjson.dumps({"meta": {"traceEvents": [1]}, "note": '"traceEvents": [',
                         "traceEvents": modern_events(1)})
    m = assert_paths_agree(write(tmp_path, "n.json", data), chunks=seams)
    assert m.kernels.height == 1


def test_byte_order_mark(tmp_path: Path, seams: tuple[int, ...]) -> None:
    data = b"\xef\xbb\xbf" + kineto_text(doc_of(modern_events(1)))
    ref = assert_paths_agree(write(tmp_path, "bom.json", data), chunks=seams)
    assert ref == ("InputError", ref[1]) if isinstance(ref, tuple) else ref.kernels.height == 1


@pytest.mark.parametrize("content, problem", [
    (b'{"hello": "world"}', "JSON object without 'traceEvents'"),
    (b'{"schema": "1.0.3", "nodes": [], "pid": 1}', "Execution Trace"),
    (b'{"segments": [], "device_traces": []}', "memory snapshot in JSON form"),
    (b'{"traceEvents": {}}', "'traceEvents' is not an array"),
    (b'{"traceEvents": []}', "trace has no events"),
    (b'{"traceEvents": [ ]  , "x": 1}', "trace has no events"),
    (b"[]", "trace has no events"),
    (b"[1, 2, 3]", "not trace events"),
    (b'[{"a": 1}, {"b": 2}]', "not trace events"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}', "no usable events"),
    (b'{"traceEvents": [ {"ph": "X", "na', "not valid JSON"),
    (b'{"traceEvents": [', "not valid JSON"),
    (b'{"traceEvents"', "not valid JSON"),
    (b'"just a string"', "not a chrome trace"),
    (b"{]", "not valid JSON"),
    (b'{"traceEvents": [] garbage', "trace has no events"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1} {"ph": "X"}]}', "not valid JSON"),
])
def test_unusable_files_same_error(tmp_path: Path, content: bytes, problem: str) -> None:
    for name in ("bad.json", "bad.json.gz"):
        ref = assert_paths_agree(write(tmp_path, name, content), chunks=(1, 5, 4096))
        assert isinstance(ref, tuple) and problem in ref[1], ref


def test_many_chunks_with_repairs_in_one(tmp_path: Path) -> None:
    """A file of many default-sized chunks where one chunk needs the slow path."""
    ev = modern_events(400)
    ev[2000]["name"] = "@CTRL@"
    text = kineto_text(doc_of(ev)).replace(b'"@CTRL@"', b'"a\x02b"')
    for name in ("many.json", "many.json.gz"):
        p = write(tmp_path, name, text)
        m = assert_paths_agree(p, chunks=(8 << 10, 64 << 10))
        assert m.kernels.height == 400 and "replaced 1 raw control characters with spaces" in m.warnings


def test_load_dispatches_to_chunked_path(tmp_path: Path) -> None:
    p = write(tmp_path, "t.json.gz", kineto_text(doc_of(modern_events(2))))
    assert_same_model(load(p), load_chrome_trace_simple(p))


def test_lazy_bracket_scan_equals_numpy_scan() -> None:
    """``_brackets`` (pure Python, stops early) gives ``_structure``'s brackets and
    depths on every buffer that is valid JSON so far: random prefixes of documents with
    escaped quotes and brackets inside strings, and random bracket/quote soups (no
    backslash outside a string, which only invalid JSON has)."""
    import random

    from traceanalyzer.load.chrome_trace.framing import _brackets, _structure

    rng = random.Random(7)
    buffers: list[bytes] = []
    for _ in range(1500):
        doc = [{"a": 'x\\"]}{' * rng.randint(0, 2), "b": [1, {"c": "\\\\"}], "d": "[" * rng.randint(0, 3)}
               for _ in range(rng.randint(1, 4))]
        text = orjson.dumps(doc)
        buffers.append(text[1:rng.randint(1, len(text))])
    for _ in range(3000):
        buffers.append(bytes(rng.choice(b'{}[]" ab,:') for _ in range(rng.randint(0, 40))))
    for buf in buffers:
        br, ch, depth = _structure(buf, 1)
        assert list(_brackets(memoryview(buf), 1)) == list(zip(br.tolist(), ch.tolist(), depth.tolist())), buf


def test_plain_trace_load_does_not_import_numpy(tmp_path: Path) -> None:
    """numpy's import (0.14 s) is kept off the loader's path for a plain trace: its framing
    scans are pure Python. (The analyses import it when they run: the critical path's
    longest-path pass needs it on every GPU trace; ``pipeline.load`` imports it in a
    background thread while the loader runs, see the next test.)"""
    import subprocess
    import sys

    p = write(tmp_path, "t.json.gz", kineto_text(doc_of(modern_events(3))))
    code = ("import sys; from traceanalyzer.load import load\n"
            "model = load(sys.argv[1])\n"
            "assert model.kernels.height > 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy')[:3])")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_pipeline_load_warms_up_the_analyses_in_the_background(tmp_path: Path) -> None:
    """``pipeline.load`` starts one thread per process that imports numpy and every analysis
    and rule module while the input is parsed; the model and the registries are the same."""
    import subprocess
    import sys

    p = write(tmp_path, "t.json.gz", kineto_text(doc_of(modern_events(3))))
    code = ("import sys, threading\n"
            "from traceanalyzer import pipeline\n"
            "model = pipeline.load(sys.argv[1], use_cache=False)\n"
            "first = pipeline._warming\n"
            "pipeline.load(sys.argv[1], use_cache=False)\n"
            "assert pipeline._warming is first, 'one warm-up thread per process'\n"
            "first.join(60)\n"
            "mods = set(sys.modules)\n"
            "print(model.kernels.height > 0, 'numpy.ma' in mods, 'traceanalyzer.analyses.critical_path' in mods,\n"
            "      'traceanalyzer.rules.blocking_copies' in mods)")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"] * 4, out.stdout + out.stderr


@pytest.mark.parametrize("where", ["early", "middle", "last"])
def test_regions_decoded_ahead_roll_back_where_one_does_not_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Two regions at once: where a region the reader cannot take exactly (here a float
    pid, which other_events would keep as "1.0") sits among many, the regions cut after it
    are dropped and decoded again one at a time, and the model is the simple path's."""
    from traceanalyzer.load.chrome_trace import framing as chrome_trace

    ev = modern_events(40)
    at = {"early": 3, "middle": len(ev) // 2, "last": len(ev) - 2}[where]
    ev.insert(at, {"ph": "i", "name": "odd", "ts": 5.0, "pid": 1.0, "tid": 1, "s": "t"})
    path = write(tmp_path, "t.json", kineto_text(doc_of(ev)))
    rollbacks: list[int] = []
    original = chrome_trace._Rollback.__init__

    def counting(self: Any, carry: bytes) -> None:
        rollbacks.append(len(carry))
        original(self, carry)

    monkeypatch.setattr(chrome_trace._Rollback, "__init__", counting)
    ref = load_chrome_trace_simple(path)
    assert_same_model(ref, chunked(path, 2048, workers=2))
    # The last events are decoded in place, after the regions in flight are settled.
    want = 0 if where == "last" else 1
    assert len(rollbacks) == want
    assert_same_model(ref, chunked(path, 2048, workers=1))
    assert len(rollbacks) == want  # one region at a time never cuts ahead
    assert ref.other_events.height >= 1


# ---------------------------------------------------------------------------
# MTIA: device activity in ``mtia_ccp_events``
# ---------------------------------------------------------------------------


def mtia_events() -> list[dict[str, Any]]:
    """A few MTIA records as the MTIA activity profilers write them (device pid 17)."""
    return [
        X("cpu_op", "aten::add", 0, 100, pid=865, tid=1828, **{"External id": 1}),
        X("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", 10, 8, pid=865, tid=1828,
          correlation=5, device=17, stream_id=101, executable_name="remote"),
        X("mtia_runtime", "enqueueCommand memcpyHtoDAsync", 20, 1, pid=865, tid=1828,
          correlation=6, device=17, stream_id="101", **{"mem size": "2048 bytes"}),
        X("mtia_runtime", "synchronizeStream", 30, 60, pid=865, tid=1828, correlation=7, device=17, stream_id=101),
        X("mtia_runtime", "synchronize", 31, 1, pid=17, tid=3568, correlation=7, device=17, stream_id=101),
        X("mtia_ccp_events", "remote", 40, 30, pid=17, tid=3536, correlation=5, stream=101, column="0", row="0"),
        X("mtia_ccp_events", "pe_exe", 75, 10, pid=17, tid=3910, stream=112, column="0", row="0", packet_ptr=15),
        X("mtia_ccp_events", "dma_request", 22, 2.5, pid=17, tid=3536, correlation=6, stream=101,
          direction="HOST_TO_DEVICE", size=2048, sqid=8),
        X("mtia_ccp_events", "dma_request", 86, 1, pid=17, tid=3672, stream=105, direction="DEVICE_TO_HOST", size=1024),
        X("mtia_ccp_events", "dma_request", 87, 1, pid=17, tid=801, direction="SIDEWAYS", size=16),
        X("mtia_ccp_events", "event_record", 88, 0.1, pid=17, tid=3672, stream=105, seq_num=1, host_ctx=1),
        X("mtia_ccp_events", "event_wait", 70, 15, pid=17, tid=3774, stream=108, wait_on_stream=104, seq_num=2),
    ]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mtia_device_events_become_kernels_and_copies(tmp_path: Path, layout: str, seams: tuple[int, ...]) -> None:
    doc = kineto_doc(mtia_events(), baseTimeNanoseconds=BASE,
                     deviceProperties=[{"id": 17, "name": "ARTEMIS", "runtimeMajorVersion": 1}])
    m = assert_paths_agree(write(tmp_path, "mtia.json", LAYOUTS[layout](doc)), chunks=seams)
    assert m.meta.vendor == "mtia"
    assert m.warnings == ()
    k = m.kernels.sort("ts_ns")
    assert k.select("name", "device", "stream", "correlation", "dur_ns").rows() == [
        ("remote", 17, 101, 5, 30_000), ("pe_exe", 17, 112, None, 10_000),
    ]
    c = m.memcpy.sort("ts_ns")
    # No args.stream: the tid stands in, as for every device event.
    assert c.select("device", "stream", "correlation", "bytes", "kind", "src", "dst").rows() == [
        (17, 101, 6, 2048, "HtoD", None, None),
        (17, 105, None, 1024, "DtoH", None, None),
        (17, 801, None, 16, "unknown", None, None),
    ]
    assert c["dur_ns"].to_list() == [2_500, 1_000, 1_000]
    # Markers and waits are not device work.
    other = m.other_events.filter(pl.col("cat") == "mtia_ccp_events")
    assert sorted(other["name"].to_list()) == ["event_record", "event_wait"]
    rt = dict(zip(m.runtime["name"].to_list(), m.runtime.select("pid", "correlation").rows()))
    assert rt["synchronizeStream"] == (865, 7)
    assert rt["enqueueCommand memcpyHtoDAsync"] == (865, 6)
    assert m.runtime.height == 4 and set(m.runtime["cat"].to_list()) == {"mtia_runtime"}


MTIA_ODD = [
    b'{"ph":"X","cat":"mtia_ccp_events","name":"dma_request","ts":5,"dur":1,"pid":17,"tid":4,"args":{"size":2048.0,'
    b'"direction":"HOST_TO_DEVICE"}}',
    b'{"ph":"X","cat":"mtia_ccp_events","name":"dma_request","ts":5,"dur":1,"pid":17,"tid":4,"args":{"size":"2048",'
    b'"direction":5}}',
    b'{"ph":"X","cat":"mtia_ccp_events","name":"dma_request","ts":5,"dur":1,"pid":17,"tid":4,"args":{"size":"2 KB",'
    b'"direction":["HOST_TO_DEVICE"]}}',
    b'{"ph":"X","cat":"mtia_ccp_events","name":"dma_request","ts":5,"dur":1,"pid":17,"tid":4,"args":{"bytes":64,'
    b'"direction":{"a":1}}}',
    b'{"ph":"X","cat":"mtia_ccp_events","name":5,"ts":5,"dur":1,"pid":17,"tid":4,"args":{"stream":"1"}}',
    b'{"ph":"X","cat":"mtia_ccp_events","name":null,"ts":5,"dur":1,"pid":17,"args":{"stream":1.0}}',
    b'{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD (Pinned -> Device)","ts":5,"dur":1,"args":{"size":9,"bytes":8,'
    b'"direction":"DEVICE_TO_HOST"}}',
]


@pytest.mark.parametrize("odd", MTIA_ODD, ids=range(len(MTIA_ODD)))
def test_mtia_odd_event_alone(tmp_path: Path, odd: bytes, odd_seams: tuple[int, ...]) -> None:
    normal = [orjson.dumps(e) for e in modern_events(1) + mtia_events()]
    body = b",\n  ".join([*normal[:3], odd, *normal[3:], odd])
    data = b'{"baseTimeNanoseconds": 1000, "traceEvents": [\n  ' + body + b"\n]}"
    m = assert_paths_agree(write(tmp_path, "odd.json", data), chunks=odd_seams)
    assert not isinstance(m, tuple) and m.memcpy.height >= 3


def test_memcpy_direction_from_args_kind_on_both_paths(tmp_path: Path, seams: tuple[int, ...]) -> None:
    """A memcpy whose name does not say its direction (ROCm's ``CopyHostToDevice``,
    ``hipMemcpyAsync``) takes it from ``args.kind``; an unknown or non-string kind is ignored;
    a name that says it keeps it. Both decoders agree."""
    ev = modern_events(2)
    extra = [
        {"ph": "X", "cat": "gpu_memcpy", "name": "CopyHostToDevice", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 9001, "kind": "HtoD", "bytes": 4096}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "hipMemcpyAsync", "pid": 0, "tid": 7, "ts": 20, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 9002, "kind": 3, "bytes": 64}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7, "ts": 30,
         "dur": 5, "args": {"device": 0, "stream": 7, "correlation": 9003, "kind": "DtoH", "bytes": 64}},
    ]
    m = assert_paths_agree(write(tmp_path, "r.json", kineto_text(doc_of(ev + extra))), chunks=seams)
    got = dict(m.memcpy.filter(pl.col("correlation") >= 9001).select("name", "kind").iter_rows())
    assert got == {"CopyHostToDevice": "HtoD", "hipMemcpyAsync": "unknown", "Memcpy DtoH (Device -> Pinned)": "DtoH"}


# ---------------------------------------------------------------------------
# Damage in the middle of a file: both decoders give the same outcome
# ---------------------------------------------------------------------------

def _damaged(text: bytes, events: list[dict[str, Any]], k: int, how: str) -> bytes:
    """``text`` with damage of kind ``how`` at the start of event ``k``."""
    s = 0
    for i in range(k + 1):
        s = text.find(orjson.dumps(events[i])[:20], s + (1 if i else 0))
    if how == "bad_token":           # a corrupted event
        return text[:s + 1] + b'"oops": @@, ' + text[s + 1:]
    if how == "unterminated_string":  # a closing quote lost: every quote after it flips
        q = text.find(b'"', text.find(b'"', s + 1) + 1)
        return text[:q] + text[q + 1:]
    if how == "garbage_between":
        return text[:s] + b"#garbage# " + text[s:]
    if how == "object_cut_midway":   # an event cut short, the next one follows
        return text[:text.find(b",", s)] + b", " + text[s:]
    if how == "missing_comma":
        return text[:s].rstrip().rstrip(b",") + b" " + text[s:]
    if how == "extra_brace":
        return text[:s] + b"}," + text[s:]
    if how == "nul_bytes":           # repaired (control characters), not damage
        return text[:s + 5] + b"\x00\x01\x02" + text[s + 5:]
    assert how == "cut_off"          # a killed job: the file ends inside event k
    return text[:s + 25]


DAMAGE = ["bad_token", "unterminated_string", "garbage_between", "object_cut_midway", "missing_comma",
          "extra_brace", "nul_bytes", "cut_off"]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("layout, where", [("kineto", "middle"), ("kineto", "near_end"), ("kineto", "last_event"),
                                           ("compact", "middle")])
def test_damage_mid_file_same_outcome_on_both_decoders(tmp_path: Path, how: str, where: str, layout: str) -> None:
    """Policy (docs/input_formats.md, "Damaged input"): damage inside the events array that
    is not where the file ends is refused with one line naming the file and the first error's
    byte on both paths (cutting there would drop every event after it); a file cut off keeps
    the events before the cut, with the truncation warning; the repairs (control characters)
    keep everything on both."""
    events = modern_events(20)
    text = kineto_text(doc_of(events)) if layout == "kineto" else orjson.dumps(doc_of(events))
    k = {"middle": len(events) // 2, "near_end": len(events) - 8, "last_event": len(events) - 1}[where]
    f = write(tmp_path, "damaged.json", _damaged(text, events, k, how))
    ref = assert_paths_agree(f, chunks=(4096, 1 << 24))
    if how == "nul_bytes":
        assert not isinstance(ref, tuple) and "replaced 3 raw control characters with spaces" in ref.warnings
    elif how == "cut_off":
        assert not isinstance(ref, tuple)
        assert any(w.startswith("file is truncated or corrupt near byte") for w in ref.warnings)
        assert ref.table("kernels").height == sum(1 for e in events[:k] if e.get("cat") == "kernel")
    else:
        assert isinstance(ref, tuple), f"{how} at {where}: kept instead of refused"
        assert ref[1].startswith(f"{f}: not valid JSON (") and "\n" not in ref[1]
        assert " at byte " in ref[1]


@pytest.mark.parametrize("how", ["bad_token", "unterminated_string", "garbage_between", "missing_comma"])
def test_damage_past_the_fallback_size_is_refused_by_the_chunked_path(
        tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SIMPLE_FALLBACK_BYTES the chunked path refuses mid-file damage itself (the simple
    path's memory would be several times the file): the same outcome, refused."""
    from traceanalyzer.load.chrome_trace import framing

    monkeypatch.setattr(framing, "SIMPLE_FALLBACK_BYTES", 0)
    events = modern_events(20)
    f = write(tmp_path, "damaged.json", _damaged(kineto_text(doc_of(events)), events, len(events) // 2, how))
    for cb in (4096, 1 << 24):
        with pytest.raises(InputError, match=r"not valid JSON \(.*byte [\d,]+ of [\d,]+"):
            _ChunkedLoader(f, cb, 1).load()
    with pytest.raises(InputError):
        load_chrome_trace_simple(f)


def test_cuda_sync_args_on_both_decoders(tmp_path: Path) -> None:
    """cuda_sync records keep their correlation and wait_on_* args (other_events columns)."""
    f = write(tmp_path, "t.json", kineto_text(doc_of(modern_events(3))))
    ref = assert_paths_agree(f)
    for m in (ref, _ChunkedLoader(f, 1 << 20, 1).load()):
        sync = m.other_events.filter(pl.col("cat") == "cuda_sync").sort("ts_ns")
        assert sync["correlation"].to_list() == [4, 14, 24]
        assert sync["wait_on_stream"].to_list() == [7, 7, 7]
        assert sync["wait_on_cuda_event_record_corr_id"].to_list() == [1, 11, 21]


def _columnar(events: list[dict[str, Any]]) -> bool:
    """Whether the columnar decoder takes these events (as one newline-delimited region)."""
    from traceanalyzer.load.chrome_trace.ndjson import _fast_chunk, _NotFast

    try:
        _fast_chunk(b"\n".join(orjson.dumps(e) for e in events), False)
    except _NotFast:
        return False
    return True


@pytest.mark.parametrize(("odd", "columnar"), [
    pytest.param(X("cpu_op", "a", 1, 1, pid=7.0), True, id="float-pid-of-an-op"),  # _int reads 7.0 as 7
    pytest.param(X("other", "a", 1, 1, pid=7.0), False, id="float-pid-in-other_events"),  # str(pid) is "7.0"
    pytest.param(X("other", "a", 1, 1, tid=True), False, id="bool-tid-in-other_events"),
    pytest.param(X("other", "a", 1, 1, pid=7), True, id="int-pid-in-other_events"),
    pytest.param(X("cpu_op", "a", 1, 1, pid=9.2e18), False, id="huge-float-pid"),
    pytest.param({**X("cpu_op", "a", 1, 1), "args": '{"External id": 5}'}, False, id="string-args-like-an-object"),
    pytest.param({**X("cpu_op", "a\\b", 1, 1), "args": {"External id": 5}}, True, id="backslash-elsewhere"),
    # The struct read refuses a list ``args``; the two-pass read takes it (the simple path reads {}).
    pytest.param({**X("cpu_op", "a", 1, 1), "args": [1, 2]}, True, id="list-args"),
    pytest.param(X("kernel", "k", 1, 1, grid=[1.0, 1, 1]), False, id="float-in-grid"),
    pytest.param(X("kernel", "k", 1, 1, grid="[1, 1, 1]"), False, id="string-grid"),
    pytest.param(X("cpu_op", "a", 1, 1, **{"Input Dims": [[2.0]]}), False, id="float-in-dims"),
    pytest.param(X("cpu_op", "a", 1, 1, **{"Input type": ["float", 1]}), False, id="number-in-input-type"),
    pytest.param(X("cpu_op", "a", 1, 1, **{"Collective name": "allreduce", "dtype": 5}), False, id="number-dtype"),
    pytest.param(X("cpu_op", "a", 1, 1, **{"Collective name": "allreduce", "dtype": "Float"}), True,
                 id="string-dtype"),
])
def test_screens_send_exactly_the_blurred_values_to_the_exact_decoder(odd: dict[str, Any], columnar: bool) -> None:
    """The columnar decoder takes a region unless a value there is one its reader would blur
    (the exact decoder then takes it, and the models agree either way: the other tests);
    a region it refuses for nothing costs speed on every trace like it. (A float pid anywhere
    in a region whose other_events rows have number-like pids sends the region to the exact
    decoder: the base events here have no other_events row.)"""
    base = [e for e in modern_events(1) if e.get("cat") != "cuda_sync"]
    assert _columnar(modern_events(2))
    assert _columnar([*base, odd]) is columnar


def test_region_size_grows_with_the_file_up_to_its_cap(tmp_path: Path) -> None:
    """Regions are the base size below REGION_SCALE_BYTES (and for an unknown size), one
    more base per REGION_SCALE_BYTES above, at most MAX_REGION_SCALE times."""
    assert [region_scale(s) for s in (None, 0, 1, REGION_SCALE_BYTES - 1)] == [1, 1, 1, 1]
    assert region_scale(REGION_SCALE_BYTES) == 1
    assert region_scale(2 * REGION_SCALE_BYTES) == 2
    assert region_scale(3 * REGION_SCALE_BYTES + 5) == 3
    assert region_scale(1 << 40) == MAX_REGION_SCALE
    small = tmp_path / "small.json"
    small.write_bytes(orjson.dumps(kineto_doc([complete("cpu_op", "a", 1, 2)])))
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: only the size matters here
        f.truncate(3 * REGION_SCALE_BYTES)
    assert _ChunkedLoader(small, workers=2).chunk == PARALLEL_CHUNK_BYTES
    assert _ChunkedLoader(small, workers=1).chunk == CHUNK_BYTES
    assert _ChunkedLoader(big, workers=2).chunk == 3 * PARALLEL_CHUNK_BYTES
    assert _ChunkedLoader(big, workers=1, chunk_bytes=1000).chunk == 1000  # an explicit size wins


def test_gzip_files_scale_by_their_decompressed_size(tmp_path: Path) -> None:
    """A .json.gz's regions follow its trailer's ISIZE (the JSON's size), never less than
    the size on disk; the model is the same as with the base regions."""
    events = [complete("cpu_op", f"op{i}", i * 10, 5) for i in range(2000)]
    text = orjson.dumps(kineto_doc(events))
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    assert size_hint(gz) == len(text) > gz.stat().st_size
    plain = tmp_path / "t.json"
    plain.write_bytes(text)
    assert size_hint(plain) == len(text)
    assert size_hint(tmp_path / "missing.json") is None
    # A trailer claiming 3 scale steps of JSON: the regions grow, the model does not change.
    fake = tmp_path / "fake.json.gz"
    body = gzip.compress(text)
    fake.write_bytes(body[:-4] + (3 * REGION_SCALE_BYTES).to_bytes(4, "little"))
    assert _ChunkedLoader(fake, workers=2).chunk == 3 * PARALLEL_CHUNK_BYTES
    short = tmp_path / "short.gz"
    short.write_bytes(b"\x1f\x8b" + b"\0" * 8)  # too short to have a trailer
    assert size_hint(short) == 10
    small = load_chrome_trace(gz)
    base = _ChunkedLoader(gz, chunk_bytes=PARALLEL_CHUNK_BYTES).load()
    for name in SCHEMAS:
        assert_frame_equal(getattr(small, name), getattr(base, name))


def test_args_fields_read_where_their_key_is_late_or_escaped() -> None:
    """A region is read with only the args fields whose key it holds (ndjson._present): a
    key first seen past the head of a region, one the earlier regions never had, and one
    written with ``\\u`` escapes (the reader decodes it) are all read."""
    from traceanalyzer.load.chrome_trace.ndjson import ArgKeys, _fast_chunk

    filler = [X("cpu_op", f"op{i}", i, 1, **{"External id": i}) for i in range(2000)]  # > 64 KiB of text
    late = X("cpu_op", "late", 5000, 1, **{"External id": 7, "Sequence number": 11, "Fwd thread id": 3})
    seen = ArgKeys()
    seen.fields = frozenset({"External id", "Sequence number"})
    nd = b"\n".join(orjson.dumps(e) for e in [*filler, late])
    assert len(nd) > 64 << 10
    frames, _ = _fast_chunk(nd, False, seen)
    row = frames["cpu_ops"].filter(pl.col("name") == "late").row(0, named=True)
    assert (row["external_id"], row["seq_num"], row["fwd_thread_id"]) == (7, 11, 3)
    assert {"External id", "Sequence number", "Fwd thread id"} <= seen.fields
    escaped = b'{"ph": "X", "cat": "cpu_op", "name": "esc", "ts": 1, "dur": 1, "pid": 1, "tid": 1, ' \
              b'"args": {"Ext\\u0065rnal id": 9}}'
    frames, _ = _fast_chunk(escaped, False, ArgKeys())
    assert frames["cpu_ops"]["external_id"].to_list() == [9]


def test_args_name_read_only_where_a_thread_name_event_can_be() -> None:
    """``"name"`` is every event's own key, so ``_present`` reads the args ``name`` (only a
    thread_name event's is read) where the text holds ``thread_name"``, and where no other
    field is there (the struct is never empty); the thread's name is read either way."""
    from traceanalyzer.load.chrome_trace.ndjson import ArgKeys, _fast_chunk, _present

    ops = b"\n".join(orjson.dumps(X("cpu_op", f"op{i}", i, 1, **{"External id": i})) for i in range(3))
    assert _present(ops, False, ArgKeys()) == ["External id"]
    thread = orjson.dumps({"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker"}})
    seen = ArgKeys()
    seen.fields = frozenset({"External id", "name"})  # an earlier region had a thread_name event
    assert _present(ops, False, seen) == ["External id"]
    assert _present(ops + b"\n" + thread, False, seen) == ["External id", "name"]
    frames, _ = _fast_chunk(ops + b"\n" + thread, False, ArgKeys())
    assert frames["threads"].rows() == [(1, 2, "worker")]
    bare = orjson.dumps(X("cpu_op", "bare", 1, 1))
    assert _present(bare, False, ArgKeys()) == ["name"]
    frames, _ = _fast_chunk(bare, False, ArgKeys())
    assert frames["cpu_ops"]["name"].to_list() == ["bare"]
