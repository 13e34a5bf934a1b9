#!/usr/bin/env python3
"""Build a large, allocator-consistent CUDA memory snapshot for measuring the loader.

Uses ``../shared/tools/make_snapshot_like.py`` (exact schema of any release 2.0…2.13).
The size is steered by ``--steps`` (≈ 60 trace entries per step and layer group);
``--target-mb`` picks the number of steps for a target file size instead.

    python scripts/make_big_snapshot.py -o bench_data/big100.pickle --target-mb 100
    python scripts/make_big_snapshot.py -o bench_data/big1g.pickle --target-mb 1000   # 5-9 min

Small files are one ``pickle.dump`` (protocol 4: frames, ``MEMOIZE``, as
``torch.cuda.memory._dump_snapshot`` writes them). Above ``--stream-mb`` (default
150 MB) the snapshot would not fit in memory as Python objects (≈ 500 B per trace
entry in the simulator), so it is **streamed**: trace entries are pickled in chunks
of 100k as the simulation makes them, each chunk by a fresh protocol-2 pickler
(``BINPUT`` memo indices restart per chunk, which ``pickle.load`` accepts), and the
file is assembled as ``PROTO``, segments, the streamed ``device_traces``, settings,
annotations. ``pickle.load`` of either kind gives the same structure. The generator
then stays under ≈ 400 MB whatever the size.

Then measure::

    /usr/bin/time -v traceanalyzer memory bench_data/big100.pickle -o /tmp/big100.out -q
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

SHARED_TOOLS = Path(__file__).resolve().parents[2] / "shared" / "tools"

# Measured with --version 2.13 --context all --layers 12: bytes of pickle per step.
_BYTES_PER_STEP_12_LAYERS = 6_300
_CHUNK_ENTRIES = 100_000


def _body(obj: Any) -> bytes:
    """``obj`` pickled with protocol 2, without the PROTO header and the STOP."""
    data = pickle.dumps(obj, protocol=2)
    assert data[:2] == b"\x80\x02" and data[-1:] == b"."
    return data[2:-1]


def _list_items(items: list[Any]) -> bytes:
    """Opcodes that append ``items`` to the list on top of the unpickler's stack: the
    pickle of the list minus its own EMPTY_LIST + BINPUT 0 (nothing refers to it)."""
    body = _body(items)
    assert body[:3] == b"]q\x00", body[:8]
    return body[3:]


class _TraceSpool:
    """Pickled trace entries of device 0, spooled to a temporary file."""

    def __init__(self, directory: Path) -> None:
        self.file: BinaryIO = tempfile.TemporaryFile(dir=directory)  # type: ignore[assignment]
        self.n = 0

    def write(self, entries: list[dict[str, Any]]) -> None:
        if entries:
            self.file.write(_list_items(entries))
            self.n += len(entries)


def _streamed(mod: Any, out: Path, protocol: int, make_args: tuple[Any, ...], make_kw: dict[str, Any]) -> int:
    spool = _TraceSpool(out.parent)

    class SpoolingSim(mod.Sim):  # type: ignore[misc, name-defined]
        def record(self, action, addr, size, stream, device, frames, pool=(0, 0)):  # type: ignore[no-untyped-def]
            super().record(action, addr, size, stream, device, frames, pool)
            t = self.traces[device]
            if len(t) >= _CHUNK_ENTRIES:
                if device != 0:
                    raise SystemExit("streamed generation supports one device")
                spool.write(t)
                t.clear()

    real_sim = mod.Sim
    mod.Sim = SpoolingSim
    try:
        snap = mod.make_snapshot(*make_args, **make_kw)
    finally:
        mod.Sim = real_sim
    leftover = snap["device_traces"][0] if snap["device_traces"] else []
    spool.write(leftover)
    with out.open("wb") as fh:
        fh.write(b"\x80" + bytes([protocol]) + b"}")                # PROTO, the top-level dict
        fh.write(_body("segments") + _body(snap["segments"]) + b"s")
        fh.write(_body("device_traces") + b"]]")                    # outer list, device 0's list
        spool.file.seek(0)
        shutil.copyfileobj(spool.file, fh, 16 << 20)
        fh.write(b"as")                                            # APPEND device 0, SETITEM
        for key, value in snap.items():
            if key not in ("segments", "device_traces"):
                fh.write(_body(key) + _body(value) + b"s")
        fh.write(b".")
    spool.file.close()
    return spool.n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--target-mb", type=float, default=None, help="approximate output size in MB")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--version", default="2.13")
    ap.add_argument("--context", default="all", choices=["none", "state", "alloc", "all"])
    ap.add_argument("--stacks", default="python", choices=["python", "all"])
    ap.add_argument("--max-entries", type=int, default=None, help="emulate the ring buffer")
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--protocol", type=int, default=4)
    ap.add_argument("--stream-mb", type=float, default=150.0,
                    help="stream the trace to disk above this estimated size (MB)")
    a = ap.parse_args()
    if not SHARED_TOOLS.exists():
        sys.exit(f"needs {SHARED_TOOLS}/make_snapshot_like.py")
    sys.path.insert(0, str(SHARED_TOOLS))
    import make_snapshot_like  # type: ignore[import-not-found]

    per_step = _BYTES_PER_STEP_12_LAYERS * a.layers / 12
    steps = a.steps
    if a.target_mb:
        steps = max(2, int(a.target_mb * 1e6 / per_step))
    stream = steps * per_step / 1e6 > a.stream_mb
    if stream and a.max_entries:
        sys.exit("--max-entries needs the whole trace in memory: use a smaller size or a larger --stream-mb")
    make_args = (a.version, None if a.context == "none" else a.context, a.stacks, steps, a.layers)
    make_kw = dict(seed=1, max_entries=a.max_entries, with_oom=a.oom)
    out = Path(a.output)
    t0 = time.perf_counter()
    if stream:
        n = _streamed(make_snapshot_like, out, a.protocol, make_args, make_kw)
        segs = "-"
    else:
        snap = make_snapshot_like.make_snapshot(*make_args, **make_kw)
        with out.open("wb") as fh:
            pickle.dump(snap, fh, protocol=a.protocol)
        n = sum(len(t) for t in snap["device_traces"])
        segs = str(len(snap["segments"]))
    size = out.stat().st_size
    print(f"wrote {out}: {size / 1e6:.1f} MB, steps={steps}, trace entries={n:,}, segments={segs}, "
          f"{'streamed' if stream else 'one pickle.dump'} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
