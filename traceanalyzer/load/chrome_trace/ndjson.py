"""The columnar decoder: a region of whole events, rewritten as newline-delimited JSON,
read by polars' reader into typed columns of only the fields the model needs, then
split into raw tables by polars expressions. No Python object per event.

The reader blurs some JSON types (``1.0`` read into a string column gives "1", a
string where a list is expected gives the list's text, …), so the text of each region
is screened for such values (``_SUSPECT_ARGS``, ``_SUSPECT_TOP``, ``_SUSPECT_IDS``) where
the columns read show that one could be there (:func:`_screen`, :func:`_screen_ids`);
a region it cannot take exactly raises :class:`_NotFast` and goes to the exact decoder
(:mod:`.exact`).
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from traceanalyzer.load.chrome_trace.raw import (
    _OUT_OF_RANGE_FLOW,
    _OUT_OF_RANGE_MEM,
    _OUT_OF_RANGE_X,
    _RAW_SCHEMAS,
    MAX_ABS_US,
    _Stats,
)
from traceanalyzer.load.chrome_trace.vocabulary import (
    _KNOWN_PH,
    CAT_TABLE,
    COUNTER_CAT,
    FLOW_KIND,
    KNOWN_OTHER_CATS,
    MEMCPY_ARG_KIND,
    MTIA_CCP_CAT,
    MTIA_DIRECTION,
    MTIA_DMA,
    MTIA_NOT_BUSY,
)

# LF/CR → TAB: both are whitespace between tokens, so the text keeps its meaning, and
# a raw LF inside a string (not strict JSON) becomes a raw TAB, which the strict
# reader refuses: that chunk then takes the slow path and gets the simple path's
# "not strict JSON" treatment.
_NL_TO_TAB = bytes.maketrans(b"\n\r", b"\t\t")


def _nl_to_tab(text: bytes) -> bytes:
    """``text`` with LF/CR as TAB (see :data:`_NL_TO_TAB`). Without a CR, ``replace`` of the
    one byte: it copies the text once and finds each LF with ``memchr``, several times
    faster than ``translate``'s pass over every byte."""
    return text.translate(_NL_TO_TAB) if b"\r" in text else text.replace(b"\n", b"\t")


# args fields read as integers (``_int``/``_num`` in the simple path).
_INT_ARGS = (
    "External id", "external id", "Sequence number", "Fwd thread id", "Ev Idx", "Profiler Event Index",
    "In msg nelems", "Out msg nelems", "Group size", "Python id", "Python parent id", "correlation",
    "cbid", "cid", "device", "stream", "registers per thread", "shared memory", "queued", "graph id",
    "bytes", "Device Type", "Device Id", "Addr", "Bytes", "Total Allocated", "Total Reserved", "size",
    "wait_on_stream", "wait_on_cuda_event_record_corr_id",
)
# ``direction`` (MTIA DMA) is only looked up in MTIA_DIRECTION, ``kind`` (a memcpy's) in
# MEMCPY_ARG_KIND: a non-string value that the reader turns into text matches no key, as in the
# simple path, so neither needs a screen.
_STR_ARGS = ("Collective name", "dtype", "name", "Process Group Name", "Process Group Description", "direction",
             "kind", "Call stack")
_DIMS_ARGS = ("Input Dims", "Input Strides", "grid", "block")  # JSON text; lists of ints
_ARG_NAMES = (*_INT_ARGS, *_STR_ARGS, *_DIMS_ARGS, "Input type", "Concrete Inputs")
_INT_TEXT = r"(?s)^(?:.* )?(-?[0-9]+)$"  # ``_int`` on a string: the number, or the last word's
_FLOAT_TEXT = r"^-?(?:[0-9]+\.[0-9]*|\.[0-9]+)$"
_DIMS_TEXT = r"^[\[\]0-9, \-]*$"


# Values the reader would turn into the same text as a different JSON value, so that
# the simple path's result depends on a type the columnar frame no longer knows:
# a non-string where a string is read (``1.0`` → "1" where ``str`` gives "1.0",
# ``true`` → "true" where ``str`` gives "True"), a string where a list of ints is read
# (``"[1,1,1]"`` is text, ``_json_text`` quotes it), a float in a list of ints
# (``[1.0]`` → "[1]"), a non-string in "Input type" or "Concrete Inputs", a string ``args`` (its text could
# read as an object). Any match sends the chunk to the slow path; a false match (the
# pattern inside a string) costs only speed. The patterns run after the read (the
# text is then known to be valid UTF-8), and only those that can matter there (see
# :func:`_screen`): a blurred value is never null, so a field with no value in the chunk
# needs no scan. Each runs alone (a pattern with one literal prefix is found by a
# substring search, an alternation of several is scanned far more slowly) in Python's
# ``re`` on the bytes: as fast per chunk as polars' engine, without its copy of the
# text and its working memory of several times the text. ``\s`` is ASCII there, which
# only matters outside JSON's own whitespace, where the reader refuses the chunk anyway.
_SUSPECT_ARGS = (
    # A string args: its text (unescaped) could read as an object.
    r'"args"\s*:\s*"',
    r'"Collective name"\s*:\s*[^"n\s]',
    r'"dtype"\s*:\s*[^"n\s]',
    r'"Process Group (?:Name|Description)"\s*:\s*[^"n\s]',
    r'"grid"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"block"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"Input Dims"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"Input Strides"\s*:\s*(?:[^\[n\s]|\[[\[\]0-9,\s-]*[.eE])',
    r'"Input type"\s*:\s*(?:[^\[n\s]|\[(?:\s*"(?:[^"\\]|\\.)*"\s*,)*\s*[^"\s\]])',
    r'"Concrete Inputs"\s*:\s*(?:[^\[n\s]|\[(?:\s*"(?:[^"\\]|\\.)*"\s*,)*\s*[^"\s\]])',
)
# Keys in every event: their columns are screened first (a value that *could* have
# been a non-string: starts with a digit, ``-``, ``[``, ``{``, or is true/false), and
# only a chunk the screen flags pays for the raw scan.
_SUSPECT_TOP = (
    r'"name"\s*:\s*[^"n\s]',
    r'"cat"\s*:\s*[^"n\s]',
    r'"ph"\s*:\s*[^"n\s]',
)
# A float or non-scalar pid/tid: ``other_events`` keeps ``str(pid)`` ("1.0", "True"),
# which the reader's text ("1", "true") does not give back (elsewhere ``_int`` reads
# "1" and 1.0 alike): see :func:`_screen_ids`.
_SUSPECT_IDS = (
    r'"pid"\s*:\s*(?:[^"n\s0-9-]|-?[0-9]+[.eE])',
    r'"tid"\s*:\s*(?:[^"n\s0-9-]|-?[0-9]+[.eE])',
)


def _any_of(patterns: tuple[str, ...]) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


def _rx(pattern: str) -> re.Pattern[bytes]:
    return re.compile(pattern.encode())


_RX_IDS = _rx(_any_of(_SUSPECT_IDS))
_HUGE_ID = 9_200_000_000_000_000_000 - 1
_RX_TOP = _rx(_any_of(_SUSPECT_TOP))
# args fields read as text whose columns tell a blurred value (see :func:`_screen`).
_STR_SCREENED = ("Collective name", "dtype", "Process Group Name", "Process Group Description")
# The args patterns by field (the first, a string ``args``, is keyed by ``args``).
# Each without its leading ``"``: Python's ``re`` finds a literal prefix by scanning for its
# first character, and ``"`` is everywhere (a match without the ``"`` is one more place
# where the slow path decides).
_ARG_SCREENS = dict(zip(("args", *_STR_SCREENED[:2], "Process Group", "grid", "block", "Input Dims", "Input Strides",
                         "Input type", "Concrete Inputs"), (_rx(p.removeprefix('"')) for p in _SUSPECT_ARGS),
                        strict=True))
_NON_STRING_TEXT = r"^(?:[-0-9\[{]|true$|false$)"


class _NotFast(Exception):
    """A chunk the columnar reader cannot take exactly."""


def _args_schema(ints_as_text: bool) -> dict[str, Any]:
    it: Any = pl.String if ints_as_text else pl.Int64
    args: dict[str, Any] = {k: it for k in _INT_ARGS}
    args.update({k: pl.String for k in (*_STR_ARGS, *_DIMS_ARGS)})
    args["Input type"] = pl.List(pl.String)
    args["Concrete Inputs"] = pl.List(pl.String)
    return args


def _nd_schema(args: Any) -> dict[str, Any]:
    return {
        "ph": pl.String, "cat": pl.String, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
        "pid": pl.String, "tid": pl.String, "id": pl.String, "args": args,
    }


_ARGS_SCHEMAS = (_args_schema(False), _args_schema(True))
# An args field the region does not hold: a null column (the expressions built once).
_NULL_ARGS = [{k: pl.lit(None, dtype).alias("a." + k) for k, dtype in schema.items()} for schema in _ARGS_SCHEMAS]
# Two passes: ``args`` as the reader's JSON text, then those texts as NDJSON of their own.
_ND_TOP_SCHEMA = _nd_schema(pl.String)
_ND_TOP_COLS = [k for k in _ND_TOP_SCHEMA if k != "args"]
_ARG_COLS = ["a." + k for k in _ARG_NAMES]


def _int_text(e: pl.Expr) -> pl.Expr:
    """``_int`` of a value the reader gave as text (a JSON number or string)."""
    return e.str.strip_chars().str.extract(_INT_TEXT, 1).cast(pl.Int64, strict=False)


def _int_column(s: pl.Series) -> pl.Series:
    """``_int_text`` of a column: a plain cast, and the regex only on the rows the cast
    does not take (the common case has none, and the regex on every row is costly).
    ``cast`` alone would also read ``"+7"`` (``_int`` gives None) and refuses
    ``"stream 7"``. A fractional number as text could have been a JSON float (``_int``
    truncates it) or a string (``_int`` gives None): only the slow path can tell, and
    such text never casts, so only those rows need the check."""
    c = s.cast(pl.Int64, strict=False)
    odd = (c.is_null() & s.is_not_null()) | s.str.starts_with("+")
    if not odd.any():
        return c
    idx = odd.arg_true()
    rows = s.gather(idx)
    if rows.str.strip_chars().str.contains(_FLOAT_TEXT).any():
        raise _NotFast("fractional number as an id")
    fixed = rows.to_frame().select(_int_text(pl.col(s.name))).to_series()
    return c.scatter(idx, fixed)


def _matches(nd: bytes, pattern: re.Pattern[bytes]) -> bool:
    """Whether ``pattern`` occurs in the chunk's text (which the reader has read: valid UTF-8)."""
    return pattern.search(nd) is not None


def _screen(nd: bytes, df: pl.DataFrame, backslash: bool) -> None:
    """Raise :class:`_NotFast` where a value the reader read (``df``, the chunk ``nd``
    read) may have been blurred (see ``_SUSPECT_ARGS``). Only what can matter is scanned:

    * an args field with no value in the chunk cannot hold a blurred one; a string field
      (``_STR_SCREENED``) is scanned only where a value reads like a non-string's text;
    * a string ``args`` reads as an object in the two-pass read only where its text has a
      ``"``, escaped in the chunk: a chunk without a backslash needs no scan;
    * a float or non-scalar pid/tid changes only ``other_events`` (``str(pid)``; elsewhere
      ``_int`` reads "1" and 1.0 alike, and the text of a fractional or non-scalar one
      reads as no id, as ``_int`` gives): see :func:`_screen_ids`.
    """
    patterns: list[re.Pattern[bytes]] = []
    if backslash:
        patterns.append(_ARG_SCREENS["args"])
    n = df.height
    for k, pattern in _ARG_SCREENS.items():
        if k == "args":
            continue
        keys = ["Process Group Name", "Process Group Description"] if k == "Process Group" else [k]
        cols = [df.get_column("a." + key) for key in keys]
        if all(c.null_count() == n for c in cols):
            continue
        if k in _STR_SCREENED or k == "Process Group":
            if not any(c.str.contains(_NON_STRING_TEXT).any() for c in cols):
                continue
        patterns.append(pattern)
    # One scan per pattern: each has one literal prefix (see above).
    if any(_matches(nd, p) for p in patterns):
        raise _NotFast("a value of a type the reader would blur")


# Whether a name or cat read may be the reader's text of a non-string (``_SUSPECT_TOP``): a
# scalar of :func:`_fast_tables`' counts query (the phases, few, are checked on the region's
# distinct phases); only where one reads like one is the chunk scanned (:data:`_RX_TOP`).
_TOP_FLAG = (
    (pl.col("name").str.contains(_NON_STRING_TEXT) & ~pl.col("name").is_in(["[memory]", "[OutOfMemory]"])).any()
    | pl.col("cat").str.contains(_NON_STRING_TEXT).any()
)
_NON_STRING_PY = re.compile(r"[-0-9\[{]|true\Z|false\Z")  # _NON_STRING_TEXT, with ``match``


def _screen_ids(nd: bytes, other: pl.DataFrame | None) -> None:
    """Raise :class:`_NotFast` where ``other_events`` (the raw frame) may hold the reader's text of
    a float, boolean or non-scalar pid/tid (``str`` of it differs): only where a pid/tid
    there reads like one is the chunk scanned."""
    if other is None or not other.height:
        return
    pid, tid = other.get_column("pid"), other.get_column("tid")
    if (pid.str.contains(_NON_STRING_TEXT).any() or tid.str.contains(_NON_STRING_TEXT).any()) and _matches(
            nd, _RX_IDS):
        raise _NotFast("a value of a type the reader would blur")


def _A(k: str) -> pl.Expr:
    return pl.col("a." + k)


def _fast_chunk(nd: bytes, autograd_array: bool, seen: ArgKeys | None = None) -> tuple[dict[str, pl.DataFrame], _Stats]:
    """Newline-delimited events → raw table frames and counts, or :class:`_NotFast`
    (``seen``: the args fields of the file's earlier regions, see :class:`ArgKeys`)."""
    if COUNTER_CAT.encode() in nd:  # counter args are free-form: the exact decoder keeps them
        raise _NotFast("CUPTI counter events")
    backslash = b"\\" in nd
    df, ints_as_text = _read(nd, backslash, seen)
    try:
        _screen(nd, df, backslash)
        frames, stats = _fast_tables(df, ints_as_text, autograd_array, nd)
        del df
        _screen_ids(nd, frames.get("other_events"))
        return frames, stats
    except _NotFast:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _NotFast(str(exc)) from None


class ArgKeys:
    """The args fields found so far in one file's regions: where to look first. The reader
    looks each field of a struct up in every object (cost ∝ fields × keys), so a region
    is read with a struct of only the fields whose key its text holds (:func:`_present`);
    those of the earlier regions are looked for in its head, with a bounded search each.
    Shared by the regions decoded at once: what it holds changes only the speed."""

    def __init__(self) -> None:
        self.fields: frozenset[str] = frozenset()


# The keys of the args fields as regexes. In the text a key can differ from its name only by
# ``\u`` escapes (the other escapes give characters no field name has): see :func:`_present`.
_KEY_RX = {k: re.escape(k) for k in _ARG_NAMES}
_KEY_TEXT = {k: f'"{k}"'.encode() for k in _ARG_NAMES}
_HEAD = 64 << 10


def _present(nd: bytes, backslash: bool, seen: ArgKeys | None) -> list[str]:
    """The args fields to read for the chunk ``nd``: a superset of those whose key it holds
    (a field read but absent is all null). The fields of the file's earlier regions are
    looked for in the chunk's head (a bounded search each); every other key by one scan
    of Rust's regex engine for all of them. The args ``name`` is read only where a
    ``thread_name`` event can be (the only one whose ``name`` the tables read): ``"name"``
    is also every event's own key."""
    if backslash and b"\\u" in nd:  # a key could be written with escapes
        return list(_ARG_NAMES)
    found: set[str] = set()
    if seen is not None:
        found.update(k for k in seen.fields if k != "name" and nd.find(_KEY_TEXT[k], 0, _HEAD) >= 0)
    rest = [_KEY_RX[k] for k in _ARG_NAMES if k != "name" and k not in found]
    text = pl.Series([nd], dtype=pl.Binary).cast(pl.String, strict=False)
    if text.null_count():  # not UTF-8: the reader refuses it
        return list(_ARG_NAMES)
    # ``key"`` (any ``"key"`` holds it): a pattern that starts with ``"`` is scanned
    # several times more slowly (``"`` is everywhere). Matches do not overlap, but one
    # cannot hide a ``"key"``: a match ends at a ``"`` and holds no other (and no key
    # ends with ``thread_name``).
    hits = text.str.extract_all("(?:" + "|".join([*rest, "thread_name"]) + ')"').explode().unique()
    found.update("name" if h == 'thread_name"' else h[:-1] for h in hits.drop_nulls().to_list())
    if not found:  # the struct is never empty
        found.add("name")
    if seen is not None and not found <= seen.fields:
        seen.fields = seen.fields | found
    return [k for k in _ARG_NAMES if k in found]


def _read(nd: bytes, backslash: bool, seen: ArgKeys | None) -> tuple[pl.DataFrame, bool]:
    """The events with ``args`` flattened to ``a.<key>`` columns (every field of
    ``_ARG_NAMES``, those not read all null), and whether the int fields were read as
    text (a value the Int64 column refuses: ``_int_column`` then reads them)."""
    fields = _present(nd, backslash, seen)
    for ints_as_text, full in enumerate(_ARGS_SCHEMAS):
        schema = _nd_schema(pl.Struct({k: full[k] for k in fields}))
        try:
            df = pl.read_ndjson(nd, schema=schema)
        except Exception:  # noqa: BLE001 - a refusal: the other schema, then the two passes
            continue
        # The reader cuts its columns in pieces of its own; the null columns are one piece:
        # made one piece here, else every expression over both would align them again.
        df = df.rechunk().with_columns(pl.col("args").struct.rename_fields(["a." + k for k in fields])).unnest("args")
        missing = [_NULL_ARGS[ints_as_text][k] for k in _ARG_NAMES if k not in fields]
        if missing:
            df = df.with_columns(missing)
        return df.select(*_ND_TOP_COLS, *_ARG_COLS), bool(ints_as_text)
    return _read_two_passes(nd)


def _read_two_passes(nd: bytes) -> tuple[pl.DataFrame, bool]:
    r"""As :func:`_read`, for a chunk whose ``args`` are not all objects (null, a list,
    a number …: the struct column refuses them, the simple path reads them as ``{}``):
    ``args`` is first read as text (the reader re-serialises the object) and those texts
    are then read as NDJSON rows of their own. The re-serialisation does not escape
    backslashes or control characters, so a chunk whose ``args`` text has a ``\`` goes
    to the exact decoder."""
    try:
        top = pl.read_ndjson(nd, schema=_ND_TOP_SCHEMA)
    except Exception:  # noqa: BLE001
        raise _NotFast("reader refused the chunk") from None
    args = top.get_column("args")
    if args.str.contains("\\", literal=True).any():
        raise _NotFast("args text with a backslash")
    # Non-object args (null, a list, a number) read as {} in the simple path too.
    lines = pl.when(pl.col("args").str.starts_with("{")).then(pl.col("args")).otherwise(pl.lit("{}"))
    nd2 = top.select(lines.str.join("\n")).item().encode()
    # The reader cuts its columns in pieces of its own, which differ between the two reads:
    # each frame is made one piece here, while it is small (the first without its args
    # texts), else the first expression over both would copy the whole frame at once.
    top = top.drop("args").rechunk()
    del args
    a: pl.DataFrame | None = None
    ints_as_text = False
    for schema in _ARGS_SCHEMAS:
        try:
            a = pl.read_ndjson(nd2, schema=schema)
        except Exception:  # noqa: BLE001
            ints_as_text = True
            continue
        break
    del nd2
    if a is None or a.height != top.height:
        raise _NotFast("args texts the reader refused")
    a = a.rechunk()
    return top.hstack([c.alias(new) for c, new in zip(a.get_columns(), _ARG_COLS)]), ints_as_text


_OTHER = "\x00other"  # the _table of a duration event that goes to other_events
_PLUS = "\x00plus"  # suffix: whether an id column has a value written with a "+"
# The id columns read as text and cast to Int64, by whether the int args were too.
_INT_COLS = (["pid", "tid", "id"], ["pid", "tid", "id", *("a." + k for k in _INT_ARGS)])


def _cast_int(c: str) -> pl.Expr:
    return pl.col(c).cast(pl.Int64, strict=False)


# The region's row classes (see _fast_tables), built once: building expressions costs as
# much as running them on a small region.
_PH, _TS, _DUR = pl.col("ph"), pl.col("ts"), pl.col("dur")
_IS_X = _PH == "X"
_IN_RANGE = (_TS.abs() <= MAX_ABS_US) & (_DUR <= MAX_ABS_US)
_HAS_TS = _IS_X & _TS.is_not_null()
_TS_OK = _TS.abs() <= MAX_ABS_US
_IS_FL = (_PH == "s") | (_PH == "f") | (_PH == "t")
_IS_MEM = ((_PH == "i") | (_PH == "I")) & ((pl.col("name") == "[memory]") | (pl.col("name") == "[OutOfMemory]"))
_IS_TH = (_PH == "M") & (pl.col("name") == "thread_name")
_VALID_X = (_IS_X & _TS.is_not_null() & _DUR.is_not_null() & (_DUR >= 0) & _IN_RANGE).fill_null(False)
_COUNTS = [
    # A pid/tid this large could be the text of a float that ``_int`` refuses (|v| ≥ 9.2e18):
    # :func:`_screen` does not scan pids (see :func:`_screen_ids`), so the slow path decides.
    pl.any_horizontal(_cast_int(c).is_between(-_HUGE_ID, _HUGE_ID).not_() for c in ("pid", "tid")).any().alias("huge"),
    (_IS_X & _TS.is_null()).sum().alias("no_ts"), (_HAS_TS & _DUR.is_null()).sum().alias("no_dur"),
    (_HAS_TS & (_DUR < 0)).sum().alias("neg"), (_HAS_TS & (_DUR >= 0) & ~_IN_RANGE).sum().alias("far"),
    (_IS_FL & _TS.is_null()).sum().alias("fl_no_ts"),
    (_IS_FL & _TS.is_not_null() & ~_TS_OK).sum().alias("fl_far"), _IS_MEM.sum().alias("n_mem"),
    (_IS_MEM & _TS.is_null()).sum().alias("mem_no_ts"), (_IS_MEM & _TS.is_not_null() & ~_TS_OK).sum().alias("mem_far"),
    _IS_TH.sum().alias("n_th"),
    # The phases in order of first appearance (null included) and their counts.
    _PH.unique(maintain_order=True).implode().alias("ph_values"), _PH.unique_counts().implode().alias("ph_counts"),
    _PH.head(100).is_null().all().alias("no_ph_head"), _TOP_FLAG.alias("top"),
]


def _x_table(autograd_array: bool) -> tuple[pl.Expr, pl.Expr]:
    """The table of each valid duration event (null elsewhere; ``_OTHER`` for other_events),
    and its category (``_xcat``: a bare event of an autograd array gets one)."""
    table = pl.col("cat").replace_strict(CAT_TABLE, default=None, return_dtype=pl.String)
    cat = pl.col("cat")
    if autograd_array:
        bare = table.is_null() & cat.is_null()
        cuda = pl.col("pid_s").str.starts_with("CUDA").fill_null(False)
        table = (pl.when(bare).then(pl.when(cuda).then(pl.lit("kernels")).otherwise(pl.lit("cpu_ops")))
                 .otherwise(table))
        cat = pl.when(bare).then(pl.when(cuda).then(pl.lit("Kernel")).otherwise(pl.lit("Operator"))).otherwise(cat)
    xname = pl.col("name").fill_null("")
    table = (
        pl.when(pl.col("cat") == MTIA_CCP_CAT)
        .then(
            pl.when(xname == MTIA_DMA).then(pl.lit("memcpy"))
            .when(xname.is_in(MTIA_NOT_BUSY)).then(pl.lit(None, pl.String))
            .otherwise(pl.lit("kernels"))
        )
        .otherwise(table)
        .fill_null(pl.lit(_OTHER))
    )
    return pl.when(_VALID_X).then(table).alias("_table"), cat.alias("_xcat")


_X_TABLE = {a: _x_table(a) for a in (False, True)}
_FLOW_KIND = pl.col("cat").replace_strict(FLOW_KIND, default=pl.col("cat"), return_dtype=pl.String).fill_null("None")


def _fast_tables(
    df: pl.DataFrame, ints_as_text: bool, autograd_array: bool, nd: bytes
) -> tuple[dict[str, pl.DataFrame], _Stats]:
    """The raw tables of a region read (``df``) and its counts. Also screens the names, cats
    and phases read (``_SUSPECT_TOP`` in the chunk's text ``nd``)."""
    stats = _Stats(n_events=df.height)
    int_cols = _INT_COLS[ints_as_text]
    df = df.hstack([df.get_column("pid").alias("pid_s"), df.get_column("tid").alias("tid_s")])
    # The plain cast of every id column in one query; ``_int_column`` only where it is not enough.
    casts = df.select(*(_cast_int(c) for c in int_cols), *(pl.col(c).str.starts_with("+").any().alias(c + _PLUS)
                                                           for c in int_cols))
    df = df.with_columns(
        casts.get_column(c) if casts.get_column(c).null_count() == df.get_column(c).null_count()
        and not casts.get_column(c + _PLUS)[0] else _int_column(df.get_column(c))
        for c in int_cols
    )
    counts = df.select(_COUNTS).row(0, named=True)
    ph_counts = dict(zip(counts["ph_values"], counts["ph_counts"], strict=True))
    top = counts["top"] or any(ph is not None and _NON_STRING_PY.match(ph) for ph in ph_counts)
    if top and _matches(nd, _RX_TOP):
        raise _NotFast("a value of a type the reader would blur")
    if counts["huge"]:
        raise _NotFast("a pid/tid past the float range _int reads")
    n_null = ph_counts.pop(None, 0)
    if n_null:
        stats.skipped["events without a phase (ph)"] += n_null
    stats.no_ph_head = bool(counts["no_ph_head"])
    for ph, n in ph_counts.items():
        if ph not in _KNOWN_PH:
            stats.skipped[f"events of phase {ph!r}"] += n
    stats.counters = ph_counts.get("C", 0)
    frames: dict[str, pl.DataFrame] = {}
    parts: dict[str, pl.LazyFrame] = {}  # each table's query, collected together
    no_ts, no_dur, neg, far = (counts[k] for k in ("no_ts", "no_dur", "neg", "far"))
    n_x, n_fl = ph_counts.get("X", 0), sum(ph_counts.get(ph, 0) for ph in ("s", "f", "t"))

    # Rows are taken table by table with only the columns each table reads (lazy, projection
    # pushdown): the frame is wide (one column per args field), and a filter or partition of
    # all of it would copy every column.
    # Duration events.
    if n_x:
        for what, n in (("duration events without a numeric ts", no_ts), ("duration events without dur", no_dur),
                        ("duration events with negative dur", neg), (_OUT_OF_RANGE_X, far)):
            if n:
                stats.skipped[what] += n
        # The table of each valid duration event, null elsewhere; ``_xcat`` its category.
        df = df.with_columns(_X_TABLE[autograd_array])
        for t in df.get_column("_table").drop_nulls().unique(maintain_order=True):
            rows = pl.col("_table") == t
            if t == _OTHER:
                parts["other_events"] = _part(df, rows, _OTHER_COLS)
            else:
                parts[t] = _x_frame(t, df, rows)
    # Flow endpoints.
    if n_fl:
        for what, n in (("flow events without a numeric ts", counts["fl_no_ts"]),
                        (_OUT_OF_RANGE_FLOW, counts["fl_far"])):
            if n:
                stats.skipped[what] += n
        parts["flows"] = df.lazy().filter(_IS_FL & _TS_OK).select(
            _typed_exprs("flows", [_FLOW_KIND, "ph", "id", "ts", "pid", "tid"]))
    # Allocator instant events.
    if counts["n_mem"]:
        for what, n in (("[memory] events without ts or args", counts["mem_no_ts"]),
                        (_OUT_OF_RANGE_MEM, counts["mem_far"])):
            if n:
                stats.skipped[what] += n
        parts["memory_events"] = df.lazy().filter(_IS_MEM & _TS_OK).select(_typed_exprs("memory_events", [
            "ts", "pid", "tid", _A("Device Type"), _A("Device Id"), _A("Addr"), _A("Bytes"),
            _A("Total Allocated"), _A("Total Reserved"), pl.col("name") == "[OutOfMemory]"]))
    if counts["n_th"]:
        parts["threads"] = df.lazy().filter(_IS_TH).select(
            _typed_exprs("threads", ["pid", "tid", _A("name").fill_null("None")]))
    # Every table of the region in one call (the queries run side by side).
    for t, out in zip(parts, pl.collect_all(parts.values()), strict=True):
        if t == "other_events":
            frames[t] = _other_frame(out, stats)
        else:
            frames[t] = _check_dims(out)
    return frames, stats


def _typed_exprs(table: str, columns: list[str | pl.Expr]) -> list[pl.Expr]:
    """``columns`` renamed positionally to the raw columns of ``table`` and cast."""
    return [(pl.col(c) if isinstance(c, str) else c).cast(dtype).alias(new)
            for c, (new, dtype) in zip(columns, _RAW_SCHEMAS[table].items(), strict=True)]


_DIMS_MARK = "\x00dims:"  # in _x_frame's column list: ``_json_dims`` of that args field


def _json_dims(k: str) -> pl.Expr:
    """``_json_text`` of a list of ints the reader gave as text (``[[2, 3], [4]]``); the
    caller checks the result is one (``_DIMS_TEXT``: without spaces, the same check)."""
    return _A(k).str.replace_all(" ", "", literal=True)


def _json_strings(k: str) -> pl.Expr:
    """``_json_text`` of a list of strings (compact, escaped as orjson does)."""
    enc = pl.struct(_A(k).alias("x")).struct.json_encode().str.slice(5).str.head(-1)
    return pl.when(_A(k).is_null()).then(pl.lit(None, pl.String)).otherwise(enc)


_OTHER_COLS = ["_xcat", "name", "ts", "dur", "pid_s", "tid_s", "a.correlation", "a.wait_on_stream",
               "a.wait_on_cuda_event_record_corr_id"]


def _part(df: pl.DataFrame, rows: pl.Expr, columns: list[str]) -> pl.LazyFrame:
    """The ``rows`` of ``df`` with only ``columns`` (``_xcat`` as ``cat``, null names as ``""``)."""
    part = df.lazy().filter(rows).select(columns)
    if "name" in columns:
        part = part.with_columns(pl.col("name").fill_null(""))
    return part.rename({"_xcat": "cat"}) if "_xcat" in columns else part


def _x_exprs(t: str) -> tuple[list[pl.Expr], list[str]]:
    """The select of table ``t`` from a region's frame (its raw columns, cast), and the raw
    columns that hold a list of ints as text (checked by :func:`_check_dims`)."""
    ext = pl.coalesce(_A("External id"), _A("external id"))
    comm_dtype = pl.when(_A("Collective name").is_not_null()).then(_A("dtype"))
    device = pl.coalesce(_A("device"), pl.col("pid"))
    stream = pl.coalesce(_A("stream"), pl.col("tid"))
    base = ["name", "ts", "dur"]
    cols: list[Any]
    if t == "cpu_ops":
        cols = [*base, "pid", "tid", "cat", ext, _A("Sequence number"), _A("Fwd thread id"),
                pl.coalesce(_A("Ev Idx"), _A("Profiler Event Index")), _DIMS_MARK + "Input Dims",
                _json_strings("Input type"), _DIMS_MARK + "Input Strides", _json_strings("Concrete Inputs"),
                _A("Collective name"), comm_dtype,
                _A("In msg nelems"), _A("Out msg nelems"), _A("Group size"), _A("Process Group Name"),
                _A("Process Group Description"),
                pl.when(_A("Call stack") != "").then(_A("Call stack"))]
    elif t == "python_frames":
        cols = [*base, "pid", "tid", _A("Python id"), _A("Python parent id")]
    elif t == "runtime":
        cols = [*base, "pid", "tid", "cat", _A("correlation"), ext, pl.coalesce(_A("cbid"), _A("cid"))]
    elif t == "kernels":
        cols = [*base, device, stream, _A("correlation"), ext, _DIMS_MARK + "grid", _DIMS_MARK + "block",
                _A("registers per thread"), _A("shared memory"), _A("queued"), _A("graph id"),
                _A("Collective name"), comm_dtype, _A("In msg nelems"), _A("Group size")]
    elif t == "memcpy":
        mtia = pl.col("cat") == MTIA_CCP_CAT
        kind = (pl.when(mtia)
                .then(_A("direction").replace_strict(MTIA_DIRECTION, default=None, return_dtype=pl.String))
                .otherwise(_A("kind").replace_strict(MEMCPY_ARG_KIND, default=None, return_dtype=pl.String)))
        size = pl.when(mtia).then(_A("size")).otherwise(_A("bytes"))
        cols = [*base, device, stream, _A("correlation"), ext, size, kind]
    elif t == "memset":
        cols = [*base, device, stream, _A("correlation"), ext, _A("bytes")]
    elif t == "annotations":
        cols = [*base, "pid", "tid", ext]
    elif t == "gpu_annotations":
        cols = [*base, device, stream]
    else:  # pragma: no cover - CAT_TABLE names only the tables above
        raise _NotFast(f"table {t}")
    schema = _RAW_SCHEMAS[t]
    dims = [new for c, new in zip(cols, schema) if isinstance(c, str) and c.startswith(_DIMS_MARK)]
    cols = [_json_dims(c[len(_DIMS_MARK):]) if isinstance(c, str) and c.startswith(_DIMS_MARK) else c for c in cols]
    exprs = [(pl.col(c) if isinstance(c, str) else c).cast(dtype).alias(new)
             for c, (new, dtype) in zip(cols, schema.items())]
    return exprs, dims


# Built once: building the expressions costs as much as running them on a small region.
_X_EXPRS = {t: _x_exprs(t) for t in dict.fromkeys(CAT_TABLE.values())}


_BAD_DIMS = "\x00bad dims"  # a scalar column of _x_frame's query: see _check_dims


def _x_frame(t: str, df: pl.DataFrame, rows: pl.Expr) -> pl.LazyFrame:
    """The rows of table ``t`` with only the columns it reads: one lazy query (projection
    pushdown), collected with the region's other tables. Where the table has list-of-ints
    fields, a scalar column says whether one of them is not such a list (``_check_dims``)."""
    exprs, dims = _X_EXPRS[t] if t in _X_EXPRS else _x_exprs(t)
    lf = df.lazy().filter(rows).with_columns(pl.col("name").fill_null(""), cat=pl.col("_xcat")).select(exprs)
    if dims:
        lf = lf.with_columns(pl.any_horizontal(pl.col(dims).str.contains(_DIMS_TEXT).not_()).any().alias(_BAD_DIMS))
    return lf


def _check_dims(out: pl.DataFrame) -> pl.DataFrame:
    """``out`` (an ``_x_frame``) without its check column, or :class:`_NotFast` where a
    list-of-ints field is not one."""
    if _BAD_DIMS not in out.columns:
        return out
    if out.height and out.get_column(_BAD_DIMS)[0]:
        raise _NotFast("list-of-ints fields that are not lists of ints")
    return out.drop(_BAD_DIMS)


def _other_frame(p: pl.DataFrame, stats: _Stats) -> pl.DataFrame:
    scat = pl.col("cat").fill_null("<no category>")
    p = p.with_columns(scat=scat)
    unknown = p.filter(~pl.col("scat").is_in(list(KNOWN_OTHER_CATS)))
    if unknown.height:
        for c, n in unknown.group_by("scat", maintain_order=True).len().iter_rows():
            stats.unknown_cats[c] += n
    return p.select(_typed_exprs("other_events", [
        "scat", "name", "ts", "dur", pl.col("pid_s").fill_null("None"), pl.col("tid_s").fill_null("None"),
        pl.lit(None, pl.String),  # args: only counter events keep theirs, decoded exactly
        _A("correlation"), _A("wait_on_stream"), _A("wait_on_cuda_event_record_corr_id"),
    ]))


def _decode_region(region: bytes, sep_nd: bytes, sep_nl: bytes, autograd: bool,
                   seen: ArgKeys | None = None) -> tuple[dict[str, pl.DataFrame], _Stats] | None:
    """A region of whole events (cut at separators) → raw frames and counts, or None when
    the columnar reader cannot take it exactly (the caller frames it exactly)."""
    try:
        nd = _nl_to_tab(region).replace(sep_nd, sep_nl)
        return _fast_chunk(nd, autograd, seen)
    except _NotFast:
        return None
