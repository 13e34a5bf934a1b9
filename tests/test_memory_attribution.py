"""Memory attribution users recognise: call sites in the user's code, leaks that need
repetition, one percentage per fact."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceanalyzer.analyses import run_analyses
from traceanalyzer.analyses._callsites import is_user_frame
from traceanalyzer.analyses._memory import stack_sites
from traceanalyzer.config import Config
from traceanalyzer.load import load
from traceanalyzer.rules import run_rules

MiB = 1 << 20
SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots"
SITE = "/usr/lib/python3.10/site-packages"


def _frames(stacks: dict[int, list[tuple[str, str, int]]]) -> pl.DataFrame:
    """Frames table from ``{stack_id: [(name, filename, line), ...]}``, innermost first."""
    rows = [{"stack_id": sid, "depth": d, "name": n, "filename": f, "line": ln}
            for sid, fr in stacks.items() for d, (n, f, ln) in enumerate(fr)]
    return pl.DataFrame(rows, schema={"stack_id": pl.Int64, "depth": pl.Int64, "name": pl.String,
                                      "filename": pl.String, "line": pl.Int64})


# --------------------------------------------------------------------------------------
# 1. One frame filter: the first frame in the user's code
# --------------------------------------------------------------------------------------

JUPYTER = [
    ("empty_like", f"{SITE}/torch/_refs/__init__.py", 4100),
    ("forward", "/tmp/ipykernel_4242/1234567.py", 7),
    ("_call_impl", f"{SITE}/torch/nn/modules/module.py", 1501),
    ("<module>", "/tmp/ipykernel_4242/999.py", 3),
    ("run_code", f"{SITE}/IPython/core/interactiveshell.py", 3577),
    ("dispatch_shell", f"{SITE}/ipykernel/kernelbase.py", 409),
    ("_run_once", "/usr/lib/python3.10/asyncio/base_events.py", 1909),
    ("_run_module_as_main", "<frozen runpy>", 198),
]
OLD_IPYTHON = [("mm", f"{SITE}/torch/functional.py", 10), ("f", "<ipython-input-3-0123abcd>", 2),
               ("run_code", f"{SITE}/IPython/core/interactiveshell.py", 3577)]
THREAD = [("_worker", "/home/u/proj/loader.py", 12), ("run", "/usr/lib/python3.11/threading.py", 975),
          ("_bootstrap_inner", "/usr/lib/python3.11/threading.py", 1038)]
WINDOWS = [("einsum", "D:\\Dev\\proj\\.venv\\Lib\\site-packages\\torch\\functional.py", 402),
           ("forward", "D:\\Dev\\proj\\model.py", 39),
           ("_call_impl", "D:\\Dev\\proj\\.venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py", 1747),
           ("run", "C:\\Python311\\Lib\\threading.py", 975)]
LIBRARY_ONLY = [("_init_group", f"{SITE}/torch/optim/adamw.py", 120), ("run", "/usr/lib/python3.11/threading.py", 975),
                ("_run_module_as_main", "<frozen runpy>", 198)]
RUNTIME_ONLY = [("run", "/usr/lib/python3.11/threading.py", 975), ("_run_module_as_main", "<frozen runpy>", 198)]
CPP_EXT = [("torch::unwind::unwind()", "??", 0),
           ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long)",
            "CUDACachingAllocator.cpp", 1100),
           ("at::native::empty_cuda(c10::ArrayRef<long>)", "", 0),
           ("my_ext::fused_op(at::Tensor const&)", "my_ext.cpp", 42),
           ("PyEval_EvalFrameDefault", "ceval.c", 4000), ("0x7f12 (libtorch_python.so)", "libtorch_python.so", 0)]
CPP_ONLY = [("torch::unwind::unwind()", "??", 0),
            ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long)",
             "CUDACachingAllocator.cpp", 1100),
            ("at::native::empty_cuda(c10::ArrayRef<long>)", "??", 0), ("_PyObject_Call", "??", 0)]


def test_first_user_frame_skips_runtime_and_native_frames() -> None:
    st = {1: JUPYTER, 2: OLD_IPYTHON, 3: THREAD, 4: WINDOWS, 5: LIBRARY_ONLY, 6: RUNTIME_ONLY, 7: CPP_EXT, 8: CPP_ONLY}
    s = {r["stack_id"]: r for r in stack_sites(_frames(st)).iter_rows(named=True)}
    # A notebook cell is the user's code; torch, IPython, ipykernel, asyncio and runpy are not.
    assert (s[1]["site"], s[1]["site_kind"]) == ("forward (ipykernel_4242/1234567.py:7)", "python")
    assert (s[2]["site"], s[2]["site_kind"]) == ("f (<ipython-input-3-0123abcd>:2)", "python")
    assert (s[3]["site"], s[3]["site_kind"]) == ("_worker (proj/loader.py:12)", "python")
    # Windows paths: .venv\Lib\site-packages and the interpreter's Lib\ are library code.
    assert (s[4]["site"], s[4]["site_kind"]) == ("forward (proj/model.py:39)", "python")
    # No user frame: the best frame stands in, and site_kind says so.
    assert (s[5]["site"], s[5]["site_kind"]) == ("_init_group (optim/adamw.py:120)", "library")
    assert (s[6]["site"], s[6]["site_kind"]) == ("run (python3.11/threading.py:975)", "runtime")
    assert (s[7]["site"], s[7]["site_kind"]) == ("my_ext::fused_op(at::Tensor const&) (my_ext.cpp:42)", "native")
    assert s[8]["site_kind"] == "native_internal" and s[8]["site"].startswith("torch::unwind::unwind() (??)")
    # The raw stack stays, innermost first, full paths.
    assert len(s[1]["stack"]) == len(JUPYTER)
    assert s[1]["stack"][0] == f"empty_like ({SITE}/torch/_refs/__init__.py:4100)"
    assert s[4]["stack"][1] == "forward (D:\\Dev\\proj\\model.py:39)"
    assert s[5]["stack_category"] == "optimizer_state"


def test_trace_and_snapshot_share_the_frame_filter() -> None:
    # The same predicate decides trace python_function frames.
    assert is_user_frame("/tmp/ipykernel_4242/1234567.py(7): forward")
    assert is_user_frame("<ipython-input-3-0123abcd>(2): f")
    assert is_user_frame("D:\\Dev\\proj\\model.py(39): forward")
    assert not is_user_frame("C:\\Python311\\Lib\\threading.py(975): run")
    assert not is_user_frame("D:\\Dev\\proj\\.venv\\Lib\\site-packages\\torch\\functional.py(402): einsum")
    assert not is_user_frame("<frozen runpy>(198): _run_module_as_main")
    assert not is_user_frame(f"{SITE}/ipykernel/kernelbase.py(409): dispatch_shell")
    assert not is_user_frame("/home/u/src/pytorch/torch/nn/modules/module.py(1501): _call_impl")


# --------------------------------------------------------------------------------------
# Hand-built snapshots: a bump allocator in one segment; the dump is the end state
# --------------------------------------------------------------------------------------

def _stack(user: tuple[str, str, int], *inner: tuple[str, str, int]) -> list[dict[str, Any]]:
    """Innermost first: library frames, the user's frame, then the runtime wrappers."""
    fr = [*inner, user, ("<module>", "/home/u/train.py", 90), ("_run_code", "/usr/lib/python3.10/runpy.py", 86),
          ("_run_module_as_main", "<frozen runpy>", 198)]
    return [{"name": n, "filename": f, "line": ln} for n, f, ln in fr]


CALL = ("_call_impl", f"{SITE}/torch/nn/modules/module.py", 1501)
FWD = _stack(("forward", "/home/u/model.py", 9), CALL)
FWD_TMP = _stack(("forward", "/home/u/model.py", 12), CALL)
LOSS = _stack(("train_step", "/home/u/train.py", 31), ("cross_entropy", f"{SITE}/torch/nn/functional.py", 3000))
GRAD = _stack(("train_step", "/home/u/train.py", 32), ("backward", f"{SITE}/torch/_tensor.py", 522))
GRAD_TMP = _stack(("train_step", "/home/u/train.py", 32), ("mm_backward", f"{SITE}/torch/autograd/graph.py", 744))
OPT = _stack(("train_step", "/home/u/train.py", 33), ("_init_group", f"{SITE}/torch/optim/adam.py", 100))


class _Snap:
    """Records alloc/free with times; ``doc()`` dumps segments matching the end state."""

    def __init__(self, seg: int = 1024 * MiB) -> None:
        self.base, self.seg, self.next = 1 << 40, seg, 1 << 40
        self.ev: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": self.base, "size": seg, "stream": 0}]
        self.live: dict[int, tuple[int, list]] = {}

    def alloc(self, size: int, frames: list) -> int:
        a, self.next = self.next, self.next + size
        self.ev.append({"action": "alloc", "addr": a, "size": size, "stream": 0, "frames": frames})
        self.live[a] = (size, frames)
        return a

    def free(self, a: int) -> None:
        size, frames = self.live.pop(a)
        for act in ("free_requested", "free_completed"):
            self.ev.append({"action": act, "addr": a, "size": size, "stream": 0, "frames": frames})

    def doc(self) -> dict[str, Any]:
        for i, e in enumerate(self.ev):
            e["time_us"] = 1_700_000_000_000_000 + 10 * i
        blocks, a = [], self.base
        for addr in sorted(self.live):
            if addr > a:
                blocks.append({"address": a, "size": addr - a, "requested_size": 0, "state": "inactive", "frames": []})
            size, frames = self.live[addr]
            blocks.append({"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                           "frames": frames})
            a = addr + size
        end = self.base + self.seg
        if end > a:
            blocks.append({"address": a, "size": end - a, "requested_size": 0, "state": "inactive", "frames": []})
        live = sum(s for s, _ in self.live.values())
        seg = {"device": 0, "address": self.base, "total_size": self.seg, "allocated_size": live,
               "active_size": live, "requested_size": live, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
        return {"segments": [seg], "device_traces": [self.ev]}


def _iteration(s: _Snap, layers: int, grads: list[int] | None, keep_loss: list[int] | None,
               opt: list[int] | None) -> None:
    """Forward (an activation and a temporary per layer, the loss), backward (a temporary
    gradient per layer; gradients allocated the first time only: later ones accumulate in
    place), activations freed; optimizer state created the first time."""
    acts = []
    for _ in range(layers):
        acts.append(s.alloc(16 * MiB, FWD))
        s.free(s.alloc(4 * MiB, FWD_TMP))
    loss = s.alloc(8 * MiB, LOSS)
    first = grads is not None and not grads
    for a in reversed(acts):
        s.free(s.alloc(4 * MiB, GRAD_TMP))
        if first:
            grads.append(s.alloc(8 * MiB, GRAD))  # type: ignore[union-attr]
        s.free(a)
    if keep_loss is None:
        s.free(loss)
    else:
        keep_loss.append(loss)  # losses.append(loss): the leak
    if opt is not None and not opt:
        opt += [s.alloc(8 * MiB, OPT) for _ in range(layers)]


def _write(tmp_path: Path, doc: Any, name: str) -> Path:
    f = tmp_path / name
    f.write_bytes(pickle.dumps(doc, protocol=4))
    return f


def _rules(path: Path, config: Config | None = None) -> tuple[Any, Any]:
    results = run_analyses(load(path), config, strict=True)
    return results, run_rules(results, config, strict=True)


# --------------------------------------------------------------------------------------
# 2. A leak needs repetition
# --------------------------------------------------------------------------------------

def test_single_step_gradients_are_not_a_leak(tmp_path: Path) -> None:
    # One training step: gradients (8 layers × 8 MiB) appear in the first backward and stay.
    s = _Snap()
    _iteration(s, layers=8, grads=[], keep_loss=None, opt=[])
    r, out = _rules(_write(tmp_path, s.doc(), "one_step.pickle"))
    leaks = r["memory_leaks"]
    assert (leaks.window_kind, leaks.n_windows) == ("iterations", 1)
    assert leaks.suspects.is_empty() and leaks.growth_bytes == 0
    assert "no leak verdict: 1 iteration(s)" in leaks.verdict_note
    assert not [f for f in out.findings if f.rule_id == "memory_growth"]
    assert "3 needed" in out.not_run["memory_growth"]
    # the gradients are there, alive at the end: just not growth across iterations
    assert leaks.live_at_end_bytes == 8 * 8 * MiB + 8 * 8 * MiB


def test_loss_kept_every_iteration_is_a_leak(tmp_path: Path) -> None:
    s = _Snap()
    grads: list[int] = []
    kept: list[int] = []
    opt: list[int] = []
    for _ in range(5):
        _iteration(s, layers=2, grads=grads, keep_loss=kept, opt=opt)
    r, out = _rules(_write(tmp_path, s.doc(), "leak.pickle"))
    leaks = r["memory_leaks"]
    assert (leaks.window_kind, leaks.n_windows) == ("iterations", 5)
    assert leaks.verdict_note is None
    assert leaks.suspects.height == 1
    row = leaks.suspects.row(0, named=True)
    assert row["site"] == "train_step (u/train.py:31)" and row["site_kind"] == "python"
    assert row["growth_bytes"] == 4 * 8 * MiB and row["grew_windows"] == 4 and row["end_bytes"] == 5 * 8 * MiB
    assert row["stack"][0].startswith("cross_entropy (") and row["stack"][-1].startswith("_run_module_as_main")
    assert leaks.floor_rising
    floors = leaks.window_floor_bytes  # the first iteration adds gradients and optimizer state once
    assert [b - a for a, b in zip(floors[1:], floors[2:])] == [8 * MiB] * 3
    (f,) = [f for f in out.findings if f.rule_id == "memory_growth"]
    assert f.cost_bytes == 32 * MiB and f.confidence == 0.7
    # one figure: the finding's share is the analysis'
    assert f.evidence["pct_of_peak"] == leaks.growth_pct_of_peak
    assert leaks.growth_pct_of_peak == round(32 * MiB * 100.0 / r["memory_peak"].peak_allocated_bytes, 2)
    # with 6 iterations required, 5 are not enough
    r6, out6 = _rules(_write(tmp_path, s.doc(), "leak6.pickle"), Config({"memory_leaks.min_iterations": 6}))
    assert r6["memory_leaks"].suspects.is_empty() and "6 needed" in out6.not_run["memory_growth"]


def test_peak_and_oom_sites_carry_kind_and_stack(tmp_path: Path) -> None:
    s = _Snap()
    _iteration(s, layers=2, grads=[], keep_loss=None, opt=[])
    r = run_analyses(load(_write(tmp_path, s.doc(), "p.pickle")), strict=True)
    mp = r["memory_peak"]
    top = mp.top_sites.row(0, named=True)
    assert top["site"] == "forward (u/model.py:9)" and top["site_kind"] == "python"
    assert top["stack"][0].startswith("_call_impl (") and len(top["stack"]) == len(FWD)
    assert "stack" not in mp.tables()["Live at peak by call site"].columns
    assert json.dumps(mp.to_json())  # lists serialise


# --------------------------------------------------------------------------------------
# 4. One percentage per fact
# --------------------------------------------------------------------------------------

@pytest.mark.shared
@pytest.mark.skipif(not (SNAPSHOTS / "MAGMA27__memory_snapshot.pickle").exists(), reason="../shared absent")
def test_activation_share_is_the_tables_on_a_real_snapshot() -> None:
    r, out = _rules(SNAPSHOTS / "MAGMA27__memory_snapshot.pickle")
    (f,) = [f for f in out.findings if f.rule_id == "activation_peak"]
    row = r["memory_peak"].categories.filter(pl.col("category") == "activation").row(0, named=True)
    assert f.evidence["pct_of_peak"] == row["pct_of_peak"]
    assert f.title.startswith(f"Activations are {row['pct_of_peak']:.0f} % of the memory peak")
    frag = [f for f in out.findings if f.rule_id == "fragmentation"]
    fr = r["memory_fragmentation"]
    assert frag and frag[0].evidence["unused_pct_of_reserved"] in (fr.max_unused_pct_of_reserved,
                                                                   fr.free_pct_of_reserved)


def test_no_repeating_pattern_gives_no_verdict(tmp_path: Path) -> None:
    # No stacks (context=None): no cycle and no recurring stack to cut iterations with.
    s = _Snap()
    for _ in range(6):
        s.alloc(4 * MiB, [])
    r, out = _rules(_write(tmp_path, s.doc(), "nostack.pickle"))
    leaks = r["memory_leaks"]
    assert (leaks.window_kind, leaks.n_windows) == ("none", 1) and leaks.suspects.is_empty()
    assert "no repeating pattern" in out.not_run["memory_growth"]
