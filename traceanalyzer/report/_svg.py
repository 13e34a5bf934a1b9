"""Inline SVG charts drawn by our own code: the HTML report's charts without matplotlib.

A :class:`Figure` is a fixed-size canvas (``viewBox``, so it scales with the page) holding
titled panels (:class:`Axes`); an axes maps data to pixels through two :class:`Scale` s
(linear or log, set before anything is drawn) and collects SVG elements: rectangles (bars),
lines and steps, markers, text. :meth:`Figure.svg` writes the whole chart as one ``<svg>``
element: axes with "nice" ticks and their labels, grid lines, a legend, a ``<title>`` (the
browser's hover text) on bars and points.

Every string goes through :func:`esc` (HTML/XML escaping; characters XML forbids are dropped),
and every coordinate through :func:`num`, which never writes ``nan`` or ``inf``. Text widths
are estimated from the character count (no font metrics here): layout leaves room for them.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Characters XML 1.0 does not allow (a trace's strings may hold any of them).
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
#: Font sizes (px) of the chart's parts.
TITLE_SIZE, PANEL_TITLE_SIZE, LABEL_SIZE, TICK_SIZE, NOTE_SIZE, LEGEND_SIZE = 15, 12.5, 12, 11, 10, 11
FONT = "-apple-system,BlinkMacSystemFont,'Segoe UI',Helvetica,Arial,'DejaVu Sans',sans-serif"
AXIS_COLOR, GRID_COLOR, TEXT_COLOR = "#888888", "#E6E6E6", "#333333"
#: Coordinates are clamped to this many pixels around the canvas (a stray value never makes a huge number).
_CLAMP = 1e5


def esc(value: object) -> str:
    """Text safe inside an SVG/HTML element or a quoted attribute."""
    return html.escape(_XML_BAD.sub("", str(value)), quote=True)


def num(v: float) -> str:
    """A coordinate: one decimal, never ``nan``/``inf`` (non-finite values are 0, huge ones clamped)."""
    if not -_CLAMP <= v <= _CLAMP:  # one test for the usual coordinate (NaN fails it too)
        v = min(max(v, -_CLAMP), _CLAMP) if math.isfinite(v) else 0.0
    text = f"{v:.1f}"
    if text == "-0.0":
        return "0"
    return text[:-2] if text.endswith(".0") else text


def short(text: object, width: int = 48) -> str:
    """``text`` cut to ``width`` characters with "…" (``None`` is "–")."""
    s = str(text) if text is not None else "–"
    return s if len(s) <= width else s[: width - 1] + "…"


def text_width(text: str, size: float) -> float:
    """Estimated rendered width of ``text`` in px at font ``size`` (average glyph ≈ 0.56 em)."""
    return 0.56 * size * len(text)


def nice_step(span: float, n: int) -> float:
    """A tick step of 1, 2, 2.5 or 5 × 10^k giving about ``n`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(n, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def tick_label(v: float, step: float) -> str:
    """A tick value with as many decimals as the step needs (thousands separated)."""
    if abs(v) < step * 1e-9:
        v = 0.0
    decimals = max(0, math.ceil(-math.log10(step) - 1e-9))
    if abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:  # 2.5, 0.25
        decimals += 1
    return f"{v:,.{decimals}f}"


def log_label(v: float) -> str:
    """A power-of-ten tick: ``0.01``, ``1``, ``1,000``, or ``1e-05`` beyond that range."""
    if 1e-3 <= v < 1e7:
        return f"{v:,.{max(0, -math.floor(math.log10(v) + 1e-9))}f}"
    return f"{v:.0e}"


@dataclass
class Scale:
    """Data → pixels on one axis: ``lo`` maps to ``p0``, ``hi`` to ``p1`` (either way round)."""

    lo: float
    hi: float
    p0: float
    p1: float
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v = math.log10(v) if v > 0 else -_CLAMP
            lo, hi = math.log10(self.lo), math.log10(self.hi)
        else:
            lo, hi = self.lo, self.hi
        span = hi - lo
        return self.p0 if span == 0 else self.p0 + (v - lo) / span * (self.p1 - self.p0)

    def ticks(self, n: int = 5) -> list[tuple[float, str]]:
        """Nice tick positions within the range, with their labels."""
        lo, hi = min(self.lo, self.hi), max(self.lo, self.hi)
        if self.log:
            if lo <= 0:
                return []
            return [(10.0 ** k, log_label(10.0 ** k))
                    for k in range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1)]
        step = nice_step(hi - lo, n)
        first = math.ceil(lo / step - 1e-9)
        out: list[tuple[float, str]] = []
        k = first
        while k * step <= hi + step * 1e-9 and len(out) < 50:
            out.append((k * step, tick_label(k * step, step)))
            k += 1
        return out


@dataclass(frozen=True)
class LegendItem:
    """One legend entry: a ``box`` (bars), a ``line`` (``dash`` optional) or a ``marker`` (``v``, ``x``…)."""

    label: str
    color: str
    kind: str = "box"
    dash: str = ""
    marker: str = ""


@dataclass
class Axes:
    """One panel: its pixel box, scales and the elements drawn in it."""

    x0: float
    y0: float
    w: float
    h: float
    xs: Scale = field(init=False)
    ys: Scale = field(init=False)
    parts: list[str] = field(default_factory=list)
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    xticks: list[tuple[float, str]] | None = None
    yticks: list[tuple[float, str]] | None = None
    xtick_rotate: bool = False
    grid: str = "y"
    legend_items: list[LegendItem] = field(default_factory=list)
    legend_loc: str = "upper right"
    legend_ncol: int = 1
    frame: bool = True

    def __post_init__(self) -> None:
        self.xs = Scale(0, 1, self.x0, self.x0 + self.w)
        self.ys = Scale(0, 1, self.y0 + self.h, self.y0)

    # -- scales -----------------------------------------------------------------------------
    def set_xlim(self, lo: float, hi: float, log: bool = False) -> None:
        self.xs = Scale(lo, hi, self.x0, self.x0 + self.w, log)

    def set_ylim(self, lo: float, hi: float, log: bool = False) -> None:
        """``lo`` at the bottom, ``hi`` at the top (give ``lo > hi`` to put the first category on top)."""
        self.ys = Scale(lo, hi, self.y0 + self.h, self.y0, log)

    def categories_x(self, labels: Sequence[str], max_labels: int = 24) -> None:
        """A category axis: positions 0 … n-1, labels thinned to at most ``max_labels`` (as the PNG's)."""
        n = len(labels)
        self.set_xlim(-0.5, max(n, 1) - 0.5)
        stride = max(1, -(-n // max_labels))
        self.xticks = [(float(i), labels[i]) for i in range(0, n, stride)]
        self.xtick_rotate = n > 12

    def categories_y(self, labels: Sequence[str], min_rows: int = 0) -> None:
        """A category axis, first label on top."""
        n = max(len(labels), min_rows, 1)
        self.set_ylim(n - 0.5, -0.5)
        self.yticks = [(float(i), s) for i, s in enumerate(labels)]
        self.grid = "x"

    # -- elements ---------------------------------------------------------------------------
    def rect(self, x0: float, x1: float, y0: float, y1: float, color: str, title: str = "", cls: str = "bar",
             opacity: float = 1.0) -> None:
        """A rectangle between data coordinates (a bar); ``title`` is its hover text."""
        a, b = sorted((self.xs(x0), self.xs(x1)))
        c, d = sorted((self.ys(y0), self.ys(y1)))
        op = f' fill-opacity="{opacity:.2f}"' if opacity < 1 else ""
        tip = f"<title>{esc(title)}</title>" if title else ""
        end = f">{tip}</rect>" if tip else "/>"
        self.parts.append(f'<rect class="{cls}" x="{num(a)}" y="{num(c)}" width="{num(max(b - a, 0.0))}" '
                          f'height="{num(max(d - c, 0.0))}" fill="{esc(color)}"{op}{end}')

    def rects(self, boxes: Iterable[tuple[float, float, float, float]], color: str, title: str = "",
              cls: str = "bar", opacity: float = 1.0) -> None:
        """Many rectangles ``(x0, x1, y0, y1)`` of one colour as one ``<path>`` (one hover text for
        all): a few bytes each, where a ``<rect>`` apiece would weigh ten times more."""
        d = []
        xs, ys = self.xs, self.ys
        # The boxes of a path usually share their rows, and their edges and widths (whole pixel
        # columns) repeat: each (y0, y1) is mapped once and each number written once (num gives
        # equal numbers one text: 0.0 and -0.0 both read "0").
        rows: dict[tuple[float, float], tuple[str, str]] = {}
        texts: dict[float, str] = {}
        for x0, x1, y0, y1 in boxes:
            p, q = xs(x0), xs(x1)
            a, b = (q, p) if q < p else (p, q)  # sorted(): the second first only when it is smaller
            row = rows.get((y0, y1))
            if row is None:
                p, q = ys(y0), ys(y1)
                c, e = (q, p) if q < p else (p, q)
                row = rows[(y0, y1)] = (num(c), num(e - c))
            w = b - a
            ta = texts.get(a) or texts.setdefault(a, num(a))
            tw = texts.get(w) or texts.setdefault(w, num(w))
            tm = texts.get(-w) or texts.setdefault(-w, num(a - b))
            d.append(f"M{ta} {row[0]}h{tw}v{row[1]}h{tm}z")
        if not d:
            return
        op = f' fill-opacity="{opacity:.2f}"' if opacity < 1 else ""
        tip = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(f'<path class="{cls}" d="{"".join(d)}" fill="{esc(color)}"{op}>{tip}</path>')

    def bars(self, xs: Sequence[float], heights: Sequence[float], width: float, colors: str | Sequence[str],
             bottoms: Sequence[float] | None = None, titles: Sequence[str] | None = None) -> None:
        """Vertical bars centred on ``xs``."""
        for i, (x, v) in enumerate(zip(xs, heights)):
            b = bottoms[i] if bottoms is not None else 0.0
            color = colors if isinstance(colors, str) else colors[i]
            self.rect(x - width / 2, x + width / 2, b, b + v, color, titles[i] if titles else "")

    def barh(self, ys: Sequence[float], widths: Sequence[float], height: float, colors: str | Sequence[str],
             lefts: Sequence[float] | None = None, titles: Sequence[str] | None = None) -> None:
        """Horizontal bars centred on ``ys``."""
        for i, (y, v) in enumerate(zip(ys, widths)):
            left = lefts[i] if lefts is not None else (self.xs.lo if self.xs.log else 0.0)
            color = colors if isinstance(colors, str) else colors[i]
            self.rect(left, v if self.xs.log else left + v, y - height / 2, y + height / 2, color,
                      titles[i] if titles else "")

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str, width: float = 1.4, dash: str = "",
             steps: bool = False, opacity: float = 1.0, title: str = "") -> None:
        """A polyline (``steps``: held until the next point, matplotlib's ``steps-post``)."""
        pts = [(self.xs(x), self.ys(y)) for x, y in zip(xs, ys)]
        if not pts:
            return
        d = [f"M{num(pts[0][0])} {num(pts[0][1])}"]
        for qx, qy in pts[1:]:
            d.append(f"H{num(qx)}V{num(qy)}" if steps else f"L{num(qx)} {num(qy)}")
        extra = (f' stroke-dasharray="{dash}"' if dash else "") + (f' stroke-opacity="{opacity:.2f}"' if opacity < 1
                                                                    else "")
        tip = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(f'<path class="line" d="{"".join(d)}" fill="none" stroke="{esc(color)}" '
                          f'stroke-width="{width}"{extra}>{tip}</path>')

    def hline(self, y: float, color: str, width: float = 1.2, dash: str = "") -> None:
        self.line([self.xs.lo, self.xs.hi], [y, y], color, width, dash)

    def marker(self, x: float, y: float, kind: str, color: str, size: float = 8, title: str = "",
               opacity: float = 1.0, cls: str = "pt", stroke: str = "") -> None:
        """A point: ``o`` (disc of diameter ``size``), ``v`` (triangle down), ``x``, ``_`` or ``|``."""
        self.parts.append(marker_svg(self.xs(x), self.ys(y), kind, color, size, title, opacity, cls, stroke))

    def text(self, x: float, y: float, s: str, dx: float = 0, dy: float = 0, anchor: str = "start",
             size: float = NOTE_SIZE, color: str = TEXT_COLOR, weight: str = "normal", baseline: str = "middle",
             halo: bool = False, cls: str = "") -> None:
        """Text at data ``(x, y)`` moved by ``(dx, dy)`` px (``dy`` > 0 is up, as matplotlib's offsets)."""
        self.parts.append(text_svg(self.xs(x) + dx, self.ys(y) - dy, s, anchor, size, color, weight, baseline,
                                   halo=halo, cls=cls))

    def legend(self, items: Iterable[LegendItem], loc: str = "upper right", ncol: int = 1) -> None:
        self.legend_items = list(items)
        self.legend_loc, self.legend_ncol = loc, ncol

    # -- output -----------------------------------------------------------------------------
    def under(self) -> float:
        """How far below the axis its label sits (rotated tick labels take room by their length)."""
        if not self.xtick_rotate:
            return 34.0
        ticks = self.xticks if self.xticks is not None else []
        return 30.0 + 0.71 * max((text_width(lb, TICK_SIZE) for _, lb in ticks), default=20.0)

    def svg(self) -> str:
        out: list[str] = []
        bottom, right = self.y0 + self.h, self.x0 + self.w
        xt = self.xticks if self.xticks is not None else self.xs.ticks()
        yt = self.yticks if self.yticks is not None else self.ys.ticks()
        if self.frame:  # grid lines under everything (``grid``: "y", "x", "both" or "")
            if self.grid in ("y", "both"):
                out.extend(f'<path d="M{num(self.x0)} {num(self.ys(v))}H{num(right)}" stroke="{GRID_COLOR}"/>'
                           for v, _ in yt)
            if self.grid in ("x", "both"):
                out.extend(f'<path d="M{num(self.xs(v))} {num(self.y0)}V{num(bottom)}" stroke="{GRID_COLOR}"/>'
                           for v, _ in xt)
        out.extend(self.parts)
        if self.frame:
            out.append(f'<path d="M{num(self.x0)} {num(self.y0)}V{num(bottom)}H{num(right)}" fill="none" '
                       f'stroke="{AXIS_COLOR}"/>')
            for v, label in xt:
                p = self.xs(v)
                if not self.x0 - 0.5 <= p <= right + 0.5:
                    continue
                out.append(f'<path d="M{num(p)} {num(bottom)}v4" stroke="{AXIS_COLOR}"/>')
                if self.xtick_rotate:
                    out.append(f'<text x="{num(p)}" y="{num(bottom + 14)}" font-size="{TICK_SIZE}" '
                               f'text-anchor="end" transform="rotate(-45 {num(p)} {num(bottom + 14)})" '
                               f'fill="{TEXT_COLOR}">{esc(label)}</text>')
                else:
                    out.append(text_svg(p, bottom + 15, label, "middle", TICK_SIZE, TEXT_COLOR))
            for v, label in yt:
                p = self.ys(v)
                if not self.y0 - 0.5 <= p <= bottom + 0.5:
                    continue
                out.append(f'<path d="M{num(self.x0)} {num(p)}h-4" stroke="{AXIS_COLOR}"/>')
                out.append(text_svg(self.x0 - 7, p, label, "end", TICK_SIZE, TEXT_COLOR))
        if self.title:
            out.append(text_svg(self.x0, self.y0 - 10, self.title, "start", PANEL_TITLE_SIZE, "#1f2328",
                                baseline="auto"))
        if self.xlabel:
            out.append(text_svg(self.x0 + self.w / 2, bottom + self.under(), self.xlabel, "middle", LABEL_SIZE,
                                "#1f2328"))
        if self.ylabel:
            width = max((text_width(lb, TICK_SIZE) for _, lb in yt), default=20.0)
            x = self.x0 - width - 22
            y = self.y0 + self.h / 2
            out.append(f'<text x="{num(x)}" y="{num(y)}" font-size="{LABEL_SIZE}" text-anchor="middle" '
                       f'transform="rotate(-90 {num(x)} {num(y)})" fill="#1f2328">{esc(self.ylabel)}</text>')
        if self.legend_items:
            out.append(legend_svg(self.legend_items, self, self.legend_loc, self.legend_ncol))
        return "".join(out)


def marker_svg(x: float, y: float, kind: str, color: str, size: float, title: str = "", opacity: float = 1.0,
               cls: str = "pt", stroke: str = "") -> str:
    r = size / 2
    tip = f"<title>{esc(title)}</title>" if title else ""
    op = f' fill-opacity="{opacity:.2f}"' if opacity < 1 else ""
    c = esc(color)
    if kind == "o":
        edge = f' stroke="{esc(stroke)}" stroke-width="0.8"' if stroke else ""
        return f'<circle class="{cls}" cx="{num(x)}" cy="{num(y)}" r="{num(max(r, 0.5))}" fill="{c}"{op}{edge}>{tip}' \
               "</circle>"
    if kind == "v":
        d = f"M{num(x - r)} {num(y - r)}H{num(x + r)}L{num(x)} {num(y + r)}Z"
        return f'<path class="{cls}" d="{d}" fill="{c}"{op}>{tip}</path>'
    if kind == "x":
        d = f"M{num(x - r)} {num(y - r)}L{num(x + r)} {num(y + r)}M{num(x - r)} {num(y + r)}L{num(x + r)} {num(y - r)}"
    elif kind == "|":
        d = f"M{num(x)} {num(y - r)}V{num(y + r)}"
    else:  # "_"
        d = f"M{num(x - r)} {num(y)}H{num(x + r)}"
    width = 2.5 if kind == "|" else 1.6
    return f'<path class="{cls}" d="{d}" stroke="{c}" stroke-width="{width}" fill="none">{tip}</path>'


def text_svg(x: float, y: float, s: str, anchor: str = "start", size: float = NOTE_SIZE, color: str = TEXT_COLOR,
             weight: str = "normal", baseline: str = "middle", halo: bool = False, cls: str = "") -> str:
    """A ``<text>``: one line per ``\\n`` of ``s``; ``baseline``: ``middle``, ``auto`` (above ``y``) or ``hanging``."""
    lines = s.split("\n")
    attrs = (f'class="{cls}" ' if cls else "") + f'font-size="{size}" text-anchor="{anchor}" fill="{esc(color)}"'
    if weight != "normal":
        attrs += f' font-weight="{weight}"'
    if halo:
        attrs += ' paint-order="stroke" stroke="#ffffff" stroke-width="3" stroke-opacity="0.85"'
    if len(lines) == 1:
        dy = {"middle": size * 0.35, "auto": 0.0, "hanging": size * 0.8}.get(baseline, 0.0)
        return f'<text x="{num(x)}" y="{num(y + dy)}" {attrs}>{esc(s)}</text>'
    lead = size * 1.2
    first = {"middle": -(len(lines) - 1) * lead / 2 + size * 0.35, "auto": -(len(lines) - 1) * lead,
             "hanging": size * 0.8}.get(baseline, 0.0)
    spans = "".join(f'<tspan x="{num(x)}" dy="{num(first if i == 0 else lead)}">{esc(line)}</tspan>'
                    for i, line in enumerate(lines))
    return f'<text x="{num(x)}" y="{num(y)}" {attrs}>{spans}</text>'


def _legend_entry(item: LegendItem, x: float, y: float) -> str:
    c = esc(item.color)
    if item.kind == "line":
        dash = f' stroke-dasharray="{item.dash}"' if item.dash else ""
        sym = f'<path d="M{num(x)} {num(y)}h18" stroke="{c}" stroke-width="1.6"{dash}/>'
    elif item.kind == "marker":
        sym = marker_svg(x + 9, y, item.marker or "o", item.color, 9, cls="legend-mark")
    else:
        sym = f'<rect x="{num(x + 2)}" y="{num(y - 5.5)}" width="13" height="11" fill="{c}"/>'
    return sym + text_svg(x + 24, y, item.label, "start", LEGEND_SIZE, TEXT_COLOR)


def _entry_width(item: LegendItem) -> float:
    return 24 + text_width(item.label, LEGEND_SIZE) + 14


def legend_svg(items: Sequence[LegendItem], ax: Axes, loc: str, ncol: int = 1) -> str:
    """A legend inside ``ax`` (``upper right``, ``upper left``, ``lower right``; ``ncol`` entries a
    row) or under it (``below``, at the panel's left edge, no background)."""
    width = max((_entry_width(i) for i in items), default=0.0)
    ncol = max(1, min(ncol, len(items)))
    nrow = -(-len(items) // ncol)
    w, h = width * ncol, 17 * nrow + 6
    if loc == "below":
        x, y = ax.x0, ax.y0 + ax.h + ax.under() + 6
    else:
        x = ax.x0 + ax.w - w - 4 if "right" in loc else ax.x0 + 8
        y = ax.y0 + 4 if "upper" in loc else ax.y0 + ax.h - h - 2
    out = ['<g class="legend">']
    if loc != "below":
        out.append(f'<rect x="{num(x - 4)}" y="{num(y)}" width="{num(w + 4)}" height="{num(h)}" fill="#ffffff" '
                   'fill-opacity="0.8"/>')
    for k, item in enumerate(items):
        out.append(_legend_entry(item, x + width * (k % ncol), y + 12 + 17 * (k // ncol)))
    out.append("</g>")
    return "".join(out)


def legend_rows(items: Sequence[LegendItem], width: float, ncol: int) -> list[list[LegendItem]]:
    """``items`` in rows of at most ``ncol`` entries that fit ``width``."""
    rows: list[list[LegendItem]] = [[]]
    used = 0.0
    for item in items:
        w = _entry_width(item)
        if rows[-1] and (len(rows[-1]) >= ncol or used + w > width):
            rows.append([])
            used = 0.0
        rows[-1].append(item)
        used += w
    return [r for r in rows if r]


class Figure:
    """A chart: a ``width`` × ``height`` px canvas, a bold title, panels and an optional legend below.

    Panels are laid out by :meth:`panels` inside the margins, which the chart sizes for its
    tick labels (``left``) and what goes under the axes (``bottom``)."""

    def __init__(self, title: str, width: float = 880, height: float = 440, name: str = "") -> None:
        self.title, self.width, self.height, self.name = title, width, height, name
        self.axes: list[Axes] = []
        self.below: list[LegendItem] = []
        self.below_ncol = 6
        self.notes: list[str] = []

    def legend_height(self, items: Sequence[LegendItem], ncol: int = 6) -> float:
        """The height a legend of ``items`` below the axes needs."""
        return 18.0 * len(legend_rows(items, self.width - 40, ncol)) + 8 if items else 0.0

    def legend_below(self, items: Sequence[LegendItem], ncol: int = 6) -> None:
        self.below = list(items)
        self.below_ncol = ncol

    def panels(self, ncols: int = 1, nrows: int = 1, *, left: float | Sequence[float] = 70, right: float = 20,
               top: float = 46, bottom: float = 50, wspace: float = 60, hspace: float = 30,
               width_ratios: Sequence[float] | None = None) -> list[list[Axes]]:
        """A grid of panels (``[row][col]``); ``left`` may differ per column (room for its tick labels)."""
        lefts = list(left) if isinstance(left, Sequence) else [left] * ncols
        ratios = list(width_ratios) if width_ratios else [1.0] * ncols
        free = self.width - right - sum(lefts) - wspace * (ncols - 1)
        widths = [free * r / sum(ratios) for r in ratios]
        ph = (self.height - top - bottom - hspace * (nrows - 1)) / nrows
        grid: list[list[Axes]] = []
        for r in range(nrows):
            row, x = [], 0.0
            for c in range(ncols):
                x += lefts[c] + (wspace if c else 0.0)
                ax = Axes(x, top + r * (ph + hspace), max(widths[c], 10.0), max(ph, 10.0))
                row.append(ax)
                x += widths[c]
            grid.append(row)
            self.axes.extend(row)
        return grid

    def svg(self) -> str:
        """The chart as one ``<svg>`` element (``viewBox``: scales to the page's width)."""
        w, h = self.width, self.height
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart-svg" viewBox="0 0 {num(w)} {num(h)}" '
               f'width="{num(w)}" height="{num(h)}" role="img" aria-label="{esc(self.title)}" '
               f'font-family="{FONT}" data-chart="{esc(self.name)}">',
               f'<rect width="{num(w)}" height="{num(h)}" fill="#ffffff"/>',
               text_svg(10, 24, self.title, "start", TITLE_SIZE, "#1f2328", "bold", "auto")]
        for ax in self.axes:
            out.append(f'<g class="axes">{ax.svg()}</g>')
        if self.below:
            rows = legend_rows(self.below, w - 40, self.below_ncol)
            y = h - 18.0 * len(rows) + 4
            out.append('<g class="legend">')
            for row in rows:
                total = sum(_entry_width(i) for i in row)
                x = (w - total) / 2
                for item in row:
                    out.append(_legend_entry(item, x, y))
                    x += _entry_width(item)
                y += 18
            out.append("</g>")
        out.append("</svg>")
        return "".join(out)


__all__ = ["Axes", "Figure", "LegendItem", "Scale", "esc", "nice_step", "num", "short", "text_svg", "text_width"]
