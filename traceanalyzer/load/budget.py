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

Both variables take a plain number; the size also takes a ``K``/``M``/``G``/``T``
suffix (powers of 1024). The command line sets them for one run: ``traceanalyzer
--max-input-size 40G --max-gzip-ratio 500 <command> …`` (before the sub-command; batch
workers inherit them). ``docs/input_formats.md`` has the table.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from traceanalyzer.errors import ConfigError, InputError

ENV_MAX_INPUT_BYTES = "TRACEANALYZER_MAX_INPUT_BYTES"
ENV_MAX_GZIP_RATIO = "TRACEANALYZER_MAX_GZIP_RATIO"
DEFAULT_MAX_INPUT_BYTES = 16 << 30
DEFAULT_MAX_GZIP_RATIO = 200.0
# Output below this never trips the ratio check: a small file cannot hurt, and the
# first blocks of a real trace (its header, repeated metadata) may compress better
# than its average.
RATIO_FLOOR_BYTES = 16 << 20

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)i?B?\s*", re.I)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(text: str) -> int:
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{ENV_MAX_INPUT_BYTES}={text!r}: expected a size such as 40G, 512M or 1000000")
    return int(float(m.group(1)) * _UNIT[m.group(2).upper()])


def _human(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n):,} bytes"


@dataclass(frozen=True)
class Budget:
    """The limits in force (see the module docstring)."""

    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    max_gzip_ratio: float = DEFAULT_MAX_GZIP_RATIO

    @classmethod
    def from_env(cls) -> Budget:
        size = os.environ.get(ENV_MAX_INPUT_BYTES, "").strip()
        ratio = os.environ.get(ENV_MAX_GZIP_RATIO, "").strip()
        max_bytes = _parse_size(size) if size else DEFAULT_MAX_INPUT_BYTES
        try:
            max_ratio = float(ratio) if ratio else DEFAULT_MAX_GZIP_RATIO
        except ValueError:
            raise ConfigError(f"{ENV_MAX_GZIP_RATIO}={ratio!r}: expected a number such as 500") from None
        if max_bytes <= 0 or not max_ratio > 0:
            raise ConfigError(f"{ENV_MAX_INPUT_BYTES} and {ENV_MAX_GZIP_RATIO} must be positive")
        return cls(max_bytes, max_ratio)

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
