"""The input budget: what a file may cost before it is refused, and which files are read.

Hostile or degenerate input must fail fast with one line, never run for minutes or
exhaust memory. The loaders check, while they read:

* **Only regular files.** A FIFO, socket or device is refused before it is opened
  (opening a FIFO without a writer blocks forever; ``/dev/zero`` never ends); a
  symlink loop is named as such.
* **Input size** (``TRACEANALYZER_MAX_INPUT_BYTES``, default 16 GiB): the bytes of
  JSON text, after gunzipping. A plain file over it is refused from its size; a
  ``.gz`` as soon as its decompressed output passes it.
* **Decompression ratio** (``TRACEANALYZER_MAX_GZIP_RATIO``, default 200): decompressed
  bytes per compressed byte consumed so far. Real chrome traces compress 6–30×; a
  gzip bomb (megabytes of whitespace or one endless string in a few kilobytes) runs
  near deflate's maximum of ~1,030×. Checked once the output passes
  :data:`RATIO_FLOOR_BYTES` (16 MiB), so small files, whatever their ratio, always load,
  and a bomb is stopped while decompressing, at 16 MiB of output.

* **Events** (``TRACEANALYZER_MAX_EVENTS``, default 20 M): items of the ``traceEvents``
  array. The chunked reader counts each region's events before decoding it, so a file of
  10⁸ tiny events is refused once the count passes the limit, with the model built so far
  (bounded by the limit) as all that was spent.
* **String length** (``TRACEANALYZER_MAX_STRING_BYTES``, default 1 MiB): bytes of one
  JSON string as written in the file (an escape counts its bytes). A longer string is
  *kept truncated* to the limit (cut at a character boundary, never inside an escape)
  with one counted warning, and the file loads: one absurd event name is no reason to
  lose a trace, and the bytes past the limit are dropped as they stream in (never
  held), so memory stays bounded by the limit, not by the string. Refusing would buy
  nothing: the rest of the file is as valid as before.
* **Nesting depth** (``TRACEANALYZER_MAX_DEPTH``, default 1,000): levels of nested
  arrays/objects in the document (a real trace nests 7 deep). JSON nested deeper is
  refused with the depth reached. Both decoders stop near 1,024 levels on their own, so
  the limit can only be lowered, never raised above :data:`DEPTH_CEILING`; at the
  default, a region the columnar reader accepts (no deeper than its own 1,024) is not
  scanned, a lowered limit scans every region (slower).

Every limit is in :data:`LIMITS` (name, environment variable, default, description),
the one list the command-line options and the configuration file are built from.

The variables take a plain number; sizes also take a ``K``/``M``/``G``/``T``
suffix (powers of 1024). The command line sets them for one run: ``traceanalyzer
--max-input-size 40G --max-gzip-ratio 500 <command> …`` (before the sub-command; batch
workers inherit them). ``docs/input_formats.md`` has the table.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO

from traceanalyzer.errors import ConfigError, InputError

ENV_MAX_INPUT_BYTES = "TRACEANALYZER_MAX_INPUT_BYTES"
ENV_MAX_GZIP_RATIO = "TRACEANALYZER_MAX_GZIP_RATIO"
ENV_MAX_EVENTS = "TRACEANALYZER_MAX_EVENTS"
ENV_MAX_STRING_BYTES = "TRACEANALYZER_MAX_STRING_BYTES"
ENV_MAX_DEPTH = "TRACEANALYZER_MAX_DEPTH"
DEFAULT_MAX_INPUT_BYTES = 16 << 30
DEFAULT_MAX_GZIP_RATIO = 200.0
# The real traces in ../shared reach 456 k events, strings of 5 KB and depth 7: each
# default is 44x (events), 200x (strings) and 140x (depth) above that.
DEFAULT_MAX_EVENTS = 20_000_000
DEFAULT_MAX_STRING_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 1000
# orjson and polars' reader refuse JSON nested 1,024 deep: a deeper limit would never be
# reached, so it is refused as a setting.
DEPTH_CEILING = 1000
# Output below this never trips the ratio check: a small file cannot hurt, and the
# first blocks of a real trace (its header, repeated metadata) may compress better
# than its average.
RATIO_FLOOR_BYTES = 16 << 20

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)i?B?\s*", re.I)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(text: str, env: str = ENV_MAX_INPUT_BYTES) -> int:
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{env}={text!r}: expected a size such as 40G, 512M or 1000000")
    return int(float(m.group(1)) * _UNIT[m.group(2).upper()])


def _parse_count(text: str, env: str) -> int:
    try:
        value = float(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise ConfigError(f"{env}={text!r}: expected a whole number such as 100000000") from None
    if not (value == value and abs(value) < 1e18):
        raise ConfigError(f"{env}={text!r}: expected a whole number such as 100000000")
    return int(value)


def _human(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n):,} bytes"


@dataclass(frozen=True)
class Limit:
    """One entry of the input budget, as the options and the configuration file see it.

    ``name`` is the :class:`Budget` field (or, for ``applies_to == "snapshot"``, the
    :class:`~traceanalyzer.load.pickle_budget.PickleBudget` field), ``env`` the variable
    the loaders read, ``default`` its value when unset, ``kind`` how a value is written
    (``"size"``: bytes with an optional K/M/G/T suffix; ``"count"``: a whole number;
    ``"ratio"``: a number), ``trips`` what input passes it."""

    name: str
    env: str
    default: float
    kind: str
    applies_to: str
    description: str
    trips: str


def _snapshot_limits() -> tuple[Limit, ...]:
    from traceanalyzer.load.pickle_budget import ENV_PREFIX, LIMIT_TEXT, PickleBudget

    out = []
    for f in fields(PickleBudget):
        kind = "size" if f.name == "max_string_bytes" else "ratio" if f.name == "max_gzip_ratio" else "count"
        description, trips = LIMIT_TEXT[f.name]
        out.append(Limit(f.name, ENV_PREFIX + f.name.upper(), f.default, kind, "snapshot",  # type: ignore[arg-type]
                         description, trips))
    return tuple(out)


# The whole input budget: the trace limits (fields of Budget), then the snapshot limits
# (fields of PickleBudget). Options and configuration keys are derived from this list.
TRACE_LIMITS: tuple[Limit, ...] = (
    Limit("max_input_bytes", ENV_MAX_INPUT_BYTES, DEFAULT_MAX_INPUT_BYTES, "size", "trace",
          "JSON text bytes of one trace, after gunzipping",
          "a plain file larger than it; a .gz as soon as its output passes it"),
    Limit("max_gzip_ratio", ENV_MAX_GZIP_RATIO, DEFAULT_MAX_GZIP_RATIO, "ratio", "trace",
          "decompressed bytes per compressed byte of a .gz trace (checked past 16 MiB of output)",
          "a gzip bomb (whitespace or one endless string: ~1,000x)"),
    Limit("max_events", ENV_MAX_EVENTS, DEFAULT_MAX_EVENTS, "count", "trace",
          "items of the traceEvents array",
          "a trace of more events, refused when the count passes it (before that region is decoded)"),
    Limit("max_string_bytes", ENV_MAX_STRING_BYTES, DEFAULT_MAX_STRING_BYTES, "size", "trace",
          "bytes of one JSON string",
          "a longer string is kept truncated to the limit, with a counted warning (not refused)"),
    Limit("max_depth", ENV_MAX_DEPTH, DEFAULT_MAX_DEPTH, "count", "trace",
          f"nesting levels of arrays/objects (at most {DEPTH_CEILING:,}: the decoders stop at 1,024)",
          "JSON nested deeper, refused with the depth reached"),
)
LIMITS: tuple[Limit, ...] = TRACE_LIMITS + _snapshot_limits()


@dataclass(frozen=True)
class Budget:
    """The limits in force for traces (see the module docstring)."""

    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    max_gzip_ratio: float = DEFAULT_MAX_GZIP_RATIO
    max_events: int = DEFAULT_MAX_EVENTS
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH

    @classmethod
    def from_env(cls) -> Budget:
        """The defaults, overridden by the ``TRACEANALYZER_MAX_*`` variables; a bad value
        is a :class:`ConfigError` naming the variable."""
        def get(env: str) -> str:
            return os.environ.get(env, "").strip()

        size = get(ENV_MAX_INPUT_BYTES)
        ratio = get(ENV_MAX_GZIP_RATIO)
        max_bytes = _parse_size(size) if size else DEFAULT_MAX_INPUT_BYTES
        try:
            max_ratio = float(ratio) if ratio else DEFAULT_MAX_GZIP_RATIO
        except ValueError:
            raise ConfigError(f"{ENV_MAX_GZIP_RATIO}={ratio!r}: expected a number such as 500") from None
        if max_bytes <= 0 or not max_ratio > 0:
            raise ConfigError(f"{ENV_MAX_INPUT_BYTES} and {ENV_MAX_GZIP_RATIO} must be positive")
        events, strings, depth = get(ENV_MAX_EVENTS), get(ENV_MAX_STRING_BYTES), get(ENV_MAX_DEPTH)
        max_events = _parse_count(events, ENV_MAX_EVENTS) if events else DEFAULT_MAX_EVENTS
        max_str = _parse_size(strings, ENV_MAX_STRING_BYTES) if strings else DEFAULT_MAX_STRING_BYTES
        max_depth = _parse_count(depth, ENV_MAX_DEPTH) if depth else DEFAULT_MAX_DEPTH
        for env, value in ((ENV_MAX_EVENTS, max_events), (ENV_MAX_STRING_BYTES, max_str), (ENV_MAX_DEPTH, max_depth)):
            if value <= 0:
                raise ConfigError(f"{env} must be positive")
        if max_depth > DEPTH_CEILING:
            raise ConfigError(f"{ENV_MAX_DEPTH}={depth}: at most {DEPTH_CEILING:,} (the JSON decoders stop at "
                              "1,024 levels; real traces nest 7 deep)")
        return cls(max_bytes, max_ratio, max_events, max_str, max_depth)

    def events_exceeded(self, path: Path, reached: int, at: int | None = None) -> InputError:
        """The refusal of a trace with more than ``max_events`` events (``reached``: how
        many were counted when the check tripped, ``at``: the byte it had read to)."""
        where = f" by byte {at:,}" if at is not None else ""
        return InputError(path, f"holds more than {self.max_events:,} events ({reached:,} counted{where}), past the "
                                f"event limit (real traces hold up to a few million); if the file is genuine, raise "
                                f"it with --limit max_events={_more(reached)} (or {ENV_MAX_EVENTS}={_more(reached)})")

    def depth_exceeded(self, path: Path, reached: int, at: int | None = None) -> InputError:
        """The refusal of JSON nested deeper than ``max_depth`` (``reached`` levels at byte ``at``)."""
        where = f" at byte {at:,}" if at is not None else ""
        if self.max_depth >= DEPTH_CEILING:
            raise_it = "the limit cannot be raised: the JSON decoders stop at 1,024 levels"
        else:
            raise_it = (f"if the file is genuine, raise it (up to {DEPTH_CEILING:,}) with --limit max_depth=N "
                        f"(or {ENV_MAX_DEPTH}=N)")
        return InputError(path, f"JSON nested {reached:,} levels deep{where}, past the nesting depth limit of "
                                f"{self.max_depth:,} (real traces nest 7 deep); refused as hostile or corrupt "
                                f"({raise_it})")

    def string_warning(self, count: int, longest: int) -> str:
        """The warning for ``count`` strings cut to ``max_string_bytes`` (``longest``: the
        longest one's length, as far as it was read)."""
        what = "1 string" if count == 1 else f"{count:,} strings"
        return (f"truncated {what} longer than the string limit of {_human(self.max_string_bytes)} to that length "
                f"(longest: {_human(longest)}); raise the limit with --limit max_string_bytes=<size> "
                f"(or {ENV_MAX_STRING_BYTES}=<size>)")

    def check_size(self, path: Path, nbytes: int) -> None:
        """Refuse a plain file larger than the input size limit."""
        if nbytes > self.max_input_bytes:
            raise InputError(path, f"is {_human(nbytes)}, over the input size limit of "
                                   f"{_human(self.max_input_bytes)}; raise it with "
                                   f"--max-input-size {_suggest(nbytes)} (or {ENV_MAX_INPUT_BYTES}={_suggest(nbytes)})")

    def check_gzip(self, path: Path, out: int, consumed: int) -> None:
        """Refuse a gzip stream that has produced ``out`` bytes from ``consumed``
        compressed bytes, when either limit is passed."""
        if out > self.max_input_bytes:
            raise InputError(path, f"gzip data decompresses to more than the input size limit of "
                                   f"{_human(self.max_input_bytes)} (stopped there); raise it with "
                                   f"--max-input-size <size> (or {ENV_MAX_INPUT_BYTES}=<size>)")
        if out >= RATIO_FLOOR_BYTES and out > self.max_gzip_ratio * max(consumed, 1):
            ratio = out / max(consumed, 1)
            raise InputError(path, f"gzip data expands {ratio:,.0f}x ({_human(out)} from {_human(consumed)} "
                                   f"so far), past the decompression ratio limit of {self.max_gzip_ratio:g}x "
                                   "(real traces compress 6-30x): refused as a likely gzip bomb; if the file "
                                   "is genuine, raise the limit with --max-gzip-ratio <ratio> "
                                   f"(or {ENV_MAX_GZIP_RATIO}=<ratio>)")


def _more(n: int) -> str:
    """A round figure comfortably above ``n`` (for "raise it with …=N")."""
    target = 2 * n
    step = 10 ** max(0, len(str(target)) - 2)
    return str(-(-target // step) * step)


def _suggest(nbytes: int) -> str:
    gib = -(-nbytes // (1 << 30))
    return f"{gib}G"


_KIND = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)

DIRECTORY_PROBLEM = "is a directory, not a trace file (use `traceanalyzer batch` for directories)"


def check_regular(path: Path) -> os.stat_result:
    """``os.stat`` of ``path`` when it is a regular file (symlinks followed), else a
    one-line :class:`InputError`. Never opens the file, so a FIFO cannot block."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(path, "is a broken symbolic link (its target does not exist)") from None
        raise InputError(path, "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(path, "is a symbolic link loop (following its links never reaches a file)") from None
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise InputError(path, DIRECTORY_PROBLEM)
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _KIND if test(mode)), "not a regular file")
        raise InputError(path, f"is {what}, not a regular file: only regular files are read")
    return st


def open_regular(path: Path) -> tuple[BinaryIO, os.stat_result]:
    """Open a regular file for reading, never blocking: :func:`check_regular` first, then
    a non-blocking open whose ``fstat`` must still be a regular file (the path could have
    been replaced in between)."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(path, "is not a regular file: only regular files are read")
    return os.fdopen(fd, "rb"), st
