"""The batch index: ``index.html``, ``index.csv`` (one row per file), ``runs.csv`` (one
row per run) and ``index.json`` (everything, including multi-rank summaries and the
ignored candidates). Each file is written atomically.

The HTML page is self-contained (inline CSS, no script, a CSP that forbids loading
anything) and every string that comes from a trace or a path is escaped with
:func:`html.escape`. Renderers format only; every number was computed earlier.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from traceanalyzer import __version__
from traceanalyzer.batch.summary import top_finding_text
from traceanalyzer.report.fsutil import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from traceanalyzer.batch.runner import BatchResult

INDEX_SCHEMA_VERSION = "1.0"

#: (CSV column, metrics key or None for a row key, header in HTML)
FILE_COLUMNS: tuple[tuple[str, str | None, str], ...] = (
    ("file", None, "File"),
    ("run", None, "Run"),
    ("kind", None, "Kind"),
    ("rank", None, "Rank"),
    ("status", None, "Status"),
    ("error", None, "Error"),
    ("n_steps", "n_steps", "Steps"),
    ("step_ms", "step_ms", "Step (ms, median)"),
    ("gpu_busy_pct", "gpu_busy_pct", "GPU busy %"),
    ("idle_pct", "idle_pct", "Idle %"),
    ("comm_ms_per_step", "comm_ms_per_step", "Comm (ms/step)"),
    ("exposed_comm_ms_per_step", "exposed_comm_ms_per_step", "Exposed comm (ms/step)"),
    ("comm_overlap_pct", "comm_overlap_pct", "Comm overlap %"),
    ("n_kernels", "n_kernels", "Kernels"),
    ("peak_memory_bytes", "peak_memory_bytes", "Peak memory (B)"),
    ("n_findings", "n_findings", "Findings"),
    ("top_finding", None, "Top finding"),
    ("cached", None, "Cached"),
    ("seconds", None, "Seconds"),
    ("report", None, "Report"),
)

RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "Run"),
    ("n_files", "Files"),
    ("n_failed", "Failed"),
    ("ranks", "Ranks"),
    ("world_size", "World size"),
    ("step_ms", "Step (ms, slowest rank)"),
    ("gpu_busy_pct", "GPU busy % (mean)"),
    ("idle_pct", "Idle % (mean)"),
    ("comm_ms_per_step", "Comm (ms/step)"),
    ("exposed_comm_ms_per_step", "Exposed comm (ms/step)"),
    ("comm_overlap_pct", "Comm overlap %"),
    ("straggler", "Straggler"),
    ("top_finding", "Top finding"),
)


def main_report(row: Mapping[str, Any]) -> str:
    """The report file a human should open first (html, then md, then json)."""
    reports = list(row.get("reports") or [])
    for ext in (".html", ".md", ".json"):
        for r in reports:
            if r.endswith(ext):
                return str(r)
    return str(reports[0]) if reports else ""


def file_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """The flat CSV/HTML record of one file row."""
    m = row.get("metrics") or {}
    rec: dict[str, Any] = {}
    for col, key, _ in FILE_COLUMNS:
        if key is not None:
            rec[col] = m.get(key)
        elif col == "top_finding":
            rec[col] = top_finding_text(m)
        elif col == "report":
            rec[col] = main_report(row)
        else:
            rec[col] = row.get(col)
    return rec


def run_record(run: Mapping[str, Any]) -> dict[str, Any]:
    rec = {col: run.get(col) for col, _ in RUN_COLUMNS}
    rec["ranks"] = _ranks_text(run.get("ranks") or [])
    return rec


def _ranks_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return ""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return " ".join(parts)


def _csv(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for rec in records:
        w.writerow(["" if rec.get(c) is None else rec.get(c) for c in columns])
    return buf.getvalue()


def index_json(result: BatchResult, expected: int | None = None) -> dict[str, Any]:
    return {
        "schema_version": INDEX_SCHEMA_VERSION,
        "tool": {"name": "traceanalyzer", "version": __version__},
        "backend": result.backend,
        "interrupted": result.interrupted,
        "in_progress": result.in_progress,
        "totals": {
            "files": len(result.rows),
            "expected": expected if expected is not None else len(result.rows),
            "failed": result.n_failed,
            "cached": result.n_cached,
            "runs": len(result.runs),
            "ignored": len(result.ignored),
            "wall_s": result.wall_s,
        },
        "files": list(result.rows),
        "runs": list(result.runs),
        "ignored": [{"path": p, "reason": why} for p, why in result.ignored],
    }


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

_CSS = """
body{margin:0;font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;
color:#1f2328;background:#f6f8fa}
header{background:#1d2b3a;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:20px;font-weight:600}
header p{margin:0;color:#c9d4e0}
main{padding:8px 28px 40px}
h2{font-size:17px;margin:26px 0 8px}
.tiles{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0}
.tile{background:#fff;border:1px solid #d1d9e0;border-radius:6px;padding:10px 14px;min-width:110px}
.tile b{display:block;font-size:20px}
.tile.bad b{color:#b42318}
table{border-collapse:collapse;background:#fff;border:1px solid #d1d9e0;font-size:13px;width:100%}
th,td{padding:5px 8px;border-bottom:1px solid #e6eaef;text-align:left;vertical-align:top}
th{background:#eef2f6;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.error td{background:#fff4f2}
td.err{color:#b42318}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
.muted{color:#59636e}
details{margin:8px 0}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _num(x: Any, digits: int = 2) -> str:
    if x is None or isinstance(x, bool):
        return "–" if x is None else _e(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return _e(x)


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def _files_table(rows: Sequence[Mapping[str, Any]]) -> str:
    heads = [h for c, _, h in FILE_COLUMNS if c not in ("error", "report", "cached")]
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in heads), "</tr></thead><tbody>"]
    for row in rows:
        rec = file_record(row)
        bad = rec["status"] != "ok"
        out.append(f'<tr class="{"error" if bad else "ok"}">')
        link = rec["report"]
        name = _e(rec["file"])
        out.append(f'<td><a href="{_e(link)}"><code>{name}</code></a></td>' if link
                   else f"<td><code>{name}</code></td>")
        out.append(f"<td>{_e(rec['run'])}</td><td>{_e(rec['kind'])}</td><td class=num>{_num(rec['rank'])}</td>")
        if bad:
            out.append(f'<td class="err">error</td><td class="err" colspan="{len(heads) - 5}">{_e(rec["error"])}</td>')
            out.append(f"<td class=num>{_num(rec['seconds'])}</td></tr>")
            continue
        status = "ok (cached)" if rec["cached"] else "ok"
        out.append(f"<td>{status}</td>")
        for col in ("n_steps", "step_ms", "gpu_busy_pct", "idle_pct", "comm_ms_per_step",
                    "exposed_comm_ms_per_step", "comm_overlap_pct", "n_kernels"):
            out.append(f"<td class=num>{_num(rec[col], 3 if col.endswith('ms') or 'ms_' in col else 1)}</td>")
        out.append(f"<td class=num>{_bytes(rec['peak_memory_bytes'])}</td>")
        out.append(f"<td class=num>{_num(rec['n_findings'])}</td><td>{_e(rec['top_finding'])}</td>")
        out.append(f"<td class=num>{_num(rec['seconds'])}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _runs_table(runs: Sequence[Mapping[str, Any]]) -> str:
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for _, h in RUN_COLUMNS), "</tr></thead><tbody>"]
    for run in runs:
        rec = run_record(run)
        cells = []
        for col, _ in RUN_COLUMNS:
            v = rec[col]
            if col in ("run", "ranks", "top_finding"):
                cells.append(f"<td>{_e(v)}</td>")
            else:
                cells.append(f"<td class=num>{_num(v, 3 if 'ms' in col else 1)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _multirank_block(run: Mapping[str, Any]) -> str:
    mr = run.get("multirank")
    if not mr:
        return ""
    world = f" of {mr['world_size']}" if mr.get("world_size") else ""
    out = [f"<h3>Run <code>{_e(run['run'])}</code>: {mr['n_ranks']} ranks{_e(world)}</h3>"]
    f = mr.get("finding")
    if f:
        out.append(f"<p><b>{_e(f['severity'])}</b>: {_e(f['title'])}<br><span class=muted>{_e(f['fix'])}</span></p>")
    elif mr.get("imbalance_pct") is not None:
        out.append(f"<p>Balanced: the slowest rank ({_e(mr['straggler'])}) does {_num(mr['imbalance_ms'], 3)} ms/step "
                   f"({_num(mr['imbalance_pct'], 1)} % of the step) more work than the median of the others.</p>")
    cols = ("rank", "step_ms", "busy_pct", "idle_pct", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_pct",
            "work_ms", "wait_ms")
    heads = ("Rank", "Step (ms)", "Busy %", "Idle %", "Compute (ms/step)", "Comm (ms/step)",
             "Exposed comm (ms/step)", "Overlap %", "Work (ms/step)", "Waits in collectives (ms/step)")
    out.append("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr></thead><tbody>")
    for e in mr["ranks"]:
        mark = ' style="font-weight:600"' if f and e["rank"] == mr.get("straggler") else ""
        out.append(f"<tr{mark}>" + "".join(f"<td class=num>{_num(e.get(c), 3)}</td>" for c in cols) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _state_note(doc: Mapping[str, Any]) -> str:
    if doc.get("in_progress"):
        return " · <b>in progress: partial index</b>"
    if doc.get("interrupted"):
        return " · <b>interrupted: partial index</b>"
    return ""


def to_html(doc: Mapping[str, Any]) -> str:
    t = doc["totals"]
    rows = doc["files"]
    runs = doc["runs"]
    multi = [r for r in runs if r.get("n_files", 0) > 1]
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        "<meta name=viewport content='width=device-width,initial-scale=1'>",
        "<title>traceanalyzer batch index</title>",
        f"<style>{_CSS}</style></head><body>",
        "<header><h1>traceanalyzer batch index</h1>",
        f"<p>traceanalyzer {_e(doc['tool']['version'])} · backend {_e(doc['backend'])} · "
        f"{_num(t['wall_s'])} s{_state_note(doc)}</p></header>",
        "<main><div class=tiles>",
        f"<div class=tile><b>{t['files']}</b>files</div>",
        f"<div class='tile{' bad' if t['failed'] else ''}'><b>{t['failed']}</b>failed</div>",
        f"<div class=tile><b>{t['cached']}</b>from cache</div>",
        f"<div class=tile><b>{t['runs']}</b>runs</div>",
        f"<div class=tile><b>{t['ignored']}</b>ignored</div>",
        "</div>",
    ]
    if multi:
        parts.append(f"<h2>Runs with several files ({len(multi)})</h2>")
        parts.append(_runs_table(multi))
        parts += [_multirank_block(r) for r in multi]
        n_single = len(runs) - len(multi)
        if n_single:
            parts.append(f"<p class=muted>{n_single} single-file runs are listed in the files table and runs.csv.</p>")
    parts.append(f"<h2>Files ({len(rows)})</h2>")
    parts.append(_files_table(rows))
    if doc["ignored"]:
        parts.append(f"<details><summary>Ignored candidates ({len(doc['ignored'])})</summary><ul>")
        parts += [f"<li><code>{_e(i['path'])}</code>: {_e(i['reason'])}</li>" for i in doc["ignored"]]
        parts.append("</ul></details>")
    parts.append("<p class=muted>index.csv (files), runs.csv (runs) and index.json (everything) are next to this page."
                 "</p></main></body></html>\n")
    return "".join(parts)


def write_index(result: BatchResult, expected: int | None = None) -> list[Path]:
    """Write the four index files into ``result.outdir``; returns their paths."""
    out = result.outdir
    doc = index_json(result, expected)
    paths = [out / "index.json", out / "index.csv", out / "runs.csv", out / "index.html"]
    atomic_write_bytes(paths[0], orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")
    atomic_write_text(paths[1], _csv([file_record(r) for r in result.rows], [c for c, _, _ in FILE_COLUMNS]))
    atomic_write_text(paths[2], _csv([run_record(r) for r in result.runs], [c for c, _ in RUN_COLUMNS]))
    atomic_write_text(paths[3], to_html(doc))
    return paths
