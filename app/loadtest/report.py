"""report.html: one self-contained page per run (inline SVG, no external assets)."""

from __future__ import annotations

import html
import json
from typing import Any

from app.loadtest import rundir
from app.loadtest.rundir import RunDir, read_jsonl

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
Series = tuple[str, list[tuple[float, float]]]


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return value


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:.3g}"


def line_chart(title: str, series: list[Series], y_label: str,
               width: int = 760, height: int = 260) -> str:
    left, right, top, bottom = 60, 170, 28, 34
    pw, ph = width - left - right, height - top - bottom
    points = [p for _, pts in series for p in pts]
    esc = html.escape
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
            f'<text x="{left}" y="16" font-size="13" font-weight="bold">{esc(title)}</text>')
    if not points:
        return head + (f'<text x="{left + 10}" y="{top + ph / 2}" font-size="12" '
                       f'fill="#777">no data</text></svg>')
    x_max = _nice_max(max(p[0] for p in points))
    y_max = _nice_max(max(p[1] for p in points))
    parts = [head]
    for i in range(5):
        y = top + ph - ph * i / 4
        value = y_max * i / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" '
                     f'stroke="#e5e5e5"/><text x="{left - 6}" y="{y + 4:.1f}" font-size="10" '
                     f'text-anchor="end">{_fmt(value)}</text>')
    for i in range(6):
        x = left + pw * i / 5
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 14}" font-size="10" '
                     f'text-anchor="middle">{_fmt(x_max * i / 5)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 4}" font-size="10" '
                 f'text-anchor="middle">seconds since start</text>'
                 f'<text x="12" y="{top + ph / 2}" font-size="10" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + ph / 2})">{esc(y_label)}</text>'
                 f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                 f'stroke="#999"/>')
    for n, (name, pts) in enumerate(series):
        color = _COLORS[n % len(_COLORS)]
        coords = " ".join(f"{left + pw * x / x_max:.1f},{top + ph - ph * min(y, y_max) / y_max:.1f}"
                          for x, y in sorted(pts))
        if len(pts) == 1:
            cx, cy = coords.split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
        else:
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                         f'stroke-width="1.8"/>')
        ly = top + 12 + 15 * n
        parts.append(f'<rect x="{left + pw + 10}" y="{ly - 8}" width="10" height="10" '
                     f'fill="{color}"/><text x="{left + pw + 24}" y="{ly + 1}" '
                     f'font-size="11">{esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_cell(v))}</td></tr>"
                    for k, v in rows)
    return f"<table>{cells}</table>"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, dict | list):
        return json.dumps(v)
    return str(v)


def charts(run: RunDir) -> list[str]:
    client = read_jsonl(run / rundir.CLIENT_INTERVALS)
    samples = read_jsonl(run / rundir.METRICS)
    t0 = min([s["ts"] for s in samples[:1]] + [c["ts"] - c.get("elapsed_s", 0)
                                                 for c in client[:1]] or [0.0])

    def pts(rows: list[dict[str, Any]], get: Any) -> list[tuple[float, float]]:
        out = []
        for row in rows:
            value = get(row)
            if value is not None:
                out.append((row["ts"] - t0, float(value)))
        return out

    out = [line_chart("Produce throughput", [
        ("client acked", pts(client, lambda c: c.get("records_per_s"))),
        ("brokers accepted", pts(samples, lambda s: s.get("rates", {}).get(
            "produce_records_per_s"))),
        ("brokers consumed", pts(samples, lambda s: s.get("rates", {}).get(
            "consume_records_per_s"))),
    ], "records/s")]
    lat_series: list[Series] = [
        (f"produce {q}", pts(client, lambda c, q=q: c.get("latency_ms", {}).get(q)))
        for q in ("p50", "p99", "p999")]
    if any(c.get("consumed_records") for c in client):
        lat_series += [(f"e2e {q}", pts(client, lambda c, q=q: c.get("e2e_latency_ms", {})
                                        .get(q))) for q in ("p50", "p99")]
    out.append(line_chart("Latency percentiles (per interval)", lat_series, "ms"))
    names = sorted({n for s in samples for n in s.get("processes", {})})
    cpu: list[Series] = [(n, pts(samples, lambda s, n=n: s["processes"].get(n, {})
                                 .get("cpu_pct"))) for n in names]
    cpu.append(("host (all cores)", pts(samples, lambda s: s.get("host", {}).get("cpu_pct"))))
    out.append(line_chart("CPU (100% = one core; host: % of all cores)", cpu, "%"))
    rss: list[Series] = [(n, pts(samples, lambda s, n=n: (s["processes"].get(n, {})
                                 .get("rss_bytes") or 0) / 2**20 or None)) for n in names]
    out.append(line_chart("Resident memory", rss, "MiB"))

    def op_rates(key: str) -> list[Series]:
        ops = sorted({k.split(":")[0] for s in samples for k in s.get("rates", {}).get(key, {})})
        return [(op, pts(samples, lambda s, op=op: sum(
            v for k, v in s.get("rates", {}).get(key, {}).items() if k.split(":")[0] == op)
            if "rates" in s else None)) for op in ops]

    out.append(line_chart("S3 requests by operation", op_rates("s3_requests_per_s"), "req/s"))
    out.append(line_chart("Oxia requests by operation", op_rates("oxia_requests_per_s"),
                          "req/s"))
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;
font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f6f6f6;font-weight:600}.warn{color:#a40}.ok{color:#070}
pre{background:#f6f6f6;padding:8px;font-size:11px;overflow:auto;max-height:400px}
svg{display:block;margin:12px 0}"""


def render_report(run: RunDir, summary: dict[str, Any], scenario_doc: dict[str, Any]) -> str:
    esc = html.escape
    headline = summary.get("headline", {})
    rec = summary.get("reconciliation", {})
    warnings = summary.get("warnings", [])
    status = ('<p class="ok">Reconciled: client-acknowledged records and bytes equal '
              'broker-accepted.</p>' if rec.get("ok") else
              '<p class="warn">Not reconciled; see warnings.</p>')
    warn_html = ("<ul>" + "".join(f'<li class="warn">{esc(w)}</li>' for w in warnings)
                 + "</ul>") if warnings else "<p>None.</p>"
    artifacts = summary.get("artifacts", {})
    body = [
        f"<h1>llog load test: {esc(str(summary.get('scenario')))}</h1>",
        f"<p>Run <code>{esc(run.run_id)}</code>. {esc(str(summary.get('description', '')))}"
        "</p>",
        status,
        "<h2>Headline</h2>", _table(list(headline.items())),
        *(f"<div>{svg}</div>" for svg in charts(run)),
        "<h2>Reconciliation</h2>", _table(list(rec.items())),
        "<h2>Warnings</h2>", warn_html,
        "<h2>Artifacts</h2>", _table([(k, "present" if v else "MISSING")
                                      for k, v in artifacts.items()]),
        "<h2>Resolved scenario</h2>", f"<pre>{esc(json.dumps(scenario_doc, indent=2))}</pre>",
    ]
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>llog load test {esc(run.run_id)}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")
