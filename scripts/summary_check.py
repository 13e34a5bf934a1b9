"""Check that a change leaves every ``summary.json`` byte-identical.

Runs ``traceanalyzer batch`` over ``../shared/data`` and ``sample_traces`` (every trace and
snapshot there) and compares each file's ``summary.json`` with a saved copy::

    python scripts/summary_check.py --save /tmp/before      # on the commit before the change
    python scripts/summary_check.py --against /tmp/before   # after it: exit 1 on any difference

A restructuring (issue 18) must pass this on every input; a change that means to alter a
number shows exactly which inputs it altered.
"""

from __future__ import annotations

import argparse
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


def identical(before: Path, after: Path, before_repo: str) -> bool:
    """Byte-identical once the repository's own path is the same: summaries name their input
    by absolute path, and a worktree elsewhere names sample_traces/ differently."""
    a, b = before.read_bytes(), after.read_bytes()
    return a == b or a.replace(before_repo.encode(), str(REPO).encode()) == b


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
        (args.save / "repo.txt").write_text(str(REPO))
        print(f"saved {len(summaries(args.save))} summaries in {args.save}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run_batch(Path(tmp))
        before, after = summaries(args.against), summaries(Path(tmp))
        marker = args.against / "repo.txt"
        before_repo = marker.read_text() if marker.exists() else str(REPO)
        missing = sorted(set(before) ^ set(after))
        changed = [n for n in sorted(set(before) & set(after)) if not identical(before[n], after[n], before_repo)]
        for name in missing:
            print(f"only in {'before' if name in before else 'after'}: {name}")
        for name in changed:
            print(f"differs: {name}")
        same = len(set(before) & set(after)) - len(changed)
        print(f"{same} of {len(before)} summaries byte-identical; {len(changed)} differ, {len(missing)} unmatched")
        return 0 if not changed and not missing else 1


if __name__ == "__main__":
    raise SystemExit(main())
