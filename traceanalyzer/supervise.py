"""``--max-memory``: run one command in a child process that cannot take the machine down.

The input budget (docs/input_formats.md) bounds what a file may make the loaders build; this
bounds the whole run, for users on shared machines and in CI jobs with a memory limit. The
command runs again in a child process (same arguments, same terminal) under two limits:

* **resident memory** (RSS): the parent reads the child's RSS every 50 ms (Linux ``/proc``)
  and stops it past ``limit`` bytes;
* **address space** (``RLIMIT_AS``): ``4 × limit + 2 GiB``, the same margin ``batch`` workers
  get, because allocators and thread stacks reserve several times what they touch; an
  allocation beyond it fails at once instead of waking the kernel's OOM killer.

A child stopped either way is reported with one line naming the command, its inputs, the limit
and how to raise it; the exit code is 2 (the input was too large for the limit the user set, not
a bug). Otherwise the child's own exit code is returned unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

#: Bytes of ``--max-memory``, as the CLI resolved it.
ENV_MAX_MEMORY = "TRACEANALYZER_MAX_MEMORY"
#: Set in the child so it runs the command instead of supervising again.
ENV_CHILD = "TRACEANALYZER_SUPERVISED"
_POLL_S = 0.05
#: Exit statuses of a process that died of an allocation failure: SIGKILL (our watchdog or the
#: kernel), SIGABRT (a native allocator's abort, e.g. Rust's "memory allocation failed"),
#: SIGSEGV (a stack that could not grow).
_MEMORY_DEATHS = frozenset({-signal.SIGKILL, -signal.SIGABRT, -signal.SIGSEGV, 128 + signal.SIGABRT})


def address_space_for(limit: int) -> int:
    """The ``RLIMIT_AS`` that goes with a resident-memory limit (see the module docstring)."""
    return 4 * limit + (2 << 30)


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _limit_address_space(space: int) -> None:
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = space if hard == resource.RLIM_INFINITY else min(space, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass  # not on this platform: the RSS watchdog still applies


def _gib(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _inputs(argv: Sequence[str]) -> str:
    """The arguments that name existing files or folders (what the line names as the input)."""
    names = [a for a in argv if not a.startswith("-") and os.path.exists(a)]
    return " ".join(names)


def run_supervised(argv: Sequence[str], limit: int, command: str | None) -> int:
    """Run ``traceanalyzer ARGV`` in a child under ``limit`` bytes of resident memory; its exit
    code, or 2 after one line on stderr when it was stopped for memory."""
    env = dict(os.environ, **{ENV_CHILD: "1"})
    space = address_space_for(limit)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the child; it decides
    try:
        child = subprocess.Popen([sys.executable, "-m", "traceanalyzer", *argv], env=env,
                                 preexec_fn=lambda: _limit_address_space(space))  # noqa: PLW1509 - no threads yet
        exceeded = 0
        while child.poll() is None:
            rss = _rss_bytes(child.pid)
            if rss is not None and rss > limit:
                exceeded = rss
                child.kill()
                child.wait()
                break
            time.sleep(_POLL_S)
    finally:
        signal.signal(signal.SIGINT, previous)
    code = child.returncode
    if not exceeded and code not in _MEMORY_DEATHS:
        return code
    what = f"{command} {_inputs(argv)}".strip()
    how = (f"used {_gib(exceeded)}, over" if exceeded else "ran out of memory under")
    sys.stderr.write(f"error: {what}: {how} the memory limit of {_gib(limit)} (--max-memory); raise it with "
                     f"--max-memory <size>, or leave it out to use the machine's memory\n")
    return 2


__all__ = ["ENV_CHILD", "ENV_MAX_MEMORY", "address_space_for", "run_supervised"]
