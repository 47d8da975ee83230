"""The HTML building blocks every page of headprobe uses (report.html, compare.html): the stylesheet, escaping,
number formatting, tables, embedded figures and the page shell."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plots import Plot

__all__ = ["CSS", "esc", "figure", "flatten", "fmt", "kv_table", "page", "table"]

CSS = """
:root { --ink:#1d2330; --muted:#5f6b7a; --line:#d9dee5; --soft:#f4f6f9; --bb:#eef0f3; --out:#e7f0fb;
        --good:#1f7a3f; --bad:#b42318; --warn:#a15c00; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
       color:var(--ink); background:#fff; }
main { max-width:1180px; margin:0 auto; padding:24px 28px 64px; }
header { border-bottom:2px solid var(--ink); padding-bottom:12px; margin-bottom:8px; }
h1 { font-size:26px; margin:0 0 4px; } h2 { font-size:20px; margin:36px 0 10px; padding-bottom:4px;
     border-bottom:1px solid var(--line); } h3 { font-size:16px; margin:20px 0 8px; }
.sub { color:var(--muted); margin:0; } nav { margin:10px 0 0; font-size:14px; }
nav a { color:var(--ink); margin-right:14px; text-decoration:none; border-bottom:1px dotted var(--muted); }
table { border-collapse:collapse; margin:6px 0 14px; font-size:13.5px; }
th, td { border:1px solid var(--line); padding:4px 9px; text-align:left; vertical-align:top; }
th { background:var(--soft); font-weight:600; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
.metrics td.bb, .metrics th.bb { background:var(--bb); }
.metrics td.out, .metrics th.out { background:var(--out); font-weight:600; }
.metrics tr.bb td, .metrics tr.bb th { background:var(--bb); }
.delta { display:block; font-size:11.5px; font-weight:400; }
.up { color:var(--good); } .down { color:var(--bad); }
.kv th { width:16em; font-weight:500; } .kv td { word-break:break-word; }
.grid { display:grid; grid-template-columns:repeat(auto-fit,minmax(340px,1fr)); gap:0 28px; }
pre { background:var(--soft); border:1px solid var(--line); padding:10px 12px; overflow:auto; max-height:26em;
      font-size:12.5px; line-height:1.4; }
figure { margin:14px 0 22px; } figure img { max-width:100%; height:auto; border:1px solid var(--line); }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
.missing, .note { background:#fff8e6; border:1px solid #f0d9a8; padding:8px 12px; color:var(--warn); }
.error { background:#fdecea; border:1px solid #f5c2bd; padding:8px 12px; color:var(--bad); }
.badge { display:inline-block; padding:1px 9px; border-radius:10px; font-size:13px; font-weight:600;
         color:#fff; background:var(--muted); }
.badge.buffer, .badge.complete { background:var(--good); } .badge.mixed, .badge.running { background:var(--warn); }
.badge.no-buffer, .badge.failed { background:var(--bad); }
.card { border:1px solid var(--line); border-radius:6px; padding:4px 16px 8px; margin:12px 0; }
.bar { display:inline-block; height:9px; background:#8aa4c8; vertical-align:middle; margin-right:6px; }
.legend { color:var(--muted); font-size:13px; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def fmt(value, plain: bool = False) -> str:
    """A value as short text: floats to 4 decimals below 10, 2 above, 3 significant digits when tiny or huge
    (up to 6 significant digits when `plain`, for settings); long lists shortened."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float) and plain:
        return f"{value:.6g}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(fmt(v, plain) for v in value[:8])
        return f"[{items}, … ({len(value)} values)]" if len(value) > 8 else f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v, plain)}" for k, v in value.items()) + "}"
    return str(value)


def flatten(data: dict, prefix: str = "") -> dict:
    """Nested dicts → one level with dotted keys; lists and scalars are kept as values."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def kv_table(data: dict, caption: str | None = None) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(fmt(v, plain=True))}</td></tr>" for k, v in flatten(data).items())
    head = f"<h3>{esc(caption)}</h3>" if caption else ""
    return f"{head}<table class='kv'>{rows}</table>" if rows else f"{head}<p class='legend'>nothing recorded</p>"


def table(header: Sequence[str], rows: Sequence[Sequence], numeric_from: int = 1, cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td class='num'>{esc(fmt(c))}</td>" if i >= numeric_from and isinstance(c, (int, float))
                         else f"<td>{esc(fmt(c))}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows)
    return f"<table class='{esc(cls)}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(plot: Plot) -> str:
    if plot.path is None or plot.error:
        return f"<figure class='missing'>Figure “{esc(plot.title)}” could not be drawn: {esc(plot.error)}</figure>"
    data = base64.b64encode(Path(plot.path).read_bytes()).decode("ascii")
    return (f"<figure><img src='data:image/png;base64,{data}' alt='{esc(plot.title)}'>"
            f"<figcaption>{esc(plot.title)} (plots/{esc(Path(plot.path).name)})</figcaption></figure>")


def page(title: str, header: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body><main><header>{header}</header>{body}</main></body></html>\n")
