"""torch.profiler / Kineto chrome-trace JSON → :class:`~traceanalyzer.model.TraceModel`.

Handles every layout from PyTorch 1.8 to today (see
``../shared/reference/TRACE_FORMAT_AND_RULES.md`` part B):

* JSON object with ``traceEvents`` (Kineto) or a bare event array (autograd exporter);
* capitalised legacy categories (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``,
  ``Memset``) and the modern ones; ``gpu_user_Annotation`` typo;
* flow names of every era (``async``/``launch``, ``async_cpu_to_gpu``/``async_gpu``,
  ``forward_backward``/``fwd_bwd``, ``ac2g``/``fwdbwd``);
* timestamps as integer absolute µs, fractional µs (ns resolution) relative to
  ``baseTimeNanoseconds``, or floats relative to the profiler start;
* string pids/tids (``"stream 7"``, ``"Spans"``, numeric strings);
* NVIDIA (cuda*/cu*), AMD ROCm (hip* under ``cuda_runtime``), Intel XPU
  (``xpu_runtime``/``xpu_driver``), MTIA runtimes.

The package's parts, in the order an event meets them:

* :mod:`.framing`: the byte stream cut into regions of whole events, and the driver
  of the chunked path (regions decoded ahead, rollback, the array's end and tail);
* :mod:`.ndjson`: the columnar decoder (polars' NDJSON reader), with the screens that
  send a region it cannot take exactly to the exact decoder;
* :mod:`.exact`: the per-event decoder (orjson and a Python loop), which defines the
  semantics;
* :mod:`.vocabulary`: which category, phase or name means which table or kind;
* :mod:`.raw`: the raw tables both decoders fill, the value limits they share;
* :mod:`.assembly`: raw tables + top-level keys → the model, its meta and warnings.

Two paths give the same model (``tests/test_chunked_loader.py`` checks every table,
dtype, meta field and warning on every shared/sample trace and on hand-made edge
cases, with chunks down to one event).

* The simple path (:func:`load_chrome_trace_simple`, :func:`build_model`) reads the
  whole file, decodes it with orjson and sorts events into row tuples in a Python
  loop. It defines the semantics. Its memory is the decoded document, several times
  the file's size.
* The chunked path (:func:`load_chrome_trace`, the default) streams the
  ``traceEvents`` array (gzip decompressed on the fly by
  :class:`~traceanalyzer.load.jsonio.ByteStream`, never whole) in chunks of
  ``CHUNK_BYTES`` cut at event boundaries. Each chunk becomes newline-delimited JSON
  that polars' reader (Rust) decodes into typed columns of only the fields the model
  needs, in one pass with ``args`` as a struct of only the fields whose key the chunk
  holds (the reader's cost grows with the struct's fields); polars expressions sort
  the rows into tables.
  No Python object per event. Two chunks are decoded at once where polars has two
  threads (``_ChunkedLoader``: the reader keeps two cores busy, the rest of a chunk's
  work one), in chunks of ``PARALLEL_CHUNK_BYTES``. Memory: the model's columns plus
  the chunks' transients, each many times the chunk (the reader's parse buffers, the
  NDJSON copies): bounded by the chunk size, never the decoded document. Figures are
  in docs/performance.md.

Exactness: the reader blurs some JSON types (it reads ``1.0`` into a string column as
"1", a string where a list is expected as the list's text, …), so each chunk is
screened for such values (``_SUSPECT_ARGS``…) and any chunk it cannot take exactly (odd
types, NaN/inf tokens, control characters, a non-object item …) is decoded by the
simple path's per-event loop with the same repairs.
Known, accepted difference: an event object with a duplicate key (the reader keeps
the first value, orjson the last; RFC 8259 leaves it undefined). Damage in the
middle of the events array (not a file cut off) is refused by both paths with the
first error's position (:func:`~traceanalyzer.load.jsonio.damage_inside_events`);
the chunked path hands such a file to the simple path up to
:data:`~traceanalyzer.load.chrome_trace.framing.SIMPLE_FALLBACK_BYTES`, so the line
is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceanalyzer.errors import InputError
from traceanalyzer.load.budget import Budget
from traceanalyzer.load.chrome_trace.assembly import _assemble, _refuse_object
from traceanalyzer.load.chrome_trace.exact import _collect_events
from traceanalyzer.load.chrome_trace.framing import _ChunkedLoader, _Unframed
from traceanalyzer.load.chrome_trace.guard import clip_strings, max_depth
from traceanalyzer.load.jsonio import parse_json, read_bytes
from traceanalyzer.model.trace import TraceModel


def load_chrome_trace(path: str | Path) -> TraceModel:
    """Load one chrome-trace file (``.json``, ``.json.gz``, any supported layout).

    Streams the ``traceEvents`` array in chunks (the chunked path, see the module
    docstring and this module's lower half): memory holds one chunk of text plus the
    model's columns, never the whole decoded document. Files whose framing is unusual (no
    ``traceEvents`` near the top, a byte-order mark, not an object or array) go
    through :func:`load_chrome_trace_simple`, which gives the same model.

    Raises :class:`InputError` with a one-line reason when the file is not a usable
    trace; recoverable damage becomes ``TraceModel.warnings``.
    """
    p = Path(path)
    try:
        return _ChunkedLoader(p).load()
    except _Unframed:
        return load_chrome_trace_simple(p)


def load_chrome_trace_simple(path: str | Path) -> TraceModel:
    """The simple path: read the whole file, decode it, one Python loop over events.

    The reference semantics of the loader (the chunked path must give the same
    model); also the path for files the chunked reader cannot frame.

    The input budget (:mod:`traceanalyzer.load.budget`) holds here too: strings past the
    string limit are cut before decoding (one counted warning), JSON nested past the depth
    limit is refused before decoding, and more events than the event limit are refused
    before the event loop (the whole document is in memory on this path by design).
    """
    p = Path(path)
    budget = Budget.from_env()
    data, warnings = read_bytes(p, budget)
    data, n_clipped, longest, open_len = clip_strings(data, budget.max_string_bytes)
    if n_clipped:
        warnings.append(budget.string_warning(n_clipped, max(longest, open_len)))
    depth, at = max_depth(data, 0)
    if depth > budget.max_depth:
        raise budget.depth_exceeded(p, depth, at)
    parsed = parse_json(p, data, events=True)
    del data
    warnings.extend(parsed.warnings)
    return build_model(p, parsed.doc, warnings, budget)


def build_model(path: Path, doc: Any, warnings: list[str] | None = None, budget: Budget | None = None) -> TraceModel:
    """Build the model from an already-decoded document (dict or bare array); more events
    than ``budget.max_events`` (default: :meth:`Budget.from_env`) are refused."""
    autograd_array = False
    if isinstance(doc, list):
        events = doc
        top: dict[str, Any] = {}
        autograd_array = True
        if events and not any(isinstance(e, dict) and "ph" in e for e in events[:100]):
            raise InputError(path, "a JSON array whose items are not trace events (no 'ph' fields)")
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            _refuse_object(path, doc)
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise InputError(path, "not a chrome trace: 'traceEvents' is not an array")
        top = {k: v for k, v in doc.items() if k != "traceEvents"}
    else:
        raise InputError(path, f"not a chrome trace: top-level JSON {type(doc).__name__}")
    budget = budget or Budget.from_env()
    if len(events) > budget.max_events:
        raise budget.events_exceeded(path, len(events))
    frames, stats = _collect_events(events, autograd_array)
    del events
    return _assemble(path, top, autograd_array, {t: [f] for t, f in frames.items()}, stats, list(warnings or []))


__all__ = ["build_model", "load_chrome_trace", "load_chrome_trace_simple"]
