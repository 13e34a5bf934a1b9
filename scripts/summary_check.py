"""Check that a change leaves every ``summary.json`` byte-identical.

Runs ``traceanalyzer batch`` over ``../shared/data`` and ``sample_traces`` (every trace and
snapshot there) and compares each file's ``summary.json`` with a saved copy::

    python scripts/summary_check.py --save /tmp/before      # on the commit before the change
    python scripts/summary_check.py --against /tmp/before   # after it: exit 1 on any difference

A restructuring (issue 18) must pass this on every input; a change that means to alter a
number shows exactly which inputs it altered. The checkout's own path is not part of the
comparison: a sample's ``source`` is ``/any/checkout/sample_traces/x`` on both sides, so a copy
saved in one checkout (or worktree) compares with a run in another.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INPUTS = [REPO.parent / "shared" / "data", REPO / "sample_traces"]


def run_batch(outdir: Path) -> None:
    """Analyse every input into ``outdir`` (JSON reports only, no cache)."""
    inputs = [str(p) for p in INPUTS if p.exists()]
    cmd = [sys.executable, "-m", "traceanalyzer", "batch", *inputs, "-o", str(outdir), "-f", "json", "--no-cache"]
    # exit 1 means some input failed: the comparison below still shows it (no summary.json).
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"batch failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")


# An absolute path up to a sample: the checkout's location, which differs between worktrees.
_CHECKOUT = re.compile(rb'(?<=["\s(`])/[^"\s]*/(?=sample_traces/)')


def same_summary(a: Path, b: Path) -> bool:
    """Byte-identical once each checkout's path before ``sample_traces/`` is left out."""
    return _CHECKOUT.sub(b"", a.read_bytes()) == _CHECKOUT.sub(b"", b.read_bytes())


def summaries(root: Path) -> dict[str, Path]:
    """Report folder name → its summary.json."""
    return {p.parent.name: p for p in sorted((root / "reports").glob("*/summary.json"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the current summaries here")
    group.add_argument("--against", type=Path, help="compare the current summaries with these")
    args = ap.parse_args()
    if args.save:
        run_batch(args.save)
        print(f"saved {len(summaries(args.save))} summaries in {args.save}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run_batch(Path(tmp))
        before, after = summaries(args.against), summaries(Path(tmp))
        missing = sorted(set(before) ^ set(after))
        changed = [n for n in sorted(set(before) & set(after)) if not same_summary(before[n], after[n])]
        for name in missing:
            print(f"only in {'before' if name in before else 'after'}: {name}")
        for name in changed:
            print(f"differs: {name}")
        same = len(set(before) & set(after)) - len(changed)
        print(f"{same} of {len(before)} summaries byte-identical; {len(changed)} differ, {len(missing)} unmatched")
        return 0 if not changed and not missing else 1


if __name__ == "__main__":
    raise SystemExit(main())
