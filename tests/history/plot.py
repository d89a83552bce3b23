"""The run as a picture: one row per process, each operation a bar from its invoke to its
completion coloured by outcome, the nemesis' faults as shaded bands, and each anomaly's
entries marked; a single HTML file with inline SVG (nothing to install, opens anywhere)."""

from __future__ import annotations

import html as escape
from collections import defaultdict

from tests.history.checker import Report
from tests.history.model import History

COLOURS = {"ok": "#2e7d32", "fail": "#c62828", "info": "#ef6c00"}
ROW, LEFT, WIDTH = 12, 180, 1400


def html(history: History, report: Report, seed: int) -> str:
    ops = [op for op in history.ops if op.f != "nemesis"]
    rows = sorted({op.invoke.process for op in ops})
    end = max((e.time for e in history.entries), default=1.0) or 1.0

    def x(t: float) -> float:
        return LEFT + (min(t, end) / end) * (WIDTH - LEFT - 10)

    y = {p: 20 + i * ROW for i, p in enumerate(rows)}
    height = 40 + len(rows) * ROW
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             'font-family="monospace" font-size="10">']
    for op in history.of("nemesis"):
        fault = escape.escape(f"{op.asked.get('fault')} {op.asked.get('target')}")
        parts.append(f'<rect x="{x(op.start):.1f}" y="10" width="'
                     f'{max(1.0, x(op.end) - x(op.start)):.1f}" height="{height - 20}" '
                     f'fill="#90caf9" opacity="0.3"><title>{fault}</title></rect>')
    for p in rows:
        parts.append(f'<text x="4" y="{y[p] + 8}">{escape.escape(p)}</text>')
    for op in ops:
        colour = COLOURS.get(op.outcome, "#000")
        parts.append(f'<rect x="{x(op.start):.1f}" y="{y[op.invoke.process]}" width="'
                     f'{max(1.0, x(op.end) - x(op.start)):.1f}" height="{ROW - 3}" '
                     f'fill="{colour}"><title>{op.f} {op.outcome} '
                     f'#{op.invoke.index}</title></rect>')
    marked: dict[int, list[str]] = defaultdict(list)
    for kind, found in report.anomalies.items():
        for anomaly in found:
            for i in anomaly.entries:
                marked[i].append(kind)
    for entry in history.entries:
        if entry.index in marked and entry.process in y:
            what = escape.escape(", ".join(sorted(set(marked[entry.index]))))
            parts.append(f'<circle cx="{x(entry.time):.1f}" cy="{y[entry.process] + 4}" '
                         f'r="5" fill="none" stroke="#6a1b9a" stroke-width="2">'
                         f'<title>{what}</title></circle>')
    parts.append("</svg>")
    counts = "".join(f"<li>{k}: {v}</li>" for k, v in report.summary()["anomalies"].items())
    verdict = "no anomalies" if report.valid else "ANOMALIES FOUND"
    return (f"<!doctype html><meta charset=utf-8><title>llog history, seed {seed}</title>"
            f"<h1>llog history, seed {seed}: {verdict}</h1><ul>{counts}</ul>"
            "<p>green ok, red fail, orange info (unknown); blue bands: faults; purple "
            f"circles: entries of anomalies (hover for details)</p>{''.join(parts)}")
