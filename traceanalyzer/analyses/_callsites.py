"""Call sites: which line of the user's code (or which CPU op chain) an event came from.

Shared by the copies, syncs, idle-gaps and memory analyses (private to the analyses package). Three answers, best first:

1. **Innermost user Python frame** (``with_stack=True`` traces): the deepest
   ``python_function`` event on the same thread that covers the event's start and is
   *user code* by :func:`is_user_frame` — i.e. not the standard library, not torch and
   the usual frameworks, not ``<built-in …>``/``<frozen …>``/``<string>`` pseudo-frames,
   not ``nn.Module: X_0`` markers (``with_modules``), not anything under
   ``site-packages``/``dist-packages``/``lib/pythonX.Y``.
2. **Innermost Python frame of any kind** when no user frame covers the event (e.g. the
   copy happens in a library thread); reported with ``site_kind = "library"``.
3. **CPU context chain** without stacks: the enclosing ``record_function``/user
   annotations and the outermost CPU op, outermost first
   (``"## forward ## > aten::to"``), ``site_kind = "ops"``.

torch.profiler writes frame names as ``<path>(<line>): <function>`` where ``<path>`` has the
``sys.path`` entry stripped (``torch/nn/modules/module.py``, ``transformers/…``,
``threading.py``) unless the file lies outside it (``/home/me/train.py``). A bare
relative path is classified by its first component: a standard-library module
(``sys.stdlib_module_names``) or a known library (:data:`LIBRARY_MODULES`, extendable per
call) is library code; anything else is the user's.

Everything is vectorised: the predicate is a polars expression, attribution is
:func:`~traceanalyzer.model.relations.deepest_at` plus a bounded number of parent joins
(one per nesting level, never one per event).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

import polars as pl

from traceanalyzer.model import TraceModel
from traceanalyzer.model.relations import (
    CoverIndex,
    TraceTables,
    by_id,
    cover_index,
    deepest_at,
    nest_with_index,
    trace_tables,
)

#: Top-level modules treated as library code (besides the standard library). Users who
#: develop one of these pass it in ``user_modules`` to see its lines as theirs.
LIBRARY_MODULES: frozenset[str] = frozenset(
    {
        "torch", "torchvision", "torchaudio", "torchtext", "torchdata", "torchgen", "functorch",
        "triton", "numpy", "scipy", "pandas", "transformers", "accelerate", "deepspeed", "apex",
        "lightning", "pytorch_lightning", "lightning_fabric", "timm", "diffusers", "peft",
        "safetensors", "tokenizers", "datasets", "huggingface_hub", "xformers", "flash_attn",
        "tqdm", "typing_extensions", "_pytest", "pytest", "pluggy", "IPython", "ipykernel",
        "tornado", "zmq", "PIL", "cv2", "einops", "fsspec", "google", "wandb", "tensorboard",
        "torch_xla", "intel_extension_for_pytorch", "habana_frameworks",
    }
)

_STDLIB: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__", "<frozen"}
# Components that mark an installed or interpreter path wherever they appear: site/dist-packages,
# a Unix interpreter's lib/pythonX.Y, a Windows interpreter's Lib/ (capital L), pseudo-files
# (<frozen …>, <string>, <built-in …>) and nn.Module markers. A Jupyter cell is user code although
# its file is a pseudo-file (<ipython-input-3-…>) or a temporary one (/tmp/ipykernel_123/456.py).
_LIB_PATH_RE = (r"(^|/)(site-packages|dist-packages)/|/lib(64)?/python\d|/python\d+(\.\d+)?/lib/|(^|/)Lib/|^<|"
                r"^nn\.Module:")
_NOTEBOOK_CELL_RE = r"^<ipython-input-"
# Framework and notebook/runtime packages found by an absolute path outside site-packages
# (a source checkout, an editable install).
_TORCH_COMPONENT_RE = r"/(torch|torchvision|torchaudio|functorch|torchgen|triton|IPython|ipykernel)/"
# A Python source file (or a notebook cell): C++ frames (``??``, ``foo.cpp``, ``libtorch.so``) are not.
_PYTHON_FILE_RE = r"\.py[cwx]?$|^<"
_FRAME_RE = r"^(.*)\((\d+)\): (.*)$"


def _csv(text: str | Iterable[str] | None) -> list[str]:
    if text is None:
        return []
    if isinstance(text, str):
        return [t.strip() for t in text.split(",") if t.strip()]
    return [t.strip() for t in text if t and t.strip()]


def user_path_expr(
    path: pl.Expr,
    library_modules: str | Iterable[str] | None = None,
    user_modules: str | Iterable[str] | None = None,
) -> pl.Expr:
    """Polars expression: True where a frame's source file is user code.

    The one frame filter of the tool: trace call sites (:func:`user_frame_expr`) and
    snapshot call sites (:func:`~traceanalyzer.analyses.memory_timeline.stack_sites`) both
    use it. Library code is: not a Python file (C++ frames: ``??``, ``*.cpp``, ``*.so``, no
    file), the standard library (``threading.py``, ``runpy.py``, ``asyncio/…``, ``<frozen …>``
    under ``lib/pythonX.Y`` or a Windows ``Lib/``), anything under ``site-packages`` /
    ``dist-packages`` (torch, ipykernel, IPython …), pseudo-files (``<string>``,
    ``<built-in …>``), an absolute path through a ``torch``/``triton``/``IPython``/``ipykernel``
    folder, and a relative path whose first component is a standard-library module or in
    :data:`LIBRARY_MODULES`. Jupyter cells (``<ipython-input-…>``, ``/tmp/ipykernel_*/…py``)
    are user code. Windows paths are compared with ``/`` separators.
    ``library_modules``/``user_modules`` (iterables or comma-separated text) add top-level
    modules to, or remove them from, the library set.
    """
    extra_user = set(_csv(user_modules))
    libs = sorted((_STDLIB | LIBRARY_MODULES | set(_csv(library_modules))) - extra_user)
    path = path.str.replace_all(r"\\", "/")
    first = path.str.extract(r"^([^/]+?)(?:\.py[cw]?)?(?:/|$)", 1)
    absolute = path.str.starts_with("/") | path.str.contains(r"^[A-Za-z]:/")
    cell = path.str.contains(_NOTEBOOK_CELL_RE)
    is_lib = (
        path.is_null()  # <built-in …>, nn.Module: …, anything without "file(line): func"
        | ~path.str.contains(_PYTHON_FILE_RE)
        | (path.str.contains(_LIB_PATH_RE) & ~cell)
        | (absolute & path.str.contains(_TORCH_COMPONENT_RE))
        | (~absolute & first.is_in(libs))
    )
    if extra_user:
        forced = ~absolute & first.is_in(sorted(extra_user))
        return (~is_lib | forced).fill_null(False)
    return (~is_lib).fill_null(False)


def user_frame_expr(
    name: pl.Expr,
    library_modules: str | Iterable[str] | None = None,
    user_modules: str | Iterable[str] | None = None,
) -> pl.Expr:
    """Polars expression: True where the ``python_function`` name (``file.py(12): func``) is
    user code, by :func:`user_path_expr` on its file."""
    return user_path_expr(name.str.extract(_FRAME_RE, 1), library_modules, user_modules)


def is_user_frame(
    name: str,
    library_modules: str | Iterable[str] | None = None,
    user_modules: str | Iterable[str] | None = None,
) -> bool:
    """Scalar form of :func:`user_frame_expr`, for one frame name."""
    out = pl.select(user_frame_expr(pl.lit(name, dtype=pl.String), library_modules, user_modules)).item()
    return bool(out)


def frame_parts(name: pl.Expr) -> list[pl.Expr]:
    """``file``, ``line`` (Int64) and ``function`` of a ``file.py(12): func`` frame name."""
    return [
        name.str.extract(_FRAME_RE, 1).alias("file"),
        name.str.extract(_FRAME_RE, 2).cast(pl.Int64).alias("line"),
        name.str.extract(_FRAME_RE, 3).alias("function"),
    ]


def short_site(name: pl.Expr) -> pl.Expr:
    """``file.py:12 (func)`` from ``file.py(12): func``; other names unchanged."""
    return (
        pl.when(name.str.contains(_FRAME_RE))
        .then(pl.format("{}:{} ({})", *(e for e in frame_parts(name))))
        .otherwise(name)
    )


def has_stacks(model: TraceModel) -> bool:
    """True when the trace holds Python frames (profiled with ``with_stack=True``), as
    ``python_function`` events or, in PyTorch 1.8-1.9 traces, as the ops' ``Call stack``."""
    return model.python_frames.height > 0 or _legacy_stacks(model).height > 0


def _legacy_stacks(model: TraceModel) -> pl.DataFrame:
    """The CPU ops that carry a ``Call stack`` (PyTorch 1.8-1.9; ``call_stack``)."""
    ops = model.cpu_ops
    if "call_stack" not in ops.columns:
        return ops.clear()
    return ops.filter(pl.col("call_stack").is_not_null())


def _points(points: pl.DataFrame, point_col: str) -> pl.DataFrame:
    return points.select(
        pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), pl.col(point_col).cast(pl.Int64).alias("ts_ns")
    )


def _covering(intervals: pl.DataFrame, pts: pl.DataFrame, value: str = "name") -> pl.Series:
    """``value`` of the deepest interval of ``intervals`` covering each point (null if none)."""
    if intervals.is_empty() or pts.is_empty():
        return pl.Series(value, [None] * pts.height, dtype=intervals.schema.get(value, pl.String))
    iv = intervals.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    ids = deepest_at(iv.select("id", "ts_ns", "end_ns", "pid", "tid"), pts)
    return iv[value].gather(ids)  # ids are row numbers of iv


def innermost_frames(
    model: TraceModel,
    points: pl.DataFrame,
    point_col: str = "ts_ns",
    library_modules: str | Iterable[str] | None = None,
    user_modules: str | Iterable[str] | None = None,
) -> pl.DataFrame:
    """For each point (``pid, tid, point_col``): ``user_frame`` and ``any_frame``.

    ``user_frame`` is the innermost covering user frame, ``any_frame`` the innermost
    covering frame that has a file and line (library code included). Both are null when
    the trace has no stacks or nothing covers the point.
    """
    pts = _points(points, point_col)
    if model.python_frames.is_empty():
        legacy = _legacy_stacks(model)
        if legacy.height:
            return _legacy_frames(legacy, pts, library_modules, user_modules)
    py = model.python_frames.select("name", "ts_ns", "end_ns", "pid", "tid")
    # Classify each distinct name once (frames repeat: 120k events, a few thousand names).
    names = py.select(pl.col("name").unique()).with_columns(
        user=user_frame_expr(pl.col("name"), library_modules, user_modules),
        named=pl.col("name").str.contains(_FRAME_RE) & ~pl.col("name").str.starts_with("<"),
    )
    py = py.join(names, on="name", how="left", maintain_order="left")
    user = py.filter(pl.col("user")).drop("user", "named")
    named = py.filter(pl.col("named")).drop("user", "named")
    return pl.DataFrame(
        {"user_frame": _covering(user, pts), "any_frame": _covering(named, pts)},
        schema={"user_frame": pl.String, "any_frame": pl.String},
    )


def _legacy_frames(
    ops: pl.DataFrame,
    pts: pl.DataFrame,
    library_modules: str | Iterable[str] | None,
    user_modules: str | Iterable[str] | None,
) -> pl.DataFrame:
    """:func:`innermost_frames` from PyTorch 1.8-1.9's ``Call stack`` (``"f(l): fn;…"``, innermost
    frame first) of the deepest CPU op carrying one that covers each point: ``user_frame`` is
    that stack's first user frame, ``any_frame`` its first frame."""
    stacks = ops.select(pl.col("call_stack").unique())
    frames = (
        stacks.with_columns(frame=pl.col("call_stack").str.split(";"))
        .explode("frame")
        .with_columns(pl.col("frame").str.strip_chars())
        .filter(pl.col("frame") != "")
        .with_columns(user=user_frame_expr(pl.col("frame"), library_modules, user_modules))
    )
    per_stack = frames.group_by("call_stack").agg(
        user_frame=pl.col("frame").filter(pl.col("user")).first(), any_frame=pl.col("frame").first()
    )
    iv = ops.select("ts_ns", "end_ns", "pid", "tid", "call_stack").join(per_stack, on="call_stack", how="left")
    user = iv.filter(pl.col("user_frame").is_not_null())
    return pl.DataFrame(
        {"user_frame": _covering(user, pts, "user_frame"), "any_frame": _covering(iv, pts, "any_frame")},
        schema={"user_frame": pl.String, "any_frame": pl.String},
    )


def cpu_tree(src: TraceModel | TraceTables) -> pl.DataFrame:
    """The columns of :func:`build_cpu_tree` that :func:`cpu_chain` and idle-gap attribution
    read, ``id, name, source, parent_id``, built once per run (copies, syncs and idle_gaps
    share it; the times stay in its cover index: half the memory of the whole tree)."""
    return cpu_tree_index(src)[0]


def cpu_tree_index(src: TraceModel | TraceTables) -> tuple[pl.DataFrame, CoverIndex]:
    """:func:`cpu_tree` and the :func:`~traceanalyzer.model.relations.cover_index` of its
    intervals (by ``id``), built together once per run."""
    t = trace_tables(src)

    def build() -> tuple[pl.DataFrame, CoverIndex]:
        return _build_cpu_tree(t.model, ["id", "name", "source"])

    return t.get("cpu_tree", build)


def build_cpu_tree(model: TraceModel) -> pl.DataFrame:
    """CPU ops and user annotations (not ProfilerStep#) with nesting: ``id`` (the row number),
    ``name, ts_ns, end_ns, pid, tid, source, depth, parent_id``. Pass it to :func:`cpu_chain`/:func:`attribute` when
    attributing several point sets of one trace, to build it once."""
    return _build_cpu_tree(model)[0]


def _build_cpu_tree(model: TraceModel, columns: Sequence[str] | None = None) -> tuple[pl.DataFrame, CoverIndex]:
    """The tree (``columns`` of it, or all, plus ``depth, parent_id``) and its cover index."""
    cols = ["name", "ts_ns", "end_ns", "pid", "tid"]
    iv = (
        pl.concat(
            [
                model.cpu_ops.select(cols).with_columns(source=pl.lit("cpu_op")),
                model.annotations.select(cols).with_columns(source=pl.lit("annotation")),
            ]
        )
        .filter(~pl.col("name").str.starts_with("ProfilerStep#"))
        .with_row_index("id")
        .with_columns(pl.col("id").cast(pl.Int64))
    )
    if iv.is_empty():
        tree = iv.with_columns(parent_id=pl.lit(None, dtype=pl.Int64), depth=pl.lit(None, dtype=pl.Int64))
        return tree, cover_index(tree)
    # Nesting and the covering index of cpu_chain from one sort of the boundaries.
    links, index = nest_with_index(iv.filter(pl.col("end_ns") > pl.col("ts_ns")).select("id", "ts_ns", "end_ns",
                                                                                          "pid", "tid"))
    if columns is not None:
        return iv.select(columns).with_columns(parent_id=by_id(iv["id"], links["id"], links["parent_id"])), index
    return iv.with_columns(
        depth=by_id(iv["id"], links["id"], links["depth"]), parent_id=by_id(iv["id"], links["id"], links["parent_id"])
    ), index


def cpu_chain(
    src: TraceModel | TraceTables,
    points: pl.DataFrame,
    point_col: str = "ts_ns",
    max_depth: int = 64,
    tree: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """For each point: ``innermost_op``, ``outermost_op``, ``chain`` and ``op_site``.

    * ``innermost_op`` / ``outermost_op``: deepest / top-level CPU op covering the point
      (null if none); ``outermost_op_id`` identifies the latter's instance (row id in
      :func:`cpu_tree`);
    * ``chain``: every covering annotation and op, outermost first, joined with " > ";
    * ``op_site``: the covering annotations and the outermost op only — what the user's
      code called, without ATen internals (``"## forward ## > aten::to"``).

    ``tree`` (from :func:`build_cpu_tree`, or the run's :func:`cpu_tree`) saves building it
    again for several point sets.
    """
    pts = _points(points, point_col)
    t = trace_tables(src)
    if tree is None or ("cpu_tree" in t.held() and tree is cpu_tree(t)):
        tree, index = cpu_tree_index(t)
    else:
        index = cover_index(tree.select("id", "ts_ns", "end_ns", "pid", "tid"))
    schema = {"innermost_op": pl.String, "outermost_op": pl.String, "outermost_op_id": pl.Int64,
              "chain": pl.String, "op_site": pl.String}
    if tree.is_empty() or pts.is_empty():
        return pl.DataFrame({k: [None] * pts.height for k in schema}, schema=schema)
    deepest = index.lookup(pts)
    # Tree ids are its row numbers (build_cpu_tree): a node's fields are a gather, not a join.
    parent, source, name = tree["parent_id"], tree["source"], tree["name"]
    levels = []
    cur = pl.DataFrame({"_row": pl.int_range(pts.height, eager=True, dtype=pl.Int64), "id": deepest})
    cur = cur.filter(pl.col("id").is_not_null())
    for level in range(max_depth):  # one step per nesting level, not per event
        if cur.is_empty():
            break
        ids = cur["id"]
        levels.append(cur.with_columns(pl.lit(level, dtype=pl.Int64).alias("level"), pl.col("id"),
                                       source.gather(ids), name.gather(ids)).select(
            "_row", "level", "id", "source", "name"))
        cur = cur.with_columns(id=parent.gather(ids)).filter(pl.col("id").is_not_null())
    rows = pl.DataFrame({"_row": pl.int_range(pts.height, eager=True, dtype=pl.Int64)})
    if not levels:
        return pl.DataFrame({k: [None] * pts.height for k in schema}, schema=schema)
    long = pl.concat(levels).sort(["_row", "level"], descending=[False, True])  # outermost first
    is_op = pl.col("source") == "cpu_op"
    agg = long.group_by("_row", maintain_order=True).agg(
        innermost_op=pl.col("name").filter(is_op).last(),
        outermost_op=pl.col("name").filter(is_op).first(),
        outermost_op_id=pl.col("id").filter(is_op).first(),
        chain=pl.col("name").str.join(" > "),
        _top_level=pl.col("level").filter(is_op).max(),
        _ann=pl.col("name").filter(pl.col("source") == "annotation"),
    )
    agg = agg.with_columns(
        op_site=pl.concat_list(pl.col("_ann"), pl.col("outermost_op").fill_null(pl.lit(None)))
        .list.drop_nulls()
        .list.join(" > ")
    ).with_columns(pl.when(pl.col("op_site") == "").then(None).otherwise(pl.col("op_site")).alias("op_site"))
    out = rows.join(agg, on="_row", how="left").sort("_row")
    return out.select(list(schema))


def attribute(
    src: TraceModel | TraceTables,
    points: pl.DataFrame,
    point_col: str = "ts_ns",
    library_modules: str | Iterable[str] | None = None,
    user_modules: str | Iterable[str] | None = None,
    tree: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Call-site attribution of points (``pid, tid, point_col``), aligned with ``points``.

    Columns: ``user_frame``, ``any_frame``, ``innermost_op``, ``outermost_op``, ``outermost_op_id``,
    ``chain``, ``op_site``, the resolved ``site`` with its ``site_kind``
    (``"python"``: innermost user frame; ``"library"``: innermost frame, no user frame
    covers it; ``"ops"``: CPU op chain, no stacks; ``"none"``), and ``via``: the innermost
    frame (library code) below the user frame, when it differs — the line inside the
    library that the user's line called.
    """
    t = trace_tables(src)
    frames = innermost_frames(t.model, points, point_col, library_modules, user_modules)
    chain = cpu_chain(t, points, point_col, tree=tree)
    df = pl.concat([frames, chain], how="horizontal")
    return df.with_columns(
        site=pl.coalesce(short_site(pl.col("user_frame")), short_site(pl.col("any_frame")), pl.col("op_site")),
        via=pl.when(pl.col("user_frame").is_not_null() & (pl.col("any_frame") != pl.col("user_frame")))
        .then(short_site(pl.col("any_frame")))
        .otherwise(None),
        site_kind=pl.when(pl.col("user_frame").is_not_null())
        .then(pl.lit("python"))
        .when(pl.col("any_frame").is_not_null())
        .then(pl.lit("library"))
        .when(pl.col("op_site").is_not_null())
        .then(pl.lit("ops"))
        .otherwise(pl.lit("none")),
    )


STACK_HINT = (
    "this trace has no Python stacks: profile with torch.profiler.profile(with_stack=True) "
    "to name the file and line of each call site (shown here: the enclosing record_function "
    "ranges and the top-level CPU op)"
)

__all__: Sequence[str] = (
    "LIBRARY_MODULES",
    "STACK_HINT",
    "attribute",
    "cpu_chain",
    "build_cpu_tree",
    "cpu_tree",
    "cpu_tree_index",
    "frame_parts",
    "has_stacks",
    "innermost_frames",
    "is_user_frame",
    "short_site",
    "user_frame_expr",
    "user_path_expr",
)
