"""Charts: analysis results → matplotlib figures (the ``png`` format), and the chart registry.

Each chart is drawn two ways from the same results: a matplotlib figure here (``--format png``)
and its inline SVG twin for the HTML page (:func:`svg_chart`, ``report/_svg_charts.py``), which
shows the same data, series, labels, colours and title without matplotlib.

Contract
--------
A chart is registered with :func:`chart`::

    @chart("kernels", section="kernels", title="Top kernels by total GPU time")
    def kernels_chart(res: KernelsResult, results: Mapping[str, object]) -> Figure | None: ...

* ``section`` names the analysis result it draws (the HTML places it in that
  analysis' section); ``also`` names other results it reads when present
  (:func:`_also`, typed by its result class). A chart whose ``section`` result is absent
  is not drawn; the registry passes it that result, so the function's first parameter is
  typed by the result class it draws.
* It only draws what the results hold (no recomputation beyond geometry: clipping a
  gap to its step window, converting ns to ms). It returns ``None`` when there is
  nothing worth drawing (e.g. one step).
* Figures are made with :class:`matplotlib.figure.Figure` and rendered with the Agg
  canvas: no pyplot state, no GUI, safe in threads and on headless machines.
* Drawing (:class:`ChartDrawing`, :func:`draw_all`): the figures are built in this process,
  then rasterised to PNG by it and by forked children (:func:`chart_jobs`) from one queue;
  each chart is drawn once per report.
* The HTML page's charts: :func:`draw_svgs` (every chart with an SVG drawing, in the same
  order; a chart without one, or one that fails, is reported in its place).

matplotlib is imported lazily (:func:`_mpl`) so a run without ``png`` never pays for it;
the Agg backend is selected explicitly there.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import select
import signal
import struct
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from traceanalyzer.analyses.copies import CopiesResult
from traceanalyzer.analyses.export_timeline import ExportTimelineResult
from traceanalyzer.analyses.gpu_time import GpuTimeResult
from traceanalyzer.analyses.idle_gaps import IdleGapsResult
from traceanalyzer.analyses.kernels import KernelsResult
from traceanalyzer.analyses.launches import LaunchesResult
from traceanalyzer.analyses.memory_peak import MemoryPeakResult
from traceanalyzer.analyses.memory_timeline import MemoryTimelineResult
from traceanalyzer.analyses.steps import StepsResult
from traceanalyzer.analyses.syncs import SyncsResult
from traceanalyzer.analyses.trace_memory import TraceMemoryResult
from traceanalyzer.units import device_name, fmt_bytes_short, fmt_ns_short

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

R = TypeVar("R")
#: A chart as the registry holds it: the result class of its first parameter is erased here
#: (:func:`draw` passes the ``section`` result by name); each chart function names it.
ChartFunc = Callable[[Any, Mapping[str, object]], "Figure | None"]

#: Figure geometry: 1056×528 px at the default dpi; fonts sized to stay legible when a
#: ticket shows the PNG as a ~400 px thumbnail.
FIGSIZE = (8.8, 4.4)
DPI = 120

# A calm, colour-blind-friendly palette (seaborn "deep"/"muted" family).
BLUE, ORANGE, GREEN, RED, PURPLE = "#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"
BROWN, PINK, GREY, KHAKI, CYAN = "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"
IDLE = "#D9D9D9"
CATEGORY_COLORS = {
    "compute": BLUE,
    "communication": PURPLE,
    "memcpy": ORANGE,
    "memset": KHAKI,
    "idle": IDLE,
}
CAUSE_COLORS = {
    "host_bound": RED,
    "sync": ORANGE,
    "memcpy": BROWN,
    "data_loader": PINK,
    "stream_dependency": PURPLE,
    "other": GREY,
}
CAUSE_LABELS = {
    "host_bound": "host-bound (CPU late)",
    "sync": "synchronisation",
    "memcpy": "blocking copy",
    "data_loader": "data loader",
    "stream_dependency": "stream dependency",
    "other": "other",
}


@dataclass(frozen=True)
class ChartSpec:
    name: str
    section: str
    title: str
    also: tuple[str, ...]
    order: int
    func: ChartFunc


_REGISTRY: dict[str, ChartSpec] = {}


def chart(
    name: str, *, section: str, title: str, also: tuple[str, ...] = (), order: int = 100
) -> Callable[[Callable[[R, Mapping[str, object]], Figure | None]], Callable[[R, Mapping[str, object]], Figure | None]]:
    """Register a chart; ``name`` is also the PNG file stem (``<name>.png``)."""

    def deco(func: Callable[[R, Mapping[str, object]], Figure | None]) -> Callable[[R, Mapping[str, object]],
                                                                                    Figure | None]:
        _REGISTRY[name] = ChartSpec(name, section, title, also, order, func)
        return func

    return deco


def registry() -> dict[str, ChartSpec]:
    return dict(_REGISTRY)


def _also(results: Mapping[str, object], name: str, kind: type[R]) -> R | None:
    """The result ``name`` a chart also reads, or ``None`` when it is absent."""
    value = results.get(name)
    return value if isinstance(value, kind) else None


def charts_for(results: Mapping[str, object]) -> list[ChartSpec]:
    """The charts whose ``section`` result is present, in drawing order."""
    return sorted(
        (s for s in _REGISTRY.values() if s.section in results),
        key=lambda s: (s.order, s.name),
    )


@dataclass(frozen=True)
class Drawn:
    """A drawn chart: its spec and PNG bytes, or the error that stopped it."""

    spec: ChartSpec
    png: bytes | None
    error: str | None = None


def draw(spec: ChartSpec, results: Mapping[str, object], dpi: int = DPI) -> bytes | None:
    """Render one chart to PNG bytes (``None`` when it has nothing to show)."""
    mpl = _mpl()
    with mpl.rc_context(_STYLE):
        fig = spec.func(results[spec.section], results)
        if fig is None:
            return None
        return figure_png(fig, dpi=dpi)


#: The output formats whose charts matplotlib draws (``png`` writes them): the others never import
#: matplotlib (the HTML page draws its charts as inline SVG, :func:`draw_svgs`).
CHART_FORMATS = frozenset({"png"})

#: A chart's inline SVG version (the HTML page's): the same result → an ``<svg>`` element, or ``None``.
SvgFunc = Callable[[Any, Mapping[str, object]], "str | None"]
_SVG: dict[str, SvgFunc] = {}


def svg_chart(name: str) -> Callable[[Callable[[R, Mapping[str, object]], str | None]],
                                     Callable[[R, Mapping[str, object]], str | None]]:
    """Register the SVG drawing of the chart ``name`` (registered with :func:`chart`): it shows the
    same data, series, labels, colours and title as the matplotlib figure, drawn by
    :mod:`traceanalyzer.report._svg` without matplotlib."""

    def deco(func: Callable[[R, Mapping[str, object]], str | None]) -> Callable[[R, Mapping[str, object]],
                                                                                str | None]:
        _SVG[name] = func
        return func

    return deco


@dataclass(frozen=True)
class DrawnSvg:
    """A chart drawn for the HTML page: its spec and ``<svg>`` element, or the error that stopped it."""

    spec: ChartSpec
    svg: str | None
    error: str | None = None


def draw_svgs(results: Mapping[str, object], strict: bool = False,
              on_drawn: Callable[[DrawnSvg], None] | None = None) -> list[DrawnSvg]:
    """Every applicable chart as inline SVG, in drawing order, without matplotlib. A chart with
    nothing to show is left out; one that fails (or has no SVG drawing) is reported in its
    place, never fatal (``strict`` re-raises: tests use it)."""
    import traceanalyzer.report._svg_charts  # noqa: F401 - registers the SVG drawings

    out: list[DrawnSvg] = []
    for spec in charts_for(results):
        func = _SVG.get(spec.name)
        try:
            if func is None:
                raise NotImplementedError("no SVG drawing of this chart")
            svg = func(results[spec.section], results)
        except Exception as exc:  # noqa: BLE001 - one broken chart must not sink the report
            if strict:
                raise
            drawn = DrawnSvg(spec, None, f"{type(exc).__name__}: {exc}")
        else:
            if svg is None:
                continue
            drawn = DrawnSvg(spec, svg)
        out.append(drawn)
        if on_drawn is not None:
            on_drawn(drawn)
    return out

#: Environment variable: how many processes render charts at once (``1``: in this process).
JOBS_ENV = "TRACEANALYZER_CHART_JOBS"
#: At most this many rendering processes, whatever the machine (a report has about ten charts).
_MAX_JOBS = 8


def chart_jobs() -> int:
    """How many processes render charts at once: ``$TRACEANALYZER_CHART_JOBS`` when set, else
    the CPUs this process may use (at most 8); 1 (in this process) where ``fork`` is not the
    safe default (anything but Linux)."""
    env = os.environ.get(JOBS_ENV, "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_JOBS))


_last: tuple[Any, int, list[Drawn]] | None = None  # (weakref to results, dpi, charts)


def draw_all(results: Mapping[str, object], dpi: int = DPI, strict: bool = False,
             on_drawn: Callable[[Drawn], None] | None = None, jobs: int | None = None) -> list[Drawn]:
    """Every applicable chart as PNG bytes, in drawing order (:class:`ChartDrawing`, finished at
    once). A chart that fails is reported, never fatal (``strict`` re-raises: tests use it).
    ``on_drawn`` is called with each chart as it is done (progress display)."""
    with ChartDrawing(results, dpi=dpi, strict=strict, on_drawn=on_drawn, jobs=jobs) as drawing:
        return drawing.finish()


class ChartDrawing:
    """The charts of ``results``, being drawn.

    Creating it builds the figures, one after the other (only this process reads the
    results' tables), and forks up to ``jobs - 1`` children (default :func:`chart_jobs`)
    that start rasterising them (text layout, Agg, PNG encoding: most of a chart's time) from
    a shared queue. The caller may do other work meanwhile (``analyze`` writes the formats
    without charts), then :meth:`finish` takes the rest of the queue here and collects the
    children's charts. Leaving the ``with`` block stops children still running.

    The charts of the last ``results`` drawn are kept (weakly), so writing both the PNG
    files and the HTML page of one report draws each chart once.
    """

    def __init__(self, results: Mapping[str, object], dpi: int = DPI, strict: bool = False,
                 on_drawn: Callable[[Drawn], None] | None = None, jobs: int | None = None) -> None:
        self.results, self.dpi, self.strict, self.on_drawn = results, dpi, strict, on_drawn
        self.slots: dict[int, Drawn] = {}
        self.out: list[Drawn] | None = None
        self.built: list[tuple[int, ChartSpec, Figure]] = []
        self.pool: _ForkedRender | None = None
        if _last is not None and not strict and _last[0]() is results and _last[1] == dpi:
            self.out = list(_last[2])
            for d in self.out:
                self._report(d)
            return
        mpl = _mpl()
        for i, spec in enumerate(charts_for(results)):
            try:
                with mpl.rc_context(_STYLE):
                    fig = spec.func(results[spec.section], results)
            except Exception as exc:  # noqa: BLE001 - one broken chart must not sink the report
                if strict:
                    raise
                self._done(i, Drawn(spec, None, f"{type(exc).__name__}: {exc}"))
                continue
            if fig is not None:
                self.built.append((i, spec, fig))
        n_jobs = min(jobs if jobs is not None else chart_jobs(), len(self.built))
        if n_jobs > 1:
            with mpl.rc_context(_STYLE):
                self.pool = _ForkedRender(self.built, n_jobs - 1, dpi, self._done)

    def _report(self, drawn: Drawn) -> None:
        if self.on_drawn is not None:
            self.on_drawn(drawn)

    def _done(self, i: int, drawn: Drawn) -> None:
        self.slots[i] = drawn
        self._report(drawn)

    def poll(self) -> None:
        """Collect the charts children finished so far (progress), without waiting."""
        if self.pool is not None and self.out is None:
            self.pool.read(0)

    def finish(self) -> list[Drawn]:
        """Every chart, in drawing order: this process rasterises what no child has taken yet."""
        global _last
        if self.out is not None:
            return list(self.out)
        mpl = _mpl()
        with mpl.rc_context(_STYLE):
            if self.pool is not None:
                self.pool.finish(lambda i, spec, fig: self._done(i, _render(spec, fig, self.dpi, self.strict)))
            else:
                for i, spec, fig in self.built:
                    self._done(i, _render(spec, fig, self.dpi, self.strict))
        for i, spec, _fig in self.built:
            if i not in self.slots:  # its process died (killed, out of memory)
                self._done(i, Drawn(spec, None, "the process drawing it ended before it was done"))
        out = [self.slots[i] for i in sorted(self.slots)]
        if self.strict:
            failed = [d for d in out if d.error is not None]
            if failed:
                raise RuntimeError(f"chart {failed[0].spec.name}: {failed[0].error}")
        self.out = out
        try:
            _last = (weakref.ref(self.results), self.dpi, out)
        except TypeError:  # a plain dict cannot be weakly referenced: no caching
            _last = None
        return list(out)

    def close(self) -> None:
        """Stop and reap children still running (the caller failed before :meth:`finish`)."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> ChartDrawing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _render(spec: ChartSpec, fig: Figure, dpi: int, strict: bool) -> Drawn:
    try:
        return Drawn(spec, figure_png(fig, dpi=dpi))
    except Exception as exc:  # noqa: BLE001 - one broken chart must not sink the report
        if strict:
            raise
        return Drawn(spec, None, f"{type(exc).__name__}: {exc}")


_INDEX = struct.Struct("<I")  # a chart's number in the work queue
_FRAME = struct.Struct("<IcI")  # chart number, b"P" (PNG) or b"E" (error text), payload length


class _ForkedRender:
    """Rasterise built figures in ``children`` forked processes (and, at :meth:`finish`, in
    this one).

    The work is a queue: a pipe holding the figures' numbers, from which every process takes
    the next one when it is free, so a slow chart does not hold up the rest. A child inherits
    the figures (nothing is pickled), writes each PNG (or its error) to its own pipe as a
    frame (:data:`_FRAME`) and leaves with ``os._exit`` (no atexit handlers, no finalisers: it
    shares this process's files and locks). A fork that fails leaves the work to the others;
    a chart whose child died is reported as an error by the caller.
    """

    def __init__(self, built: list[tuple[int, ChartSpec, Figure]], children: int, dpi: int,
                 done: Callable[[int, Drawn], None]) -> None:
        import fcntl  # POSIX only, as fork is: chart_jobs() is 1 elsewhere

        self.figures = {i: (spec, fig) for i, spec, fig in built}
        self.done = done
        self.queue, queue_w = os.pipe()
        os.write(queue_w, b"".join(_INDEX.pack(i) for i in self.figures))  # a few bytes: never blocks
        os.close(queue_w)
        self.children: dict[int, tuple[int, bytearray]] = {}  # read fd → (pid, bytes not yet framed)
        for _ in range(children):
            r, w = os.pipe()
            with contextlib.suppress(OSError, AttributeError):  # room for every PNG: a child never waits
                fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
            try:
                with warnings.catch_warnings():
                    # Python >= 3.12 warns on fork() in a process with threads (polars' pool, the
                    # progress spinner): the child only rasterises figures and touches neither.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                break
            if pid == 0:  # the child
                try:
                    os.close(r)
                    self._child(w, dpi)
                finally:
                    os._exit(0)
            os.close(w)
            self.children[r] = (pid, bytearray())

    def take(self) -> int | None:
        """The next figure's number from the queue (``None``: the queue is empty)."""
        data = os.read(self.queue, _INDEX.size)  # reads of a few bytes from a pipe are atomic
        return _INDEX.unpack(data)[0] if len(data) == _INDEX.size else None

    def _child(self, w: int, dpi: int) -> None:
        gc.disable()
        warnings.simplefilter("ignore")  # stderr's lock may be held by a thread of the parent
        while (i := self.take()) is not None:
            try:
                status, payload = b"P", figure_png(self.figures[i][1], dpi=dpi)
            except BaseException as exc:  # noqa: BLE001 - reported by the parent
                status, payload = b"E", f"{type(exc).__name__}: {exc}".encode()
            view = memoryview(_FRAME.pack(i, status, len(payload)) + payload)
            while view:
                view = view[os.write(w, view):]

    def read(self, timeout: float | None) -> None:
        """Read what the children wrote (waiting up to ``timeout``) and report whole frames."""
        if not self.children:
            return
        ready, _, _ = select.select(list(self.children), [], [], timeout)
        for fd in ready:
            pid, buf = self.children[fd]
            chunk = os.read(fd, 1 << 20)
            buf.extend(chunk)
            while len(buf) >= _FRAME.size:
                i, status, size = _FRAME.unpack_from(buf)
                if len(buf) < _FRAME.size + size:
                    break
                payload = bytes(buf[_FRAME.size:_FRAME.size + size])
                del buf[:_FRAME.size + size]
                spec = self.figures[i][0]
                self.done(i, Drawn(spec, payload) if status == b"P"
                          else Drawn(spec, None, payload.decode(errors="replace")))
            if not chunk:  # the child is gone
                del self.children[fd]
                os.close(fd)
                os.waitpid(pid, 0)

    def finish(self, render: Callable[[int, ChartSpec, Figure], None]) -> None:
        """Render what is left in the queue here (reading the children's frames between two
        charts, so the progress display moves), then wait for the children."""
        try:
            while (i := self.take()) is not None:
                render(i, *self.figures[i])
                self.read(0)
            while self.children:
                self.read(None)
        finally:
            self.close()

    def close(self) -> None:
        """Stop and reap the children still running; close the queue."""
        for fd, (pid, _buf) in self.children.items():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            os.close(fd)
        self.children.clear()
        if self.queue >= 0:
            os.close(self.queue)
            self.queue = -1


#: zlib level of the PNGs: 1 encodes several times faster than PIL's default 6, for files
#: about a tenth larger (flat-coloured charts compress well at any level).
PNG_COMPRESS_LEVEL = 1


def figure_png(fig: Figure, dpi: int = DPI) -> bytes:
    """PNG bytes of ``fig`` via the Agg canvas (no metadata: byte-stable output)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None},
                pil_kwargs={"compress_level": PNG_COMPRESS_LEVEL})
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# matplotlib plumbing
# ---------------------------------------------------------------------------------------------

#: Font sizes (points) the report's charts use, also applied to axes made outside the rc context.
_TITLE_SIZE, _LABEL_SIZE, _TICK_SIZE = 14, 12, 10.5
_STYLE: dict[str, object] = {
    "font.size": 11,
    "axes.titlesize": _TITLE_SIZE,
    "axes.titleweight": "bold",
    "axes.labelsize": _LABEL_SIZE,
    "xtick.labelsize": _TICK_SIZE,
    "ytick.labelsize": _TICK_SIZE,
    "legend.fontsize": 10,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "#E6E6E6",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "axes.edgecolor": "#888888",
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
}


def _mpl() -> Any:
    """Import matplotlib with the Agg backend (once; never switches a pyplot user's backend)."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg", force=False)
    return matplotlib


def new_figure(title: str, ncols: int = 1, nrows: int = 1, figsize: tuple[float, float] = FIGSIZE,
               **kw: Any) -> tuple[Figure, Any]:
    """A titled Figure with a grid of axes, in the report's style."""
    _mpl()
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    for ax in axes.flat:
        _style_axes(ax)
    fig.suptitle(title, fontsize=_TITLE_SIZE, fontweight="bold", x=0.01, ha="left")
    return fig, axes


def _style_axes(ax: Axes) -> None:
    for k, v in (("top", False), ("right", False)):
        ax.spines[k].set_visible(v)
    ax.set_axisbelow(True)
    ax.grid(True, axis="y", color="#E6E6E6", linewidth=0.8)
    ax.tick_params(labelsize=_TICK_SIZE)
    ax.xaxis.label.set_fontsize(_LABEL_SIZE)
    ax.yaxis.label.set_fontsize(_LABEL_SIZE)


def _short(text: Any, width: int = 48) -> str:
    s = str(text) if text is not None else "–"
    s = s.replace("$", r"\$")  # matplotlib mathtext would interpret $…$ in kernel names
    return s if len(s) <= width else s[: width - 1] + "…"


def _step_labels(steps: list[Any], windows: list[Any] | None = None) -> list[str]:
    out = []
    for i, s in enumerate(steps):
        out.append(f"#{s}" if s is not None else (f"w{windows[i]}" if windows else "trace"))
    return out


def _thin_ticks(ax: Axes, labels: list[str], max_labels: int = 24) -> None:
    n = len(labels)
    stride = max(1, -(-n // max_labels))
    ax.set_xticks(range(0, n, stride))
    ax.set_xticklabels(labels[::stride], rotation=0 if n <= 12 else 45, ha="center" if n <= 12 else "right")


def _max(column: pl.Series) -> float:
    """The largest value of a numeric column as a float (0 when empty or all null)."""
    value = column.max()
    return float(value) if isinstance(value, (int, float)) else 0.0


def _ms(ns: Any) -> float:
    return float(ns or 0) / 1e6


def _legend_below(fig: Figure, ax: Axes, ncol: int = 6) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(ncol, len(handles)), frameon=False)


# ---------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------


@chart("steps", section="steps", title="Step time per step", order=10)
def steps_chart(res: StepsResult, results: Mapping[str, object]) -> Figure | None:
    """Bars of each step window's duration; warm-up and truncated steps coloured apart."""
    if not res.has_steps or res.table.height < 1:
        return None
    t = res.table
    durs = [_ms(v) for v in t["dur_ns"].to_list()]
    labels = _step_labels(t["step"].to_list())
    warm = t["is_warmup"].to_list()
    trunc = t["is_truncated"].to_list()
    colors = [ORANGE if w else (GREY if tr else BLUE) for w, tr in zip(warm, trunc)]
    fig, axes = new_figure("Step time per step")
    ax = axes[0][0]
    x = list(range(len(durs)))
    ax.bar(x, durs, color=colors, width=0.8 if len(durs) > 1 else 0.4)
    med = (res.stats or {}).get("median")
    if med is not None:
        ax.axhline(med / 1e6, color="#333333", linestyle="--", linewidth=1.2,
                   label=f"median of steady steps: {med / 1e6:.2f} ms")
    from matplotlib.patches import Patch

    handles = [Patch(color=BLUE, label="steady step")]
    if any(warm):
        handles.append(Patch(color=ORANGE, label="warm-up"))
    if any(trunc):
        handles.append(Patch(color=GREY, label="truncated (last)"))
    line_h, line_l = ax.get_legend_handles_labels()
    ax.legend(handles=handles + line_h, loc="upper right", ncol=2)
    ax.set_ylim(0, max(durs) * 1.22 if durs and max(durs) > 0 else 1)
    _thin_ticks(ax, labels)
    ax.set_xlabel("Step")
    ax.set_ylabel("Step time (ms)")
    return fig


# ---------------------------------------------------------------------------------------------
# GPU time breakdown
# ---------------------------------------------------------------------------------------------

_GPU_CATS = ("compute", "communication", "memcpy", "memset", "idle")


@chart("gpu_time", section="gpu_time", title="GPU time per step: busy by category vs idle", order=20)
def gpu_time_chart(res: GpuTimeResult, results: Mapping[str, object]) -> Figure | None:
    """Stacked bars per step window (one panel per device, up to 4): compute,
    exposed communication, memcpy, memset and idle time, in ms."""
    ps = res.per_step
    if ps.height == 0:
        return None
    devices = sorted(d for d in set(ps["device"].to_list()) if d is not None)[:4]
    if not devices:
        return None
    fig, axes = new_figure("GPU time per step: busy by category vs idle", nrows=len(devices), sharex=True,
                           figsize=(FIGSIZE[0], FIGSIZE[1] if len(devices) == 1 else 2.4 + 1.6 * len(devices)))
    for i, dev in enumerate(devices):
        ax = axes[i][0]
        d = ps.filter(ps["device"] == dev).sort("window")
        labels = _step_labels(d["step"].to_list(), d["window"].to_list())
        x = list(range(d.height))
        bottom = [0.0] * d.height
        for cat in _GPU_CATS:
            col = f"{cat}_ns"
            if col not in d.columns:
                continue
            vals = [_ms(v) for v in d[col].to_list()]
            if not any(vals) and cat not in ("compute", "idle"):
                continue
            ax.bar(x, vals, bottom=bottom, color=CATEGORY_COLORS[cat], label=cat,
                   width=0.8 if d.height > 1 else 0.4)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if "busy_pct" in d.columns and d.height <= 40:
            for xi, top, bp in zip(x, bottom, d["busy_pct"].to_list()):
                if bp is not None:
                    ax.annotate(f"{bp:.0f}%", (xi, top), ha="center", va="bottom", fontsize=9,
                                xytext=(0, 2), textcoords="offset points", color="#333333")
        ax.set_ylim(0, max(bottom) * 1.15 if bottom and max(bottom) > 0 else 1)
        ax.set_ylabel(f"{device_name(dev, res.vendor)} (ms)" if len(devices) > 1 else "Time (ms)")
        _thin_ticks(ax, labels)
    axes[-1][0].set_xlabel("Step (label: GPU busy %)")
    _legend_below(fig, axes[0][0])
    return fig


# ---------------------------------------------------------------------------------------------
# Timeline strip: busy / idle per step with the longest gaps marked
# ---------------------------------------------------------------------------------------------

_MAX_ROWS = 40


TimelineRow = tuple[int, Any, Any, int, int]  # (window, step, device, start ns, end ns)


def timeline_rows(res: IdleGapsResult, results: Mapping[str, object]
                  ) -> tuple[list[TimelineRow], list[Any], dict[Any, tuple[int, int]], bool] | None:
    """The rows both drawings of the timeline chart show (PNG here, SVG in ``_svg_charts``):
    one per step window and device (at most four devices, :data:`_MAX_ROWS` rows), the devices,
    each device's first/last activity (ns) and whether rows were cut. None: nothing to draw."""
    steps = _also(results, "steps", StepsResult)
    if steps is None:
        return None
    win = steps.table.sort("start_ns")
    per_dev = res.per_device
    devices = sorted(set(per_dev["device"].to_list())) if per_dev.height else []
    gpu_time = _also(results, "gpu_time", GpuTimeResult)
    span = gpu_time.gpu_span if gpu_time is not None else None
    first_last: dict[Any, tuple[int, int]] = {}
    if span is not None and span.height:
        for r in span.iter_rows(named=True):
            first_last[r["device"]] = (r["first_ns"], r["last_ns"])
            if r["device"] not in devices:
                devices.append(r["device"])
    devices = sorted(devices)[:4]
    if not devices or win.height == 0:
        return None
    rows = [(w["window"], w["step"], d, w["start_ns"], w["end_ns"])
            for w in win.iter_rows(named=True) for d in devices]
    return rows[:_MAX_ROWS], devices, first_last, len(rows) > _MAX_ROWS


@chart("timeline", section="idle_gaps", also=("steps", "gpu_time"), order=25,
       title="GPU timeline per step: busy vs idle, longest gaps marked")
def timeline_chart(res: IdleGapsResult, results: Mapping[str, object]) -> Figure | None:
    """One row per step window (and device): busy time, idle gaps coloured by cause,
    no activity before the first / after the last kernel; the five longest gaps marked."""
    prep = timeline_rows(res, results)
    if prep is None:
        return None
    rows, devices, first_last, truncated_rows = prep
    gaps = res.device_gaps
    nrow = len(rows)
    height = min(11.0, max(2.8, 1.7 + 0.5 * nrow))
    title = "GPU timeline per step: busy vs idle, longest gaps marked"
    fig, axes = new_figure(title, figsize=(FIGSIZE[0] + 1.2, height))
    ax = axes[0][0]
    ax.grid(True, axis="x", color="#E6E6E6")
    ax.grid(False, axis="y")

    g = gaps.select("device", "start_ns", "end_ns", "dur_ns", "cause")
    longest = g.sort("dur_ns", descending=True).head(5)
    longest_keys = {(r["device"], r["start_ns"]) for r in longest.iter_rows(named=True)}
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    labels = [(f"#{step}" if step is not None else "trace")
              + (f" · {device_name(dev, res.vendor)}" if len(devices) > 1 else "")
              for _window, step, dev, _ws, _we in rows]
    lengths = [_ms(we - ws) for _window, _step, _dev, ws, we in rows]
    max_len = max(lengths, default=0.0)
    busy: list[tuple[int, float, float]] = []  # (row, x, width) of the span between first and last kernel
    for y, (_window, _step, dev, ws, we) in enumerate(rows):
        fl = first_last.get(dev)
        lo, hi = (max(ws, fl[0]), min(we, fl[1])) if fl else (ws, we)
        if hi > lo:
            busy.append((y, _ms(lo - ws), _ms(hi - lo)))
    # Every gap clipped to every row it overlaps, at once: a step has thousands of short gaps,
    # and one collection per colour draws them in a fraction of the time of one bar each.
    row_frame = pl.DataFrame({"y": list(range(nrow)), "device": [r[2] for r in rows],
                              "ws": [r[3] for r in rows], "we": [r[4] for r in rows]},
                             schema_overrides={"device": g.schema["device"]})
    clipped = (
        g.join(row_frame, on="device")
        .filter((pl.col("end_ns") > pl.col("ws")) & (pl.col("start_ns") < pl.col("we")))
        .with_columns(lo=pl.max_horizontal("start_ns", "ws"), hi=pl.min_horizontal("end_ns", "we"))
        .with_columns(x=(pl.col("lo") - pl.col("ws")) / 1e6, w=(pl.col("hi") - pl.col("lo")) / 1e6)
    )
    _bars(ax, [(y, 0.0, length) for y, length in enumerate(lengths)], IDLE)
    _bars(ax, busy, GREEN)
    used_causes = set(clipped["cause"].unique().to_list())
    for cause in CAUSE_COLORS:
        if cause in used_causes:
            c = clipped.filter(pl.col("cause") == cause)
            ax.add_collection(PolyCollection(_bar_verts(c["y"].to_numpy(), c["x"].to_numpy(), c["w"].to_numpy()),
                                             facecolors=CAUSE_COLORS[cause], edgecolors="none"))
    # a gap spanning a step boundary is marked once, in the row holding most of it
    marks: dict[tuple[Any, Any], tuple[int, float, int, str]] = {}
    for r in clipped.filter(pl.col("start_ns").is_in([s for _d, s in longest_keys])).sort("y").iter_rows(named=True):
        key = (r["device"], r["start_ns"])
        if key not in longest_keys:
            continue
        overlap = r["hi"] - r["lo"]
        mid = _ms((r["lo"] + r["hi"]) / 2 - r["ws"])
        if key not in marks or overlap > marks[key][0]:
            marks[key] = (overlap, mid, r["y"], fmt_ns_short(r["dur_ns"]))
    for _, mid, y, text in marks.values():
        edge = mid / max_len if max_len else 0.5
        ha = "left" if edge < 0.08 else ("right" if edge > 0.92 else "center")
        ax.plot([mid], [y - 0.45], marker="v", color="#222222", markersize=7, zorder=5)
        ax.annotate(text, (mid, y - 0.45), xytext=(-4 if ha == "right" else (4 if ha == "left" else 0), 3),
                    textcoords="offset points", ha=ha, va="bottom", fontsize=8.5, fontweight="bold",
                    color="#222222", zorder=6,
                    bbox={"boxstyle": "round,pad=0.12", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    ax.set_yticks(range(nrow))
    ax.set_yticklabels(labels)
    ax.set_ylim(nrow - 0.5, -1.3)
    ax.set_xlim(0, max_len * 1.01 if max_len > 0 else 1)
    ax.set_xlabel("Time since step start (ms)" + (f"  ·  first {_MAX_ROWS} rows" if truncated_rows else ""))
    handles = [Patch(color=GREEN, label="busy"), Patch(color=IDLE, label="no GPU work")]
    handles += [Patch(color=CAUSE_COLORS[c], label=f"gap: {CAUSE_LABELS[c]}") for c in CAUSE_COLORS
                if c in used_causes]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), frameon=False)
    return fig


def _bar_verts(y: Any, x: Any, w: Any, half: float = 0.3) -> Any:
    """The corners of horizontal bars (row ``y``, from ``x``, ``w`` long) as an (n, 4, 2) array."""
    import numpy as np

    y0, y1, x1 = y - half, y + half, x + w
    return np.stack([np.stack([x, y0], -1), np.stack([x, y1], -1), np.stack([x1, y1], -1), np.stack([x1, y0], -1)],
                    axis=1)


def _bars(ax: Axes, bars: list[tuple[int, float, float]], color: str) -> None:
    """One collection of horizontal bars ``(row, x, width)`` in ``color``."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    if bars:
        y, x, w = (np.asarray(v, dtype=float) for v in zip(*bars))
        ax.add_collection(PolyCollection(_bar_verts(y, x, w), facecolors=color, edgecolors="none"))


# ---------------------------------------------------------------------------------------------
# Idle-gap causes
# ---------------------------------------------------------------------------------------------


@chart("idle_gaps", section="idle_gaps", title="GPU idle time by cause", order=30)
def idle_causes_chart(res: IdleGapsResult, results: Mapping[str, object]) -> Figure | None:
    """Left: idle time per step stacked by cause (ms), plus the window time before the first /
    after the last activity (``outside_gaps_ns``): as ``idle_gaps.per_step`` gives it (each gap
    split across the steps it spans), so a step's bar is ``gpu_time``'s idle of that step (summed
    over devices). Right: where the idle time lies by gap length (total idle per length bin,
    gap counts on the bars)."""
    ps, hist = res.per_step, res.histogram
    if ps.height == 0:
        return None
    has_hist = hist.height > 0 and "total_ns" in hist.columns
    fig, axes = new_figure("GPU idle time by cause", ncols=2 if has_hist else 1,
                           figsize=(FIGSIZE[0] + (2.4 if has_hist else 0), FIGSIZE[1]),
                           gridspec_kw={"width_ratios": [3, 2]} if has_hist else {})
    ax = axes[0][0]
    agg = ps.group_by("window", "step").agg([pl.col(f"{c}_ns").sum().alias(c) for c in (*CAUSE_COLORS, "outside_gaps")
                                             if f"{c}_ns" in ps.columns]).sort("window")
    labels = _step_labels(agg["step"].to_list(), agg["window"].to_list())
    x = list(range(agg.height))
    bottom = [0.0] * agg.height
    for cause, color in CAUSE_COLORS.items():
        if cause not in agg.columns:
            continue
        vals = [_ms(v) for v in agg[cause].to_list()]
        if not any(vals):
            continue
        ax.bar(x, vals, bottom=bottom, color=color, label=CAUSE_LABELS[cause], width=0.8 if agg.height > 1 else 0.4)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if "outside_gaps" in agg.columns:
        vals = [_ms(v) for v in agg["outside_gaps"].to_list()]
        if any(vals):
            ax.bar(x, vals, bottom=bottom, color=IDLE, label="no GPU work yet / any more",
                   width=0.8 if agg.height > 1 else 0.4)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, max(bottom) * 1.12 if bottom and max(bottom) > 0 else 1)
    _thin_ticks(ax, labels)
    ax.set_title("Idle time per step, by cause", fontsize=12, fontweight="normal", loc="left")
    ax.set_xlabel("Step")
    ax.set_ylabel("Idle time (ms)")
    _legend_below(fig, ax, ncol=3)
    if has_hist:
        ax2 = axes[0][1]
        h = hist.group_by("bin", "lo_ns").agg(pl.col("count").sum(), pl.col("total_ns").sum())
        h = h.sort("lo_ns", nulls_last=False)
        h = h.filter(h["count"] > 0) if h.height > 6 else h
        xs = list(range(h.height))
        tot = [_ms(v) for v in h["total_ns"].to_list()]
        ax2.bar(xs, tot, color=GREY, width=0.75)
        for xi, v, c in zip(xs, tot, h["count"].to_list()):
            ax2.annotate(f"{c:,}", (xi, v), ha="center", va="bottom", fontsize=8.5, xytext=(0, 2),
                         textcoords="offset points", color="#333333")
        ax2.set_xticks(xs)
        ax2.set_xticklabels([_short(b, 14) for b in h["bin"].to_list()], rotation=40, ha="right", fontsize=9)
        ax2.set_ylim(0, max(tot) * 1.18 if tot and max(tot) > 0 else 1)
        ax2.set_title("Idle time by gap length (n gaps)", fontsize=12, fontweight="normal", loc="left")
        ax2.set_xlabel("Gap length")
        ax2.set_ylabel("Idle time (ms)")
    return fig


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@chart("kernels", section="kernels", title="Top kernels by total GPU time", order=40)
def kernels_chart(res: KernelsResult, results: Mapping[str, object]) -> Figure | None:
    """Horizontal bars of the top 12 kernels (normalised names) by total time, with
    their share of kernel time and call count; collectives in purple."""
    by = res.by_name
    if by.height == 0:
        return None
    top = by.head(12)
    names = [_short(n, 56) for n in top["name"].to_list()]
    tot = [_ms(v) for v in top["total_ns"].to_list()]
    comm = top["is_comm"].to_list() if "is_comm" in top.columns else [False] * top.height
    pcts = top["pct_of_kernel_time"].to_list() if "pct_of_kernel_time" in top.columns else [None] * top.height
    counts = top["count"].to_list() if "count" in top.columns else [None] * top.height
    fig, axes = new_figure("Top kernels by total GPU time",
                           figsize=(FIGSIZE[0] + 1.6, max(3.0, 1.3 + 0.36 * top.height)))
    ax = axes[0][0]
    ax.grid(True, axis="x", color="#E6E6E6")
    ax.grid(False, axis="y")
    y = list(range(top.height))
    ax.barh(y, tot, color=[PURPLE if c else BLUE for c in comm], height=0.7)
    for yi, v, p, c in zip(y, tot, pcts, counts):
        label = (f"{p:.1f} %" if p is not None else "") + (f" · {c:,}×" if c is not None else "")
        ax.annotate(label, (v, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=9.5,
                    color="#333333")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=9.5)
    ax.invert_yaxis()
    ax.set_xlim(0, max(tot) * 1.25 if tot and max(tot) > 0 else 1)
    ax.set_xlabel("Total GPU time (ms)  ·  label: % of kernel time · calls")
    if any(comm):
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=BLUE, label="compute"), Patch(color=PURPLE, label="communication")],
                  loc="lower right")
    return fig


# ---------------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------------


@chart("launches", section="launches", title="Kernel launch statistics", order=50)
def launches_chart(res: LaunchesResult, results: Mapping[str, object]) -> Figure | None:
    """Left: CPU time in launch calls vs GPU time of the work they launched, per step
    (launch-bound steps marked). Right: median launch-call time and launch delay per API."""
    ps, by_api = res.per_step, res.by_api
    if ps.height == 0 and by_api.height == 0:
        return None
    panels = int(ps.height > 0) + int(by_api.height > 0)
    fig, axes = new_figure("Kernel launch statistics", ncols=panels, figsize=(FIGSIZE[0] + 2.2, FIGSIZE[1]))
    i = 0
    if ps.height > 0:
        ax = axes[0][i]
        i += 1
        d = ps.sort("window")
        labels = _step_labels(d["step"].to_list(), d["window"].to_list())
        x = list(range(d.height))
        cpu = [_ms(v) for v in d["launch_cpu_ns"].to_list()]
        gpu = [_ms(v) for v in d["launched_gpu_ns"].to_list()]
        w = 0.38
        ax.bar([xi - w / 2 for xi in x], cpu, width=w, color=ORANGE, label="CPU time in launch calls")
        ax.bar([xi + w / 2 for xi in x], gpu, width=w, color=BLUE, label="GPU time launched")
        top = max(cpu + gpu) if cpu + gpu else 0
        if "launch_bound" in d.columns:
            for xi, lb in zip(x, d["launch_bound"].to_list()):
                if lb:
                    ax.annotate("launch-bound", (xi, top * 1.02), ha="center", fontsize=8.5, color=RED,
                                fontweight="bold")
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        _thin_ticks(ax, labels)
        ax.set_title("Launch CPU time vs launched GPU time", fontsize=12, fontweight="normal", loc="left")
        ax.set_xlabel("Step")
        ax.set_ylabel("Time (ms)")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.18), ncol=1)
    if by_api.height > 0:
        ax = axes[0][i]
        b = by_api.head(8)
        names = [_short(n, 28) for n in b["api"].to_list()]
        y = list(range(b.height))
        h = 0.38
        cpu_us = [float(v or 0) / 1e3 for v in b["median_cpu_ns"].to_list()]
        delay_us = [float(v or 0) / 1e3 for v in b["median_delay_ns"].to_list()]
        ax.grid(True, axis="x", color="#E6E6E6")
        ax.grid(False, axis="y")
        ax.barh([yi - h / 2 for yi in y], cpu_us, height=h, color=ORANGE, label="median call (CPU)")
        ax.barh([yi + h / 2 for yi in y], delay_us, height=h, color=GREY, label="median launch delay")
        calls = b["calls"].to_list() if "calls" in b.columns else [None] * b.height
        for yi, v, c in zip(y, cpu_us, calls):
            if c is not None:
                ax.annotate(f"{c:,} calls", (max(v, 0), yi - h / 2), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=8.5, color="#333333")
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=9.5)
        ax.invert_yaxis()
        m = max(cpu_us + delay_us) if cpu_us + delay_us else 0
        positive = [v for v in cpu_us + delay_us if v > 0]
        if positive and m / min(positive) > 50:
            ax.set_xscale("log")
            ax.set_xlim(min(positive) / 2, m * 8)
            ax.set_xlabel("Median time (µs, log scale)")
        else:
            ax.set_xlim(0, m * 1.35 if m > 0 else 1)
            ax.set_xlabel("Median time (µs)")
        ax.set_title("Per launch API", fontsize=12, fontweight="normal", loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.18), ncol=1)
    return fig


# ---------------------------------------------------------------------------------------------
# Copies and syncs: per-step cost and the call sites responsible
# ---------------------------------------------------------------------------------------------


def _hotspot_figure(title: str, per_step: pl.DataFrame, step_bars: list[tuple[str, str, str]], sites: pl.DataFrame,
                    site_value: str, site_label: Callable[[dict[str, Any]], str], site_xlabel: str) -> Figure | None:
    """Left: per-step bars of ``step_bars`` (column, legend, colour), in ms. Right: the top
    call sites by ``site_value`` (ns), labelled by ``site_label(row)``."""
    has_steps = per_step.height > 0 and all(c in per_step.columns for c, _, _ in step_bars)
    has_sites = sites.height > 0 and site_value in sites.columns
    if not has_steps and not has_sites:
        return None
    ncols = int(has_steps) + int(has_sites)
    fig, axes = new_figure(title, ncols=ncols, figsize=(FIGSIZE[0] + (2.6 if ncols == 2 else 0), FIGSIZE[1]),
                           gridspec_kw={"width_ratios": [2, 3]} if ncols == 2 else {})
    i = 0
    if has_steps:
        ax = axes[0][i]
        i += 1
        d = per_step
        labels = _step_labels(d["step"].to_list()) if "step" in d.columns else [str(k) for k in range(d.height)]
        x = list(range(d.height))
        w = 0.8 / len(step_bars)
        top = 0.0
        for j, (col, label, color) in enumerate(step_bars):
            vals = [_ms(v) for v in d[col].to_list()]
            top = max([top, *vals])
            ax.bar([xi - 0.4 + w * (j + 0.5) for xi in x], vals, width=w, color=color, label=label)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        _thin_ticks(ax, labels, max_labels=16)
        ax.set_title("Per step", fontsize=12, fontweight="normal", loc="left")
        ax.set_xlabel("Step")
        ax.set_ylabel("Time (ms)")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.18), ncol=1)
    if has_sites:
        ax = axes[0][i]
        top_sites = sites.sort(site_value, descending=True, nulls_last=True).head(8)
        rows = list(top_sites.iter_rows(named=True))
        y = list(range(len(rows)))
        vals = [_ms(r[site_value]) for r in rows]
        ax.grid(True, axis="x", color="#E6E6E6")
        ax.grid(False, axis="y")
        ax.barh(y, vals, color=RED, height=0.65)
        for yi, v, r in zip(y, vals, rows):
            ax.annotate(_short(site_label(r), 40), (v, yi), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=9, color="#333333")
        ax.set_yticks(y)
        ax.set_yticklabels([_short(r.get("site"), 42) for r in rows], fontsize=9.5)
        ax.set_ylim(max(len(rows), 5) - 0.5, -0.5)
        ax.set_xlim(0, max(vals) * 1.6 if vals and max(vals) > 0 else 1)
        ax.set_title("Top call sites", fontsize=12, fontweight="normal", loc="left")
        ax.set_xlabel(site_xlabel)
    return fig


@chart("copies", section="copies", title="Copies: time per step and hotspots by call site", order=60)
def copies_chart(res: CopiesResult, results: Mapping[str, object]) -> Figure | None:
    """Per step: GPU time of copies and host time spent in copy ops; top call sites by
    host time (label: directions, bytes, count)."""
    def label(r: dict[str, Any]) -> str:
        bits = [str(r.get("directions") or ""), fmt_bytes_short(r.get("bytes")), f"{r.get('count', 0):,}×"]
        if r.get("blocking"):
            bits.append(f"{r['blocking']:,} blocking")
        return " · ".join(b for b in bits if b)

    return _hotspot_figure(
        "Copies: time per step and hotspots by call site",
        res.per_step,
        [("gpu_ns", "GPU copy time", ORANGE), ("cpu_ns", "CPU time in copy ops", BLUE)],
        res.by_site, "cpu_ns", label, "CPU time in copy ops (ms)",
    )


@chart("syncs", section="syncs", title="Host-device syncs: cost per step and hotspots by call site", order=61)
def syncs_chart(res: SyncsResult, results: Mapping[str, object]) -> Figure | None:
    """Per step: CPU time blocked in syncs and GPU idle right after them; top call sites
    by blocked time (label: cause, count)."""
    def label(r: dict[str, Any]) -> str:
        causes = r.get("causes")
        if isinstance(causes, (list, tuple)):
            causes = ", ".join(map(str, causes))
        return " · ".join(b for b in (str(causes or ""), f"{r.get('count', 0):,}×") if b)

    return _hotspot_figure(
        "Host-device syncs: cost per step and hotspots by call site",
        res.per_step,
        [("blocked_ns", "CPU blocked", RED), ("idle_after_ns", "GPU idle after", IDLE_DARK)],
        res.by_site, "blocked_ns", label, "CPU blocked (ms)",
    )


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

IDLE_DARK = "#A6A6A6"
GIB = float(1 << 30)


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    """The scale and unit that keep a byte axis readable (GiB, MiB or KiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if max_bytes >= scale:
            return float(scale), unit
    return float(1 << 10), "KiB"


@chart("memory_steps", section="trace_memory", title="GPU memory per step (profiler events)", order=70)
def trace_memory_chart(res: TraceMemoryResult, results: Mapping[str, object]) -> Figure | None:
    """Peak allocated memory per step and device, with the allocated level at step start
    and end; the overall peak is annotated with the op that reached it."""
    ps = res.per_step
    if ps.height == 0 or "peak_allocated_bytes" not in ps.columns:
        return None
    devices = sorted({d for d in ps["device"].to_list() if d is not None}, key=str)[:4]
    fig, axes = new_figure("GPU memory per step (profiler [memory] events)")
    ax = axes[0][0]
    width = 0.8 / max(1, len(devices))
    colors = [BLUE, PURPLE, GREEN, CYAN]
    top = 0.0
    peaks = {r["device"]: r for r in res.per_device.iter_rows(named=True)}
    labels: list[str] = []
    scale, unit = _byte_unit(_max(ps["peak_allocated_bytes"]))
    for j, dev in enumerate(devices):
        d = ps.filter(pl.col("device") == dev)
        labels = _step_labels(d["step"].to_list())
        x = list(range(d.height))
        xs = [xi - 0.4 + width * (j + 0.5) for xi in x]
        peak = [float(v or 0) / scale for v in d["peak_allocated_bytes"].to_list()]
        top = max([top, *peak])
        ax.bar(xs, peak, width=width * 0.9, color=colors[j % len(colors)],
               label=f"{device_name(str(dev))} peak allocated")
        for col, marker, name in (("start_allocated_bytes", "_", "at step start"),
                                  ("end_allocated_bytes", "x", "at step end")):
            if col in d.columns:
                ax.plot(xs, [float(v or 0) / scale for v in d[col].to_list()], linestyle="none", marker=marker,
                        markersize=10, color="#222222", label=f"{name}" if j == 0 else None)
        pk = peaks.get(dev)
        if pk and peak:
            k = max(range(len(peak)), key=lambda i: peak[i])
            op = pk.get("peak_op")
            text = f"peak {fmt_bytes_short(pk.get('peak_allocated_bytes'))}" + (f"\n{_short(op, 30)}" if op else "")
            ax.annotate(text, (xs[k], peak[k]), xytext=(0, 6), textcoords="offset points", ha="center",
                        va="bottom", fontsize=9, fontweight="bold", color="#222222")
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    _thin_ticks(ax, labels, max_labels=20)
    ax.set_xlabel("Step")
    ax.set_ylabel(f"Allocated ({unit})")
    _legend_below(fig, ax, ncol=4)
    return fig


# A line of more points than this is drawn from bucket maxima (a snapshot has one point
# per allocator event, millions for a large one: as Python lists they alone would take gigabytes).
_MAX_LINE_POINTS = 20_000


def _memory_lines(ax: Axes, series: pl.DataFrame, by_time: bool) -> None:
    """Allocated (solid) and reserved (dashed) bytes after each event, per device; the peak marked."""
    devices = sorted(d for d in series["device"].unique().to_list() if d is not None)[:4]
    colors = [BLUE, PURPLE, GREEN, CYAN]
    first = series["ts_ns"].min() if by_time else None
    t0 = first if isinstance(first, int) else 0
    hi = max(_max(series["allocated_bytes"]),
             _max(series["reserved_bytes"]) if "reserved_bytes" in series.columns else 0.0)
    scale, unit = _byte_unit(hi)
    for j, dev in enumerate(devices):
        d = series.filter(pl.col("device") == dev)
        if not d["event_idx"].is_sorted():
            d = d.sort("event_idx")
        if d.height > _MAX_LINE_POINTS:  # millions of events: per-bucket maxima keep the peak
            from traceanalyzer.analyses._memory import decimate
            d = decimate(d, _MAX_LINE_POINTS)
        xs: list[Any]
        if by_time:
            xs = [(t - t0) / 1e9 if t is not None else None for t in d["ts_ns"].to_list()]
        else:
            xs = d["event_idx"].to_list()
        alloc = [float(v or 0) / scale for v in d["allocated_bytes"].to_list()]
        suffix = f" ({device_name(dev)})" if len(devices) > 1 else ""
        ax.plot(xs, alloc, drawstyle="steps-post", color=colors[j % 4], linewidth=1.4, label="allocated" + suffix)
        if "reserved_bytes" in d.columns:
            ax.plot(xs, [float(v or 0) / scale for v in d["reserved_bytes"].to_list()], drawstyle="steps-post",
                    color=colors[j % 4], linewidth=1.0, linestyle="--", alpha=0.7, label="reserved" + suffix)
        if alloc:
            k = max(range(len(alloc)), key=lambda i: alloc[i])
            ax.plot([xs[k]], [alloc[k]], marker="v", color=RED, markersize=9, zorder=5)
            ax.annotate(f"peak {fmt_bytes_short(alloc[k] * scale)}", (xs[k], alloc[k]), xytext=(6, 6),
                        textcoords="offset points", fontsize=9.5, fontweight="bold", color=RED)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("Time since first event (s)" if by_time else "Allocator event #")
    ax.set_ylabel(f"Memory ({unit})")
    ax.legend(loc="lower right", ncol=2)


def _no_history_note(ax: Axes, res: MemoryTimelineResult) -> None:
    """The panel of a snapshot without allocator history: why there is no line, and the state
    at the dump (the one point there is)."""
    ax.set_axis_off()
    lines = ["No allocator history in this snapshot, so no memory over time:",
             "it is recorded only while torch.cuda.memory._record_memory_history()",
             "is on. What the dump itself holds:", ""]
    for d in res.devices[:4]:
        lines.append(f"cuda:{d.device}  allocated {fmt_bytes_short(d.final_allocated)}"
                     f" · reserved {fmt_bytes_short(d.final_reserved)}")
    ax.text(0.0, 0.95, "\n".join(lines), transform=ax.transAxes, ha="left", va="top", fontsize=11,
            color="#333333", linespacing=1.5)


@chart("memory_timeline", section="memory_timeline", also=("memory_peak",), order=10,
       title="GPU memory over time, peak annotated")
def memory_timeline_chart(res: MemoryTimelineResult, results: Mapping[str, object]) -> Figure | None:
    """Allocated and reserved bytes after each allocator event (per device, up to 4); the
    peak is marked, and the right panel shows what was live at it by category and site."""
    series = res.series
    if series.height == 0:
        return None
    peak = _also(results, "memory_peak", MemoryPeakResult)
    sites = peak.top_sites if peak is not None else pl.DataFrame()
    has_live = sites.height > 0 and "bytes" in sites.columns
    by_time = res.x_axis == "time" and series["ts_ns"].null_count() < series.height
    fig, axes = new_figure("GPU memory over time, peak annotated", ncols=2 if has_live else 1,
                           figsize=(FIGSIZE[0] + (3.0 if has_live else 0), FIGSIZE[1]),
                           gridspec_kw={"width_ratios": [3, 2]} if has_live else {})
    ax = axes[0][0]
    points = series.group_by("device").len()["len"].max()
    if res.history and isinstance(points, int) and points >= 2:
        _memory_lines(ax, series, by_time)
    else:  # one point per device: a line would be an empty axis with fractional ticks
        _no_history_note(ax, res)
        fig.suptitle("GPU memory at the dump (no allocator history recorded)", fontsize=_TITLE_SIZE,
                     fontweight="bold", x=0.01, ha="left")
    if has_live:
        ax2 = axes[0][1]
        top = sites.head(8)
        y = list(range(top.height))
        lscale, lunit = _byte_unit(_max(top["bytes"]))
        vals = [float(v or 0) / lscale for v in top["bytes"].to_list()]
        cats = top["category"].to_list() if "category" in top.columns else [None] * top.height
        palette = {"activation": ORANGE, "parameter": BLUE, "gradient": GREEN, "optimizer_state": PURPLE,
                   "pre_recording": GREY, "unknown": IDLE_DARK}
        ax2.grid(True, axis="x", color="#E6E6E6")
        ax2.grid(False, axis="y")
        ax2.barh(y, vals, color=[palette.get(str(c), CYAN) for c in cats], height=0.65)
        pcts = top["pct_of_peak"].to_list() if "pct_of_peak" in top.columns else [None] * top.height
        for yi, v, p, c in zip(y, vals, pcts, cats):
            ax2.annotate((f"{p:.0f} %" if p is not None else "") + (f" · {c}" if c else ""), (v, yi), xytext=(4, 0),
                         textcoords="offset points", va="center", fontsize=8.5, color="#333333")
        ax2.set_yticks(y)
        ax2.set_yticklabels([_short(s, 34) for s in top["site"].to_list()], fontsize=9)
        ax2.invert_yaxis()
        ax2.set_xlim(0, max(vals) * 1.6 if vals and max(vals) > 0 else 1)
        ax2.set_title("Live at the peak, by call site", fontsize=12, fontweight="normal", loc="left")
        ax2.set_xlabel(f"Live at the peak ({lunit})")
    return fig


@chart("export_timeline", section="export_timeline", order=10,
       title="Memory by category at the peak (export_memory_timeline)")
def export_timeline_chart(res: ExportTimelineResult, results: Mapping[str, object]) -> Figure | None:
    """What the memory held at its peak, by category (bars), with each category's own
    maximum over the run (markers)."""
    at_peak = res.at_peak
    if at_peak.height == 0:
        return None
    rows = list(at_peak.sort("bytes", descending=True).iter_rows(named=True))
    maxima = res.max_per_category or {}
    hi = max([float(r["bytes"] or 0) for r in rows] + [float(v or 0) for v in maxima.values()])
    scale, unit = _byte_unit(hi)
    fig, axes = new_figure("Memory by category at the peak", figsize=(FIGSIZE[0], max(3.0, 1.6 + 0.42 * len(rows))))
    ax = axes[0][0]
    ax.grid(True, axis="x", color="#E6E6E6")
    ax.grid(False, axis="y")
    palette = {"activation": ORANGE, "parameter": BLUE, "gradient": GREEN, "optimizer_state": PURPLE,
               "input": CYAN, "temporary": KHAKI, "autograd_detail": PINK, "unknown": GREY}
    y = list(range(len(rows)))
    vals = [float(r["bytes"] or 0) / scale for r in rows]
    ax.barh(y, vals, color=[palette.get(str(r["category"]), GREY) for r in rows], height=0.65, label="at the peak")
    mx = [float(maxima.get(r["category"]) or 0) / scale for r in rows]
    if any(mx):
        ax.plot(mx, y, linestyle="none", marker="|", markersize=16, markeredgewidth=2.5, color="#222222",
                label="own maximum over the run")
    for yi, v, r in zip(y, vals, rows):
        p = r.get("pct_of_peak")
        ax.annotate(f"{p:.1f} %" if p is not None else "", (v, yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=9.5, color="#333333")
    ax.set_yticks(y)
    ax.set_yticklabels([str(r["category"]) for r in rows])
    ax.set_ylim(max(len(rows), 3) - 0.5, -0.5)
    ax.set_xlim(0, hi / scale * 1.2 if hi > 0 else 1)
    peak = res.peak_total_bytes
    ax.set_xlabel(f"Memory ({unit})" + (f"  ·  peak total {fmt_bytes_short(peak)}" if peak else ""))
    ax.legend(loc="lower right")
    return fig


__all__ = ["CHART_FORMATS", "JOBS_ENV", "ChartDrawing", "ChartSpec", "Drawn", "DrawnSvg", "chart", "chart_jobs",
           "charts_for", "draw", "draw_all", "draw_svgs", "figure_png", "new_figure", "registry", "svg_chart"]
