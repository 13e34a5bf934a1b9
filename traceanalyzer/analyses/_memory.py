"""Helpers shared by the snapshot analyses (private to the analyses package): the call sites
of allocation stacks (:func:`stack_sites`, :func:`attach_stacks`), the allocations live at an
event (:func:`live_at`), what they are made of (:func:`breakdown`) and decimated series for
charts (:func:`decimate`)."""

from __future__ import annotations

from typing import Any

import polars as pl

# C++ frames MemoryViz hides (its frameFilter) and C++ runtime frames: allocator, unwinder,
# interpreter, dispatcher, ATen/c10/torch internals, shared objects, unresolved addresses.
# Matched at the start of the name: ``my_ext::op(at::Tensor const&)`` is not an ATen internal.
_NOISE_NAME = (r"(^(c10::|at::|torch::|_Py|Py[A-Z]|\?\?|<built-in|<unknown|0x[0-9a-fA-F]+)|"
               r"unwind::unwind|CapturedTraceback|PyEval_|ceval\.c|core/boxing|/Register)")


_NOISE_FILE = r"(\.so(\.\d+)*$|^\?\?|^$)"


# Python runtime wrappers: the frames every stack starts with (interpreter entry, threads,
# notebooks, event loops), never where the memory is used.
_WRAPPER_FILE = (r"(threading\.py$|runpy\.py$|^<frozen|[/\\]asyncio[/\\]|[/\\]ipykernel[/\\]|[/\\]IPython[/\\]|"
                 r"[/\\]tornado[/\\]|[/\\]zmq[/\\]|[/\\]traitlets[/\\]|^<string>|[/\\]concurrent[/\\]|"
                 r"[/\\](multiprocessing|pydevd|debugpy|_pydev_bundle)[/\\])")


_OPTIM = r"(?i)([\\/]optim[\\/]|optimizer)"


_BACKWARD_NAME = r"(?i)([\\/]autograd[\\/]|backward)"


_AUTOGRAD_FILE = r"[\\/]autograd[\\/]"


_PARAM_FUNCS = ["__init__", "_apply", "to", "cuda", "load_state_dict", "_load_from_state_dict",
                "reset_parameters", "build_model", "from_pretrained", "to_empty", "register_parameter"]


_FORWARD_FUNCS = ["forward", "_call_impl", "_wrapped_call_impl", "__call__"]


#: Rank of a frame as a call site, best first: the innermost frame of the lowest rank is the site.
SITE_KINDS = ("python", "library", "runtime", "native", "native_internal")


NO_STACK = "<no stack: allocated before recording or recorded without context>"


STACKS_SCHEMA: dict[str, Any] = {
    "stack_id": pl.Int64, "site": pl.String, "site_kind": pl.String, "stack_category": pl.String,
    "stack": pl.List(pl.String),
}


def _short_path_expr(path: pl.Expr) -> pl.Expr:
    """The last two components of a path (``dir/file.py``), Windows separators as ``/``."""
    p = path.str.replace_all(r"\\", "/").str.replace_all("/+", "/").str.strip_chars("/")
    return pl.coalesce(p.str.extract(r"([^/]+/[^/]+)$", 1), p)


def stack_sites(frames: pl.DataFrame) -> pl.DataFrame:
    """One row per stack: ``site`` (the chosen frame, "func (dir/file.py:line)"), its
    ``site_kind``, the frame-inferred ``stack_category`` and the raw ``stack``.

    The site is the innermost frame of the best kind present (:data:`SITE_KINDS`):

    * ``python``: user code, by the tool's one frame filter
      (:func:`~traceanalyzer.analyses._callsites.user_path_expr`): not torch/site-packages,
      not the standard library, not a C++ frame. Jupyter cells count as user code.
    * ``library``: no user frame; the innermost Python frame of a library (``torch/optim/…``).
    * ``runtime``: only Python runtime wrappers (``threading.py``, ``runpy.py``, ``<frozen …>``,
      ``ipykernel``/``IPython``, ``asyncio`` …).
    * ``native``: a C++-only stack; the innermost frame outside the allocator, unwinder,
      interpreter and ``c10::``/``at::``/``torch::`` internals (a C++ extension's function).
    * ``native_internal``: nothing but those; the innermost frame.

    Anything but ``python`` says the stack has no frame in the user's code (the ``site``
    is the best there is). ``stack`` lists every frame, innermost first, as
    ``"func (file:line)"`` with the full path: the raw evidence behind the site.
    Categories: ``optimizer_state`` (a frame in ``*/optim/*``), ``backward`` (a
    backward/autograd frame: gradients and backward temporaries), ``parameter`` (module
    construction/loading: ``__init__``, ``to``, ``cuda``, ``load_state_dict`` …),
    ``forward`` (a module ``forward``), else ``unknown``.

    Vectorised over frames (one row per (stack, depth)); stacks are deduplicated.
    """
    from traceanalyzer.analyses._callsites import user_path_expr

    if frames.is_empty():
        return pl.DataFrame(schema=STACKS_SCHEMA)
    file = pl.col("filename").fill_null("")
    name = pl.col("name").fill_null("")
    py = file.str.contains(r"\.py[cwx]?$|^<") & ~file.str.contains(r"^<(built-in|unknown)")
    rank = (
        pl.when(user_path_expr(pl.col("filename"))).then(0)
        .when(py & ~file.str.contains(_WRAPPER_FILE)).then(1)
        .when(py).then(2)
        .when(~name.str.contains(_NOISE_NAME) & ~file.str.contains(_NOISE_FILE) & (name != "")).then(3)
        .otherwise(4)
    )
    fn = file.str.replace(r"^$", "?")
    where = pl.when(file.is_in(["", "??"])).then(fn).otherwise(
        pl.format("{}:{}", _short_path_expr(file), pl.col("line").cast(pl.String).fill_null("?")))
    f = frames.sort("stack_id", "depth").with_columns(
        _rank=rank.cast(pl.Int64),
        _label=pl.format("{} ({})", name, where),
        _raw=pl.format("{} ({}:{})", name, fn, pl.col("line").cast(pl.String).fill_null("?")),
    )
    out = f.group_by("stack_id", maintain_order=True).agg(
        site=pl.col("_label").sort_by("_rank", "depth").first(),
        _kind=pl.col("_rank").min(),
        _optim=file.str.contains(_OPTIM).any(),
        _backward=name.str.contains(_BACKWARD_NAME).any() | file.str.contains(_AUTOGRAD_FILE).any(),
        _param=name.is_in(_PARAM_FUNCS).any(),
        _forward=name.is_in(_FORWARD_FUNCS).any(),
        stack=pl.col("_raw"),
    )
    return out.select(
        pl.col("stack_id").cast(pl.Int64),
        "site",
        site_kind=pl.col("_kind").replace_strict(dict(enumerate(SITE_KINDS)), return_dtype=pl.String),
        stack_category=pl.when("_optim").then(pl.lit("optimizer_state"))
        .when("_backward").then(pl.lit("backward"))
        .when(pl.col("_param") & ~pl.col("_forward")).then(pl.lit("parameter"))
        .when("_forward").then(pl.lit("forward"))
        .otherwise(pl.lit("unknown")),
        stack="stack",
    ).cast(STACKS_SCHEMA)  # type: ignore[arg-type]


def attach_stacks(df: pl.DataFrame, stacks: pl.DataFrame | None) -> pl.DataFrame:
    """Add ``site_kind`` and the raw ``stack`` (of the row's ``stack_id``) to a grouped table;
    rows without a stack get ``site_kind = "none"``. Drops ``stack_id``."""
    if stacks is None or "stack_id" not in df.columns:
        return df.with_columns(site_kind=pl.lit("none"), stack=pl.lit(None, dtype=pl.List(pl.String))).drop(
            "stack_id", strict=False)
    return df.join(stacks.select("stack_id", "site_kind", "stack"), on="stack_id", how="left",
                   maintain_order="left").with_columns(pl.col("site_kind").fill_null("none")).drop("stack_id")


def live_at(allocations: pl.DataFrame, device: int, event_idx: int) -> pl.DataFrame:
    """Allocations held by the program just after event ``event_idx`` (``-1`` = before
    the first event) on ``device``: ``alloc_idx <= i < free_requested_idx``."""
    return allocations.filter(
        (pl.col("device") == device) & (pl.col("alloc_idx") <= event_idx)
        & (pl.col("free_requested_idx").is_null() | (pl.col("free_requested_idx") > event_idx))
    )


def decimate(series: pl.DataFrame, max_points: int = 1000) -> pl.DataFrame:
    """At most ``max_points`` rows per device, keeping each bucket's maxima (so peaks
    survive); ``event_idx``/``ts_ns`` are the bucket's first event."""
    if series.is_empty():
        return series.drop("action")
    out = []
    for (_dev,), g in series.group_by(["device"], maintain_order=True):
        k = max(1, -(-g.height // max_points))
        out.append(
            g.with_columns(_b=pl.int_range(pl.len()) // k).group_by("_b", maintain_order=True).agg(
                pl.col("device").first(), pl.col("event_idx").first(), pl.col("ts_ns").first(),
                pl.col("allocated_bytes").max(), pl.col("active_bytes").max(), pl.col("reserved_bytes").max(),
            ).drop("_b")
        )
    return pl.concat(out)


def breakdown(live: pl.DataFrame, total: int, top_n: int, stacks: pl.DataFrame | None = None,
              pct: str = "pct_of_peak") -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(top allocations, top sites, categories) of a set of live allocations; each share of
    ``total`` is in the column named ``pct`` (its base in its name).

    Sites and allocations carry ``site_kind`` (``python`` when the site is a frame of the
    user's code, see :func:`~traceanalyzer.analyses.memory_timeline.stack_sites`) and the raw
    ``stack`` behind it (for a site: the stack of its largest live allocation)."""
    denom = max(total, 1)
    # Address breaks ties: allocations made before recording all have alloc_idx −1.
    top = live.sort(
        ["bytes", "alloc_idx", "device", "addr"], descending=[True, False, False, False]).head(top_n).select(
        "device", "bytes", "site", "category", "alloc_idx", "alloc_ts_ns", "stream", "addr", "stack_id",
    ).with_columns((pl.col("bytes") * 100.0 / denom).round(2).alias(pct))
    top = attach_stacks(top, stacks)
    sites = (
        live.group_by("site").agg(bytes=pl.col("bytes").sum(), count=pl.len(),
                                  category=pl.col("category").mode().sort().first(),
                                  stack_id=pl.col("stack_id").sort_by("bytes", "alloc_idx", descending=[True, False])
                                  .first())
        .with_columns((pl.col("bytes") * 100.0 / denom).round(2).alias(pct))
        .sort(["bytes", "site"], descending=[True, False]).head(top_n)
        .select("site", "category", "count", "bytes", pct, "stack_id")
    )
    sites = attach_stacks(sites, stacks)
    cats = (
        live.group_by("category").agg(bytes=pl.col("bytes").sum(), count=pl.len())
        .with_columns((pl.col("bytes") * 100.0 / denom).round(2).alias(pct))
        .sort(["bytes", "category"], descending=[True, False])
    )
    return top, sites, cats
