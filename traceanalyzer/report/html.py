"""HTML output: ``report.html``, one self-contained page that opens anywhere, offline.

Layout: a header with the run's metadata and key numbers, the ranked findings, then
one section per analysis (its key numbers, its charts, its tables), then what could
not be checked and why. Everything is inline: CSS, a small script (sortable tables,
collapsible long tables) and the charts as inline SVG drawn from the results
(:func:`traceanalyzer.report.charts.draw_svgs`; no matplotlib: ``--format png`` writes the
same charts as PNG files). There is no external URL.

A trace is untrusted input: every string that comes from it (kernel names, file
paths, annotations, even numbers) goes through :func:`html.escape`, and a
Content-Security-Policy allows only this page's own script (by its SHA-256), so even
an escaping bug could not run planted code. The page records script errors in the
``data-js-errors`` attribute of ``<html>`` and sets ``data-js-ready="1"`` once its
script has run (the browser test reads both).

Sections come from the generic ``summary_of``/``tables_of`` of each result, so a new
analysis appears without changes here; charts come from
:mod:`traceanalyzer.report.charts` (their SVG drawings from ``report/_svg_charts.py``).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer import __version__
from traceanalyzer.analyses import registry as analysis_registry
from traceanalyzer.analyses import summary_of, tables_of
from traceanalyzer.analyses.diagnosis import DiagnosisResult
from traceanalyzer.analyses.timeline_view import TimelineViewResult
from traceanalyzer.report import renderer
from traceanalyzer.report.charts import DrawnSvg, draw_svgs
from traceanalyzer.report.document import JSON_SCHEMA_VERSION, Report, key_evidence
from traceanalyzer.report.fsutil import atomic_write_text
from traceanalyzer.report.perfetto import perfetto_link
from traceanalyzer.report.text import ColumnFormat, fmt_column_value, shorten, table_formats
from traceanalyzer.units import fmt_cell, fmt_cost, fmt_ns, fmt_pct

#: Rows shown before a table collapses behind a "show all" button.
COLLAPSE_AFTER = 12
#: Rows written at most per table (the rest are in summary.json), keeping pages small.
MAX_ROWS = 300
#: Longest text kept in a cell (the full text is in the cell's tooltip up to 2000 chars).
CELL_WIDTH = 160


def esc(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    s = str(value)
    # Most texts (numbers, names) hold none of the five characters: five membership tests
    # cost half of html.escape's five replacements.
    if "&" in s or "<" in s or ">" in s or '"' in s or "'" in s:
        return html.escape(s, quote=True)
    return s


CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--card:#fff;--accent:#2f5d9b;
--crit:#b42318;--warn:#b54708;--info:#2f5d9b;--ok:#1a7f37}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,"Noto Sans",
"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg)}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
header.top{background:#1d2b3a;color:#fff;padding:22px 32px 18px}
header.top h1{margin:0 0 4px;font-size:22px;font-weight:600;letter-spacing:.2px}
header.top h1 .file{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-weight:500;
overflow-wrap:anywhere}
header.top .sub{color:#b8c4d0;font-size:13px}
main{max-width:1240px;margin:0 auto;padding:20px 28px 40px}
nav.toc{display:flex;flex-wrap:wrap;gap:6px;margin:0 0 18px}
nav.toc a{font-size:12.5px;color:var(--accent);text-decoration:none;background:#fff;border:1px solid var(--line);
border-radius:14px;padding:2px 10px}
nav.toc a:hover{background:#eef3f9}
section.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:18px 22px;margin:0 0 18px}
section.card>h2{margin:0 0 4px;font-size:18px;font-weight:600}
section.card>p.doc{margin:0 0 12px;color:var(--muted)}
h3{font-size:14px;margin:18px 0 6px;font-weight:600}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:4px 24px;margin:0}
.facts div{display:flex;gap:8px;min-width:0;padding:3px 0;border-bottom:1px dashed #e6e9ed}
.facts dt{color:var(--muted);flex:0 0 auto;min-width:96px}
.facts dd{margin:0;overflow-wrap:anywhere}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:10px;margin:14px 0 0}
.tile{background:var(--bg);border:1px solid var(--line);border-radius:6px;padding:8px 12px}
.tile .k{color:var(--muted);font-size:12px}
.tile .v{font-size:17px;font-weight:600;overflow-wrap:anywhere}
dl.kv{display:grid;grid-template-columns:minmax(160px,max-content) 1fr;gap:3px 18px;margin:6px 0 10px}
dl.kv dt{color:var(--muted)}
dl.kv dd{margin:0;overflow-wrap:anywhere}
.warnbox{background:#fff8e6;border:1px solid #f0d089;border-radius:6px;padding:10px 14px;margin:0 0 18px}
.warnbox h2{font-size:14px;margin:0 0 4px}
.warnbox ul{margin:0;padding-left:20px}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:11.5px;font-weight:600;color:#fff;
text-transform:uppercase;letter-spacing:.3px;white-space:nowrap}
.sev-critical{background:var(--crit)}.sev-warning{background:var(--warn)}.sev-info{background:var(--info)}
.finding{border:1px solid var(--line);border-left:4px solid var(--info);border-radius:6px;padding:10px 14px;
margin:0 0 10px;background:#fff}
.finding.sev-critical-b{border-left-color:var(--crit)}.finding.sev-warning-b{border-left-color:var(--warn)}
.finding .head{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.finding .title{font-weight:600;font-size:14.5px;flex:1 1 420px;overflow-wrap:anywhere}
.finding .cost{font-weight:600;white-space:nowrap}
.finding .meta{color:var(--muted);font-size:12.5px}
.finding .fix{margin:6px 0 0}
.finding pre{background:var(--bg);border:1px solid var(--line);border-radius:4px;padding:8px 10px;
overflow:auto;margin:6px 0 0;white-space:pre-wrap;overflow-wrap:anywhere}
details>summary{cursor:pointer;color:var(--accent);font-size:12.5px;margin-top:6px}
.tablewrap{overflow-x:auto;margin:4px 0 6px;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{padding:4px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #eaeef2}
th{background:#f3f5f7;font-weight:600;white-space:nowrap;position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th:hover{background:#e8edf2}
th[aria-sort=ascending]::after{content:" ▲";font-size:10px}
th[aria-sort=descending]::after{content:" ▼";font-size:10px}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.txt{max-width:44em;min-width:12em;overflow-wrap:anywhere}
td.txt.short{min-width:0;white-space:nowrap}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#f0f5fb}
tr.collapsed{display:none}
.tablefoot{display:flex;gap:12px;align-items:center;color:var(--muted);font-size:12px;margin:0 0 12px}
button.more{font:inherit;font-size:12px;color:var(--accent);background:#fff;border:1px solid var(--line);
border-radius:4px;padding:2px 10px;cursor:pointer}
button.more:hover,button.tl-btn:hover{background:#eef3f9}
button.tl-btn{font:inherit;font-size:12px;color:var(--accent);background:#fff;border:1px solid var(--line);
border-radius:4px;padding:2px 10px;cursor:pointer}
figure.chart{margin:10px 0 14px}
figure.chart img,figure.chart svg{max-width:100%;height:auto;border:1px solid #eaeef2;border-radius:4px}
figure.chart svg{display:block}
figure.chart svg .bar:hover,figure.chart svg .gap:hover,figure.chart svg .pt:hover{stroke:#1f2328;stroke-width:1}
figure.chart figcaption{color:var(--muted);font-size:12px}
.note{color:var(--muted);font-size:12.5px}
.muted{color:var(--muted)}
ul.notrun{margin:6px 0;padding-left:20px}
ul.notrun li{margin:2px 0;overflow-wrap:anywhere}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 30px}
p.runline{margin:0 0 6px;color:var(--muted);overflow-wrap:anywhere}
p.runline b{color:var(--fg);font-weight:600}
p.verdict{margin:0;font-size:19px;font-weight:600;line-height:1.35}
.keyev{margin:4px 0 0;font-size:13px}
button.tl-show{font:inherit;font-size:12px;color:var(--accent);background:none;border:none;padding:0;cursor:pointer;
text-decoration:underline}
.finding.tl-active{box-shadow:0 0 0 2px #f5b700}
.finding .title.tl-link{cursor:pointer}
.tl{position:relative}
.tl-bar{display:flex;gap:12px;align-items:center;margin:0 0 6px;font-size:12.5px;color:var(--muted)}
canvas.tl-canvas{display:block;width:100%;border:1px solid var(--line);border-radius:4px;cursor:grab;
touch-action:none}
.tl-tip{position:absolute;z-index:5;pointer-events:none;background:#1d2b3a;color:#fff;font-size:12px;
padding:6px 9px;border-radius:4px;max-width:560px;overflow-wrap:anywhere;white-space:pre-line}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);margin:6px 0 0}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
@media print{body{background:#fff}nav.toc,button.more{display:none}tr.collapsed{display:table-row}
section.card{break-inside:avoid-page;border:none;padding:0}header.top{background:#fff;color:#000}}
"""

# The page's only script (in <head>; the table code runs on DOMContentLoaded). Its SHA-256 is whitelisted
# in the Content-Security-Policy, so nothing else (e.g. a <script> planted in a kernel name) could ever run.
JS = """
(function () {
  "use strict";
  var root = document.documentElement, errors = 0;
  window.addEventListener("error", function () {
    errors += 1;
    root.setAttribute("data-js-errors", String(errors));
  });
  document.addEventListener("securitypolicyviolation", function (e) {
    var n = parseInt(root.getAttribute("data-csp-violations") || "0", 10) + 1;
    root.setAttribute("data-csp-violations", String(n));
    root.setAttribute("data-csp-last", String(e.violatedDirective));
  });
  function key(cell) {
    var v = cell.getAttribute("data-v");
    if (v !== null && v !== "") {
      var n = parseFloat(v);
      if (!isNaN(n)) { return n; }
    }
    return cell.textContent.trim().toLowerCase();
  }
  function compare(a, b) {
    var na = typeof a === "number", nb = typeof b === "number";
    if (na && nb) { return a - b; }
    if (na !== nb) { return na ? -1 : 1; }
    return a < b ? -1 : (a > b ? 1 : 0);
  }
  function collapse(table) {
    var limit = parseInt(table.getAttribute("data-collapse") || "0", 10);
    if (!limit) { return; }
    var open = table.getAttribute("data-open") === "1";
    var rows = table.tBodies[0].rows;
    for (var i = 0; i < rows.length; i++) {
      rows[i].classList.toggle("collapsed", !open && i >= limit);
    }
  }
  // The interactive timeline: one canvas drawn from the JSON in #ta-timeline-data.
  function initTimeline() {
    var holder = document.getElementById("ta-timeline");
    var src = document.getElementById("ta-timeline-data");
    if (!holder || !src) { return null; }
    var data = JSON.parse(src.textContent);
    var canvas = holder.querySelector("canvas"), tip = holder.querySelector(".tl-tip");
    var info = holder.querySelector(".tl-info"), g = canvas.getContext("2d");
    var LABEL = 190, ROW = 18, AXIS = 24, W = Math.max(data.window_ns, 1);
    var v0 = 0, v1 = W, lit = {}, nlit = 0, lanes = [], gapLane = {}, height = AXIS;
    data.lanes.forEach(function (l, i) {
      var lane = {label: l.label, kind: l.kind, device: l.device, y: height, h: Math.max(l.rows, 1) * ROW, rows: []};
      for (var r = 0; r < Math.max(l.rows, 1); r++) { lane.rows.push([]); }
      if (l.kind === "gaps") { gapLane[l.device] = i; }
      lanes.push(lane);
      height += lane.h + 4;
    });
    var it = data.items, n = it.start_ns.length;
    for (var k = 0; k < n; k++) {
      var ln = lanes[it.lane[k]];
      if (ln && ln.rows[it.row[k]]) { ln.rows[it.row[k]].push(k); }
    }
    var gaps = data.gaps;
    function fmt(ns) {
      var a = Math.abs(ns);
      if (a >= 1e6) { return (ns / 1e6).toFixed(3) + " ms"; }
      if (a >= 1e3) { return (ns / 1e3).toFixed(1) + " µs"; }
      return Math.round(ns) + " ns";
    }
    function plotWidth() { return Math.max(canvas.clientWidth - LABEL - 8, 50); }
    function xOf(t) { return LABEL + (t - v0) / (v1 - v0) * plotWidth(); }
    function tOf(x) { return v0 + (x - LABEL) / plotWidth() * (v1 - v0); }
    function box(x0, x1, y, h, color) {
      var a = Math.max(x0, LABEL), b = Math.min(x1, LABEL + plotWidth());
      if (b < LABEL || a > LABEL + plotWidth()) { return; }
      g.fillStyle = color;
      g.fillRect(a, y, Math.max(b - a, 1), h);
    }
    function draw() {
      var dpr = window.devicePixelRatio || 1, cw = canvas.clientWidth || 800;
      canvas.width = Math.round(cw * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.height = height + "px";
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, cw, height);
      g.font = "11px sans-serif";
      g.textBaseline = "middle";
      // time axis, relative to the step start
      var span = v1 - v0, step = Math.pow(10, Math.floor(Math.log(span / 6) / Math.LN10));
      if (span / step > 12) { step *= 5; } else if (span / step > 6) { step *= 2; }
      g.fillStyle = "#59636e";
      g.strokeStyle = "#e6e9ed";
      for (var t = Math.ceil(v0 / step) * step; t <= v1; t += step) {
        var x = xOf(t);
        g.beginPath(); g.moveTo(x, AXIS - 4); g.lineTo(x, height); g.stroke();
        g.fillText("+" + fmt(t), x + 2, AXIS / 2);
      }
      lanes.forEach(function (lane, li) {
        g.fillStyle = li % 2 ? "#fafbfc" : "#f3f5f7";
        g.fillRect(0, lane.y, LABEL - 4, lane.h);
        g.fillStyle = "#1f2328";
        g.save(); g.beginPath(); g.rect(0, lane.y, LABEL - 6, lane.h); g.clip();
        g.fillText(lane.label, 4, lane.y + Math.min(lane.h, ROW) / 2);
        g.restore();
        lane.rows.forEach(function (row, r) {
          row.forEach(function (k) {
            var x0 = xOf(it.start_ns[k]), x1 = xOf(it.start_ns[k] + it.dur_ns[k]);
            var c = data.kind_colors[it.kind[k]] || "#888";
            box(x0, x1, lane.y + r * ROW + 1, ROW - 2, nlit ? fade(c) : c);
          });
        });
      });
      gaps.forEach(function (gp) {
        var li = gapLane[gp.device];
        if (li === undefined) { return; }
        var lane = lanes[li], c = data.cause_colors[gp.cause] || "#888";
        var x0 = xOf(gp.start_ns), x1 = xOf(gp.start_ns + gp.dur_ns), on = lit[gp.id];
        box(x0, x1, lane.y + 1, lane.h - 2, nlit && !on ? fade(c) : c);
        if (on) {
          g.fillStyle = "rgba(245,183,0,0.25)";
          box(x0, x1, AXIS, height - AXIS, "rgba(245,183,0,0.25)");
          g.strokeStyle = "#f5b700"; g.lineWidth = 2;
          g.strokeRect(Math.max(x0, LABEL) - 1, lane.y, Math.max(x1 - x0, 2) + 2, lane.h);
          g.lineWidth = 1;
        }
      });
    }
    function fade(c) { return c + "55"; }
    function hit(x, y) {
      if (x < LABEL) { return null; }
      var t = tOf(x), tol = (v1 - v0) / plotWidth() * 2;
      for (var li = 0; li < lanes.length; li++) {
        var lane = lanes[li];
        if (y < lane.y || y >= lane.y + lane.h) { continue; }
        if (lane.kind === "gaps") {
          for (var j = 0; j < gaps.length; j++) {
            var gp = gaps[j];
            if (gapLane[gp.device] === li && t >= gp.start_ns - tol && t <= gp.start_ns + gp.dur_ns + tol) {
              return {gap: gp};
            }
          }
          return null;
        }
        var row = lane.rows[Math.floor((y - lane.y) / ROW)] || [], best = null;
        for (var q = 0; q < row.length; q++) {
          var k = row[q];
          if (t >= it.start_ns[k] - tol && t <= it.start_ns[k] + it.dur_ns[k] + tol) {
            if (best === null || it.dur_ns[k] < it.dur_ns[best]) { best = k; }
          }
        }
        return best === null ? null : {item: best};
      }
      return null;
    }
    function describe(h) {
      if (h.gap) {
        var gp = h.gap;
        return "idle gap: " + gp.cause.replace(/_/g, " ") + "\\nduration " + fmt(gp.dur_ns) + " at +" +
          fmt(gp.start_ns) + (gp.cpu_context ? "\\nCPU was in: " + gp.cpu_context : "");
      }
      var k = h.item, what = it.kind[k].replace(/_/g, " ");
      var lines = [data.strings[it.name[k]], what + ", " + fmt(it.dur_ns[k]) + " at +" + fmt(it.start_ns[k])];
      if (it.site[k] !== null) { lines.push("call site: " + data.strings[it.site[k]]); }
      return lines.join("\\n");
    }
    var drag = null;
    canvas.addEventListener("wheel", function (e) {
      e.preventDefault();
      var r = canvas.getBoundingClientRect(), t = tOf(Math.max(e.clientX - r.left, LABEL));
      var span = Math.min(Math.max((v1 - v0) * Math.exp(e.deltaY * 0.0015), 200), W);
      v0 = t - (t - v0) * span / (v1 - v0);
      v0 = Math.min(Math.max(v0, 0), W - span);
      v1 = v0 + span;
      draw();
    }, {passive: false});
    canvas.addEventListener("mousedown", function (e) { drag = {x: e.clientX, v0: v0, v1: v1}; });
    window.addEventListener("mouseup", function () { drag = null; });
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
      if (drag) {
        var dt = (e.clientX - drag.x) / plotWidth() * (drag.v1 - drag.v0), span = drag.v1 - drag.v0;
        v0 = Math.min(Math.max(drag.v0 - dt, 0), W - span);
        v1 = v0 + span;
        draw();
        tip.hidden = true;
        return;
      }
      var h = hit(x, y);
      if (!h) { tip.hidden = true; return; }
      tip.textContent = describe(h);
      tip.hidden = false;
      tip.style.left = Math.min(x + 14, canvas.clientWidth - 300) + "px";
      tip.style.top = (canvas.offsetTop + y + 14) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    function reset() { v0 = 0; v1 = W; lit = {}; nlit = 0; mark(-1); info.textContent = ""; draw(); }
    canvas.addEventListener("dblclick", reset);
    holder.querySelector(".tl-reset").addEventListener("click", reset);
    function mark(i) {
      Array.prototype.forEach.call(document.querySelectorAll(".finding[data-finding]"), function (el) {
        el.classList.toggle("tl-active", el.getAttribute("data-finding") === String(i));
      });
      holder.setAttribute("data-highlighted", String(nlit));
    }
    function show(i) {
      var f = data.findings[i];
      if (!f) { return 0; }
      lit = {}; nlit = 0;
      var lo = Infinity, hi = -Infinity;
      f.gaps.forEach(function (id) {
        gaps.forEach(function (gp) {
          if (gp.id === id) {
            lit[id] = true; nlit++;
            lo = Math.min(lo, gp.start_ns); hi = Math.max(hi, gp.start_ns + gp.dur_ns);
          }
        });
      });
      if (nlit) {
        var pad = Math.max((hi - lo) * 0.5, W * 0.02);
        v0 = Math.max(lo - pad, 0); v1 = Math.min(hi + pad, W);
        info.textContent = "Finding " + (i + 1) + " (" + f.rule + "): " + nlit + " gap(s) highlighted";
      } else {
        v0 = 0; v1 = W;
        info.textContent = "Finding " + (i + 1) + " (" + f.rule + ") prices no idle gap of this step";
      }
      mark(i);
      draw();
      return nlit;
    }
    Array.prototype.forEach.call(document.querySelectorAll("button.tl-show"), function (btn) {
      function go() {
        show(parseInt(btn.getAttribute("data-finding"), 10));
        holder.scrollIntoView({block: "nearest"});
      }
      btn.addEventListener("click", go);
      // the finding's title is a target too
      var title = btn.closest(".finding").querySelector(".title");
      title.classList.add("tl-link");
      title.addEventListener("click", go);
    });
    window.addEventListener("resize", draw);
    draw();
    // For the self-test: the tooltip text at the middle of the first item of the first lane,
    // and the visible time range.
    function probe() {
      var k = lanes.length && lanes[0].rows[0].length ? lanes[0].rows[0][0] : null;
      if (k === null) { return ""; }
      var h = hit(xOf(it.start_ns[k] + it.dur_ns[k] / 2), lanes[0].y + ROW / 2);
      return h ? describe(h) : "";
    }
    return {show: show, canvas: canvas, probe: probe, view: function () { return [v0, v1]; }, reset: reset};
  }
  function init() {
  var timeline = initTimeline();
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(heads, function (th, col) {
      th.setAttribute("tabindex", "0");
      function sort() {
        var numeric = th.getAttribute("data-type") === "num";
        var current = th.getAttribute("aria-sort");
        var dir = current ? (current === "ascending" ? -1 : 1) : (numeric ? -1 : 1);
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r1, r2) { return dir * compare(key(r1.cells[col]), key(r2.cells[col])); });
        rows.forEach(function (r) { body.appendChild(r); });
        collapse(table);
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sort(); } });
    });
    collapse(table);
  });
  Array.prototype.forEach.call(document.querySelectorAll("button.more"), function (btn) {
    btn.hidden = false;
    btn.addEventListener("click", function () {
      var table = document.getElementById(btn.getAttribute("data-table"));
      var open = table.getAttribute("data-open") !== "1";
      table.setAttribute("data-open", open ? "1" : "0");
      btn.textContent = open ? btn.getAttribute("data-less") : btn.getAttribute("data-more");
      collapse(table);
    });
  });
  // Self-test for the headless-browser test (file://…/report.html#ta-selftest): open a
  // collapsed table and sort a numeric column, then say whether both worked.
  if (window.location.hash === "#ta-selftest") {
    var problems = [];
    var btn = document.querySelector("button.more");
    if (btn) {
      btn.click();
      var t = document.getElementById(btn.getAttribute("data-table"));
      if (t.querySelectorAll("tr.collapsed").length) { problems.push("expand"); }
    }
    var th = document.querySelector("table.sortable th[data-type=num]");
    if (th) {
      th.click();
      var tb = th.closest("table"), col = th.cellIndex, prev = Infinity;
      Array.prototype.forEach.call(tb.tBodies[0].rows, function (r) {
        var k = key(r.cells[col]);
        if (typeof k === "number") { if (k > prev) { problems.push("sort"); } prev = k; }
      });
    }
    if (timeline) {
      if (timeline.probe().indexOf("kernel") < 0 && timeline.probe().indexOf("memcpy") < 0) {
        problems.push("timeline-hover");
      }
      var before = timeline.view()[1] - timeline.view()[0], r = timeline.canvas.getBoundingClientRect();
      timeline.canvas.dispatchEvent(new WheelEvent("wheel", {deltaY: -300, clientX: r.left + r.width / 2,
                                                             clientY: r.top + 30, cancelable: true}));
      if (!(timeline.view()[1] - timeline.view()[0] < before)) { problems.push("timeline-zoom"); }
      timeline.reset();
      var px = timeline.canvas.getContext("2d").getImageData(0, 0, timeline.canvas.width, timeline.canvas.height).data;
      var inked = 0;
      for (var p = 3; p < px.length; p += 4 * 7) { if (px[p] > 0) { inked++; } }
      if (inked < 50) { problems.push("timeline-blank"); }
    }
    // last: a click on a finding's button leaves its gaps highlighted (the browser test reads it)
    var tb2 = document.querySelector("button.tl-show:not([data-gaps='0'])");
    if (timeline && tb2) {
      tb2.click();
      if (document.getElementById("ta-timeline").getAttribute("data-highlighted") === "0") {
        problems.push("timeline-highlight");
      }
    }
    root.setAttribute("data-selftest", problems.length ? "fail:" + problems.join(",") : "ok");
  }
  root.setAttribute("data-js-ready", "1");
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
"""


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(JS.encode("utf-8")).digest()).decode("ascii")
    return (
        "default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'"
    )


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


class _Ids:
    """Unique, deterministic element ids (``t1``, ``t2`` …) for one page."""

    def __init__(self) -> None:
        self.n = 0

    def next(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def _anchor(name: str) -> str:
    return "sec-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)


def _facts(pairs: Iterable[tuple[str, Any]]) -> str:
    items = "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>" for k, v in pairs)
    return f'<dl class="facts">{items}</dl>'


def _kv(pairs: Iterable[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs)
    return f'<dl class="kv">{items}</dl>' if items else ""


def _is_num(dtype: pl.DataType) -> bool:
    return dtype.is_numeric()


def _cell(column: str, value: Any, fmt: ColumnFormat, t0: int | None) -> str:
    if isinstance(value, bool):
        return f'<td data-v="{int(value)}">{"✓" if value else ""}</td>'
    if value is None:
        return '<td data-v="">–</td>'
    if isinstance(value, (int, float)):
        text = fmt_column_value(fmt, column, value, t0)
        return f'<td class="num" data-v="{esc(value)}">{esc(text)}</td>'
    text = fmt_cell(column, value, t0)
    short = shorten(text, CELL_WIDTH)
    title = f' title="{esc(shorten(text, 2000))}"' if short != text else ""
    cls = "txt short" if len(short) <= 24 else "txt"  # short words never break mid-word
    return f'<td class="{cls}"{title}>{esc(short)}</td>'


def _column_cells(column: str, values: list[Any], fmt: ColumnFormat, t0: int | None) -> list[str]:
    """:func:`_cell` of each value of one column; a value the column repeats (a device, a
    stream, a name, a share) is formatted once. A float zero is formatted each time: ``-0.0``
    reads differently but equals ``0.0``."""
    seen: dict[tuple[type, Any], str] = {}  # by type too: 1 and 1.0 read differently
    out = []
    for value in values:
        t = type(value)
        if t is int or t is str or (t is float and value):
            cell = seen.get((t, value))
            if cell is None:
                cell = seen[(t, value)] = _cell(column, value, fmt, t0)
        else:
            cell = _cell(column, value, fmt, t0)
        out.append(cell)
    return out


def table_html(df: pl.DataFrame, ids: _Ids, t0: int | None = None, max_rows: int = MAX_ROWS,
               collapse_after: int = COLLAPSE_AFTER, caption: str | None = None) -> str:
    """A sortable table; more than ``collapse_after`` rows collapse behind a button."""
    tid = ids.next("t")
    cols = df.columns
    dtypes = dict(zip(cols, df.dtypes))
    fmts = table_formats(df, t0)  # plain headers, one unit per quantity (named in the header)
    head = "".join(
        f'<th title="{esc(c)}" data-type="{"num" if _is_num(dtypes[c]) else "txt"}">{esc(fmts[c].label)}</th>'
        for c in cols
    )
    shown = df.head(max_rows)
    columns = [_column_cells(c, shown.get_column(c).to_list(), fmts[c], t0) for c in cols]
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in zip(*columns))
    collapse = collapse_after if shown.height > collapse_after + 3 else 0
    parts = []
    if caption:
        parts.append(f"<h3>{esc(caption)}</h3>")
    parts.append(
        f'<div class="tablewrap"><table class="sortable" id="{tid}" data-collapse="{collapse}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
    notes = [f"{df.height:,} row{'s' if df.height != 1 else ''}"]
    if df.height > shown.height:
        notes.append(f"first {shown.height:,} shown, all of them are in summary.json")
    if shown.height > 1:
        notes.append("click a header to sort")
    button = ""
    if collapse:
        more, less = f"Show all {shown.height:,} rows", f"Show first {collapse}"
        button = (
            f'<button class="more" type="button" hidden data-table="{tid}" data-more="{esc(more)}" '
            f'data-less="{esc(less)}">{esc(more)}</button>'
        )
    parts.append(f'<div class="tablefoot">{button}<span>{esc(" · ".join(notes))}</span></div>')
    return "".join(parts)


def _chart_svg(name: str, title: str, svg: str) -> str:
    """A chart as inline SVG (drawn from the results, :func:`charts.draw_svgs`; hover a bar or a
    point for its value). The page does not know whether ``--format png`` ran beside it, so the
    caption names no file; the footer says how to get PNGs."""
    return f'<figure class="chart" id="chart-{esc(name)}">{svg}<figcaption>{esc(title)}</figcaption></figure>'



# ---------------------------------------------------------------------------------------------
# Page parts
# ---------------------------------------------------------------------------------------------


def _run_facts(report: Report) -> list[tuple[str, str]]:
    m = report.meta
    facts: list[tuple[str, str]] = [("File", Path(report.source).name or report.source), ("Input", report.kind)]
    if m.get("layout"):
        facts.append(("Format", str(m["layout"])))
    if m.get("rank") is not None or m.get("world_size") is not None:
        ws = m.get("world_size")
        facts.append(("Rank", f"{m.get('rank', '?')} of {ws if ws is not None else '?'}"))
    devices = [str(d.get("name")) for d in m.get("device_properties") or [] if isinstance(d, Mapping) and d.get("name")]
    if devices:
        counts: dict[str, int] = {}
        for d in devices:
            counts[d] = counts.get(d, 0) + 1
        facts.append(("Devices", ", ".join(f"{n}× {d}" if n > 1 else d for d, n in counts.items())))
    elif m.get("vendor"):
        facts.append(("Vendor", str(m["vendor"])))
    for k, v in (m.get("versions") or {}).items():
        facts.append((k.replace("_", " "), str(v)))
    for key, label in (("release_hint", "PyTorch release"), ("devices", "Devices"), ("n_segments", "Segments"),
                       ("n_trace_entries", "History entries"), ("n_samples", "Samples")):
        v = m.get(key)
        if v not in (None, "", [], ()) and not any(k == label for k, _ in facts):
            facts.append((label, ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else
                          (f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))))
    flags = m.get("profiler_flags") or {}
    if flags:
        facts.append(("Profiler flags", ", ".join(f"{k}={'on' if v else 'off'}" for k, v in flags.items())))
    steps = report.results.values.get("steps")
    table = getattr(steps, "table", None)
    if steps is not None and getattr(steps, "has_steps", False) and table is not None and table.height:
        nums = table["step"].to_list()
        facts.append(("Steps", f"{len(nums)} (#{nums[0]}–#{nums[-1]})"))
    if m.get("span_ns"):
        facts.append(("Trace span", fmt_ns(m["span_ns"])))
    return facts


def _tiles(report: Report) -> str:
    """Short facts under the verdict, each a number with its base named in the label."""
    tiles: list[tuple[str, str]] = []
    steps = report.results.values.get("steps")
    stats = getattr(steps, "stats", None)
    if getattr(steps, "has_steps", False) and isinstance(stats, Mapping) and stats.get("median") is not None:
        tiles.append(("Median steady step", fmt_ns(stats["median"])))
    diag = report.results.values.get("diagnosis")
    if isinstance(diag, DiagnosisResult) and diag.resource == "gpu":
        b = diag.breakdown
        if b.get("productive_pct") is not None:
            tiles.append(("GPU productive, % of steady steps", fmt_pct(b["productive_pct"])))
        if b.get("idle_pct") is not None:
            tiles.append(("GPU idle, % of steady steps", fmt_pct(b["idle_pct"])))
    sev: dict[str, int] = {}
    for f in report.findings:
        sev[str(f.severity)] = sev.get(str(f.severity), 0) + 1
    order = ("critical", "warning", "info")
    detail = ", ".join(f"{sev[k]} {k}" for k in order if k in sev)
    tiles.append(("Findings", f"{len(report.findings)}" + (f" ({detail})" if detail else "")))
    if report.findings:
        f = report.findings[0]
        cost = fmt_cost(f.cost_ms_per_step, None, f.cost_bytes, missing="")
        if cost:
            tiles.append(("Largest finding cost", cost))
    items = "".join(f'<div class="tile"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
                    for k, v in tiles)
    return f'<div class="tiles">{items}</div>'


def _first_screen(report: Report) -> str:
    """The run line, the verdict sentence with its number, and short facts."""
    run = " · ".join(f"<b>{esc(k)}</b> {esc(v)}" for k, v in report.run_line())
    return (f'<section class="card" id="sec-run"><p class="runline">{run}</p>'
            f'<p class="verdict">{esc(report.verdict())}</p>{_tiles(report)}</section>')


def _evidence(ev: Mapping[str, Any], ids: _Ids, t0: int | None) -> str:
    scalars: list[tuple[str, str]] = []
    blocks: list[str] = []
    for k, v in ev.items():
        if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v):
            try:
                df = pl.DataFrame([dict(r) for r in v], infer_schema_length=None)
                blocks.append(table_html(df, ids, t0, caption=str(k), collapse_after=8))
                continue
            except Exception:  # noqa: BLE001 - ragged evidence: show it as text instead
                pass
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            scalars.append((k, fmt_cell(k, v, t0)))
        elif isinstance(v, (list, tuple)):
            scalars.append((k, ", ".join(shorten(str(x), 200) for x in v[:50]) + (" …" if len(v) > 50 else "")))
        elif isinstance(v, Mapping):
            scalars.append((k, "; ".join(f"{a}: {shorten(str(b), 120)}" for a, b in list(v.items())[:30])))
        else:
            scalars.append((k, shorten(str(v), 500)))
    return _kv(scalars) + "".join(blocks)


def gaps_by_rule(tv: TimelineViewResult | None) -> dict[str, list[str]]:
    """Rule id → ids of the timeline's gaps that its findings price, in the timeline's order
    (read from the timeline result; a finding's gaps are those of its rule)."""
    out: dict[str, list[str]] = {}
    if tv is None:
        return out
    for gap, rules in tv.gap_rules().items():
        for rule_id in dict.fromkeys(rules):
            out.setdefault(rule_id, []).append(gap)
    return out


def _findings(report: Report, ids: _Ids, t0: int | None, gaps_of: Mapping[str, list[str]]) -> str:
    out = ['<section class="card" id="sec-findings"><h2>Findings</h2>']
    if not report.findings:
        out.append('<p class="doc">No findings: none of the checks that could run found a problem.</p>')
    else:
        out.append(f'<p class="doc">{len(report.findings)} finding{"s" if len(report.findings) != 1 else ""}, '
                   "ranked by estimated cost: GPU time per step a fix could win back (GPU idle it would fill or "
                   "GPU work it would remove; % of the median step), never a CPU wait on a busy GPU; then memory. "
                   "Costs may price the same time from different angles and do not add up.</p>")
    for i, f in enumerate(report.findings, 1):
        sev = str(f.severity)
        conf = f" · confidence {f.confidence:.0%}" if f.confidence < 1 else ""
        cost = fmt_cost(f.cost_ms_per_step, f.cost_pct_of_step, f.cost_bytes, missing="")
        gaps = gaps_of.get(f.rule_id, [])
        out.append(
            f'<div class="finding sev-{esc(sev)}-b" data-finding="{i - 1}"><div class="head">'
            f'<span class="badge sev-{esc(sev)}">{esc(sev)}</span><span class="title">{i}. {esc(f.title)}</span>'
            f'<span class="cost">{esc(cost)}</span></div>'
            f'<div class="meta">rule <code>{esc(f.rule_id)}</code>{esc(conf)}'
        )
        if gaps:
            label = f"show its {len(gaps)} gap{'s' if len(gaps) != 1 else ''} on the timeline"
            out.append(f' · <button class="tl-show" type="button" data-finding="{i - 1}" data-gaps="{len(gaps)}">'
                       f"{esc(label)}</button>")
        out.append("</div>")
        ev = key_evidence(f)
        if ev is not None:
            out.append(f'<div class="keyev">{esc(ev[0])}: <b>{esc(ev[1])}</b></div>')
        out.append(f'<div class="fix"><b>Fix:</b> {esc(f.fix)}</div>')
        # the detail stays one click away, so the ranked list fits the first screen
        if f.code_hint or f.evidence:
            summary = " and ".join(w for w, has in (("Code", f.code_hint), ("evidence", f.evidence)) if has)
            out.append(f"<details><summary>{esc(summary[0].upper() + summary[1:])}</summary>")
            if f.code_hint:
                out.append(f"<pre>{esc(f.code_hint)}</pre>")
            if f.evidence:
                out.append(_evidence(f.evidence, ids, t0))
            out.append("</details>")
        out.append("</div>")
    floor = report.floor_line()
    if floor:
        out.append(f'<p class="doc">{esc(floor)}.</p>')
    out.append("</section>")
    return "".join(out)


#: Colours of the timeline (one source: the legend and the script's data).
KIND_COLORS = {"kernel": "#2f5d9b", "memcpy": "#16a34a", "memset": "#0d9488", "cpu_op": "#8fa3bf",
               "annotation": "#b48ad9", "runtime": "#c2883a", "merged": "#a3aab3"}
CAUSE_COLORS = {"host_bound": "#e8590c", "sync": "#d6336c", "memcpy": "#7048e8", "data_loader": "#1098ad",
                "stream_dependency": "#74b816", "other": "#868e96"}


def _json_for_html(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">``: ``</`` and ``<!--`` cannot end
    or comment the element (``<`` is written ``\\u003c``), and U+2028/2029 are escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def timeline_data(report: Report, gaps_of: Mapping[str, list[str]]) -> dict[str, Any]:
    """What the page's timeline script draws: the report's ``timeline_view`` result as JSON,
    each finding's gap ids (``gaps_of``: :func:`gaps_by_rule`; in the order the findings are
    shown) and the colours."""
    data = dict(report.result_json("timeline_view"))  # as summary.json holds it (before rounding)
    data["findings"] = [{"rule": f.rule_id, "title": f.title, "gaps": list(gaps_of.get(f.rule_id, []))}
                        for f in report.findings]
    data["kind_colors"] = KIND_COLORS
    data["cause_colors"] = CAUSE_COLORS
    return data


def _timeline(report: Report, tv: TimelineViewResult | None, gaps_of: Mapping[str, list[str]]) -> str:
    if tv is None:
        return ""
    what = f"step #{tv.step}" if tv.step is not None else "the device activity span"
    kinds = "".join(f'<span><i style="background:{c}"></i>{esc(k.replace("_", " "))}</span>'
                    for k, c in KIND_COLORS.items())
    causes = "".join(f'<span><i style="background:{c}"></i>{esc(k.replace("_", " "))}</span>'
                     for k, c in CAUSE_COLORS.items())
    note = ""
    if tv.n_merged or tv.n_dropped:
        note = (f" {tv.n_merged:,} intervals shorter than a pixel are merged"
                + (f", {tv.n_dropped:,} short ones left out" if tv.n_dropped else "") + ".")
    return (
        '<section class="card" id="sec-timeline"><h2>Timeline</h2>'
        f'<p class="doc">{esc(what)} ({esc(fmt_ns(tv.window_ns))}, the steady step closest to the median): GPU '
        "streams, idle gaps coloured by cause and the launching CPU thread. Wheel to zoom, drag to pan, double-click "
        f"to reset; hover for name, duration and call site; a finding's button highlights its gaps.{esc(note)}</p>"
        '<div id="ta-timeline" class="tl" data-highlighted="0"><div class="tl-bar">'
        '<button type="button" class="tl-btn tl-reset">Reset zoom</button><span class="tl-info"></span></div>'
        '<canvas class="tl-canvas" height="120"></canvas><div class="tl-tip" hidden></div>'
        f'<div class="legend"><b>work</b> {kinds}</div><div class="legend"><b>idle gaps</b> {causes}</div></div>'
        '<script type="application/json" id="ta-timeline-data">'
        f"{_json_for_html(timeline_data(report, gaps_of))}</script>"
        "</section>"
    )


def _not_run(report: Report) -> str:
    skipped = {**report.results.skipped, **report.not_run}
    failed = {**report.results.failed, **report.rule_failures}
    if not skipped and not failed:
        return ""
    items = [f"<li><code>{esc(k)}</code>: {esc(v)}</li>" for k, v in sorted(skipped.items())]
    items += [
        f"<li><code>{esc(k)}</code> failed (internal error, please report): {esc(v)}</li>"
        for k, v in sorted(failed.items())
    ]
    return (
        '<section class="card" id="sec-not-run"><h2>Checks that could not run</h2>'
        '<p class="doc">What this input could not tell, and why.</p>'
        f'<ul class="notrun">{"".join(items)}</ul></section>'
    )


def to_html(report: Report, charts: list[DrawnSvg] | None = None) -> str:
    """The whole page. ``charts``: the charts as SVG (:func:`charts.draw_svgs`); drawn here when ``None``."""
    if charts is None:
        charts = draw_svgs(report.results)
    ids = _Ids()
    t0 = report.meta.get("span_start_ns") if isinstance(report.meta.get("span_start_ns"), int) else None
    specs = analysis_registry()
    by_section: dict[str, list[Any]] = {}
    for d in charts:
        by_section.setdefault(d.spec.section, []).append(d)
    name = Path(report.source).name or report.source
    facts = _run_facts(report)

    tv = report.results.values.get("timeline_view")
    timeline = tv if isinstance(tv, TimelineViewResult) else None
    gaps_of = gaps_by_rule(timeline)
    sections = [sec for sec in report.sections() if sec[0] != "timeline_view"]  # drawn as the timeline card
    toc = ['<a href="#sec-findings">Findings</a>']
    if timeline is not None:
        toc.append('<a href="#sec-timeline">Timeline</a>')
    toc.append('<a href="#sec-run-details">Run details</a>')
    body: list[str] = []
    for sname, title, result in sections:
        anchor = _anchor(sname)
        toc.append(f'<a href="#{esc(anchor)}">{esc(title)}</a>')
        part = [f'<section class="card" id="{esc(anchor)}"><h2>{esc(title)}</h2>']
        doc = specs[sname].doc.splitlines()[0] if sname in specs and specs[sname].doc else ""
        if doc:
            part.append(f'<p class="doc">{esc(doc)}</p>')
        part.append(_kv(summary_of(result)))
        for d in by_section.get(sname, []):
            if d.svg is not None:
                part.append(_chart_svg(d.spec.name, d.spec.title, d.svg))
            else:
                part.append(f'<p class="note">Chart “{esc(d.spec.title)}” could not be drawn: {esc(d.error)}</p>')
        for ttitle, df in tables_of(result).items():
            if df is None or df.height == 0:
                continue
            part.append(table_html(df, ids, t0, caption=ttitle))
        part.append("</section>")
        body.append("".join(part))
    not_run = _not_run(report)
    if not_run:
        toc.append('<a href="#sec-not-run">Could not run</a>')

    warn = ""
    if report.warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
        warn = f'<div class="warnbox"><h2>Input warnings</h2><ul>{items}</ul></div>'

    page = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{esc(_csp())}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f'<meta name="generator" content="traceanalyzer {esc(__version__)}">',
        f"<title>{esc(name)} · traceanalyzer report</title>",
        f"<style>{CSS}</style>",
        # In <head>, so that its error and CSP-violation listeners see the whole page.
        f"<script>{JS}</script>",
        "</head>",
        "<body>",
        f'<header class="top"><h1>traceanalyzer report: <span class="file">{esc(name)}</span></h1>'
        f'<div class="sub">{esc(report.kind)} · {len(report.findings)} finding'
        f'{"s" if len(report.findings) != 1 else ""} · {len(sections)} analyses</div></header>',
        "<main>",
        _first_screen(report),
        warn,
        f'<nav class="toc">{"".join(toc)}</nav>',
        _findings(report, ids, t0, gaps_of),
        _timeline(report, timeline, gaps_of),
        f'<section class="card" id="sec-run-details"><h2>Run details</h2>{_facts(facts)}</section>',
        *body,
        not_run,
        "</main>",
        f"<footer>Generated offline by traceanalyzer {esc(__version__)} · every number is in summary.json "
        f"(schema {esc(JSON_SCHEMA_VERSION)})"
        + (" · the charts as PNG files: <code>--format png</code>" if charts else "") + "</footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in page if p) + "\n"


@renderer("html", description="report.html: self-contained page (SVG charts, sortable tables), opens offline")
def render(report: Report, outdir: Path) -> list[Path]:
    path = outdir / "report.html"
    page = to_html(report)
    atomic_write_text(path, page.replace("<footer>", perfetto_link(outdir) + "<footer>", 1))
    return [path]
