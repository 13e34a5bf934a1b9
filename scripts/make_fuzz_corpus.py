#!/usr/bin/env python3
"""Write a small, deterministic corpus of damaged and hostile inputs (issue 19).

    python scripts/make_fuzz_corpus.py OUTDIR [--seed N]

One function per class; each file name starts with its class. Every file is small
(under ~200 KB): the bombs that need volume (gzip whitespace bombs, large memo fan-out)
are built by ``tests/test_fuzz_corpus.py`` at test time against a lowered budget.

The hostile pickles carry payloads that would create a file named ``PWNED_MARKER``
(``os.system`` through ``REDUCE``, ``builtins.eval`` through ``GLOBAL``) in the current
directory or next to the corpus if they ever ran; the loader must never run them.
Importable: ``from make_fuzz_corpus import generate``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The file a pickle payload would create if the loader ever executed it.
MARKER_NAME = "PWNED_MARKER"


def _events(n: int = 40) -> list[dict[str, Any]]:
    """CPU ops, their runtime launches and GPU kernels: enough for every trace analysis."""
    ev: list[dict[str, Any]] = []
    for i in range(n):
        t = 100.0 * i
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::mm{i % 4}", "ts": t, "dur": 40.0,
                   "pid": 1, "tid": 1, "args": {"External id": i, "Sequence number": i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 5, "dur": 8.0,
                   "pid": 1, "tid": 1, "args": {"External id": i, "correlation": 1000 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": f"sm80_gemm_{i % 3}", "ts": t + 20, "dur": 60.0,
                   "pid": 0, "tid": 7, "args": {"External id": i, "correlation": 1000 + i, "device": 0,
                                                "stream": 7, "grid": [1, 1, 1], "block": [128, 1, 1]}})
    for s in range(4):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": 1000.0 * s,
                   "dur": 1000.0, "pid": 1, "tid": 1, "args": {}})
    return ev


def _doc(events: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [],
                           "traceEvents": _events() if events is None else events}
    doc.update(top)
    return doc


def _dump(obj: Any, indent: bool = False) -> bytes:
    return json.dumps(obj, indent=1 if indent else None, allow_nan=True).encode()


# --- trace classes ----------------------------------------------------------------------

def truncated(out: Path, rng: random.Random) -> None:
    """Valid traces cut at several points (a job killed while writing), plain and gzip."""
    data = _dump(_doc(), indent=True)
    for frac in (0.0, 0.01, 0.3, 0.5, 0.77, 0.999):
        (out / f"truncated_{int(frac * 1000):03d}.json").write_bytes(data[: int(len(data) * frac)])
    z = gzip.compress(data)
    for frac in (0.1, 0.6):
        (out / f"truncated_gz_{int(frac * 100):02d}.json.gz").write_bytes(z[: int(len(z) * frac)])
    # cut in the middle of a string / of a number
    i = data.index(b'"sm80_gemm_1"') + 5
    (out / "truncated_in_string.json").write_bytes(data[:i])


def wrong_top_level(out: Path, rng: random.Random) -> None:
    """Documents whose top level, or traceEvents, has the wrong type."""
    for name, obj in {"list_of_ints": [1, 2, 3], "string": "hello", "number": 42, "null": None,
                      "events_dict": {"traceEvents": {"a": 1}}, "events_string": {"traceEvents": "x"},
                      "events_of_lists": {"traceEvents": [[1, 2], [3]]}, "empty_object": {},
                      "empty_events": {"traceEvents": []}}.items():
        (out / f"wrong_top_{name}.json").write_bytes(_dump(obj))


def non_finite(out: Path, rng: random.Random) -> None:
    """NaN, Infinity, 1e308 and 2**70 in ts, dur and ids."""
    for label, val in {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"),
                       "huge": 1e308, "big_int": 2**70, "negative": -1e18}.items():
        for field in ("ts", "dur", "ids"):
            ev = _events(30)
            for e in ev[::5]:
                if field == "ids":
                    e["args"]["External id"] = val
                    e["args"]["correlation"] = val
                    e["pid"] = val
                else:
                    e[field] = val
            (out / f"nonfinite_{field}_{label}.json").write_bytes(_dump(_doc(ev)))


def missing_fields(out: Path, rng: random.Random) -> None:
    """Events missing ph, ts, dur, name, pid/tid, args."""
    for f in ("ph", "ts", "dur", "name", "pid", "args", "cat"):
        ev = _events(30)
        for e in ev[::2]:
            e.pop(f, None)
        (out / f"missing_{f}.json").write_bytes(_dump(_doc(ev)))


def wrong_types(out: Path, rng: random.Random) -> None:
    """args of the wrong type, and fields of the wrong type."""
    variants: dict[str, Callable[[dict[str, Any]], None]] = {
        "args_list": lambda e: e.__setitem__("args", [1, 2]),
        "args_string": lambda e: e.__setitem__("args", "x"),
        "name_dict": lambda e: e.__setitem__("name", {"a": [1]}),
        "ts_string": lambda e: e.__setitem__("ts", "12ab"),
        "dur_list": lambda e: e.__setitem__("dur", [5]),
        "ph_number": lambda e: e.__setitem__("ph", 7),
        "extid_string": lambda e: e["args"].__setitem__("External id", "seven")
        if isinstance(e.get("args"), dict) else None,
        "stream_dict": lambda e: e["args"].__setitem__("stream", {"s": 1})
        if isinstance(e.get("args"), dict) else None,
    }
    for name, fn in variants.items():
        ev = _events(30)
        for e in ev[1::3]:
            fn(e)
        (out / f"wrongtype_{name}.json").write_bytes(_dump(_doc(ev)))


def deep_nesting(out: Path, rng: random.Random) -> None:
    """Deeply nested arrays in args, as an event, at the top level (past the depth limit:
    refused with the depth reached), and a real trace's depth in args (loads)."""
    deep = b"[" * 5000 + b"]" * 5000
    ev = _dump(_doc(_events(10)))
    (out / "deep_args.json").write_bytes(ev.replace(b'"args": {}', b'"args": {"x": ' + deep + b"}", 1))
    (out / "deep_top.json").write_bytes(b'{"traceEvents": ' + deep + b"}")
    (out / "deep_unclosed.json").write_bytes(b"[" * 100_000)
    deep = b"[" * 90_000 + b"]" * 90_000
    (out / "deep_event_90k.json").write_bytes(ev.replace(b'"traceEvents": [', b'"traceEvents": [' + deep + b", ", 1))
    (out / "deep_args_shallow.json").write_bytes(ev.replace(b'"args": {}', b'"args": {"x": [[[[1]]]]}', 1))


def budget_trace(out: Path, rng: random.Random) -> None:
    """Inputs for the event and string limits, small enough for the corpus: they load under
    the default budget and trip a lowered one (``TRACEANALYZER_MAX_EVENTS``,
    ``TRACEANALYZER_MAX_STRING_BYTES``) in tests/test_fuzz_corpus.py."""
    tiny = b'{"ph":"X","cat":"cpu_op","name":"a","ts":%d,"dur":1,"pid":1,"tid":1}'
    (out / "events_many_tiny.json").write_bytes(
        b'{"traceEvents":[' + b",".join(tiny % i for i in range(2500)) + b"]}")
    ev = _events(10)
    ev[0]["name"] = "x" * 150_000
    (out / "string_long_name.json").write_bytes(_dump(_doc(ev)))
    ev = _events(10)
    ev[3]["name"] = "é\"😀\\" * 6_000
    (out / "string_long_escapes.json").write_bytes(_dump(_doc(ev)))


def bom(out: Path, rng: random.Random) -> None:
    """A UTF-8 byte-order mark, and UTF-16 text."""
    data = _dump(_doc())
    (out / "bom_utf8.json").write_bytes(b"\xef\xbb\xbf" + data)
    (out / "bom_utf16.json").write_bytes(data.decode().encode("utf-16"))


def gzip_odd(out: Path, rng: random.Random) -> None:
    """Two gzip members, a gzip of non-JSON, a gzip with trailing garbage."""
    data = _dump(_doc())
    half = len(data) // 2
    (out / "gzip_two_members.json.gz").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    (out / "gzip_non_json.json.gz").write_bytes(gzip.compress(b"this is not json at all\n" * 100))
    (out / "gzip_trailing_garbage.json.gz").write_bytes(gzip.compress(data) + b"\x00garbage")
    (out / "gzip_header_only.json.gz").write_bytes(gzip.compress(b"")[:10])


def random_bytes(out: Path, rng: random.Random) -> None:
    """Random bytes under trace and snapshot names."""
    for i, name in enumerate(("random.json", "random.pickle", "random.json.gz", "random.pickle.gz")):
        (out / f"random_{i}_{name}").write_bytes(rng.randbytes(4096 + 1000 * i))
    (out / "random_empty.json").write_bytes(b"")
    (out / "random_empty.pickle").write_bytes(b"")


def execution_trace(out: Path, rng: random.Random) -> None:
    """A PyTorch execution trace (ExecutionTraceObserver), not a Kineto trace."""
    nodes = [{"id": i, "name": f"aten::add_{i}", "ctrl_deps": max(i - 1, 0), "inputs": {"values": [i]},
              "outputs": {"values": [i + 1]}, "attrs": [{"name": "rf_id", "type": "uint64", "value": i}]}
             for i in range(50)]
    (out / "exectrace_pytorch_et.json").write_bytes(_dump(
        {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "2024-01-01", "start_ts": 0, "nodes": nodes,
         "finish_ts": 100}))


def osc_escapes(out: Path, rng: random.Random) -> None:
    """Terminal escape sequences (OSC 52 clipboard write, OSC 8 link, CSI clear) in names."""
    ev = _events(30)
    nasty = ["\x1b]52;c;cHduZWQ=\x07evil", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "\x1b[2J\x1b[Hclr",
             "\x9b31mc1", "bidi\u202eexe.txt", "nul\x00byte"]
    for i, e in enumerate(ev):
        if e["cat"] == "kernel":
            e["name"] = nasty[i % len(nasty)] + e["name"]
    (out / "osc_kernel_names.json").write_bytes(_dump(_doc(ev, deviceProperties=[{"name": "\x1b]0;title\x07GPU"}])))


# --- pickle classes ---------------------------------------------------------------------

def _snapshot(n_blocks: int = 8) -> dict[str, Any]:
    blocks = [{"address": 4096 * (i + 1), "size": 4096, "requested_size": 4000, "state": "active_allocated",
               "frames": [{"name": f"fn{i}", "filename": "train.py", "line": i}]} for i in range(n_blocks)]
    segs = [{"device": 0, "address": 4096, "total_size": 4096 * n_blocks, "allocated_size": 4096 * n_blocks,
             "active_size": 4096 * n_blocks, "requested_size": 4000 * n_blocks, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
             "blocks": blocks}]
    traces = [[{"action": "alloc", "addr": 4096 * (i + 1), "size": 4096, "stream": 0, "time_us": i,
                "frames": [{"name": f"fn{i}", "filename": "train.py", "line": i}]} for i in range(n_blocks)]]
    return {"segments": segs, "device_traces": traces, "allocator_settings": {"expandable_segments": False}}


class _Reduce:
    """Pickles as REDUCE(os.system, (cmd,)): would run a shell command if ever unpickled."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> tuple[Any, ...]:
        import os
        return (os.system, (self.cmd,))


def hostile_pickles(out: Path, rng: random.Random) -> None:
    """REDUCE of os.system, GLOBAL of builtins.eval, inside and around a snapshot."""
    marker = (out / MARKER_NAME).resolve()
    cmd = f"touch {marker} {MARKER_NAME}"
    snap = _snapshot()
    (out / "pickle_reduce_os_system.pickle").write_bytes(pickle.dumps(_Reduce(cmd), protocol=2))
    snap2 = _snapshot()
    snap2["allocator_settings"] = _Reduce(cmd)
    (out / "pickle_reduce_in_snapshot.pickle").write_bytes(pickle.dumps(snap2, protocol=4))
    snap3 = _snapshot()
    snap3["segments"][0]["blocks"][0]["frames"][0]["name"] = _Reduce(cmd)
    (out / "pickle_reduce_in_frame.pickle.gz").write_bytes(gzip.compress(pickle.dumps(snap3, protocol=4)))
    # protocol 0 GLOBAL of builtins.eval with a REDUCE of an expression creating the marker
    expr = f"open({str(marker)!r}, 'w').close() or open({MARKER_NAME!r}, 'w').close()"
    glob = b"cbuiltins\neval\n(V" + expr.encode() + b"\ntR."
    (out / "pickle_global_eval.pickle").write_bytes(glob)
    # the same GLOBAL inside a valid snapshot dict (protocol 0 framing)
    body = pickle.dumps(snap, protocol=0)
    assert body.startswith(b"(dp0") and body.endswith(b"s.")
    inj = body[:-1] + b"Vevil\n" + glob[:-1] + b"s."
    (out / "pickle_global_eval_in_snapshot.pickle").write_bytes(inj)
    # STACK_GLOBAL (protocol 4) of posix.system
    sg = (b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93\x94"
          + b"X" + len(cmd.encode()).to_bytes(4, "little") + cmd.encode() + b"\x94\x85\x94R\x94.")
    (out / "pickle_stack_global_system.pickle").write_bytes(sg)


def memo_laughs(out: Path, rng: random.Random) -> None:
    """Memo reuse: a few hundred bytes naming 2**40 objects ("billion laughs")."""
    x: list[Any] = [1]
    for _ in range(40):
        x = [x, x]
    snap = _snapshot()
    snap["segments"][0]["segment_pool_id"] = x
    (out / "laughs_pool_id.pickle").write_bytes(pickle.dumps(snap, protocol=4))
    snap = _snapshot()
    snap["extra"] = x
    (out / "laughs_extra.pickle").write_bytes(pickle.dumps(snap, protocol=4))
    (out / "laughs_bare.pickle").write_bytes(pickle.dumps(x, protocol=2))


def deep_snapshots(out: Path, rng: random.Random) -> None:
    """Snapshot pickles nested 100,000 deep, three ways (nested 1-tuples, EMPTY_LIST pushes
    closed by single APPENDs, lists built one memo reference inside the next): a few hundred
    KB of opcodes, refused by ``max_depth``."""
    head = b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x01x\x94"
    n = 100_000
    (out / "snapshot_deep_tuples.pickle").write_bytes(head + b"K\x01" + b"\x85" * n + b"u.")
    (out / "snapshot_deep_appends.pickle").write_bytes(head + b"]" * (n // 2) + b"a" * (n // 2 - 1) + b"u.")
    (out / "snapshot_deep_memo.pickle").write_bytes(head + b"]q\x000" + b"]h\x00aq\x000" * (n // 4) + b"h\x00u.")


def damaged_snapshots(out: Path, rng: random.Random) -> None:
    """Non-string frame names, nested pool ids, a cut-short file, protocols 0/1, duplicate block addresses."""
    s = _snapshot()
    for b in s["segments"][0]["blocks"]:
        b["frames"][0]["name"] = [1, 2]
        b["frames"][0]["line"] = "x"
    (out / "snapshot_nonstring_frames.pickle").write_bytes(pickle.dumps(s, protocol=4))
    s = _snapshot()
    s["segments"][0]["segment_pool_id"] = [[[1, 2], [3]], 4]
    s["segments"][0]["blocks"][0]["size"] = "big"
    (out / "snapshot_nested_pool_id.pickle").write_bytes(pickle.dumps(s, protocol=4))
    data = pickle.dumps(_snapshot(200), protocol=4)
    for frac in (0.2, 0.5, 0.9):
        (out / f"snapshot_cut_{int(frac * 100)}.pickle").write_bytes(data[: int(len(data) * frac)])
    # protocols 0 and 1 (no PROTO opcode): read like the others, whole or cut short
    (out / "snapshot_protocol0.pickle").write_bytes(pickle.dumps(_snapshot(), protocol=0))
    data = pickle.dumps(_snapshot(200), protocol=1)
    (out / "snapshot_protocol1_cut_60.pickle").write_bytes(data[: int(len(data) * 0.6)])
    s = _snapshot()
    for b in s["segments"][0]["blocks"]:
        b["address"] = 4096
    (out / "snapshot_duplicate_blocks.pickle").write_bytes(pickle.dumps(s, protocol=4))
    s = _snapshot()
    s["segments"] = {"not": "a list"}
    s["device_traces"] = "nope"
    (out / "snapshot_wrong_containers.pickle").write_bytes(pickle.dumps(s, protocol=4))
    (out / "snapshot_not_a_dict.pickle").write_bytes(pickle.dumps([1, "a", None], protocol=4))
    s = _snapshot()
    s["device_traces"][0][0]["action"] = ["alloc"]
    s["device_traces"][0][1]["addr"] = float("nan")
    s["device_traces"][0][2]["size"] = 2**70
    (out / "snapshot_bad_trace_entries.pickle").write_bytes(pickle.dumps(s, protocol=4))


CLASSES: tuple[Callable[[Path, random.Random], None], ...] = (
    truncated, wrong_top_level, non_finite, missing_fields, wrong_types, deep_nesting, budget_trace, bom, gzip_odd,
    random_bytes, execution_trace, osc_escapes, hostile_pickles, memo_laughs, deep_snapshots, damaged_snapshots,
)


def generate(outdir: Path | str, seed: int = 0) -> list[Path]:
    """Write every class into ``outdir`` (created); return the files written, sorted.

    Byte-identical for one seed and one ``outdir``: the pickle payloads embed the absolute
    path of their marker file."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for fn in CLASSES:
        fn(out, rng)
    return sorted(p for p in out.iterdir() if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    files = generate(a.outdir, a.seed)
    print(f"{len(files)} files, {sum(p.stat().st_size for p in files):,} bytes in {a.outdir}")


if __name__ == "__main__":
    main()
